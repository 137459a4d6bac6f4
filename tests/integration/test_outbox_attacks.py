"""Attacks on the outbox and its relay: the relay's own database link stalled or reset, a
relay frozen inside its claim, hostile input to ``add``, per-key order under failures, and
the life cycle of the objects (fork, close twice, stop before run).

Real servers only (PostgreSQL, MariaDB, SQLite); network faults come from the loopback
``FaultProxy`` between the relay and its outbox database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence.backends.base import OutboxRow
from jobfence.testing import hooked
from tests.integration._outbox_env import OutboxSide
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL

pytestmark = pytest.mark.timeout(120)

FLAVOURS = ("sync", "async")
PG_PORT = urlsplit(POSTGRES_URL).port or 5432


@contextlib.contextmanager
def outbox_of(kind: str, tmp_path: Path) -> Iterator[OutboxSide]:
    side = OutboxSide(kind, tmp_path)
    try:
        yield side
    finally:
        side.drop()


def wait_until(check: Any, timeout: float, what: str) -> None:
    """Poll ``check`` every 10 ms (a relay's counters have no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


class Sink:
    """A send(rows) target that records the ids it was given; waits for ids to arrive."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, rows: list[OutboxRow]) -> None:
        with self.cond:
            self.ids.extend(r.id for r in rows)
            self.cond.notify_all()

    def wait_for(self, ids: list[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: set(ids) <= set(self.ids), timeout)


class RelayThread:
    """``run()`` of a relay (blocking, or asyncio on a loop of its own) on an outbox at
    ``url`` in a thread; :meth:`stop` stops and joins it."""

    def __init__(self, flavour: str, url: str, table: str, to: Any, **options: Any) -> None:
        self.flavour = flavour
        self.error: BaseException | None = None
        self.relay: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(url, table, to, options), daemon=True
        )
        self.thread.start()
        assert self.ready.wait(30), "the relay did not start"

    def _main(self, url: str, table: str, to: Any, options: dict[str, Any]) -> None:
        opts = {"timeout": 1.0, "connect_timeout": 1.0}
        try:
            if self.flavour == "sync":
                with jobfence.Outbox(url, table=table, **opts) as outbox:
                    self.relay = jobfence.Relay(outbox, to, **options)
                    self.ready.set()
                    self.relay.run()
            else:

                async def main() -> None:
                    async with jobfence.AsyncOutbox(url, table=table, **opts) as outbox:
                        self.relay = jobfence.AsyncRelay(outbox, to, **options)
                        self.ready.set()
                        await self.relay.run()

                asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the relay did not stop"
        if self.error is not None:
            raise self.error


def wrap_wait(backend: Any, waiting: threading.Event) -> None:
    """Set ``waiting`` when the relay next waits for rows on ``backend`` after an empty
    claim (the relay's own first waits are slices of at most 0.5 s)."""
    real_wait = backend.wait
    if asyncio.iscoroutinefunction(real_wait):

        async def wait_async(timeout: float) -> bool:
            waiting.set()
            return bool(await real_wait(timeout))

        backend.wait = wait_async
    else:

        def wait(timeout: float) -> bool:
            waiting.set()
            return bool(real_wait(timeout))

        backend.wait = wait


# -- the relay's own database link ---------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_claim_on_a_stalled_link_times_out_and_the_relay_recovers(
    flavour: str, tmp_path: Path
) -> None:
    """The link between the relay and PostgreSQL hangs (no reset: bytes are held) just as a
    claim starts. Every statement of the claim -- its BEGIN and COMMIT too -- is bounded by
    the ``timeout`` option: the claim fails within it and the relay claims again (backing
    off) instead of hanging for as long as the link does; once the link is back, the rows
    are published, none failed or dead."""
    sink = Sink()
    claims: list[int] = []
    claimed_again = threading.Event()
    with outbox_of("postgres", tmp_path) as side, FaultProxy(PG_PORT) as proxy:
        armed = threading.Event()

        def hook(point: str, **info: Any) -> None:
            if point != "outbox.claim" or not armed.is_set():
                return
            claims.append(1)
            if len(claims) == 1:
                proxy.stall()  # the link hangs from this claim on
            elif len(claims) >= 3:
                claimed_again.set()

        with hooked(hook):
            runner = RelayThread(
                flavour, proxy.url_for(side.url, PG_PORT), side.table, sink, poll=0.2
            )
            try:
                with side.open() as outbox:
                    first = side.add(outbox, [{"queue": "q", "body": 1}])
                    assert sink.wait_for(first, 20), "the relay does not publish"
                    armed.set()
                    ids = side.add(outbox, [{"queue": "q", "body": i} for i in range(3)])
                    stalled = claimed_again.wait(30)
                    proxy.resume()
                    assert stalled, "a claim on a stalled link hung past its timeout"
                    assert sink.wait_for(ids, 30), "the rows were not published after the stall"
                    stats = outbox.stats()
                    assert stats.dead == 0
            finally:
                proxy.resume()
                runner.stop()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_relay_whose_listen_connection_was_lost_hears_rows_committed_meanwhile(
    flavour: str, tmp_path: Path
) -> None:
    """The relay's connections to PostgreSQL are reset and refused for a moment (a server
    restart, a failover): its LISTEN connection is lost and cannot be opened again at once
    (it is tried again a few seconds later). A row committed while nobody listens is not
    announced to anyone: when the LISTEN connection comes back, the relay must look at the
    table again, not wait for the next notification (poll=30: the safety net is 150 s)."""
    sink = Sink()
    listen_failed = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "LISTEN connection failed" in record.getMessage():
                listen_failed.set()

    seen = Seen()
    logger = logging.getLogger("jobfence.backends.postgres")
    logger.addHandler(seen)
    try:
        with outbox_of("postgres", tmp_path) as side, FaultProxy(PG_PORT) as proxy:
            runner = RelayThread(
                flavour, proxy.url_for(side.url, PG_PORT), side.table, sink, poll=30.0
            )
            try:
                with side.open() as outbox:
                    first = side.add(outbox, [{"queue": "q", "body": 0}])
                    assert sink.wait_for(first, 20), "the relay does not publish"
                    while outbox.stats().published < 1:  # settled: nothing in flight
                        threading.Event().wait(0.05)
                    proxy.refuse(True)
                    proxy.reset()  # the LISTEN connection and the pooled ones are lost
                    assert listen_failed.wait(20), "the relay did not try to LISTEN again"
                    waiting = threading.Event()
                    wrap_wait(runner.relay.backend, waiting)
                    proxy.refuse(False)
                    assert waiting.wait(20), "the relay did not claim again"
                    # committed while the LISTEN connection is still down (tried again
                    # seconds later): announced to nobody
                    meanwhile = side.add(outbox, [{"queue": "q", "body": 1}])
                    assert sink.wait_for(meanwhile, 20), (
                        "a row committed while the LISTEN connection was down waits for the "
                        "poll interval"
                    )
                    assert outbox.stats().dead == 0
            finally:
                runner.stop()
    finally:
        logger.removeHandler(seen)


# -- a relay frozen inside its claim ---------------------------------------------------------
FROZEN_CLAIMER = r"""
import os, signal, sys
import jobfence

outbox = jobfence.Outbox(sys.argv[1], table=sys.argv[2], timeout=2)
backend = outbox.backend
real_on = backend._on


def on(cur, sql, params=None, *args):
    result = real_on(cur, sql, params, *args)
    if sql == backend._sql["claim_lock"]:
        print("locked", result[0][0][0], flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen here, holding the claim lock
    return result


backend._on = on
backend.claim("frozen-relay", 10, 30.0)
"""


def test_a_mysql_relay_frozen_inside_its_claim_does_not_stop_the_others(tmp_path: Path) -> None:
    """A relay process stops (SIGSTOP: a paused VM, a stuck host) right after it took the
    table's claim lock (GET_LOCK, held by its session while the process is frozen but its
    connection alive). The other relays' claims time out against the lock only until the
    server closes the frozen session (its wait_timeout is the request timeout while it
    claims): then they publish what is committed, without waiting for the frozen process."""
    import os
    import signal
    import subprocess
    import sys

    with outbox_of("mysql", tmp_path) as side:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(jobfence.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
        )
        frozen = subprocess.Popen(
            [sys.executable, "-c", FROZEN_CLAIMER, side.url, side.table],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert frozen.stdout is not None
            assert frozen.stdout.readline().split() == ["locked", "1"]
            with side.open() as outbox:
                ids = side.add(outbox, [{"queue": "q", "body": i} for i in range(3)])
            sink = Sink()
            with (
                jobfence.Outbox(side.url, table=side.table, timeout=2) as outbox,
                jobfence.Relay(outbox, sink) as relay,
            ):
                deadline = threading.Event()
                timer = threading.Timer(30.0, deadline.set)
                timer.start()
                errors: list[str] = []
                try:
                    while not sink.wait_for(ids, 0) and not deadline.is_set():
                        try:
                            relay.run_once()
                        except jobfence.JobfenceError as exc:
                            errors.append(type(exc).__name__)
                            deadline.wait(0.2)
                finally:
                    timer.cancel()
                assert sink.wait_for(ids, 0), (
                    f"the frozen relay's claim lock stopped the other relay ({errors[-3:]})"
                )
                assert errors, "the other relay never met the frozen relay's lock"
            assert frozen.poll() is None, "the frozen relay is still there, only stopped"
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
            frozen.wait(10)


# -- connections in autocommit mode ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_add_on_an_autocommit_connection_commits_the_row_on_its_own(
    kind: str, tmp_path: Path
) -> None:
    """``add`` never begins a transaction: on a connection in autocommit mode (sqlite3
    ``isolation_level=None``, psycopg ``autocommit=True``) with no transaction open, its
    statement commits at once, by itself -- a relay may publish it before the caller's
    other writes, and a later rollback does not take it back (documented)."""
    import sqlite3

    import psycopg

    with outbox_of(kind, tmp_path) as side, side.open() as outbox:
        conn: Any = (
            psycopg.connect(POSTGRES_URL, autocommit=True)
            if kind == "postgres"
            else sqlite3.connect(side.path, isolation_level=None)
        )
        try:
            msg = outbox.add(conn, queue="q", body={"n": 1})
            conn.rollback()
        finally:
            conn.close()
        assert [e.id for e in outbox.entries(state="pending")] == [msg]


# -- per-key order and dead rows ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["postgres", "mysql", "sqlite"])
def test_retry_dead_of_a_row_whose_later_key_rows_were_published(kind: str, tmp_path: Path) -> None:
    """A dead row no longer holds its key back: the key's later rows go out. Revived by
    ``retry_dead``, it is published after them (out of the key's order, documented), and a
    row of the key added after the revival waits for it (it is the earlier row again)."""
    sent: list[str] = []
    failing = {"k-1"}

    def send(rows: list[OutboxRow]) -> None:
        for row in rows:
            if row.id in failing:
                raise ValueError(f"rejected {row.id}")
            sent.append(row.id)

    with outbox_of(kind, tmp_path) as side, side.open() as outbox:
        side.add(outbox, [{"queue": "q", "body": i, "id": f"k-{i}", "key": "K"} for i in (1, 2, 3)])
        with jobfence.Relay(outbox, send, max_attempts=1) as relay:
            relay.run_once()
            relay.run_once()
            assert sent == ["k-2", "k-3"]  # k-1 is dead, its key went on
            assert [e.id for e in outbox.entries(state="dead")] == ["k-1"]
            failing.clear()
            assert outbox.retry_dead(["k-1"]) == 1
            side.add(outbox, [{"queue": "q", "body": 4, "id": "k-4", "key": "K"}])
            relay.run_once()
            relay.run_once()
        assert sent == ["k-2", "k-3", "k-1", "k-4"]


# -- SQLite: the application's long write transactions --------------------------------------
def test_sqlite_a_relay_locked_out_by_a_long_transaction_backs_off_and_fails_no_row(
    tmp_path: Path,
) -> None:
    """The application holds SQLite's write lock (a long transaction adding orders) while
    the relay claims: each claim waits at most ``busy_timeout``, fails as an unreachable
    outbox (backing off, not in a loop), and no row is marked failed or dead for a lock the
    relay could not get; once the transaction commits, its rows are published."""
    import sqlite3

    sink = Sink()
    claims = threading.Semaphore(0)

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.claim":
            claims.release()

    with outbox_of("sqlite", tmp_path) as side, hooked(hook):
        app = sqlite3.connect(side.path, timeout=30, isolation_level=None)
        try:
            with side.open() as outbox:
                app.execute("BEGIN IMMEDIATE")
                ids = [outbox.add(app, queue="q", body=i) for i in range(3)]
                with (
                    jobfence.Outbox(side.url, table=side.table, busy_timeout=0.2) as own,
                    jobfence.Relay(own, sink, poll=0.05) as relay,
                ):
                    thread = threading.Thread(target=relay.run, daemon=True)
                    thread.start()
                    try:
                        for _ in range(4):  # it claims again and again: each claim ends
                            assert claims.acquire(timeout=20), "a claim never ended"
                        assert relay.stats.last_error is not None
                        assert "locked" in relay.stats.last_error
                        app.execute("COMMIT")
                        assert sink.wait_for(ids, 20)
                    finally:
                        relay.stop()
                        thread.join(30)
                    assert relay.stats.failed == 0 and relay.stats.dead == 0
                stats = outbox.stats()
                assert stats.dead == 0 and stats.published == 3
        finally:
            app.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_relay_rides_out_a_postgres_restart(flavour: str) -> None:
    """PostgreSQL (a disposable server) goes down under a running relay and comes back: the
    relay backs off while it is down (a few claims, not a loop), loses and dead-letters
    nothing, holds nothing, and publishes the rows committed after the restart without
    waiting for its poll safety net (poll=30: 150 s)."""
    import psycopg

    from tests.reliability._pg_server import PostgresServer

    sink = Sink()
    failed_claims = threading.Semaphore(0)
    down = threading.Event()
    claims_while_down: list[int] = []

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.claim" and down.is_set():
            claims_while_down.append(1)
            failed_claims.release()

    def add(url: str, outbox: jobfence.Outbox, n: int) -> list[str]:
        with psycopg.connect(url) as conn, conn.transaction():
            return outbox.add_many(conn, queue="q", bodies=list(range(n)))

    with PostgresServer() as pg, hooked(hook):
        with jobfence.Outbox(pg.url, table="jfo_restart") as outbox:
            outbox.install()
            runner = RelayThread(flavour, pg.url, "jfo_restart", sink, poll=30.0)
            try:
                before = add(pg.url, outbox, 3)
                assert sink.wait_for(before, 20)
                # sent is not yet marked published: crash only once they are (a crash in
                # between leaves them held until their lease, to be sent again)
                wait_until(lambda: runner.relay.stats.published >= 3, 20, "the first rows settled")
                down.set()
                pg.crash()
                for _ in range(3):
                    assert failed_claims.acquire(timeout=30), "the relay stopped claiming"
                pg.start_again()
                down.clear()
                after = add(pg.url, outbox, 3)
                assert sink.wait_for(after, 30), "rows committed after the restart wait"
                later = add(pg.url, outbox, 3)
                assert sink.wait_for(later, 30), "rows committed after the restart wait"
            finally:
                runner.stop()
        with jobfence.Outbox(pg.url, table="jfo_restart") as fresh:  # pooled ones are stale
            stats = fresh.stats()
        assert stats.dead == 0 and stats.pending == 0 and stats.claimed == 0
        assert stats.published == 9
        assert len(claims_while_down) < 30  # backed off


def test_settling_after_a_postgres_restart_uses_a_new_connection() -> None:
    """A relay claimed rows (its pool keeps the connection), then PostgreSQL restarts while
    the rows are sent: marking them published must not fail on the pooled connection the
    server closed (the rows would be held until their lease and sent again)."""
    import psycopg

    from tests.reliability._pg_server import PostgresServer

    with PostgresServer() as pg, jobfence.Outbox(pg.url, table="jfo_settle") as outbox:
        outbox.install()
        with psycopg.connect(pg.url) as conn, conn.transaction():
            outbox.add_many(conn, queue="q", bodies=[1, 2, 3])
        backend = outbox.backend
        rows = backend.claim("relay-a", 10, 30.0)
        assert len(rows) == 3
        pg.restart()
        assert backend.published("relay-a", [r.seq for r in rows], 600.0) == 3
        assert outbox.stats().published == 3


# -- hostile input to add ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["postgres", "mysql", "sqlite"])
def test_hostile_rows_round_trip_and_bad_ones_are_refused_before_any_write(
    kind: str, tmp_path: Path
) -> None:
    """What ``add`` accepts reaches the relay unchanged (a 10 MB body, NUL and lone
    surrogates in header names and values, 1024-byte ids and keys of 4-byte characters);
    what it cannot store (non-str header values, bodies JSON cannot encode, NUL or lone
    surrogates in an id, key or queue, 1025-byte ids) is refused with ConfigurationError
    naming the argument, before anything is written."""
    rows: list[OutboxRow] = []
    big = "x" * 10_000_000
    with outbox_of(kind, tmp_path) as side, side.open() as outbox:
        conn = side.connect()
        try:
            bad: list[tuple[str, dict[str, Any]]] = [
                ("headers", {"headers": {"a": 1}}),
                ("headers", {"headers": {"a": b"x"}}),
                ("body", {"body": {1, 2}}),
                ("body", {"body": float("nan")}),
                ("body", {"body": "\ud800"}),
                ("id", {"id": "a\0b"}),
                ("id", {"id": "\udc80"}),
                ("id", {"id": "x" * 1025}),
                ("key", {"key": "k\0"}),
                ("key", {"key": "\ud800"}),
                ("queue", {"queue": "q\0"}),
            ]
            for argument, kw in bad:
                with pytest.raises(jobfence.ConfigurationError) as err:
                    outbox.add(conn, **{"queue": "q", "body": 1, **kw})
                assert err.value.argument == argument
            ids = [
                outbox.add(conn, queue="q", body=big),
                outbox.add(conn, queue="q", body=1, headers={"a\0": "x\0y", "s": "\ud800"}),
                outbox.add(conn, queue="q", body=2, id="\U0001f600" * 256, key="\U0001f600" * 256),
            ]
            conn.commit()
        finally:
            conn.close()
        with jobfence.Relay(outbox, rows.extend) as relay:
            assert relay.run_once() == 3
    assert [r.id for r in rows] == ids
    assert rows[0].value() == big
    assert rows[1].headers == {"a\0": "x\0y", "s": "\ud800"}
    assert rows[2].key == "\U0001f600" * 256


def test_add_in_an_aborted_postgres_transaction_raises_a_jobfence_error(tmp_path: Path) -> None:
    """An ``add`` on a connection whose transaction already failed raises BackendError
    (naming the operation, the driver's error kept) and writes nothing."""
    import psycopg

    with outbox_of("postgres", tmp_path) as side, side.open() as outbox:
        with psycopg.connect(POSTGRES_URL) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
            with pytest.raises(jobfence.BackendError) as err:
                outbox.add(conn, queue="q", body=1)
            assert err.value.operation == "outbox.add"
            assert isinstance(err.value.__cause__, psycopg.errors.InFailedSqlTransaction)
            conn.rollback()
        assert outbox.stats().pending == 0


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
def test_settling_after_the_link_was_reset_uses_a_new_connection(kind: str, tmp_path: Path) -> None:
    """The relay's connections are reset (a failover, a proxy restart) after it claimed rows:
    marking them published must not fail on the pooled connection that is gone (the rows
    would be held until their lease and sent again)."""
    with outbox_of(kind, tmp_path) as side:
        with side.open() as outbox:
            side.add(outbox, [{"queue": "q", "body": i} for i in range(3)])
        port = urlsplit(side.url).port or (5432 if kind == "postgres" else 3306)
        with (
            FaultProxy(port) as proxy,
            jobfence.Outbox(proxy.url_for(side.url, port), table=side.table, timeout=2) as ob,
        ):
            rows = ob.backend.claim("relay-a", 10, 30.0)
            assert len(rows) == 3
            proxy.reset()
            assert ob.backend.published("relay-a", [r.seq for r in rows], 600.0) == 3
            assert ob.stats().published == 3
