"""The PostgreSQL queue backend against a real server (tests/servers.py POSTGRES_URL).

Every test runs twice, on ``AsyncPostgresQueueBackend`` and on the generated
``PostgresQueueBackend`` (its calls made in worker threads), with the same assertions. The
module's messages live in a table of its own (dropped at the end); every test uses queue names
of its own and drops them.

Statement counts come from the backend itself: every statement it sends goes through its
``_execute``, which the tests wrap to record which section of ``sql/queue.sql`` ran.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobfence.backends import open_queue_backend
from jobfence.backends.base import QueuedMessage
from jobfence.backends.postgres.queue import PostgresQueueBackend
from jobfence.backends.postgres.queue_async import (
    CAPABILITIES,
    POLLING_CAPABILITIES,
    AsyncPostgresQueueBackend,
    notify_channel,
)
from jobfence.errors import ConfigurationError
from tests.servers import POSTGRES_URL

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = ("async", "sync")


def _url(table: str, **extra: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"table": table, **extra}.items())
    return POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + query


def _table_exists(admin: psycopg.Connection[Any], table: str) -> bool:
    row = admin.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{table}"',)).fetchone()
    return bool(row and row[0])


def _drop_table(admin: psycopg.Connection[Any], table: str) -> None:
    admin.execute(f'DROP TABLE IF EXISTS "{table}"')
    if _table_exists(admin, "jobfence_queue_schema"):
        admin.execute("DELETE FROM jobfence_queue_schema WHERE table_name = %s", (table,))


@pytest.fixture(scope="module")
def admin() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def table(admin: psycopg.Connection[Any]) -> Iterator[str]:
    name = "jfq_" + uuid.uuid4().hex[:12]
    yield name
    _drop_table(admin, name)


@pytest.fixture
def fresh_table(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A table of the test's own (for tests that drop tables or watch them being made)."""
    name = "jfq_" + uuid.uuid4().hex[:12]
    yield name
    _drop_table(admin, name)


class Statements:
    """Counts the statements a backend sends, by section of ``sql/queue.sql``."""

    def __init__(self, backend: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        sections = {sql: name for name, sql in backend._sql.items()}
        execute = backend._execute

        if isinstance(backend, AsyncPostgresQueueBackend):

            async def counting(conn: Any, sql: str, params: Any = None) -> Any:
                result = await execute(conn, sql, params)
                self.counts[sections.get(sql, "?")] += 1
                return result

            backend._execute = counting
        else:

            def counting_sync(conn: Any, sql: str, params: Any = None) -> Any:
                result = execute(conn, sql, params)
                self.counts[sections.get(sql, "?")] += 1
                return result

            backend._execute = counting_sync

    def __getitem__(self, section: str) -> int:
        return self.counts[section]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Q:
    """One queue backend, sync or async, with awaitable verbs (sync calls run in a thread)."""

    def __init__(self, url: str, name: str, sync: bool, **options: Any) -> None:
        self.name = name
        self.sync = sync
        self.backend: Any = open_queue_backend(url, name, asynchronous=not sync, **options)

    async def _call(self, verb: str, *args: Any) -> Any:
        method = getattr(self.backend, verb)
        if self.sync:
            return await asyncio.to_thread(method, *args)
        return await method(*args)

    def count(self) -> Statements:
        return Statements(self.backend)

    async def publish(self, *ids: str, delay: float = 0.0, body: bytes | None = None) -> None:
        messages = [(i, body if body is not None else i.encode(), {"n": i}) for i in ids]
        await self._call("publish", messages, delay)

    async def publish_raw(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> None:
        await self._call("publish", messages, 0.0)

    async def receive(
        self, consumer: str, n: int = 10, visibility: float = 30.0, wait: float = 0.0
    ) -> list[QueuedMessage]:
        result: list[QueuedMessage] = await self._call("receive", consumer, n, visibility, wait)
        return result

    async def ack(self, receipt: str, consumer: str) -> bool:
        return bool(await self._call("ack", receipt, consumer))

    async def nack(
        self, receipt: str, consumer: str, delay: float = 0.0, error: Any = None
    ) -> bool:
        return bool(await self._call("nack", receipt, consumer, delay, error))

    async def renew(self, items: list[tuple[str, str, float]]) -> list[bool]:
        result: list[bool] = await self._call("renew", items)
        return result

    async def dead_letter(self, receipt: str, consumer: str, error: Any = None) -> bool:
        return bool(await self._call("dead_letter", receipt, consumer, error))

    async def stats(self) -> tuple[int | None, ...]:
        s = await self._call("stats")
        return (s.ready, s.delayed, s.in_flight, s.dead)

    async def dead_letters(self, limit: int = 100) -> list[Any]:
        result: list[Any] = await self._call("dead_letters", limit)
        return result

    async def requeue_dead(self, ids: list[str] | None = None) -> int:
        return int(await self._call("requeue_dead", ids))

    async def purge(self) -> int:
        return int(await self._call("purge"))

    async def install(self) -> None:
        await self._call("install")

    async def drop(self) -> None:
        await self._call("drop")

    async def close(self) -> None:
        await self._call("close")


class Queues:
    """Makes queue clients for one table; closes them and drops their queues at the end."""

    def __init__(self, table: str, sync: bool) -> None:
        self.table = table
        self.sync = sync
        self.made: list[Q] = []

    def __call__(self, name: str | None = None, *, table: str | None = None, **kw: Any) -> Q:
        url_options = ("notify", "application_name", "prepare_threshold")
        extra = {k: str(kw.pop(k)) for k in list(kw) if k in url_options}
        url = _url(table or self.table, **extra)
        q = Q(url, name or "q." + uuid.uuid4().hex[:12], self.sync, **kw)
        self.made.append(q)
        return q

    def twin(self, q: Q) -> Q:
        """Another client (its own connections) of the same queue."""
        return self(q.name, table=q.backend.table)


@pytest.fixture(params=FLAVOURS)
async def queues(request: pytest.FixtureRequest, table: str) -> AsyncIterator[Queues]:
    made = Queues(table, request.param == "sync")
    yield made
    for q in made.made:
        try:
            if not q.backend._closed:  # a closed client's queue is dropped by its twin
                await q.drop()
        finally:
            await q.close()


def _ids(messages: list[QueuedMessage]) -> list[str]:
    return [m.id for m in messages]


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# -- publish, receive, ack ------------------------------------------------------------------
async def test_publish_receive_ack(queues: Queues) -> None:
    q = queues()
    await q.publish("a", "b", "c")
    assert await q.stats() == (3, 0, 0, 0)
    got = await q.receive("c1")
    assert _ids(got) == ["a", "b", "c"]
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert [m.headers for m in got] == [{"n": "a"}, {"n": "b"}, {"n": "c"}]
    assert {m.delivery for m in got} == {1}
    assert len({m.receipt for m in got}) == 3
    assert all(m.published_at is not None and m.last_error is None for m in got)
    assert await q.stats() == (0, 0, 3, 0)
    assert await q.receive("c2") == []
    for m in got:
        assert await q.ack(m.receipt, "c1")
        assert not await q.ack(m.receipt, "c1")  # gone
    assert await q.stats() == (0, 0, 0, 0)
    assert await q.receive("c1") == []


async def test_publish_of_a_batch_is_one_statement(queues: Queues) -> None:
    q = queues()
    count = q.count()
    await q.publish(*(f"m{i}" for i in range(100)))
    assert count["publish"] == 1
    assert await q.stats() == (100, 0, 0, 0)


async def test_ack_needs_the_consumer_of_the_delivery(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1")
    assert not await q.ack(m.receipt, "c2")
    assert not await q.nack(m.receipt, "c2")
    assert not await q.dead_letter(m.receipt, "c2")
    assert await q.renew([(m.receipt, "c2", 10)]) == [False]
    assert await q.stats() == (0, 0, 1, 0)
    assert await q.ack(m.receipt, "c1")


async def test_receipts_not_handed_out_are_refused_without_a_statement(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1")
    count = q.count()
    seq = m.receipt.split(".")[0]
    for bogus in ("", "x", "1", "1.", "-1." + "0" * 32, "99999999999999999999." + "0" * 32, seq):
        assert not await q.ack(bogus, "c1")
        assert not await q.nack(bogus, "c1")
        assert not await q.dead_letter(bogus, "c1")
    assert await q.renew([("nope", "c1", 5)]) == [False]
    assert count.total == 0
    # well-formed but not this delivery's token: the server refuses it
    assert not await q.ack(f"{seq}.{uuid.uuid4().hex}", "c1")
    assert await q.ack(m.receipt, "c1")


async def test_ids_are_not_unique(queues: Queues) -> None:
    q = queues()
    await q.publish("same")
    await q.publish("same")
    got = await q.receive("c1")
    assert _ids(got) == ["same", "same"]
    assert got[0].receipt != got[1].receipt
    for m in got:
        assert await q.ack(m.receipt, "c1")


async def test_bodies_headers_ids_and_errors_round_trip(queues: Queues) -> None:
    q = queues()
    body = bytes(range(256))
    headers = {"k\x00": "v\x00", "ü": "€ \ufffe", "empty": ""}
    await q.publish_raw([("id\x00nul", body, headers), ("\ufffeescaped", b"", {})])
    first, second = await q.receive("c1")
    assert (first.id, first.body, first.headers) == ("id\x00nul", body, headers)
    assert (second.id, second.body, second.headers) == ("\ufffeescaped", b"", {})
    assert await q.nack(first.receipt, "c1", 0, "bad \x00 \ud800 thing")
    [again] = await q.receive("c1")
    assert again.last_error == "bad \x00 \\ud800 thing"  # a lone surrogate as its escape
    assert await q.dead_letter(again.receipt, "c1", "\x00dead")
    [dead] = await q.dead_letters()
    assert (dead.id, dead.error, dead.headers) == ("id\x00nul", "\x00dead", headers)


async def test_without_prepared_statements(queues: Queues) -> None:
    """``prepare_threshold=none`` (PgBouncer < 1.21): every verb still works, repeatedly."""
    q = queues(prepare_threshold="none")
    for _ in range(7):  # past psycopg's default threshold of 5
        await q.publish("a")
        [m] = await q.receive("c1", wait=1)
        assert await q.renew([(m.receipt, "c1", 30)]) == [True]
        assert await q.ack(m.receipt, "c1")


async def test_fifo_for_one_consumer(queues: Queues) -> None:
    q = queues()
    expected = [f"m{i:03}" for i in range(60)]
    for start in range(0, 60, 12):
        await q.publish(*expected[start : start + 12])
    seen: list[str] = []
    while batch := await q.receive("c1", n=7):
        seen += _ids(batch)
        for m in batch:
            assert await q.ack(m.receipt, "c1")
    assert seen == expected


async def test_delay_holds_a_message_back(queues: Queues) -> None:
    q = queues()
    started = time.monotonic()
    await q.publish("late", delay=1.0)
    await q.publish("now")
    assert _ids(await q.receive("c1")) == ["now"]
    assert await q.receive("c1") == []
    assert await q.stats() == (0, 1, 1, 0)
    [m] = await q.receive("c1", wait=10)
    assert m.id == "late" and m.delivery == 1
    assert time.monotonic() - started >= 0.95


# -- redelivery, renewal, nack ----------------------------------------------------------------
async def test_redelivery_after_the_visibility(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [first] = await q.receive("c1", visibility=0.5)
    assert await q.receive("c2") == []  # hidden while the delivery is visible to c1
    [second] = await q.receive("c2", visibility=30, wait=10)
    assert second.id == "a" and second.delivery == 2
    assert second.receipt != first.receipt
    # the old receipt is refused and does not touch the new delivery
    assert not await q.ack(first.receipt, "c1")
    assert not await q.nack(first.receipt, "c1")
    assert not await q.dead_letter(first.receipt, "c1")
    assert await q.renew([(first.receipt, "c1", 30)]) == [False]
    assert await q.stats() == (0, 0, 1, 0)
    assert await q.ack(second.receipt, "c2")
    assert await q.stats() == (0, 0, 0, 0)


async def test_ack_after_the_visibility_while_nobody_took_it(queues: Queues) -> None:
    """Chosen behaviour: the receipt stays the delivery's until the message is delivered
    again, so a slow consumer's ack still counts; a renewal does not (see the SQL)."""
    q = queues()
    await q.publish("a", "b")
    first, second = await q.receive("c1", visibility=0.3)
    await asyncio.sleep(0.5)  # the visibility passes (time is what is tested)
    assert await q.stats() == (2, 0, 0, 0)
    assert await q.renew([(first.receipt, "c1", 30)]) == [False]
    assert await q.ack(first.receipt, "c1")
    assert await q.nack(second.receipt, "c1", 0, "late")
    [again] = await q.receive("c1")
    assert (again.id, again.delivery, again.last_error) == ("b", 2, "late")


async def test_renew_keeps_a_delivery_and_a_late_renew_fails(queues: Queues) -> None:
    q = queues()
    await q.publish("a", "b", "c")
    a, b, c = await q.receive("c1", visibility=0.6)
    count = q.count()
    renewed = await q.renew(
        [
            (a.receipt, "c1", 30),
            (b.receipt, "other", 30),
            ("junk", "c1", 30),
            (c.receipt, "c1", 0.2),
        ]
    )
    assert renewed == [True, False, False, True]
    assert count["renew"] == 1  # one round trip for every item
    await asyncio.sleep(0.9)  # past the first visibility (time is what is tested)
    got = await q.receive("c2")
    assert sorted(_ids(got)) == ["b", "c"]  # a was renewed; b was not, c only briefly
    assert await q.renew([(c.receipt, "c1", 30)]) == [False]  # c was delivered again
    assert await q.ack(a.receipt, "c1")
    for m in got:
        assert await q.ack(m.receipt, "c2")


async def test_renew_of_an_item_named_twice(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1", visibility=30)
    assert await q.renew([(m.receipt, "c1", 5), (m.receipt, "c1", 30)]) == [True, True]
    assert await q.renew([]) == []


async def test_nack_without_delay_redelivers_at_once(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1")
    assert await q.nack(m.receipt, "c1", 0, "boom")
    assert not await q.ack(m.receipt, "c1")  # the nacked delivery is over
    [again] = await q.receive("c2")
    assert (again.id, again.delivery, again.last_error) == ("a", 2, "boom")
    assert await q.ack(again.receipt, "c2")


async def test_nack_with_a_delay(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1")
    nacked = time.monotonic()
    assert await q.nack(m.receipt, "c1", 1.0, "later")
    assert await q.receive("c2") == []
    assert await q.stats() == (0, 1, 0, 0)
    [again] = await q.receive("c2", wait=10)
    assert time.monotonic() - nacked >= 0.95
    assert (again.delivery, again.last_error) == (2, "later")


# -- dead letters, stats, purge, drop ---------------------------------------------------------
async def test_dead_letters_and_requeue(queues: Queues) -> None:
    q = queues()
    await q.publish("x", "y", "z")
    x, y, z = await q.receive("c1")
    assert await q.nack(x.receipt, "c1", 0, "first")
    [x2] = await q.receive("c1", n=1)
    assert x2.id == "x" and x2.delivery == 2
    assert await q.dead_letter(x2.receipt, "c1", "poison")
    assert await q.dead_letter(y.receipt, "c1", None)
    assert not await q.dead_letter(y.receipt, "c1", "again")
    assert not await q.ack(x2.receipt, "c1")
    assert await q.stats() == (0, 0, 1, 2)
    dead = await q.dead_letters()
    assert [(d.id, d.deliveries, d.error, d.body) for d in dead] == [
        ("x", 2, "poison", b"x"),
        ("y", 1, None, b"y"),
    ]
    assert dead[0].dead_at is not None and dead[0].headers == {"n": "x"}
    assert [d.id for d in await q.dead_letters(limit=1)] == ["x"]
    assert await q.requeue_dead(["nope"]) == 0
    assert await q.requeue_dead([]) == 0
    assert await q.requeue_dead(["y"]) == 1
    assert await q.stats() == (1, 0, 1, 1)
    [y2] = await q.receive("c1")
    assert (y2.id, y2.delivery) == ("y", 1)  # the count starts again
    assert await q.requeue_dead() == 1
    [x3] = await q.receive("c1")
    assert (x3.id, x3.delivery, x3.last_error) == ("x", 1, "poison")
    assert await q.dead_letters() == []
    for m, who in ((z, "c1"), (y2, "c1"), (x3, "c1")):
        assert await q.ack(m.receipt, who)


async def test_stats_by_state(queues: Queues) -> None:
    q = queues()
    await q.publish("r1", "r2", "f1", "f2", "f3", "d1")
    await q.publish("later1", "later2", delay=60)
    got = await q.receive("c1", n=4)  # r1 r2 f1 f2 in flight
    assert await q.dead_letter(got[0].receipt, "c1", "x")
    assert await q.ack(got[1].receipt, "c1")
    assert await q.stats() == (2, 2, 2, 1)  # f3 d1 ready; later*; f1 f2; r1 dead


async def test_purge_deletes_every_state(queues: Queues) -> None:
    q = queues()
    other = queues()
    await other.publish("keep")
    await q.publish("ready", "inflight", "dead")
    await q.publish("delayed", delay=60)
    _, inflight, dead = await q.receive("c1", n=3)
    assert await q.dead_letter(dead.receipt, "c1", "x")
    assert await q.purge() == 4
    assert await q.stats() == (0, 0, 0, 0)
    assert not await q.ack(inflight.receipt, "c1")
    assert await q.purge() == 0
    assert await other.stats() == (1, 0, 0, 0)


async def test_drop_keeps_other_queues_and_drops_the_last_ones_table(
    queues: Queues, fresh_table: str, admin: psycopg.Connection[Any]
) -> None:
    one = queues(table=fresh_table)
    two = queues(table=fresh_table)
    for i in range(6):  # past psycopg's prepare threshold: a prepared statement outlives
        await one.publish(f"a{i}")  # the table it was prepared for
        await one.stats()
    await two.publish("b")
    assert _table_exists(admin, fresh_table)
    await one.drop()
    assert _table_exists(admin, fresh_table)  # two still has a message in it
    assert await one.stats() == (0, 0, 0, 0)
    assert await two.stats() == (1, 0, 0, 0)
    await two.drop()
    assert not _table_exists(admin, fresh_table)
    row = admin.execute(
        "SELECT count(*) FROM jobfence_queue_schema WHERE table_name = %s", (fresh_table,)
    ).fetchone()
    assert row == (0,)
    await two.drop()  # nothing left: no error
    # a client that used the table before creates it again on its next statement
    await one.publish("c")
    assert _table_exists(admin, fresh_table)
    assert await one.stats() == (1, 0, 0, 0)
    assert _ids(await one.receive("c1")) == ["c"]


async def test_drop_leaves_a_busy_table(queues: Queues, fresh_table: str) -> None:
    """drop() waits at most about a second for the table lock: a table in use by a long
    transaction keeps existing (empty of the queue's messages) instead of stalling every
    statement on it behind the drop."""
    q = queues(table=fresh_table)
    await q.publish("a")
    with psycopg.connect(POSTGRES_URL) as reader:  # a transaction, not autocommit
        reader.execute(f'SELECT count(*) FROM "{fresh_table}"').fetchone()
        await q.drop()
        assert reader.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{fresh_table}"',)
        ).fetchone() == (True,)
        reader.rollback()
    assert await q.stats() == (0, 0, 0, 0)


async def test_two_queues_never_see_each_others_messages(queues: Queues) -> None:
    one = queues()
    two = queues()
    await one.publish(*(f"a{i}" for i in range(5)))
    await two.publish(*(f"b{i}" for i in range(5)))
    got_one = await one.receive("c", n=100)
    got_two = await two.receive("c", n=100)
    assert _ids(got_one) == [f"a{i}" for i in range(5)]
    assert _ids(got_two) == [f"b{i}" for i in range(5)]
    # a receipt is good only on its own queue
    mine = got_one[1]
    assert not await two.ack(mine.receipt, "c")
    assert not await two.nack(mine.receipt, "c")
    assert not await two.dead_letter(mine.receipt, "c")
    assert await two.renew([(mine.receipt, "c", 30)]) == [False]
    dead = got_one[0]
    assert await one.dead_letter(dead.receipt, "c", "x")
    assert await two.dead_letters() == []
    assert await two.requeue_dead() == 0
    assert await two.stats() == (0, 0, 5, 0)
    assert await one.stats() == (0, 0, 4, 1)
    assert await two.purge() == 5
    assert await one.stats() == (0, 0, 4, 1)


# -- many consumers ---------------------------------------------------------------------------
async def test_concurrent_consumers_get_each_message_once(queues: Queues) -> None:
    q = queues()
    total = 300
    await q.publish(*(f"m{i}" for i in range(total)))
    clients = [queues.twin(q) for _ in range(6)]
    seen: list[tuple[str, int]] = []

    async def consume(client: Q, who: str) -> None:
        while batch := await client.receive(who, n=4, visibility=30):
            for m in batch:
                seen.append((m.id, m.delivery))
                assert await client.ack(m.receipt, who)

    await asyncio.gather(*(consume(c, f"c{i}") for i, c in enumerate(clients) for _ in range(2)))
    assert sorted(i for i, _ in seen) == sorted(f"m{i}" for i in range(total))
    assert {d for _, d in seen} == {1}
    assert await q.stats() == (0, 0, 0, 0)


CONSUMER = r"""
import asyncio, sys
from jobfence.backends import open_queue_backend

url, name, who, flavour, mode = sys.argv[1:6]

def handle(backend, batch):
    for m in batch:
        print("GOT", m.id, m.delivery, m.receipt, flush=True)
        if mode == "hold":
            sys.stdin.readline()  # killed here, holding the message
        assert backend.ack(m.receipt, who) is True

if flavour == "sync":
    backend = open_queue_backend(url, name, asynchronous=False)
    print("READY", flush=True)
    while batch := backend.receive(who, 3, 1.0, 1.0):
        handle(backend, batch)
    backend.close()
else:
    async def main():
        backend = open_queue_backend(url, name, asynchronous=True)
        print("READY", flush=True)
        while batch := await backend.receive(who, 3, 1.0, 1.0):
            for m in batch:
                print("GOT", m.id, m.delivery, m.receipt, flush=True)
                if mode == "hold":
                    await asyncio.to_thread(sys.stdin.readline)
                assert await backend.ack(m.receipt, who) is True
        await backend.close()
    asyncio.run(main())
print("DONE", flush=True)
"""


def _consumer(url: str, name: str, who: str, sync: bool, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    flavour = "sync" if sync else "async"
    return subprocess.Popen(
        [sys.executable, "-c", CONSUMER, url, name, who, flavour, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
async def test_consumer_processes_get_each_message_once(queues: Queues) -> None:
    q = queues()
    total = 200
    await q.publish(*(f"m{i}" for i in range(total)))
    url = _url(q.backend.table)
    procs = [_consumer(url, q.name, f"p{i}", queues.sync, "ack") for i in range(4)]
    outputs = await asyncio.gather(*(asyncio.to_thread(p.communicate, None, 50) for p in procs))
    got: list[str] = []
    for (out, err), proc in zip(outputs, procs, strict=True):
        assert proc.returncode == 0, err
        assert out.rstrip().endswith("DONE"), out + err
        got += [line.split()[1] for line in out.splitlines() if line.startswith("GOT")]
    assert sorted(got) == sorted(f"m{i}" for i in range(total))  # each exactly once
    assert await q.stats() == (0, 0, 0, 0)


@pytest.mark.slow
async def test_a_killed_consumers_message_is_delivered_again(queues: Queues) -> None:
    q = queues()
    await q.publish("job")
    proc = _consumer(_url(q.backend.table), q.name, "doomed", queues.sync, "hold")
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY"), line + (proc.stderr.read() if proc.stderr else "")
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("GOT job 1"), line
        old_receipt = line.split()[3]
        assert await q.receive("survivor") == []  # still the dead-to-be consumer's
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    [m] = await q.receive("survivor", wait=10)  # after the 1 s visibility
    assert (m.id, m.delivery) == ("job", 2)
    assert not await q.ack(old_receipt, "doomed")
    assert await q.ack(m.receipt, "survivor")


# -- waiting ----------------------------------------------------------------------------------
async def _start_waiting(q: Q, consumer: str, wait: float) -> tuple[asyncio.Task[Any], Statements]:
    """A receive waiting in the background, once its first look found nothing."""
    count = q.count()
    task = asyncio.ensure_future(q.receive(consumer, wait=wait))

    async def looked() -> bool:
        assert not task.done(), task.result()
        return count["receive"] >= 1

    await _until(looked)
    return task, count


async def test_a_waiting_receive_is_woken_by_another_clients_publish(queues: Queues) -> None:
    q = queues()
    publisher = queues.twin(q)
    assert q.backend.capabilities == CAPABILITIES
    task, count = await _start_waiting(q, "c1", wait=30)
    published = time.monotonic()
    await publisher.publish("hello")
    [m] = await asyncio.wait_for(task, 20)
    # woken by the notification: a second look, long before the 30 s wait would end
    assert m.id == "hello"
    assert time.monotonic() - published < 10
    assert count["receive"] == 2


async def test_an_idle_wait_sends_one_statement(queues: Queues) -> None:
    """No polling while idle: one receive statement for a 2 s wait, also while another queue
    of the same table gets messages."""
    q = queues()
    neighbour = queues()
    task, count = await _start_waiting(q, "c1", wait=2.0)
    started = time.monotonic()
    for i in range(5):
        await neighbour.publish(f"n{i}")
        await asyncio.sleep(0.1)
    assert await asyncio.wait_for(task, 20) == []
    assert time.monotonic() - started >= 1.0  # it really waited
    assert count["receive"] == 1
    assert count.total - count["listen"] - count["schema"] - count["schema_version"] == 1


async def test_a_queue_with_a_cut_channel_wakes_only_its_own_consumers(
    queues: Queues, admin: psycopg.Connection[Any]
) -> None:
    """Channels longer than 63 characters are cut, so two queues of a long-named table can
    share one; the payload (the queue name) still keeps their consumers apart."""
    long_table = ("jfq_" + uuid.uuid4().hex[:12]).ljust(58, "x")
    names: dict[str, str] = {}
    for i in range(10_000):
        name = f"long.{i}"
        channel = notify_channel(long_table, name)
        if channel in names:
            break
        names[channel] = name
    assert len(channel) == 63 and "#" in channel
    try:
        mine = queues(names[channel], table=long_table)
        theirs = queues(name, table=long_table)
        assert mine.backend.channel == theirs.backend.channel
        task, count = await _start_waiting(mine, "c1", wait=1.5)
        await theirs.publish("not-for-you")
        assert await asyncio.wait_for(task, 20) == []
        assert count["receive"] == 1  # the other queue's notification woke nobody here
        task, count = await _start_waiting(mine, "c1", wait=30)
        await queues.twin(mine).publish("for-you")
        assert _ids(await asyncio.wait_for(task, 20)) == ["for-you"]
        assert count["receive"] == 2
    finally:
        _drop_table(admin, long_table)


async def test_a_waiting_receive_wakes_when_a_visibility_ends(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [first] = await q.receive("c1", visibility=1.0)
    other = queues.twin(q)
    count = other.count()
    [m] = await other.receive("c2", wait=20)
    assert (m.id, m.delivery) == ("a", 2)
    # the first look said when the delivery ends; no polling in between
    assert 2 <= count["receive"] <= 4
    assert not await q.ack(first.receipt, "c1")


async def test_a_waiting_receive_wakes_when_a_delayed_message_is_due(queues: Queues) -> None:
    q = queues()
    await q.publish("later", delay=1.0)
    count = q.count()
    [m] = await q.receive("c1", wait=20)
    assert m.id == "later"
    assert 2 <= count["receive"] <= 4


async def test_a_nack_wakes_a_waiting_receive(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1", visibility=30)
    waiter = queues.twin(q)
    task, count = await _start_waiting(waiter, "c2", wait=30)
    nacked = time.monotonic()
    assert await q.nack(m.receipt, "c1", 0, "retry")
    [again] = await asyncio.wait_for(task, 20)
    assert (again.id, again.delivery, again.last_error) == ("a", 2, "retry")
    assert time.monotonic() - nacked < 10
    assert count["receive"] == 2


async def test_requeue_dead_wakes_a_waiting_receive(queues: Queues) -> None:
    q = queues()
    await q.publish("a")
    [m] = await q.receive("c1")
    assert await q.dead_letter(m.receipt, "c1", "x")
    waiter = queues.twin(q)
    task, count = await _start_waiting(waiter, "c2", wait=30)
    assert await q.requeue_dead() == 1
    [again] = await asyncio.wait_for(task, 20)
    assert (again.id, again.delivery) == ("a", 1)
    assert count["receive"] == 2


async def test_without_notify_a_waiting_receive_polls(queues: Queues) -> None:
    q = queues(notify="false")
    assert q.backend.capabilities == POLLING_CAPABILITIES
    publisher = queues.twin(q)
    task, count = await _start_waiting(q, "c1", wait=20)
    await publisher.publish("x")
    [m] = await asyncio.wait_for(task, 20)
    assert m.id == "x"
    assert count["listen"] == 0


async def test_close_ends_a_waiting_receive(queues: Queues) -> None:
    q = queues()
    queues.twin(q)  # drops the queue at the end
    task, _ = await _start_waiting(q, "c1", wait=30)
    closed = time.monotonic()
    await q.close()
    assert await asyncio.wait_for(task, 20) == []
    assert time.monotonic() - closed < 10


async def test_close_releases_every_connection(
    queues: Queues, admin: psycopg.Connection[Any]
) -> None:
    app = "jfq_" + uuid.uuid4().hex[:12]
    q = queues(application_name=app)
    queues.twin(q)  # drops the queue at the end
    await q.publish("a")
    await asyncio.gather(q.receive("c1", wait=0.3), q.receive("c2", wait=0.3), q.stats())

    def connections() -> int:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
        return int(row[0]) if row else 0

    assert connections() >= 2  # the pool and the LISTEN connection
    await q.close()

    async def none_left() -> bool:
        return connections() == 0

    await _until(none_left)


async def test_wait_zero_never_blocks(queues: Queues) -> None:
    q = queues()
    await q.publish("later", delay=30)
    count = q.count()
    assert await q.receive("c1", wait=0) == []
    assert count.total == 1


def _use_after_fork(backend: PostgresQueueBackend, results: Any) -> None:
    backend.after_fork()  # forget the parent's connections and listener, without I/O
    backend.publish([("from-child", b"", {})])
    got = backend.receive("child", 10, 30, 5)
    results.put([(m.id, backend.ack(m.receipt, "child")) for m in got])
    backend.close()


@pytest.mark.slow
def test_a_forked_child_opens_its_own_connections(table: str) -> None:
    """The parent's pooled connections and LISTEN connection stay the parent's: a child that
    calls after_fork() works on connections of its own (closing them at its end), and the
    parent's keep working."""
    backend = PostgresQueueBackend(_parsed(_url(table)), name="fork." + uuid.uuid4().hex[:8])
    try:
        assert backend.receive("parent", 1, 30, 0.2) == []  # pool + listener in use
        fork = multiprocessing.get_context("fork")
        results = fork.Queue()
        child = fork.Process(target=_use_after_fork, args=(backend, results))
        child.start()
        assert results.get(timeout=30) == [("from-child", True)]
        child.join(30)
        assert child.exitcode == 0
        backend.publish([("from-parent", b"", {})])
        [m] = backend.receive("parent", 10, 30, 5)
        assert m.id == "from-parent" and backend.ack(m.receipt, "parent")
    finally:
        backend.drop()
        backend.close()


# -- schema, options, registry ------------------------------------------------------------------
async def test_install_is_idempotent_and_concurrent(
    queues: Queues, fresh_table: str, admin: psycopg.Connection[Any]
) -> None:
    clients = [queues(table=fresh_table) for _ in range(6)]
    await asyncio.gather(*(c.install() for c in clients))
    await clients[0].install()
    row = admin.execute(
        "SELECT version FROM jobfence_queue_schema WHERE table_name = %s", (fresh_table,)
    ).fetchone()
    assert row == (1,)
    indexes = admin.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY 1", (fresh_table,)
    ).fetchall()
    assert [i for (i,) in indexes] == [f"{fresh_table}_next", f"{fresh_table}_pkey"]


async def test_the_table_is_created_on_first_use(
    queues: Queues, fresh_table: str, admin: psycopg.Connection[Any]
) -> None:
    q = queues(table=fresh_table)
    assert not _table_exists(admin, fresh_table)
    await q.publish("a")
    assert _table_exists(admin, fresh_table)


@pytest.mark.parametrize("bad", ["1abc", "a-b", 'q"', "x" * 59, ""])
def test_a_bad_table_is_refused(bad: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        AsyncPostgresQueueBackend(_parsed(POSTGRES_URL), name="q", table=bad)
    assert info.value.argument == "table"


def test_options_are_checked() -> None:
    with pytest.raises(ConfigurationError) as info:
        AsyncPostgresQueueBackend(_parsed(POSTGRES_URL), name="q", bogus=1)
    assert info.value.argument == "bogus"
    with pytest.raises(ConfigurationError) as info:
        AsyncPostgresQueueBackend(_parsed(POSTGRES_URL), name="-bad")
    assert info.value.argument == "name"
    with pytest.raises(ConfigurationError) as info:
        AsyncPostgresQueueBackend(_parsed(POSTGRES_URL), name="q", notify="maybe")
    assert info.value.argument == "notify"
    backend = AsyncPostgresQueueBackend(
        _parsed(_url("MyTable", notify="false", timeout="2")), name="q", table="Kw_Table"
    )
    assert backend.table == "kw_table"  # keywords win; one lower-case spelling
    assert backend.capabilities.server_wakeup is False
    assert backend.timeouts.request == 2.0
    assert backend.prepare_threshold == 5
    assert (
        AsyncPostgresQueueBackend(
            _parsed(POSTGRES_URL), name="q", prepare_threshold="none"
        ).prepare_threshold
        is None
    )
    with pytest.raises(ConfigurationError) as info:
        AsyncPostgresQueueBackend(_parsed(POSTGRES_URL), name="q", prepare_threshold=-1)
    assert info.value.argument == "prepare_threshold"
    assert "table=" not in backend._conninfo and "notify=" not in backend._conninfo


def test_the_registry_opens_both_flavours() -> None:
    for scheme in ("postgresql", "postgres"):
        url = POSTGRES_URL.replace("postgresql://", f"{scheme}://", 1)
        assert isinstance(
            open_queue_backend(url, "q", asynchronous=True), AsyncPostgresQueueBackend
        )
        assert isinstance(open_queue_backend(url, "q", asynchronous=False), PostgresQueueBackend)


def _parsed(url: str) -> Any:
    from jobfence._core.url import parse_url

    return parse_url(url)
