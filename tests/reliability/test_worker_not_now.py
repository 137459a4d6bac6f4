""" "Not now" is not a failure, end to end, with DEFAULT settings on every server queue.

Real ``jobfence worker`` processes run a guarded handler (an inbox claim keyed on the message
id, ``claim_in`` with the effect, all at their defaults: worker ``max_deliveries`` 5 and
``backoff`` 1 s, visibility 30 s, ``claim_ttl`` 30 s) whose effect is one ledger row in
PostgreSQL, counted from the database afterwards.

* ``test_a_killed_workers_claims_delay_its_messages_but_never_dead_letter_them``: two
  workers per queue (every queue in one run), one SIGKILLed while it holds claims. Its
  messages come back (RabbitMQ at once) while its claims still run for up to 30 s: the
  survivor is refused (``ClaimInProgress``) and must defer them, uncounted, until the claims
  expire -- never back off through ``max_deliveries`` into the dead letters.
* ``test_a_crashed_database_leaves_no_claim_that_dead_letters_its_message``: the PostgreSQL of
  the inbox and the ledger (and of the queue, on PostgreSQL) is stopped with ``pg_ctl stop -m
  immediate`` mid-run and started again (one crash, every queue's run in it). The guard's
  claims (committed on their own) outlive the aborted effect transactions, whose release
  fails while the server is down: the inbox releases them with its next claim, and a
  redelivery that meets one defers instead of burning its deliveries.

Each asserts every message's effect exactly once and zero dead letters. The wait is bounded
by the default claim ttl (30 s), so the message counts are small.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import jobfence
from tests.reliability._pg_server import PostgresServer
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
#: how long a run may take: the default claim ttl (30 s) and visibility (30 s), with room
LIMIT = 150.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: the queue of each run, given a temporary directory and the PostgreSQL of the ledger
QUEUES: dict[str, Callable[[Path, str], str]] = {
    "sqlite": lambda tmp, pg: f"sqlite:///{tmp / 'queue.db'}",
    "redis": lambda tmp, pg: REDIS_URL,
    "postgres": lambda tmp, pg: pg,
    "rabbitmq": lambda tmp, pg: RABBITMQ_URL,
}


class Run:
    """The ledger and inbox tables of one run, in the PostgreSQL at ``dsn``, and the worker
    processes on ``queue_url``'s queue ``name``."""

    def __init__(self, dsn: str, queue_url: str, tmp: Path, seconds: float) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.dsn = dsn
        self.table, self.inbox_table = f"ledger_{suffix}", f"inbox_{suffix}"
        self.name = f"notnow-{suffix}"
        self.queue_url = queue_url
        self.started_file = tmp / "started.txt"
        self.started_file.touch()
        self.tmp = tmp
        self.workers: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "JF_DSN": dsn,
            "JF_LEDGER_TABLE": self.table,
            "JF_INBOX_TABLE": self.inbox_table,
            "JF_STARTED": str(self.started_file),
            "JF_SECONDS": str(seconds),
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
        }
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f'CREATE TABLE "{self.table}" (n bigserial PRIMARY KEY, msg_id text NOT NULL, '
                "delivery int NOT NULL, pid int NOT NULL)"
            )
        with jobfence.Inbox(dsn, table=self.inbox_table) as inbox:
            inbox.install()
        self.queue = jobfence.Queue(queue_url, self.name)

    def publish(self, count: int) -> list[str]:
        ids = [f"order:{i}" for i in range(count)]
        self.queue.publish_many([{"order_id": i} for i in range(count)], ids=ids)
        return ids

    def start_worker(self) -> subprocess.Popen[bytes]:
        """``jobfence worker`` with every setting at its default."""
        log = open(self.tmp / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobfence.cli.app",
                "worker",
                "tests.reliability._not_now_handlers:effect",
                "--queue",
                self.queue_url,
                "--name",
                self.name,
                "--no-live",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        self.workers.append(proc)
        return proc

    def starts(self) -> list[tuple[int, str, int]]:
        """``(pid, message id, delivery)`` of every handler start so far."""
        lines = self.started_file.read_text(encoding="utf-8").splitlines()
        return [(int(p), m, int(d)) for p, m, d in (line.split() for line in lines if line)]

    def effects(self) -> list[str]:
        """The message id of every effect in the ledger."""
        with psycopg.connect(self.dsn, connect_timeout=3) as conn:
            return [str(r[0]) for r in conn.execute(f'SELECT msg_id FROM "{self.table}"')]

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-6000:]
            for p in sorted(self.tmp.glob("worker-*.log"))
        )

    def wait_for_effects(self, ids: list[str]) -> None:
        """Until every message's effect is in the ledger; a dead letter fails at once."""
        deadline = time.monotonic() + LIMIT
        while True:
            try:
                dead = self.queue.dead_letters()
            except jobfence.BackendError:  # the queue's server is down (it comes back)
                dead = []
            assert not dead, (
                f"dead-lettered: {[(d.id, d.deliveries, d.error) for d in dead]}\n{self.logs()}"
            )
            try:
                done = set(self.effects())
            except psycopg.OperationalError:
                done = set()
            if done >= set(ids):
                return
            assert time.monotonic() < deadline, (
                f"{len(set(ids) - done)} of {len(ids)} effects missing after {LIMIT:.0f} s: "
                f"{sorted(set(ids) - done)[:10]}\n{self.logs()}"
            )
            time.sleep(0.25)

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def close(self) -> None:
        self.stop_workers()
        try:
            self.queue.drop()
        finally:
            self.queue.close()
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'DROP TABLE IF EXISTS "{self.table}"')
                conn.execute(f'DROP TABLE IF EXISTS "{self.inbox_table}"')
                conn.execute(
                    "DELETE FROM jobfence_inbox_schema WHERE table_name = %s", (self.inbox_table,)
                )
        except psycopg.Error:
            pass


def _wait(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _check_exactly_once(run: Run, ids: list[str]) -> None:
    run.stop_workers()
    effects = run.effects()
    assert sorted(effects) == sorted(ids), "every message's effect exactly once"
    assert run.queue.dead_letters() == []
    stats = run.queue.stats()
    assert stats.dead in (0, None) and stats.ready in (0, None), stats


@pytest.fixture
def pg() -> Iterator[PostgresServer]:
    # the eight workers of the four runs (eight handler threads each, their pools) need more
    # than the default 100 connections
    with PostgresServer(max_connections=300) as server:
        yield server


def test_a_killed_workers_claims_delay_its_messages_but_never_dead_letter_them(
    tmp_path: Path,
) -> None:
    """Every server queue at once: each waits out the same default claim ttl (and, but for
    RabbitMQ, visibility) after its kill, so the four runs share that 30 s wait."""
    dsn = POSTGRES_URL
    runs: dict[str, Run] = {}
    try:
        for backend in sorted(QUEUES):
            tmp = tmp_path / backend
            tmp.mkdir()
            runs[backend] = Run(dsn, QUEUES[backend](tmp, dsn), tmp, seconds=2.0)
        ids = {backend: run.publish(24) for backend, run in runs.items()}
        victims = {backend: run.start_worker() for backend, run in runs.items()}
        for run in runs.values():
            run.start_worker()
        # each victim is killed as soon as it holds claims: handlers started (claims taken)
        # and not finished
        alive = dict(victims)
        deadline = time.monotonic() + 60
        while alive:
            for backend, victim in list(alive.items()):
                run = runs[backend]
                if sum(p == victim.pid for p, _m, _d in run.starts()) < 3:
                    continue
                victim.send_signal(signal.SIGKILL)
                victim.wait(30)
                del alive[backend]
                held = {m for p, m, _d in run.starts() if p == victim.pid} - set(run.effects())
                assert held, f"{backend}: the victim was killed while it held claims"
            assert time.monotonic() < deadline, f"timed out waiting for handler starts: {alive}"
            time.sleep(0.05)
        for backend, run in runs.items():
            try:
                run.wait_for_effects(ids[backend])
                _check_exactly_once(run, ids[backend])
            except AssertionError as exc:
                raise AssertionError(f"{backend}: {exc}") from None
    finally:
        for run in runs.values():
            run.close()


def test_a_crashed_database_leaves_no_claim_that_dead_letters_its_message(
    tmp_path: Path, pg: PostgresServer
) -> None:
    """Every server queue at once, through one crash of their PostgreSQL: a redelivery that
    meets a claim left behind waits out the same default claim ttl on each queue, so the four
    runs share that wait."""
    runs: dict[str, Run] = {}
    try:
        for backend in sorted(QUEUES):
            tmp = tmp_path / backend
            tmp.mkdir()
            runs[backend] = Run(pg.url, QUEUES[backend](tmp, pg.url), tmp, seconds=1.0)
        for run in runs.values():
            run.start_worker()
            run.start_worker()
        # every worker is up before the messages go out, so that the runs are mid-run together
        _wait(
            lambda: all(
                run.logs().count("INFO jobfence.worker: worker on queue") == 2
                for run in runs.values()
            ),
            "the workers to start",
        )
        ids = {backend: run.publish(40) for backend, run in runs.items()}
        _wait(lambda: all(len(run.starts()) >= 10 for run in runs.values()), "handler starts")
        done = {backend: len(set(run.effects())) for backend, run in runs.items()}
        pg.crash()  # mid-run: handlers are between their claim and their effect's commit
        time.sleep(1.0)  # the scenario: the server stays down a moment (not a synchronisation)
        pg.start_again()
        for backend, count in done.items():
            assert count < len(ids[backend]), f"{backend}: every effect was in before the crash"
        for backend, run in runs.items():
            try:
                run.wait_for_effects(ids[backend])
                _check_exactly_once(run, ids[backend])
            except AssertionError as exc:
                raise AssertionError(f"{backend}: {exc}") from None
    finally:
        for run in runs.values():
            run.close()
