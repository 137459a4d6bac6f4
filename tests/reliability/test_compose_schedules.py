"""The parts together, with their defaults, through crashes: ``jobfence worker
_compose_app:handle --scheduler _compose_app:sched`` processes, where a one-second schedule
publishes each slot to the queue (message id = slot key) and the ``guarded`` handler (a
tenant lock, an inbox claim) writes its effect to a PostgreSQL ledger in one transaction with
``inbox.claim_in``.

Two workers run. One is killed (SIGKILL) while a handler of it works, before its effect; the
other while a handler of it has committed its effect but not returned (nothing acked, the
claim not completed); each is replaced by a new worker. On Redis the server itself is then
killed while a handler works, kept down for longer than every lease, and started again on
its files (AOF, ``appendfsync always``). At the end every slot from the first fire on has
exactly one effect in the ledger and a ``fired`` record, the killed workers' messages were
delivered again (and the second one recognised as applied), nothing was applied twice, and
no message was dead-lettered without having run.

Only URLs and short leases (2 s: scheduler lease, claim ttl, lock ttl, queue visibility) are
set; everything else is the default (concurrency, max deliveries, grace, misfire, retention).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from jobfence import ClaimState
from tests.conformance.specs import SPECS
from tests.reliability._redis_server import RedisServer
from tests.servers import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.reliability._compose_app"
LEASE = "2"  # the queue's visibility, as the app's leases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


class DurableRedis(RedisServer):
    """The disposable redis-server, appending every write to its AOF and syncing it before
    answering (``appendonly yes``, ``appendfsync always``): the configuration under which a
    crash restart loses nothing that returned. :meth:`restart` kills it (SIGKILL) and starts
    it again on the same port and files."""

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(self._answers, timeout, f"redis-server on port {self.port}")
        return self

    def _answers(self) -> bool:
        import redis

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` (a state in a server or in another process: nothing to wait on)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


@dataclass
class Setup:
    """Where one run's parts live."""

    name: str
    url: str  # the scheduler's records and the tenant locks
    queue_url: str
    queue: str
    namespace: str
    redis: DurableRedis | None


def new_ledger() -> str:
    """A fresh namespace, and its tables in the machine's PostgreSQL: the ledger, the started
    rows and the handler's inbox."""
    namespace = "t" + uuid.uuid4().hex[:12]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{namespace}_ledger" (n bigserial PRIMARY KEY, msg_id text NOT NULL, '
            "tenant text NOT NULL, pid int NOT NULL, delivery int NOT NULL)"
        )
        conn.execute(
            f'CREATE TABLE "{namespace}_started" (n bigserial PRIMARY KEY, msg_id text NOT NULL, '
            "pid int NOT NULL, delivery int NOT NULL)"
        )
    with jobfence.Inbox(POSTGRES_URL, table=f"{namespace}_handled") as inbox:
        inbox.install()
    return namespace


def app_env(setup: Setup, hold_dir: Path) -> dict[str, str]:
    """The environment of the worker processes (see ``_compose_app``)."""
    return {
        **os.environ,
        "JF_URL": setup.url,
        "JF_QUEUE_URL": setup.queue_url,
        "JF_QUEUE": setup.queue,
        "JF_NAMESPACE": setup.namespace,
        "JF_LEDGER_DSN": POSTGRES_URL,
        "JF_HOLD_DIR": str(hold_dir),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
    }


@pytest.fixture(params=["redis", "postgres"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    """A fresh namespace; on Redis a disposable server of the test's own, on PostgreSQL the
    machine's server (every table named after the namespace, dropped afterwards). The ledger,
    the started rows and the handler's inbox are in the machine's PostgreSQL either way."""
    namespace = new_ledger()
    cleanup = next(s for s in SPECS if s.id == "postgres").cleanup
    server: DurableRedis | None = None
    try:
        if request.param == "redis":
            server = DurableRedis()
            server.start()
            yield Setup("redis", server.url, server.url, namespace + "q", namespace, server)
        else:
            queue_url = f"{POSTGRES_URL}?table={namespace}_queue"
            yield Setup("postgres", POSTGRES_URL, queue_url, namespace + "q", namespace, None)
    finally:
        if server is not None:
            server.stop()
        cleanup(POSTGRES_URL, namespace)


def _worker(setup: Setup, env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    """Start ``jobfence worker --scheduler`` on the app; its log goes to a new file in
    ``logs`` (a file, not a pipe nobody reads while it runs)."""
    log = logs / f"worker-{len(list(logs.iterdir()))}.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobfence.cli.app",
                "worker",
                f"{APP}:handle",
                "--queue",
                setup.queue_url,
                "--name",
                setup.queue,
                "--visibility",
                LEASE,
                "--scheduler",
                f"{APP}:sched",
                "--no-live",
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


class Ledger:
    """Reads of the test's tables in PostgreSQL."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.conn = psycopg.connect(POSTGRES_URL, autocommit=True)

    def rows(self, table: str, columns: str = "msg_id, pid, delivery") -> list[tuple[Any, ...]]:
        return self.conn.execute(
            f'SELECT {columns} FROM "{self.namespace}_{table}" ORDER BY n'
        ).fetchall()

    def effects(self) -> list[tuple[Any, ...]]:
        return self.rows("ledger")

    def applied(self) -> set[str]:
        return {row[0] for row in self.effects()}

    def last_started(self) -> int:
        row = self.conn.execute(
            f'SELECT coalesce(max(n), 0) FROM "{self.namespace}_started"'
        ).fetchone()
        assert row is not None
        return int(row[0])

    def started_by(self, pid: int, after: int, point: str) -> str | None:
        """The message of the first handler of ``pid`` that started after row ``after`` and
        is held at ``point`` with its effect to come (``"before"``: nobody applied the
        message) or just committed (``"after"``: no other process applied it): not a run
        again of a message applied already."""
        other = "" if point == "before" else "AND l.pid <> s.pid"
        row = self.conn.execute(
            f'SELECT s.msg_id FROM "{self.namespace}_started" s WHERE s.pid = %s AND s.n > %s '
            f'AND NOT EXISTS (SELECT 1 FROM "{self.namespace}_ledger" l '
            f"WHERE l.msg_id = s.msg_id {other}) ORDER BY s.n LIMIT 1",
            (pid, after),
        ).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        self.conn.close()


def _second(key: str) -> int:
    """The slot time (epoch seconds) of a slot key ``schedule:tick@<UTC ISO>``."""
    at = key.split("@", 1)[1].replace("Z", "+00:00")
    return int(datetime.fromisoformat(at).timestamp())


def _hold_one(ledger: Ledger, hold_dir: Path, pids: list[int], point: str) -> str:
    """Hold the handlers of the processes ``pids`` at ``point`` (``"before"`` their effect,
    ``"after"`` its commit) until :func:`_release`; return the id of the message of the
    first one that started after the hold was set (see :meth:`Ledger.started_by`)."""
    for pid in pids:
        (hold_dir / f"{point}-{pid}").touch()
    after = ledger.last_started()  # the rows after this one were written with the files there
    held: list[str] = []

    def started() -> bool:
        for pid in pids:
            msg = ledger.started_by(pid, after, point)
            if msg is not None:
                held.append(msg)
                return True
        return False

    _wait_for(started, 30, f"a handler of {pids} to start")
    return held[0]


def _release(hold_dir: Path) -> None:
    for hold in hold_dir.iterdir():
        hold.unlink()


def _key(at: int) -> str:
    """The slot key of the schedule ``tick`` at ``at`` (epoch seconds)."""
    return "schedule:tick@" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _records(setup: Setup) -> list[jobfence.Fire]:
    """Every record the schedulers kept of the schedule ``tick``."""
    with jobfence.Scheduler(setup.url, namespace=f"{setup.namespace}_sched") as sched:
        sched.add("tick", every=1, target=lambda: None)
        return sched.history("tick", limit=None)


def _stop(workers: list[subprocess.Popen[bytes]], logs: Path) -> list[str]:
    """SIGTERM the workers still running, wait for them; the workers' logs."""
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return [log.read_text(errors="replace") for log in sorted(logs.iterdir())]


def test_every_slot_is_applied_once_through_a_killed_worker_and_a_restarted_server(
    setup: Setup, tmp_path: Path
) -> None:
    hold_dir, logs = tmp_path / "hold", tmp_path / "logs"
    hold_dir.mkdir()
    logs.mkdir()
    env = app_env(setup, hold_dir)
    ledger = Ledger(setup.namespace)

    def more_effects(n: int) -> Callable[[], bool]:
        start = len(ledger.effects())
        return lambda: len(ledger.effects()) >= start + n

    first_victim, second_victim = _worker(setup, env, logs), _worker(setup, env, logs)
    workers = [first_victim, second_victim]
    try:
        _wait_for(more_effects(3), 30, "the first effects")
        # the window starts with the first slot fired
        first = min(_second(f.key) for f in _records(setup))

        # kill one worker while a handler of it works, before its effect
        before_msg = _hold_one(ledger, hold_dir, [first_victim.pid], "before")
        first_victim.send_signal(signal.SIGKILL)
        first_victim.wait(10)
        _release(hold_dir)
        assert before_msg not in ledger.applied()
        workers.append(_worker(setup, env, logs))
        _wait_for(lambda: before_msg in ledger.applied(), 30, "the first killed message")

        # kill the other one after its handler committed the effect, before it returned
        after_msg = _hold_one(ledger, hold_dir, [second_victim.pid], "after")
        _wait_for(
            lambda: (after_msg, second_victim.pid) in {r[:2] for r in ledger.effects()},
            30,
            "the held handler's effect",
        )
        second_victim.send_signal(signal.SIGKILL)
        second_victim.wait(10)
        _release(hold_dir)
        workers.append(_worker(setup, env, logs))
        _wait_for(
            lambda: any(
                r[0] == after_msg and r[1] != second_victim.pid for r in ledger.rows("started")
            ),
            30,
            "the second killed message to run again",
        )

        running = workers[2:]
        if setup.redis is not None:
            # kill the server while a handler works, keep it down for longer than every lease
            # (the handler's lock, the scheduler's claims, the deliveries), start it again
            _hold_one(ledger, hold_dir, [p.pid for p in running], "before")
            setup.redis.kill()
            time.sleep(2.5)  # the downtime itself, not a wait for something to happen
            setup.redis.start()
            _release(hold_dir)

        # run until the slots applied span 20 s
        _wait_for(lambda: len(ledger.applied()) >= 20, 40, "20 slots applied")
        assert [proc.poll() for proc in running] == [None, None], "a worker exited"
        # the window: from the first slot fired to the last one due by now
        last = math.floor(time.time()) - 1
        window = {_key(at) for at in range(first, last + 1)}
        _wait_for(lambda: window <= ledger.applied(), 30, "every slot of the window applied")
        records = _records(setup)
        with jobfence.Scheduler(setup.url, namespace=f"{setup.namespace}_sched") as sched:
            sched.add("tick", every=1, target=lambda: None)
            misses = sched.info("tick").misses
    finally:
        logged = _stop(workers, logs)
        ledger_rows = ledger.effects()
        started_rows = ledger.rows("started")
        ledger.close()
    assert [proc.returncode for proc in running] == [0, 0], logged

    # every slot in the window: one effect; no message anywhere: two effects
    counts: dict[str, int] = {}
    for msg_id, _pid, _delivery in ledger_rows:
        counts[msg_id] = counts.get(msg_id, 0) + 1
    assert {k: n for k, n in counts.items() if n > 1} == {}, "applied twice"
    assert window <= set(counts), sorted(window - set(counts))
    # the message killed before its effect: delivered again, applied once by another process
    (redone,) = [row for row in ledger_rows if row[0] == before_msg]
    assert redone[1] != first_victim.pid and redone[2] >= 2, redone
    # the message killed after its effect: delivered again, run again, applied once (by the
    # killed process)
    (done,) = [row for row in ledger_rows if row[0] == after_msg]
    assert done[1] == second_victim.pid, done
    again = [row for row in started_rows if row[0] == after_msg and row[1] != second_victim.pid]
    assert again and all(row[2] >= 2 for row in again), again
    # the scheduler: every slot of the window fired (none missed or failed)
    outcomes = {f.key: f.outcome for f in records}
    assert {outcomes.get(k) for k in window} == {"fired"}, outcomes
    assert misses == 0
    # the handler's inbox has the record of every slot applied
    with jobfence.Inbox(POSTGRES_URL, table=f"{setup.namespace}_handled") as inbox:
        infos = {k: inbox.claim_info(k) for k in window}
    assert [k for k, info in infos.items() if info is None] == []
    incomplete = [k for k, info in infos.items() if info and info.state is not ClaimState.COMPLETED]
    # dead letters: none without an attempt recorded
    queue = jobfence.Queue(setup.queue_url, setup.queue)
    try:
        dead = queue.dead_letters()
        ran = {row[0] for row in started_rows}
        assert [d.id for d in dead if d.id not in ran] == [], dead
        print(
            f"{setup.name}: {len(window)} slots, "
            f"{len(ledger_rows)} effects, {len(started_rows)} handler starts, "
            f"{len(dead)} dead letters, {len(incomplete)} handler claims not completed, "
            f"{sum(log.count(' WARNING ') for log in logged)} warnings and "
            f"{sum(log.count(' ERROR ') for log in logged)} errors logged"
        )
    finally:
        queue.close()
