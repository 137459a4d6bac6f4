"""The first article's scenario end to end, on every server queue: 4 ``jobfence worker``
processes on one queue, 1,000 messages each published twice (duplicates on purpose), workers
killed with SIGKILL mid-run and replaced (their messages are redelivered), every handler's
effect written to a ledger table in PostgreSQL.

The naive handler leaves duplicate effects in the ledger; the guarded one (``guarded`` +
``claim_in`` keyed on the message id) leaves exactly one effect per message. Both runs are
counted from the ledger itself.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 1000
WORKERS = 4
KILL_AT = (0.2, 0.45, 0.7)  # SIGKILL one worker when the ledger holds this share of messages

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def one_scenario_at_a_time() -> Iterator[None]:
    """A lock file shared by every pytest process on this machine: four scenarios at once (under
    pytest-xdist) would open more PostgreSQL connections -- 16 worker processes, their pools and
    handler threads -- than a default server allows."""
    with open(os.path.join(tempfile.gettempdir(), "jobfence-worker-scenario.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


QUEUES: dict[str, Callable[[Path], str]] = {
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'queue.db'}",
    "redis": lambda tmp: REDIS_URL,
    "postgres": lambda tmp: POSTGRES_URL,
    "rabbitmq": lambda tmp: RABBITMQ_URL,
}


@pytest.fixture
def ledger() -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:10]
    table, inbox_table = f"ledger_{suffix}", f"inbox_{suffix}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{table}" (n bigserial PRIMARY KEY, msg_id text NOT NULL, '
            "delivery int NOT NULL, pid int NOT NULL)"
        )
    inbox = jobfence.Inbox(POSTGRES_URL, table=inbox_table)
    inbox.install()
    inbox.close()
    try:
        yield table, inbox_table
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')
            conn.execute(f'DROP TABLE IF EXISTS "{inbox_table}"')
            conn.execute("DELETE FROM jobfence_inbox_schema WHERE table_name = %s", (inbox_table,))


def _counts(table: str) -> tuple[int, int]:
    """(effects, distinct messages) in the ledger."""
    with psycopg.connect(POSTGRES_URL) as conn:
        row = conn.execute(f'SELECT count(*), count(DISTINCT msg_id) FROM "{table}"').fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


#: what a worker logs once its SIGTERM handler is in place (it starts taking messages then)
RUNNING = "worker on queue"


def _start_worker(url: str, name: str, handler: str, env: dict[str, str]) -> subprocess.Popen[Any]:
    """A ``jobfence worker`` process; its log goes to a file (``_log``), read at INFO level to
    see when it runs (``RUNNING``)."""
    with tempfile.NamedTemporaryFile(prefix="jf-worker-", suffix=".log", delete=False) as log:
        path = log.name
    with open(path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobfence.cli.app",
                "worker",
                f"tests.acceptance._ledger_handlers:{handler}",
                "--queue",
                url,
                "--name",
                name,
                "--concurrency",
                "4",
                "--visibility",
                "3",
                "--max-deliveries",
                "50",
                "--shutdown-timeout",
                "10",
                "--no-live",
                "--log-level",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


def _log(proc: subprocess.Popen[Any]) -> str:
    return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]


def _drained(queue: jobfence.Queue) -> bool:
    stats = queue.stats()
    return stats.ready == 0 and stats.delayed in (0, None) and stats.in_flight in (0, None)


def _stop(workers: list[subprocess.Popen[bytes]], *, check: bool = True) -> None:
    """Stop the workers gracefully (they finish or give back what they hold) and, with
    ``check``, that each exited cleanly. A worker still starting (a replacement started just
    now, on a loaded machine) is let run first: a SIGTERM before its handler is in place ends
    the process as the signal's default does, which is no clean stop."""
    for proc in workers:
        deadline = time.monotonic() + 60
        while proc.poll() is None and RUNNING not in _log(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for proc in workers if check else ():
        assert proc.returncode == 0, _log(proc)
    for proc in workers:
        Path(proc.log_path).unlink(missing_ok=True)  # type: ignore[attr-defined]


def _run_scenario(url: str, handler: str, ledger_table: str, inbox_table: str) -> dict[str, int]:
    name = f"scenario-{handler}-{uuid.uuid4().hex[:8]}"
    queue = jobfence.Queue(url, name)
    ids = [f"order:{i}" for i in range(MESSAGES)]
    bodies = [{"order_id": i, "qty": 1} for i in range(MESSAGES)]
    for _ in range(2):  # every message twice: duplicates published on purpose
        for start in range(0, MESSAGES, 250):
            queue.publish_many(bodies[start : start + 250], ids=ids[start : start + 250])
    env = {
        **os.environ,
        "JF_LEDGER_DSN": POSTGRES_URL,
        "JF_LEDGER_TABLE": ledger_table,
        "JF_INBOX_TABLE": inbox_table,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
    }
    workers = [_start_worker(url, name, handler, env) for _ in range(WORKERS)]
    kills = 0
    try:
        deadline = time.monotonic() + 400
        pending_kills = list(KILL_AT)
        while time.monotonic() < deadline:
            _effects, distinct = _counts(ledger_table)
            if pending_kills and distinct >= pending_kills[0] * MESSAGES:
                pending_kills.pop(0)
                victim = workers.pop(0)
                victim.send_signal(signal.SIGKILL)  # mid-run: it holds deliveries
                victim.wait(30)
                kills += 1
                workers.append(_start_worker(url, name, handler, env))
            for proc in workers:
                assert proc.poll() is None, _log(proc)
            if distinct >= MESSAGES and not pending_kills and _drained(queue):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the workers did not finish: {_counts(ledger_table)}, {queue.stats()}")
        # A queue that cannot count deliveries in flight (RabbitMQ: a consumer's prefetched
        # messages are neither ready nor counted) looks drained too early. Once every worker
        # has stopped, everything unacked is ready again: stop them, and while messages are
        # left, run one worker until they are taken, and stop it again.
        for _ in range(10):
            _stop(workers)
            workers = []
            if _drained(queue):
                break
            workers = [_start_worker(url, name, handler, env)]
            while not _drained(queue):
                assert time.monotonic() < deadline, f"not drained: {queue.stats()}"
                time.sleep(0.1)
        else:
            pytest.fail(f"messages were still left after the workers stopped: {queue.stats()}")
    finally:
        _stop(workers, check=False)  # after a failure: its own error is the one to see
    effects, distinct = _counts(ledger_table)
    queue.drop()
    queue.close()
    return {"effects": effects, "distinct": distinct, "kills": kills}


@pytest.mark.parametrize("backend", sorted(QUEUES))
def test_guarded_workers_leave_one_effect_per_message_and_naive_ones_do_not(
    backend: str, tmp_path: Path, ledger: tuple[str, str]
) -> None:
    url = QUEUES[backend](tmp_path)
    table, inbox_table = ledger
    naive = _run_scenario(url, "naive", table, inbox_table)
    assert naive["kills"] == len(KILL_AT)
    assert naive["distinct"] == MESSAGES
    # every message was published twice and the naive handler repeats its effect
    assert naive["effects"] >= 2 * MESSAGES, naive
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'TRUNCATE "{table}"')
    guarded = _run_scenario(url, "guarded", table, inbox_table)
    print(f"{backend}: naive {naive}, guarded {guarded}")  # shown with pytest -s
    assert guarded["kills"] == len(KILL_AT)
    assert guarded == {"effects": MESSAGES, "distinct": MESSAGES, "kills": len(KILL_AT)}
