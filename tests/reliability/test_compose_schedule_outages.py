"""Two compositions of ``test_compose_schedules.py`` where a server the schedulers publish to
restarts, down for 2.5 s -- far less than the schedule's default ``grace`` (60 s) -- and no slot
may be lost: a publish that fails with a transient error gives the slot back, and a later pass
fires it again (the same message id, which the consumer's inbox deduplicates).

* The queue alone on a disposable Redis (AOF, ``appendfsync always``), the scheduler's records
  and the tenant locks in PostgreSQL: the schedulers keep claiming slots during the outage,
  and every slot due meanwhile fails its publish at first.
* Everything but the ledger on a disposable PostgreSQL that crashes (``pg_ctl stop -m
  immediate``) and starts again: seconds after it is back the queue publishes on idle pooled
  connections that the crash closed ("server closed the connection unexpectedly"), once per
  stale connection.

Before transient failures gave the slot back, each such slot was recorded ``failed`` and never
published again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance.specs import SPECS
from tests.reliability._pg_server import PostgresServer
from tests.reliability.test_compose_schedules import (
    DurableRedis,
    Ledger,
    Setup,
    _hold_one,
    _key,
    _records,
    _release,
    _second,
    _stop,
    _wait_for,
    _worker,
    app_env,
    new_ledger,
)
from tests.servers import POSTGRES_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

CLEANUP = next(s for s in SPECS if s.id == "postgres").cleanup


@pytest.fixture
def redis_queue() -> Iterator[tuple[Setup, Callable[[], None]]]:
    """Records and locks in the machine's PostgreSQL, the queue on a disposable Redis; and the
    outage: kill the Redis, 2.5 s later start it again on its files."""
    namespace = new_ledger()
    server = DurableRedis()
    try:
        server.start()

        def outage() -> None:
            server.kill()
            time.sleep(2.5)  # the downtime itself: slots come due meanwhile
            server.start()

        yield (
            Setup("redis-queue", POSTGRES_URL, server.url, namespace + "q", namespace, None),
            outage,
        )
    finally:
        server.stop()
        CLEANUP(POSTGRES_URL, namespace)


@pytest.fixture
def postgres_all() -> Iterator[tuple[Setup, Callable[[], None]]]:
    """Records, locks and queue on a disposable PostgreSQL; and the outage: crash it, 2.5 s
    later start it again on its data."""
    namespace = new_ledger()
    with PostgresServer() as pg:
        try:

            def outage() -> None:
                pg.crash()
                time.sleep(2.5)  # the downtime itself
                pg.start_again()

            yield Setup("postgres-all", pg.url, pg.url, namespace + "q", namespace, None), outage
        finally:
            CLEANUP(POSTGRES_URL, namespace)


def _lost_slots(setup: Setup, outage: Callable[[], None], tmp_path: Path) -> dict[str, object]:
    """Two workers; the outage while a handler works; 15 slots applied: the slots of the
    window with no effect, with their records (outcome, error)."""
    hold_dir, logs = tmp_path / "hold", tmp_path / "logs"
    hold_dir.mkdir()
    logs.mkdir()
    env = app_env(setup, hold_dir)
    ledger = Ledger(setup.namespace)
    workers = [_worker(setup, env, logs), _worker(setup, env, logs)]
    try:
        _wait_for(lambda: len(ledger.applied()) >= 3, 30, "the first effects")
        first = min(_second(f.key) for f in _records(setup))
        _hold_one(ledger, hold_dir, [p.pid for p in workers], "before")
        outage()
        _release(hold_dir)
        _wait_for(lambda: len(ledger.applied()) >= 15, 40, "15 slots applied")
        window = {_key(at) for at in range(first, math.floor(time.time()))}
        try:
            _wait_for(lambda: window <= ledger.applied(), 15, "every slot of the window applied")
        except AssertionError:
            pass  # the caller's assertion says which slots and why
        records = {f.key: f for f in _records(setup)}
    finally:
        _stop(workers, logs)
        applied = ledger.applied()
        ledger.close()
    return {
        k: (records[k].outcome, records[k].error) if k in records else None
        for k in sorted(window - applied)
    }


def test_a_queue_outage_shorter_than_grace_loses_no_slot(
    redis_queue: tuple[Setup, Callable[[], None]], tmp_path: Path
) -> None:
    lost = _lost_slots(*redis_queue, tmp_path)
    assert lost == {}, f"slots never applied, with their records: {lost}"


def test_a_postgres_crash_restart_loses_no_slot(
    postgres_all: tuple[Setup, Callable[[], None]], tmp_path: Path
) -> None:
    lost = _lost_slots(*postgres_all, tmp_path)
    assert lost == {}, f"slots never applied, with their records: {lost}"
