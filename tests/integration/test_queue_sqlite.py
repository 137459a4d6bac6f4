"""The SQLite queue backend (``sqlite:///path``) against real files, threads and processes.

Every test runs on both flavours: ``AsyncSQLiteQueueBackend`` on the event loop, and
``SQLiteQueueBackend`` with each call in a thread (as a sync worker's threads call it).
Deliveries whose visibility must pass are mostly expired by hand (their ``visible_at`` moved
into the past in the file), so that the tests need not sleep; a few tests let real time pass
to check the SQL clock arithmetic.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jobfence._core.url import parse_url
from jobfence.backends import open_queue_backend
from jobfence.backends.base import DeadLetter, QueuedMessage, QueueStats
from jobfence.backends.sqlite.common import WAITERS
from jobfence.backends.sqlite.queue import SQLiteQueueBackend
from jobfence.backends.sqlite.queue_async import AsyncSQLiteQueueBackend
from jobfence.errors import ConfigurationError
from jobfence.testing import Clock, clocked

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = ("sync", "async")
TABLE = "jobfence_queue"
#: tolerance of lower bounds on elapsed time (SQLite's clock has millisecond resolution)
EPS = 0.02

A = "host:1:consumer-a"
B = "host:2:consumer-b"


class Q:
    """A queue backend of either flavour behind awaitable methods: the async one is awaited,
    each call of the sync one runs in a thread of its own."""

    def __init__(self, backend: Any, db: Path) -> None:
        self.backend = backend
        self.db = db

    @property
    def name(self) -> str:
        return str(self.backend.name)

    def __getattr__(self, verb: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.backend, verb)

        async def call(*args: Any) -> Any:
            if inspect.iscoroutinefunction(method):
                return await method(*args)
            return await asyncio.to_thread(method, *args)

        return call


Factory = Callable[..., Q]


def _url(db: Path) -> str:
    return f"sqlite:///{db}"


def _new_name() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture(params=FLAVOURS)
async def make(request: pytest.FixtureRequest, db: Path) -> AsyncIterator[Factory]:
    """``make(name=None, flavour=None, **options)``: a queue client on ``db``, of the test's
    flavour unless ``flavour`` says otherwise; each is dropped and closed at the end."""
    made: list[Q] = []

    def factory(name: str | None = None, flavour: str | None = None, **options: Any) -> Q:
        asynchronous = (flavour or request.param) == "async"
        backend = open_queue_backend(
            _url(db), name or _new_name(), asynchronous=asynchronous, **options
        )
        client = Q(backend, db)
        made.append(client)
        return client

    yield factory
    for client in made:
        if not client.backend._closed:
            await client.drop()
        await client.close()


@pytest.fixture
def q(make: Factory) -> Q:
    return make()


def _sql(db: Path, statement: str, *params: Any) -> list[Any]:
    """Run one statement on the file through a connection of its own."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def expire(q: Q) -> None:
    """Move the visibility of every in-flight delivery of ``q`` into the past, as if it had
    run out (no sleeping)."""
    _sql(
        q.db,
        f"UPDATE {TABLE} SET visible_at = visible_at - 3600 "
        "WHERE queue = ? AND receipt IS NOT NULL",
        q.name,
    )


async def _publish(q: Q, *ids: str, delay: float = 0.0) -> None:
    await q.publish([(i, f"body of {i}".encode(), {"id": i}) for i in ids], delay)


async def _receive_all(q: Q, consumer: str = A, *, batch: int = 10) -> list[QueuedMessage]:
    """Receive (without waiting) until nothing is deliverable."""
    out: list[QueuedMessage] = []
    while True:
        got = await q.receive(consumer, batch, 30.0, 0)
        if not got:
            return out
        out.extend(got)


# -- publish, receive, ack -------------------------------------------------------------------
async def test_publish_receive_ack(q: Q) -> None:
    before = time.time()
    await q.publish(
        [
            ("order:1", b"\x00\xffbinary", {"trace": "t-1", "kind": "\u00e9v\u00e9nement"}),
            ("order:2", b"", {}),
        ]
    )
    assert await q.stats() == QueueStats(ready=2, delayed=0, in_flight=0, dead=0)
    got = await q.receive(A, 10, 30.0, 0)
    assert [(m.id, m.body, m.headers, m.delivery, m.last_error) for m in got] == [
        ("order:1", b"\x00\xffbinary", {"trace": "t-1", "kind": "\u00e9v\u00e9nement"}, 1, None),
        ("order:2", b"", {}, 1, None),
    ]
    for m in got:
        assert m.published_at is not None and before - 1 <= m.published_at <= time.time() + 1
    assert len({m.receipt for m in got}) == 2
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=2, dead=0)
    assert await q.receive(B, 10, 30.0, 0) == []  # hidden while in flight

    assert await q.ack(got[0].receipt, B) is False  # not B's delivery
    assert await q.ack(got[0].receipt, A) is True
    assert await q.ack(got[0].receipt, A) is False  # gone already
    assert await q.ack("not a receipt", A) is False
    assert await q.ack("999999.abc", A) is False
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=0)
    assert await q.ack(got[1].receipt, A) is True
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
    assert await q.receive(A, 10, 30.0, 0) == []


async def test_fifo_for_one_consumer(q: Q) -> None:
    ids = [f"m{i}" for i in range(60)]
    for start in range(0, 60, 7):  # batches of several sizes
        await _publish(q, *ids[start : start + 7])
    seen = []
    while len(seen) < len(ids):
        got = await q.receive(A, 4, 30.0, 0)
        assert got
        seen.extend(m.id for m in got)
        for m in got:
            assert await q.ack(m.receipt, A)
    assert seen == ids


async def test_max_messages_and_duplicate_ids(q: Q) -> None:
    await _publish(q, "same", "same", "other", "same")
    first = await q.receive(A, 2, 30.0, 0)
    assert [m.id for m in first] == ["same", "same"]
    rest = await q.receive(A, 10, 30.0, 0)
    assert [m.id for m in rest] == ["other", "same"]
    receipts = {m.receipt for m in first + rest}
    assert len(receipts) == 4  # one delivery each: the same id is no deduplication
    for m in first + rest:
        assert await q.ack(m.receipt, A)


# -- visibility and renewal ------------------------------------------------------------------
async def test_redelivery_after_visibility_refuses_the_old_receipt(q: Q) -> None:
    await _publish(q, "job")
    [old] = await q.receive(A, 1, 30.0, 0)
    assert await q.receive(B, 1, 30.0, 0) == []
    expire(q)
    assert await q.stats() == QueueStats(ready=1, delayed=0, in_flight=0, dead=0)
    [new] = await q.receive(B, 1, 30.0, 0)
    assert (new.id, new.delivery) == ("job", 2)
    assert new.receipt != old.receipt
    # A's delivery is over: none of its verbs touches B's delivery
    assert await q.ack(old.receipt, A) is False
    assert await q.nack(old.receipt, A, 0.0, "late") is False
    assert await q.renew([(old.receipt, A, 30.0)]) == [False]
    assert await q.dead_letter(old.receipt, A, "late") is False
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=0)
    assert await q.receive(A, 1, 30.0, 0) == []
    # even B's consumer id with A's receipt: the receipt names the delivery
    assert await q.ack(old.receipt, B) is False
    assert await q.ack(new.receipt, B) is True
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)


async def test_visibility_runs_out_in_real_time(q: Q) -> None:
    """The SQL clock arithmetic: a delivery reappears after its visibility, not before, and
    a waiting receive takes it as soon as it does (it never sleeps past the due time)."""
    await _publish(q, "slow")
    started = time.monotonic()
    [first] = await q.receive(A, 1, 0.3, 0)
    [again] = await q.receive(B, 1, 30.0, 10.0)
    assert time.monotonic() - started >= 0.3 - EPS
    assert (again.id, again.delivery) == ("slow", 2)
    assert await q.ack(first.receipt, A) is False
    assert await q.ack(again.receipt, B) is True


async def test_ack_after_the_visibility_passed_while_nobody_took_it(q: Q) -> None:
    """The delivery is still the consumer's until someone else receives the message."""
    await _publish(q, "a", "b")
    [a, b] = await q.receive(A, 2, 30.0, 0)
    expire(q)
    assert await q.ack(a.receipt, A) is True
    assert await q.nack(b.receipt, A, 0.0, "again") is True
    [b2] = await q.receive(A, 1, 30.0, 0)
    assert (b2.id, b2.delivery, b2.last_error) == ("b", 2, "again")
    assert await q.ack(b2.receipt, A)


async def test_renew_keeps_a_delivery_and_a_late_renew_fails(q: Q) -> None:
    await _publish(q, "r1", "r2", "r3")
    started = time.monotonic()
    r1, r2, _r3 = await q.receive(A, 3, 0.5, 0)
    assert await q.renew([(r1.receipt, A, 30.0), (r2.receipt, A, 30.0)]) == [True, True]
    # r3 was not renewed: it comes back after its 0.5 s; r1 and r2 stay hidden
    [back] = await q.receive(B, 10, 30.0, 10.0)
    assert time.monotonic() - started >= 0.5 - EPS
    assert (back.id, back.delivery) == ("r3", 2)
    assert await q.receive(B, 10, 30.0, 0) == []
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=3, dead=0)
    # a late renewal fails even though nobody took the message: it may be taken any moment
    expire(q)
    assert await q.renew([(r1.receipt, A, 30.0)]) == [False]
    assert await q.stats() == QueueStats(ready=3, delayed=0, in_flight=0, dead=0)
    # ... and the delivery stays over: it is delivered again, not kept
    got = await q.receive(B, 10, 30.0, 0)
    assert sorted((m.id, m.delivery) for m in got) == [("r1", 2), ("r2", 2), ("r3", 3)]


async def test_renew_many_mixed_items(q: Q) -> None:
    await _publish(q, "x", "y", "z")
    x, y = await q.receive(A, 2, 30.0, 0)
    [z] = await q.receive(B, 1, 30.0, 0)
    items = [
        (x.receipt, A, 10.0),
        (z.receipt, A, 10.0),  # B's delivery
        ("garbage", A, 10.0),
        (y.receipt, A, 20.0),
        (z.receipt, B, 10.0),
        (x.receipt, A, 10.0),  # twice
        (x.receipt.split(".")[0] + ".0000", A, 10.0),  # the right row, a wrong token
    ]
    assert await q.renew(items) == [True, False, False, True, True, True, False]
    assert await q.renew([]) == []
    left = _sql(
        q.db,
        f"SELECT id, visible_at - (julianday('now') - 2440587.5) * 86400.0 FROM {TABLE} "
        "WHERE queue = ? ORDER BY seq",
        q.name,
    )
    assert [row[0] for row in left] == ["x", "y", "z"]
    assert 5 < left[0][1] <= 10.5 and 15 < left[1][1] <= 20.5 and 5 < left[2][1] <= 10.5


def test_renew_and_an_idle_receive_are_one_statement_each(db: Path) -> None:
    """renew of many deliveries is ONE statement; a receive that finds nothing deliverable
    is one read (no write lock); one that delivers is the read and ONE UPDATE."""
    q = SQLiteQueueBackend(parse_url(_url(db)), name=_new_name())
    try:
        q.publish([(f"m{i}", b"", {}) for i in range(5)])
        got = q.receive(A, 5, 30.0, 0)
        statements: list[str] = []
        assert q._conn is not None
        q._conn.set_trace_callback(statements.append)
        assert q.renew([(m.receipt, A, 30.0) for m in got]) == [True] * 5
        assert len(statements) == 1 and statements[0].lstrip().startswith("UPDATE")
        statements.clear()
        assert q.receive(A, 5, 30.0, 0) == []
        assert len(statements) == 1 and statements[0].lstrip().startswith("SELECT")
        statements.clear()
        q.publish([("n", b"", {})])
        statements.clear()
        assert len(q.receive(A, 5, 30.0, 0)) == 1
        assert [s.lstrip().split()[0] for s in statements] == ["SELECT", "UPDATE"]
        q._conn.set_trace_callback(None)
    finally:
        q.drop()
        q.close()


def test_a_batch_is_one_transaction_in_publish_order(db: Path) -> None:
    """``publish`` of 100 messages is ONE write transaction (BEGIN IMMEDIATE, the inserts,
    COMMIT), and they are delivered in publish order."""
    q = SQLiteQueueBackend(parse_url(_url(db)), name=_new_name())
    try:
        q.publish([("warm", b"", {})])  # the table exists: no CREATE in the count
        assert [m.id for m in q.receive(A, 1, 30.0, 0)] == ["warm"]
        statements: list[str] = []
        assert q._conn is not None
        q._conn.set_trace_callback(statements.append)
        batch = [(f"m{i}", f"b{i}".encode(), {"n": str(i)}) for i in range(100)]
        q.publish(batch)
        q._conn.set_trace_callback(None)
        words = [s.lstrip().split()[0].upper() for s in statements]
        assert words.count("BEGIN") == 1 and words.count("COMMIT") == 1, words
        assert words[0] == "BEGIN" and words[-1] == "COMMIT", words
        got = q.receive(A, 100, 30.0, 0)
        assert [(m.id, m.body, m.headers) for m in got] == batch
    finally:
        q.drop()
        q.close()


# -- nack, delays ------------------------------------------------------------------------------
async def test_nack_without_delay(q: Q) -> None:
    await _publish(q, "n")
    [m] = await q.receive(A, 1, 30.0, 0)
    assert await q.nack(m.receipt, B, 0.0, "not yours") is False
    assert await q.nack(m.receipt, A, 0.0, "boom") is True
    assert await q.nack(m.receipt, A, 0.0, "twice") is False  # the delivery is over
    [m2] = await q.receive(B, 1, 30.0, 0)
    assert (m2.id, m2.delivery, m2.last_error) == ("n", 2, "boom")
    assert await q.nack(m2.receipt, B, 0.0, None) is True
    [m3] = await q.receive(A, 1, 30.0, 0)
    assert (m3.delivery, m3.last_error) == (3, None)
    assert await q.ack(m3.receipt, A)


async def test_nack_with_delay(q: Q) -> None:
    await _publish(q, "later", "now")
    later, now = await q.receive(A, 2, 30.0, 0)
    started = time.monotonic()
    assert await q.nack(later.receipt, A, 0.3, "retry me")
    assert await q.stats() == QueueStats(ready=0, delayed=1, in_flight=1, dead=0)
    assert await q.receive(B, 1, 30.0, 0) == []
    [again] = await q.receive(B, 1, 30.0, 10.0)
    assert time.monotonic() - started >= 0.3 - EPS
    assert (again.id, again.delivery, again.last_error) == ("later", 2, "retry me")
    assert await q.ack(again.receipt, B) and await q.ack(now.receipt, A)


async def test_publish_with_delay(q: Q) -> None:
    started = time.monotonic()
    await _publish(q, "delayed", delay=0.3)
    await _publish(q, "at once")
    assert await q.stats() == QueueStats(ready=1, delayed=1, in_flight=0, dead=0)
    [first] = await q.receive(A, 10, 30.0, 0)
    assert first.id == "at once"
    assert await q.receive(A, 10, 30.0, 0) == []
    [second] = await q.receive(A, 10, 30.0, 10.0)
    assert time.monotonic() - started >= 0.3 - EPS
    assert (second.id, second.delivery) == ("delayed", 1)


# -- dead letters ------------------------------------------------------------------------------
async def test_dead_letters_and_requeue(q: Q) -> None:
    await _publish(q, "d1", "d2", "d3", "ok")
    d1, d2, d3, ok = await q.receive(A, 4, 30.0, 0)
    assert await q.nack(d2.receipt, A, 0.0, "first failure")
    [d2] = await q.receive(A, 1, 30.0, 0)
    assert await q.dead_letter(d1.receipt, B, "not yours") is False
    assert await q.dead_letter(d1.receipt, A, "bad input") is True
    assert await q.dead_letter(d1.receipt, A, "twice") is False
    await asyncio.sleep(0.005)  # distinct death times (ms resolution) for the order
    assert await q.dead_letter(d2.receipt, A, "second failure") is True
    await asyncio.sleep(0.005)
    assert await q.dead_letter(d3.receipt, A, None) is True
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=3)
    dead = await q.dead_letters(10)
    assert [(d.id, d.body, d.headers, d.deliveries, d.error) for d in dead] == [
        ("d1", b"body of d1", {"id": "d1"}, 1, "bad input"),
        ("d2", b"body of d2", {"id": "d2"}, 2, "second failure"),
        ("d3", b"body of d3", {"id": "d3"}, 1, None),
    ]
    assert all(isinstance(d, DeadLetter) and d.dead_at for d in dead)
    assert dead[0].dead_at is not None and abs(dead[0].dead_at - time.time()) < 60
    assert [d.id for d in await q.dead_letters(2)] == ["d1", "d2"]
    assert await q.receive(B, 10, 30.0, 0) == []  # dead letters are never delivered

    assert await q.requeue_dead(["d2", "nope", "d2"]) == 1
    assert await q.requeue_dead([]) == 0
    [again] = await q.receive(B, 10, 30.0, 0)
    assert (again.id, again.delivery, again.last_error) == ("d2", 1, None)
    assert await q.requeue_dead(None) == 2
    assert await q.stats() == QueueStats(ready=2, delayed=0, in_flight=2, dead=0)
    assert await q.dead_letters(10) == []
    back = await q.receive(B, 10, 30.0, 0)
    assert sorted((m.id, m.delivery) for m in back) == [("d1", 1), ("d3", 1)]
    assert await q.requeue_dead(None) == 0
    for m in [again, *back]:
        assert await q.ack(m.receipt, B)
    assert await q.ack(ok.receipt, A)


# -- stats, purge, drop, isolation ----------------------------------------------------------
async def test_stats_by_state(q: Q) -> None:
    await _publish(q, "r1", "r2", "f1", "f2", "x")
    await _publish(q, "later", delay=60.0)
    got = await q.receive(A, 3, 30.0, 0)
    assert await q.dead_letter(got[2].receipt, A, "x")
    assert await q.stats() == QueueStats(ready=2, delayed=1, in_flight=2, dead=1)
    assert await q.nack(got[0].receipt, A, 60.0, None)
    assert await q.stats() == QueueStats(ready=2, delayed=2, in_flight=1, dead=1)
    expire(q)  # the last in-flight delivery ran out: deliverable again
    assert await q.stats() == QueueStats(ready=3, delayed=2, in_flight=0, dead=1)


async def test_two_queue_names_are_isolated(make: Factory) -> None:
    one, two = make(), make()
    await _publish(one, "for one")
    await _publish(two, "for two")
    await _publish(two, "dead in two")
    [m1] = await one.receive(A, 10, 30.0, 0)
    assert m1.id == "for one"
    two_msgs = await two.receive(A, 10, 30.0, 0)
    assert [m.id for m in two_msgs] == ["for two", "dead in two"]
    # a receipt of one queue means nothing to the other
    assert await two.ack(m1.receipt, A) is False
    assert await two.nack(m1.receipt, A, 0.0, None) is False
    assert await two.renew([(m1.receipt, A, 30.0)]) == [False]
    assert await two.dead_letter(m1.receipt, A, None) is False
    assert await two.dead_letter(two_msgs[1].receipt, A, "x")
    assert await one.dead_letters(10) == []
    assert await one.requeue_dead(None) == 0
    assert await one.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=0)
    assert await two.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=1)
    assert await one.purge() == 1
    assert await two.stats() == QueueStats(ready=0, delayed=0, in_flight=1, dead=1)
    assert await one.ack(m1.receipt, A) is False


async def test_purge_and_drop(make: Factory, db: Path) -> None:
    q, other = make(), make()
    await _publish(q, "a", "b", "c", "d")
    await _publish(q, "later", delay=60.0)
    await _publish(other, "keep")
    a, b, _c = await q.receive(A, 3, 30.0, 0)
    assert await q.dead_letter(b.receipt, A, None)
    assert await q.purge() == 5  # ready, delayed, in flight and dead
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
    assert await q.ack(a.receipt, A) is False
    assert await q.purge() == 0

    await _publish(q, "e")
    await q.drop()
    assert await q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
    assert await other.stats() == QueueStats(ready=1, delayed=0, in_flight=0, dead=0)
    tables = {row[0] for row in _sql(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert TABLE in tables  # the other queue still uses the table

    await other.drop()  # the last queue with messages: the table goes
    tables = {row[0] for row in _sql(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert TABLE not in tables
    assert _sql(db, "SELECT * FROM jobfence_queue_schema") == []
    # clients still connected create it again on their next use
    await _publish(q, "after drop")
    [m] = await q.receive(A, 1, 30.0, 0)
    assert m.id == "after drop"
    assert await other.receive(A, 1, 30.0, 0) == []
    assert await other.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
    await q.drop()
    await q.drop()  # idempotent


# -- waiting ---------------------------------------------------------------------------------
class NoPollClock(Clock):
    """A clock whose timed waits for an event wait (up to a minute) for the event only: a
    waiting receive then returns only when something in this process wakes it."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.pauses.append(timeout)
        return event.wait(60.0)

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        self.pauses.append(timeout)
        try:
            await asyncio.wait_for(event.wait(), 60.0)
        except TimeoutError:
            return False
        return True


class RecordingClock(Clock):
    """The real clock, recording the timeout of every timed wait."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.pauses.append(timeout)
        return super().wait(event, timeout)

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        self.pauses.append(timeout)
        return await super().wait_async(event, timeout)


async def _until_waiting(q: Q, count: int = 1) -> None:
    key = q.backend._wake_key
    deadline = time.monotonic() + 10
    while WAITERS.count(key) < count:
        assert time.monotonic() < deadline, "the receive never started waiting"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("publisher", FLAVOURS)
async def test_a_publish_in_this_process_wakes_a_waiting_receive(
    make: Factory, publisher: str
) -> None:
    """With polling taken out (every timed wait waits for the wake-up only), a waiting
    receive still gets a message published by another client of this process, of either
    flavour: the wake-up alone brings it."""
    with clocked(NoPollClock()) as clock:
        consumer = make()
        producer = make(consumer.name, flavour=publisher)
        await consumer.install()
        waiting = asyncio.ensure_future(consumer.receive(A, 1, 30.0, 30.0))
        await _until_waiting(consumer)
        await asyncio.sleep(0.05)  # let it settle into its timed wait
        assert not waiting.done()
        await _publish(producer, "wake up")
        [m] = await asyncio.wait_for(waiting, 30)
        assert m.id == "wake up"
        assert clock.pauses  # it did wait, and only the wake-up ended the wait
        assert await consumer.ack(m.receipt, A)
        # a nack without delay wakes a waiter too
        await _publish(producer, "again")
        [m] = await consumer.receive(A, 1, 30.0, 0)
        waiting = asyncio.ensure_future(consumer.receive(B, 1, 30.0, 30.0))
        await _until_waiting(consumer)
        assert await consumer.nack(m.receipt, A, 0.0, "retry")
        [m2] = await asyncio.wait_for(waiting, 30)
        assert (m2.id, m2.delivery) == ("again", 2)


async def test_a_waiting_receive_wakes_when_a_delay_ends(q: Q) -> None:
    """It never sleeps past the moment the next delayed or in-flight message is due, even
    with a long poll interval."""
    q2 = Q(type(q.backend)(parse_url(_url(q.db)), name=q.name, poll_interval=30), q.db)
    try:
        with clocked(RecordingClock()) as clock:
            started = time.monotonic()
            await _publish(q, "soon", delay=0.2)
            [m] = await q2.receive(A, 1, 0.2, 10.0)
            assert m.id == "soon"
            assert time.monotonic() - started >= 0.2 - EPS
            # the doubling pauses alone (2, 4, ... 128 ms) would overshoot to 0.254 s
            assert 0 < sum(clock.pauses) <= 0.2 + 0.03
            # an in-flight delivery's visibility (0.2 s) is a due time as well
            clock.pauses.clear()
            [m] = await q2.receive(B, 1, 30.0, 10.0)
            assert (m.id, m.delivery) == ("soon", 2)
            assert 0 < sum(clock.pauses) <= 0.2 + 0.03
    finally:
        await q2.close()


async def test_a_waiting_receive_gives_up_after_wait(q: Q) -> None:
    started = time.monotonic()
    assert await q.receive(A, 1, 30.0, 0.2) == []
    assert time.monotonic() - started >= 0.2 - EPS
    assert WAITERS.count(q.backend._wake_key) == 0  # it left the registry


async def test_many_waiting_receives_each_get_their_own(make: Factory) -> None:
    """Several waiting receives of this process (threads or tasks) and a burst of
    publishes: every message goes to exactly one of them."""
    first = make()
    consumers = [first] + [make(first.name) for _ in range(3)]
    producer = make(first.name)
    got: list[str] = []

    async def consume(c: Q, me: str) -> None:
        while len(got) < 40:
            for m in await c.receive(me, 3, 30.0, 0.3):
                assert await c.ack(m.receipt, me)
                got.append(m.id)

    tasks = [asyncio.ensure_future(consume(c, f"host:{i}:c")) for i, c in enumerate(consumers)]
    for i in range(0, 40, 4):
        await _publish(producer, *(f"m{j}" for j in range(i, i + 4)))
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert sorted(got) == sorted(f"m{j}" for j in range(40))


# -- several processes -----------------------------------------------------------------------
def _consumer_process(
    db: str, name: str, flavour: str, publish: int, total: int, out: Any, barrier: Any
) -> None:
    """Child process: publish ``publish`` messages (in small batches, between receives) and
    consume until ``total`` messages were acked by all; report what it acked, or its error."""
    consumer = f"host:{os.getpid()}:{uuid.uuid4().hex}"
    acked: list[str] = []

    def done_overall() -> bool:
        rows = _sql(Path(db), "SELECT count(*) FROM acked")
        return int(rows[0][0]) >= total

    def record(ids: list[str]) -> None:
        conn = sqlite3.connect(db, isolation_level=None, timeout=30)
        try:
            conn.executemany("INSERT INTO acked (id) VALUES (?)", [(i,) for i in ids])
        finally:
            conn.close()

    try:
        barrier.wait()
        if flavour == "sync":
            q = SQLiteQueueBackend(parse_url(f"sqlite:///{db}"), name=name)
            sent = 0
            while True:
                if sent < publish:
                    batch = [(f"{os.getpid()}-{sent + i}", b"x", {}) for i in range(5)]
                    q.publish(batch)
                    sent += len(batch)
                msgs = q.receive(consumer, 3, 60.0, 0.05)
                ids = [m.id for m in msgs if q.ack(m.receipt, consumer)]
                acked.extend(ids)
                if ids:
                    record(ids)
                if sent >= publish and not msgs and done_overall():
                    break
            q.close()
        else:

            async def main() -> None:
                q = AsyncSQLiteQueueBackend(parse_url(f"sqlite:///{db}"), name=name)
                sent = 0
                while True:
                    if sent < publish:
                        batch = [(f"{os.getpid()}-{sent + i}", b"x", {}) for i in range(5)]
                        await q.publish(batch)
                        sent += len(batch)
                    msgs = await q.receive(consumer, 3, 60.0, 0.05)
                    ids = [m.id for m in msgs if await q.ack(m.receipt, consumer)]
                    acked.extend(ids)
                    if ids:
                        record(ids)
                    if sent >= publish and not msgs and done_overall():
                        break
                await q.close()

            asyncio.run(main())
        out.put(("ok", acked))
    except BaseException as exc:
        out.put(("error", repr(exc)))


@pytest.mark.slow
def test_consumer_processes_get_each_message_exactly_once(db: Path) -> None:
    """Six processes (sync and async clients) publish and consume on one file at once, with
    no pause: every message is acked exactly once, and the contention for SQLite's write
    lock (busy waits) raises no error anywhere."""
    name = _new_name()
    _sql(db, "CREATE TABLE acked (id TEXT NOT NULL)")
    ctx = multiprocessing.get_context("spawn")
    per_process, processes = 60, 6
    out = ctx.Queue()
    barrier = ctx.Barrier(processes)
    procs = [
        ctx.Process(
            target=_consumer_process,
            args=(
                str(db),
                name,
                FLAVOURS[i % 2],
                per_process,
                per_process * processes,
                out,
                barrier,
            ),
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [detail for status, detail in results if status != "ok"]
    assert errors == []
    acked = [i for _status, ids in results for i in ids]
    assert len(acked) == per_process * processes
    assert len(set(acked)) == len(acked)
    q = SQLiteQueueBackend(parse_url(_url(db)), name=name)
    try:
        assert q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
        q.drop()
    finally:
        q.close()


WORKER = r"""
import asyncio, os, sys, time
from jobfence._core.url import parse_url

db, name, flavour, consumer = sys.argv[1:5]
url = parse_url("sqlite:///" + db)
if flavour == "sync":
    from jobfence.backends.sqlite.queue import SQLiteQueueBackend
    q = SQLiteQueueBackend(url, name=name)
    [m] = q.receive(consumer, 1, 1.0, 30.0)
    print("GOT", m.id, m.receipt, m.delivery, flush=True)
    time.sleep(3600)
else:
    from jobfence.backends.sqlite.queue_async import AsyncSQLiteQueueBackend

    async def main():
        q = AsyncSQLiteQueueBackend(url, name=name)
        [m] = await q.receive(consumer, 1, 1.0, 30.0)
        print("GOT", m.id, m.receipt, m.delivery, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_killed_consumer_s_message_is_redelivered(q: Q) -> None:
    """A consumer process (of the test's flavour) SIGKILLed mid-message (no clean-up runs):
    its message comes back after the visibility (1 s), to another consumer, delivery 2; the
    dead one's receipt is refused."""
    flavour = "async" if isinstance(q.backend, AsyncSQLiteQueueBackend) else "sync"
    await q.install()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    dead = f"host:{uuid.uuid4().hex}:dead"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(q.db), q.name, flavour, dead],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        published = time.monotonic()
        await _publish(q, "precious")  # the worker is waiting for it (polling: another process)
        assert worker.stdout is not None
        line = await asyncio.to_thread(worker.stdout.readline)
        err = "" if line or worker.stderr is None else worker.stderr.read()
        assert line.startswith("GOT precious"), (line, err)
        _got, _id, receipt, delivery = line.split()
        assert delivery == "1"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        stats = await q.stats()
        assert stats.ready + stats.in_flight == 1 and stats.dead == 0  # not lost
        [m] = await q.receive(B, 1, 30.0, 10.0)
        assert (m.id, m.delivery, m.body) == ("precious", 2, b"body of precious")
        assert time.monotonic() - published >= 1.0 - EPS  # not before the visibility
        assert await q.ack(receipt, dead) is False
        assert await q.ack(m.receipt, B) is True
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=10)


# -- SQLITE_BUSY -----------------------------------------------------------------------------
async def test_a_held_write_lock_is_waited_for_not_an_error(q: Q) -> None:
    """Another connection holds SQLite's write lock for a while: publish, receive, ack and
    renew wait for it (the busy timeout) and succeed; an idle receive is not blocked at all
    (a WAL read)."""
    await _publish(q, "first")
    [first] = await q.receive(A, 1, 30.0, 0)
    holder = sqlite3.connect(q.db, isolation_level=None, timeout=30)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert await q.receive(B, 1, 30.0, 0) == []  # a read only: not blocked
        pending = [
            asyncio.ensure_future(_publish(q, "second")),
            asyncio.ensure_future(q.renew([(first.receipt, A, 30.0)])),
        ]
        await asyncio.sleep(0.3)
        assert not any(p.done() for p in pending)  # waiting for the lock
        holder.execute("COMMIT")
        results = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert results[1] == [True]
    finally:
        holder.close()
    [second] = await q.receive(A, 1, 30.0, 0)
    assert second.id == "second"
    assert await q.ack(first.receipt, A) and await q.ack(second.receipt, A)


async def test_busy_timeout_zero_fails_fast(make: Factory) -> None:
    q = make(busy_timeout=0)
    await q.install()
    holder = sqlite3.connect(q.db, isolation_level=None, timeout=30)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await _publish(q, "x")
        holder.execute("COMMIT")
    finally:
        holder.close()
    await _publish(q, "x")  # the connection is usable again
    assert [m.id for m in await _receive_all(q)] == ["x"]


# -- configuration and lifecycle -------------------------------------------------------------
def test_registry_and_options(db: Path) -> None:
    sync = open_queue_backend(_url(db), "orders", asynchronous=False)
    asyn = open_queue_backend(_url(db), "orders", asynchronous=True)
    assert type(sync) is SQLiteQueueBackend and type(asyn) is AsyncSQLiteQueueBackend
    assert sync.capabilities.cross_process and sync.capabilities.visibility_timeout
    assert not sync.capabilities.server_wakeup
    assert (sync.table, sync.busy_timeout, sync.poll_interval) == ("jobfence_queue", 30.0, 0.1)
    sync.close()
    custom = open_queue_backend(
        _url(db) + "?table=jobs&poll_interval=0.5&synchronous=normal",
        "orders",
        asynchronous=False,
        busy_timeout=2,
    )
    assert (custom.table, custom.poll_interval, custom.busy_timeout) == ("jobs", 0.5, 2.0)
    assert custom.synchronous == "normal"
    custom.publish([("a", b"", {})])
    assert _sql(db, "SELECT id FROM jobs") == [("a",)]
    custom.drop()
    custom.close()

    for bad, argument in [
        ({"colour": "red"}, "colour"),
        ({"table": "no-dashes"}, "table"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"busy_timeout": -1}, "busy_timeout"),
        ({"synchronous": "sometimes"}, "synchronous"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            open_queue_backend(_url(db), "orders", asynchronous=False, **bad)
        assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:
        open_queue_backend(_url(db) + "?pool=1", "orders", asynchronous=False)
    assert info.value.argument == "pool"
    for name in ("", "-x", "a b", "x" * 129, 7):
        with pytest.raises(ConfigurationError):
            open_queue_backend(_url(db), name, asynchronous=False)
    with pytest.raises(ConfigurationError):
        open_queue_backend("sqlite:///:memory:", "orders", asynchronous=False)


async def test_close_is_idempotent_and_final(q: Q) -> None:
    await _publish(q, "x")
    await q.close()
    await q.close()
    with pytest.raises(ConfigurationError):
        await q.receive(A, 1, 30.0, 0)


def _child_after_fork(q: SQLiteQueueBackend, out: Any) -> None:
    q.after_fork()
    try:
        [m] = q.receive(B, 1, 30.0, 0)
        out.put((m.id, q.ack(m.receipt, B)))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    q.close()


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_after_fork_opens_a_connection_of_its_own(db: Path) -> None:
    q = SQLiteQueueBackend(parse_url(_url(db)), name=_new_name())
    try:
        q.publish([("parent", b"", {}), ("child", b"", {})])
        [m] = q.receive(A, 1, 30.0, 0)  # the parent's connection is open
        inherited = q._conn
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_child_after_fork, args=(q, out))
        child.start()
        assert out.get(timeout=30) == ("child", True)
        child.join(10)
        assert q._conn is inherited  # the parent's is untouched and works
        assert q.ack(m.receipt, A)
        assert q.stats() == QueueStats(ready=0, delayed=0, in_flight=0, dead=0)
    finally:
        q.drop()
        q.close()
