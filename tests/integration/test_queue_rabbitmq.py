"""The RabbitMQ queue backend against the real broker, both flavours: ``RabbitQueueBackend``
(pika, called here from worker threads, as a worker's handler threads would) and
``AsyncRabbitQueueBackend`` (aio-pika).

Every test uses a queue of its own (a uuid in its name) and drops it at the end. Consumer
death is a real subprocess killed with SIGKILL; a dropped or hanging link is a real TCP proxy
(``tests/netproxy.py``) between the client and the broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jobfence.backends import open_queue_backend
from jobfence.backends.base import QueuedMessage
from jobfence.backends.rabbitmq.common import (
    DELAY_BUCKETS,
    Route,
    Topology,
    Unsettled,
    delay_bucket,
    fresh,
    parse_incoming,
    unique_waves,
)
from jobfence.errors import BackendError, ConfigurationError
from tests.netproxy import FaultProxy

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("JOBFENCE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
PORT = 5672
FLAVOURS = ["sync", "async"]


class Client:
    """One backend, awaited the same way in both flavours (the blocking one runs each call
    in a worker thread, so calls come from many threads)."""

    def __init__(self, backend: Any, asynchronous: bool) -> None:
        self.backend = backend
        self.asynchronous = asynchronous

    def __getattr__(self, verb: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.backend, verb)
        if self.asynchronous:
            return method  # type: ignore[no-any-return]

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


Factory = Callable[..., Client]


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def name() -> str:
    return f"jf-test-{uuid.uuid4().hex}"


@pytest.fixture
async def make(flavour: str, name: str) -> AsyncIterator[Factory]:
    """``make(queue=name, url=URL, **options)``: a client of the test's flavour, closed at
    the end of the test; every queue a test made is dropped."""
    clients: list[Client] = []
    names: set[str] = set()

    def factory(queue: str = name, url: str = URL, **options: Any) -> Client:
        backend = open_queue_backend(url, queue, asynchronous=flavour == "async", **options)
        client = Client(backend, flavour == "async")
        clients.append(client)
        names.add(queue)
        return client

    yield factory
    for client in clients:
        await client.close()
    for queue in names:
        dropper = Client(open_queue_backend(URL, queue, asynchronous=True), True)
        await dropper.drop()
        await dropper.close()


def ids(messages: list[QueuedMessage]) -> list[str]:
    return [m.id for m in messages]


async def receive_all(client: Client, consumer: str, count: int, wait: float = 10.0) -> list[Any]:
    """Receive until ``count`` messages came (or a wait of ``wait`` seconds got none)."""
    got: list[QueuedMessage] = []
    while len(got) < count:
        batch = await client.receive(consumer, count - len(got), 30.0, wait)
        if not batch:
            break
        got += batch
    return got


# -- publish, receive, ack ------------------------------------------------------------------


async def test_round_trip_of_id_body_headers(make: Factory) -> None:
    q = make()
    before = time.time()
    await q.publish([("order:7", b"\x00body\xff", {"trace": "abc", "x-request-id": "r1"})])
    [m] = await q.receive("c1", 10, 30.0, 5.0)
    assert (m.id, m.body, m.headers, m.delivery, m.last_error) == (
        "order:7",
        b"\x00body\xff",
        {"trace": "abc", "x-request-id": "r1"},
        1,
        None,
    )
    assert m.published_at is not None and before - 1 <= m.published_at <= time.time() + 1
    assert await q.ack(m.receipt, "c1") is True
    assert await q.ack(m.receipt, "c1") is False  # settled already
    assert await q.receive("c1", 10, 30.0, 0) == []
    assert (await q.stats()).ready == 0


async def test_long_id_and_empty_body(make: Factory) -> None:
    q = make()
    long_id = "é" * 300  # 600 bytes: longer than the message_id property can hold
    await q.publish([(long_id, b"", {})])
    [m] = await q.receive("c", 1, 30.0, 5.0)
    assert (m.id, m.body, m.headers) == (long_id, b"", {})


async def test_acks_are_owner_checked(make: Factory) -> None:
    q, other = make(), make()
    await q.publish([("a", b"1", {})])
    [m] = await q.receive("c1", 1, 30.0, 5.0)
    assert await q.ack(m.receipt, "c2") is False  # another consumer of this client
    assert await other.ack(m.receipt, "c1") is False  # another client (connection)
    assert await q.nack(m.receipt, "c2", 0, "x") is False
    assert await q.dead_letter(m.receipt, "c2", "x") is False
    assert await q.ack("not-a-receipt", "c1") is False
    assert await q.renew([(m.receipt, "c1", 30.0), (m.receipt, "c2", 30.0)]) == [True, False]
    assert await q.ack(m.receipt, "c1") is True


async def test_duplicate_ids_are_delivered_twice(make: Factory) -> None:
    q = make()
    await q.publish([("same", b"1", {}), ("same", b"2", {})])
    await q.publish([("same", b"3", {})])
    got = await receive_all(q, "c", 3)
    assert [(m.id, m.body) for m in got] == [("same", b"1"), ("same", b"2"), ("same", b"3")]
    assert len({m.receipt for m in got}) == 3


async def test_fifo_for_one_consumer(make: Factory) -> None:
    q = make()
    await q.publish([(f"m{i}", b"", {}) for i in range(40)])
    await q.publish([(f"m{i}", b"", {}) for i in range(40, 60)])
    got: list[QueuedMessage] = []
    for size in (1, 7, 13, 100):  # several batch sizes
        got += await q.receive("c", size, 30.0, 5.0)
    got += await receive_all(q, "c", 60 - len(got))
    assert ids(got) == [f"m{i}" for i in range(60)]
    assert all(m.delivery == 1 for m in got)


async def test_two_queues_are_isolated(make: Factory, name: str) -> None:
    a, b = make(), make(name + "-b")
    await a.publish([("for-a", b"", {})])
    await b.publish([("for-b", b"", {})])
    assert ids(await a.receive("c", 10, 30.0, 5.0)) == ["for-a"]
    assert ids(await b.receive("c", 10, 30.0, 5.0)) == ["for-b"]
    assert await a.receive("c", 10, 30.0, 0) == []
    assert await b.receive("c", 10, 30.0, 0) == []


async def test_wait_zero_returns_at_once_on_an_empty_queue(make: Factory) -> None:
    q = make()
    assert await q.receive("c", 5, 30.0, 0) == []
    await q.publish([("a", b"", {})])
    assert ids(await q.receive("c", 5, 30.0, 0)) == ["a"]  # published: deliverable at once


async def test_wait_is_woken_by_a_publish_on_another_connection(make: Factory) -> None:
    q, producer = make(), make()
    await q.install()
    started = time.monotonic()
    receiving = asyncio.ensure_future(q.receive("c", 5, 30.0, 60.0))
    await asyncio.sleep(0.3)  # let the receive reach its wait (the outcome does not depend on it)
    await producer.publish([("wake", b"", {})])
    got = await asyncio.wait_for(receiving, 30)
    assert ids(got) == ["wake"]
    assert time.monotonic() - started < 60.0  # woken by the push, not by the end of the wait


async def test_wait_ends_empty_after_its_time(make: Factory) -> None:
    q = make()
    started = time.monotonic()
    assert await q.receive("c", 1, 30.0, 0.5) == []
    assert time.monotonic() - started >= 0.5


# -- nack, delays -------------------------------------------------------------------------


async def test_nack_without_delay_redelivers_at_once_with_count_and_error(make: Factory) -> None:
    q = make()
    await q.publish([("a", b"1", {"h": "v"})])
    [m] = await q.receive("c", 1, 30.0, 5.0)
    assert await q.nack(m.receipt, "c", 0, "boom") is True
    assert await q.nack(m.receipt, "c", 0, "again") is False  # settled already
    [m2] = await q.receive("c", 1, 30.0, 0)
    assert (m2.id, m2.body, m2.headers, m2.delivery, m2.last_error) == (
        "a",
        b"1",
        {"h": "v"},
        2,
        "boom",
    )
    assert m2.published_at == m.published_at  # the same message, not a new one
    # without an error the broker requeues it in place; the earlier error stays on it
    assert await q.nack(m2.receipt, "c", 0, None) is True
    [m3] = await q.receive("c", 1, 30.0, 0)
    assert (m3.id, m3.delivery, m3.last_error) == ("a", 3, "boom")
    assert await q.nack(m3.receipt, "c", 0, "third") is True
    [m4] = await q.receive("c", 1, 30.0, 0)
    assert (m4.delivery, m4.last_error) == (4, "third")
    assert await q.ack(m4.receipt, "c") is True


async def test_nack_with_delay_is_not_delivered_before_it(make: Factory) -> None:
    q = make()
    await q.publish([("a", b"1", {})])
    [m] = await q.receive("c", 1, 30.0, 5.0)
    nacked = time.monotonic()
    assert await q.nack(m.receipt, "c", 1.0, "later") is True
    assert await q.receive("c", 1, 30.0, 0) == []
    [m2] = await q.receive("c", 1, 30.0, 20.0)
    assert time.monotonic() - nacked >= 1.0
    assert (m2.id, m2.body, m2.delivery, m2.last_error) == ("a", b"1", 2, "later")
    assert (await q.stats()).ready == 0


async def test_publish_with_delay(make: Factory) -> None:
    q = make()
    published = time.monotonic()
    await q.publish([("late", b"", {}), ("late2", b"", {})], delay=0.7)
    await q.publish([("now", b"", {})])
    assert ids(await q.receive("c", 5, 30.0, 0)) == ["now"]
    got = await receive_all(q, "c", 2, wait=20.0)
    assert time.monotonic() - published >= 0.7
    assert ids(got) == ["late", "late2"]
    assert all(m.delivery == 1 for m in got)


def test_delays_round_up_to_a_bucket() -> None:
    assert delay_bucket(0.0001) == 10
    assert delay_bucket(0.3) == 300
    assert delay_bucket(30) == 30_000
    assert delay_bucket(31) == 35_000
    assert delay_bucket(0.0211) == 22
    for ms in range(10, 100_000, 7):  # never early, at most 20 % late
        bucket = delay_bucket(ms / 1000)
        assert ms <= bucket <= ms * 1.2
    assert len(DELAY_BUCKETS) == len(set(DELAY_BUCKETS)) < 200
    with pytest.raises(ConfigurationError):
        delay_bucket(50 * 86400)


def test_delivery_counts_and_dead_letters_read_from_headers() -> None:
    """The delivery count from the broker's headers (RabbitMQ 3.10+: x-delivery-count; 4.x:
    x-acquired-count too) plus jobfence's carried count; dead letters RabbitMQ made itself."""

    def parse(headers: dict[str, Any] | None, redelivered: bool = False) -> Any:
        return parse_incoming(
            tag=1,
            body=b"",
            message_id="m",
            headers=headers,
            timestamp=None,
            redelivered=redelivered,
            remaining=None,
        )

    assert parse(None).delivery == 1
    assert parse(None, redelivered=True).delivery == 2  # a queue that counts nothing
    assert parse({"x-delivery-count": 2}).delivery == 3
    assert parse({"x-delivery-count": 1, "x-acquired-count": 4}).delivery == 5
    assert parse({"x-delivery-count": 2, "x-jobfence-deliveries": 3}).delivery == 6
    user = parse({"a": b"bytes", "n": 7, "x-death": [], "x-jobfence-error": "e"})
    assert (user.headers, user.last_error) == ({"a": "bytes", "n": "7"}, "e")
    broker_dead = parse(
        {"x-delivery-count": 20, "x-first-death-reason": "delivery_limit", "x-death": []}
    ).dead_letter()
    assert (broker_dead.deliveries, broker_dead.error) == (
        21,
        "dead-lettered by RabbitMQ: delivery_limit",
    )


def test_waves_never_repeat_a_message_id() -> None:
    messages = [fresh(i, b"", {}, 0.0) for i in ("a", "b", "a", "c", "x" * 300, "x" * 300)]
    waves = [[m.id for m in wave] for wave in unique_waves(messages)]
    assert waves == [["a", "b"], ["a", "c", "x" * 300, "x" * 300]]


async def test_a_delay_queue_deleted_meanwhile_is_declared_again(make: Factory) -> None:
    q, other = make(), make()
    await q.publish([("first", b"", {})], delay=0.05)
    assert ids(await q.receive("c", 1, 30.0, 20.0)) == ["first"]
    await other.purge()  # deletes the delay queues (q still believes its queue exists)
    await q.publish([("second", b"", {})], delay=0.05)  # returned unroutable, then re-sent
    assert ids(await q.receive("c", 1, 30.0, 20.0)) == ["second"]


async def test_a_queue_dropped_by_another_client_is_declared_again(make: Factory) -> None:
    q, other = make(), make()
    await q.install()
    await other.drop()
    await q.publish([("after-drop", b"", {})])
    assert ids(await other.receive("c", 1, 30.0, 5.0)) == ["after-drop"]


@pytest.fixture(params=["batched", "per-message"])
def aio_waves(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the asyncio backend publishes a wave: one write of all its frames (the default),
    or aiormq's ``basic_publish`` per message (what it falls back to on a driver without
    the parts the batched write uses)."""
    if request.param == "per-message":
        from jobfence.backends.rabbitmq import queue_aio

        monkeypatch.setattr(queue_aio, "_BATCH_NEEDS", ("no_such_part",))
    return str(request.param)


async def test_async_waves_keep_order_ids_and_headers(aio_waves: str, name: str) -> None:
    backend = open_queue_backend(URL, name, asynchronous=True)
    try:
        batch = [(f"m{i}", f"b{i}".encode(), {"n": str(i)}) for i in range(250)]
        await backend.publish(batch)
        await backend.publish([("late", b"", {})], 0.05)
        got = await receive_all(Client(backend, True), "c", 251)
        assert [(m.id, m.body, m.headers) for m in got[:250]] == batch
        assert got[250].id == "late"
    finally:
        await backend.drop()
        await backend.close()


@pytest.mark.usefixtures("aio_waves")
async def test_refused_messages_of_a_batch_are_named(flavour: str, name: str) -> None:
    """A publish the broker refuses (``basic.nack``: here a queue full with ``reject-publish``
    overflow) raises, naming exactly the refused messages of the batch; the others of the
    same batch were confirmed and are in the queue. The batch is published at once and its
    confirms awaited together, so the refusals must be told apart per message."""
    route = Route(
        f"{name}.limited",
        {
            "x-queue-type": "classic",
            "x-max-length": 1,
            "x-overflow": "reject-publish",
            "x-expires": 30_000,
        },
    )
    outgoing = [fresh(f"m{i}", b"{}", {}, time.time()) for i in range(1, 4)]
    backend = open_queue_backend(URL, name, asynchronous=flavour == "async")

    async def publish(messages: list[Any]) -> None:
        if flavour == "async":
            await backend._publish(await backend._connected(), route, messages)
        else:
            await asyncio.to_thread(
                backend._run, lambda link: backend._publish(link, route, messages)
            )

    try:
        # the queue does not exist yet: returned, declared (limit 1), published again
        with pytest.raises(BackendError) as refused:
            await publish(outgoing)
        text = str(refused.value)
        assert "did not confirm 2 of the 3" in text and "basic.nack" in text, text
        assert "'m2'" in text and "'m3'" in text and "'m1'" not in text, text
        with pytest.raises(BackendError, match=r"1 of the 1 .*'again'"):
            await publish([fresh("again", b"{}", {}, time.time())])
        # a refusal is no link failure: the same client goes on publishing and receiving
        client = Client(backend, flavour == "async")
        await client.publish([("after", b"{}", {})])
        assert ids(await client.receive("c", 1, 30.0, 5.0)) == ["after"]
    finally:
        client = Client(backend, flavour == "async")
        await client.drop()
        await client.close()


# -- dead letters -------------------------------------------------------------------------


async def test_dead_letters_peek_and_requeue(make: Factory) -> None:
    q = make()
    await q.publish([("a", b"1", {"h": "1"}), ("b", b"2", {}), ("c", b"3", {})])
    got = await receive_all(q, "c", 3)
    before = time.time()
    assert await q.nack(got[0].receipt, "c", 0, "first try") is True
    [a2] = await q.receive("c", 1, 30.0, 5.0)
    assert await q.dead_letter(a2.receipt, "c", "poison") is True
    assert await q.dead_letter(a2.receipt, "c", "poison") is False  # settled already
    assert await q.dead_letter(got[1].receipt, "c", None) is True
    assert await q.dead_letter(got[2].receipt, "c", "x" * 20_000) is True
    stats = await q.stats()
    assert (stats.ready, stats.dead) == (0, 3)

    dead = await q.dead_letters(10)
    assert [(d.id, d.body, d.headers, d.deliveries, d.error) for d in dead] == [
        ("a", b"1", {"h": "1"}, 2, "poison"),
        ("b", b"2", {}, 1, None),
        ("c", b"3", {}, 1, "x" * 8192),  # long errors are cut to 8192 bytes
    ]
    assert all(d.dead_at is not None and d.dead_at >= before - 1 for d in dead)
    assert [d.id for d in await q.dead_letters(2)] == ["a", "b"]  # a peek: still there, in order
    assert (await q.stats()).dead == 3

    assert await q.requeue_dead(["b", "nope"]) == 1
    assert [d.id for d in await q.dead_letters(10)] == ["a", "c"]
    [b] = await q.receive("c", 5, 30.0, 5.0)
    assert (b.id, b.body, b.delivery, b.last_error) == ("b", b"2", 1, None)
    assert await q.requeue_dead() == 2
    got = await receive_all(q, "c", 2)
    assert [(m.id, m.headers, m.delivery, m.last_error) for m in got] == [
        ("a", {"h": "1"}, 1, None),
        ("c", {}, 1, None),
    ]
    assert await q.dead_letters(10) == []
    assert await q.requeue_dead() == 0


# -- stats, purge, drop --------------------------------------------------------------------


async def test_stats_and_purge(make: Factory) -> None:
    q, other = make(), make()
    await q.publish([(f"m{i}", b"", {}) for i in range(4)])
    await q.publish([("delayed", b"", {})], delay=1.0)
    [held] = await q.receive("c", 1, 30.0, 5.0)
    [dying] = await q.receive("c", 1, 30.0, 5.0)
    assert await q.dead_letter(dying.receipt, "c", "x") is True
    stats = await other.stats()
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (2, None, None, 1)

    # ready 2 + this client's held delivery 1 + dead 1 + delayed 1
    assert await q.purge() == 5
    stats = await q.stats()
    assert (stats.ready, stats.dead) == (0, 0)
    assert await q.ack(held.receipt, "c") is False  # purged with the rest
    assert await q.receive("c", 5, 30.0, 2.0) == []  # the delayed one is gone too
    await q.publish([("after", b"", {})])  # the queue is still there
    assert ids(await q.receive("c", 5, 30.0, 5.0)) == ["after"]


async def test_drop_removes_every_server_object(make: Factory, name: str) -> None:
    import pika
    import pika.exceptions

    q = make()
    await q.publish([("d", b"", {})], delay=5.0)
    await q.publish([("m", b"", {})])
    [m] = await q.receive("c", 1, 30.0, 5.0)
    assert await q.dead_letter(m.receipt, "c", None) is True
    topology = Topology(name)
    delay_queue = topology.delay(5.0).queue
    await q.drop()

    connection = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        for queue in (name, topology.dead, delay_queue):
            channel = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                channel.queue_declare(queue, passive=True)
            assert caught.value.reply_code == 404
    finally:
        connection.close()


# -- several consumers ---------------------------------------------------------------------


async def test_several_clients_get_each_message_once(make: Factory) -> None:
    producer = make()
    clients = [make() for _ in range(4)]
    total = 200
    await producer.publish([(f"m{i}", b"", {}) for i in range(total)])
    seen: list[str] = []

    async def consume(client: Client, consumer: str) -> None:
        while True:
            batch = await client.receive(consumer, 3, 30.0, 1.0)
            if not batch:
                return
            for m in batch:
                seen.append(m.id)
                assert await client.ack(m.receipt, consumer) is True

    await asyncio.gather(*(consume(c, f"c{i}") for i, c in enumerate(clients)))
    assert sorted(seen) == sorted(f"m{i}" for i in range(total))


async def test_one_client_shared_by_many_consumers(make: Factory) -> None:
    q = make()
    total = 120
    await q.publish([(f"m{i}", b"", {}) for i in range(total)])
    seen: list[str] = []

    async def consume(consumer: str) -> None:
        while True:
            batch = await q.receive(consumer, 2, 30.0, 1.0)
            if not batch:
                return
            for m in batch:
                seen.append(m.id)
                assert await q.ack(m.receipt, consumer) is True

    await asyncio.gather(*(consume(f"c{i}") for i in range(6)))
    assert sorted(seen) == sorted(f"m{i}" for i in range(total))


async def test_many_settlements_at_once(make: Factory) -> None:
    """Concurrent acks, nacks and dead letters of one client (tasks sharing one round trip,
    or threads taking turns on the connection) each settle their own delivery."""
    q = make()
    await q.publish([(f"m{i}", b"", {}) for i in range(40)])
    got = await receive_all(q, "c", 40)
    assert len(got) == 40
    results = await asyncio.gather(
        *(q.ack(m.receipt, "c") for m in got[:20]),
        *(q.nack(m.receipt, "c", 0, "again") for m in got[20:30]),
        *(q.dead_letter(m.receipt, "c", "dead") for m in got[30:]),
    )
    assert results == [True] * 40
    assert await q.renew([(m.receipt, "c", 30.0) for m in got]) == [False] * 40  # settled
    stats = await q.stats()
    assert (stats.ready, stats.dead) == (10, 10)
    again = await receive_all(q, "c", 10)
    assert sorted(m.id for m in again) == [f"m{i}" for i in range(20, 30)]
    assert {(m.delivery, m.last_error) for m in again} == {(2, "again")}


def test_unsettled_tags_split_a_batch_of_acks() -> None:
    """One ack with ``multiple`` covers the acks that no other unsettled tag precedes; a tag
    counts as unsettled from when a higher one was read (its own delivery may never have been
    read) until its settlement was sent."""
    tags = Unsettled()
    for tag in (1, 2, 3, 4, 6):  # 5 was delivered, never read: still unsettled
        tags.seen(tag)
    assert tags.split([1, 2, 3]) == (3, [])
    assert tags.split([2, 3, 4]) == (None, [2, 3, 4])  # 1 is held elsewhere
    assert tags.split([1, 2, 4, 6]) == (2, [4, 6])  # 3 held: 4 and 6 one by one
    assert tags.split([1, 2, 3, 4, 6]) == (4, [6])  # 5 never read: never covered
    tags.sent([1, 2, 3])
    assert tags.split([4]) == (None, [4])  # one ack saves nothing with multiple
    tags.sent([4])
    tags.seen(5)  # read late: nothing changes
    tags.sent([5])
    tags.seen(8)
    assert tags.split([6, 8]) == (None, [6, 8])  # 7 not read yet
    tags.seen(7)
    assert tags.split([6, 7, 8]) == (8, [])
    tags.sent([6, 7, 8])
    assert len(tags) == 0


async def test_batched_acks_never_settle_a_delivery_held_elsewhere(name: str) -> None:
    """``ack_many`` acks the run of its deliveries that no other open delivery precedes with
    one ``basic.ack`` (``multiple``), the others one by one -- and never settles a delivery
    it was not given: those held below, between and above the acked ones stay the client's
    and settle on their own afterwards (acking a delivery that a ``multiple`` ack had settled
    already would make RabbitMQ close the channel, and a wrongly covered one would be gone)."""
    q = open_queue_backend(URL, name, asynchronous=True)
    try:
        await q.publish([(f"m{i}", b"", {}) for i in range(12)])
        got = await receive_all(Client(q, True), "c", 12)
        assert ids(got) == [f"m{i}" for i in range(12)]
        frames: list[bool] = []  # each basic.ack frame sent: multiple or not
        channel = q._link.channel
        send = channel.basic_ack

        async def counted(tag: int, multiple: bool = False, wait: bool = True) -> None:
            frames.append(multiple)
            await send(tag, multiple=multiple, wait=wait)

        channel.basic_ack = counted

        def batch(*numbers: int) -> list[tuple[str, str]]:
            return [(got[i].receipt, "c") for i in numbers]

        # m4, m5, m9, m10, m11 held: m0-m3 go as one frame, m6-m8 one frame each
        assert await q.ack_many(batch(0, 1, 2, 3, 6, 7, 8)) == [True] * 7
        assert frames == [True, False, False, False]
        assert await q.nack(got[4].receipt, "c", 0, None) is True  # requeued, still m4
        frames.clear()
        # m11 held above: m5, m9 and m10 are everything open below it
        assert await q.ack_many(batch(5, 9, 10)) == [True] * 3
        assert frames == [True]
        assert await q.ack(got[11].receipt, "c") is True
        assert await q.renew([(m.receipt, "c", 30.0) for m in got]) == [False] * 12
        [again] = await q.receive("c", 5, 30.0, 5.0)
        assert (again.id, again.delivery) == ("m4", 2)
        assert await q.ack(again.receipt, "c") is True
        stats = await q.stats()
        assert (stats.ready, stats.dead) == (0, 0)
    finally:
        await q.drop()
        await q.close()


async def test_cancelled_async_receives_lose_nothing(name: str) -> None:
    """An asyncio receive cancelled at any point (in a basic.get, in its wait, while its
    consumer is being cancelled) neither loses a message nor closes the channel: a message
    it got is returned by the next receive, and the client's other deliveries stay valid."""
    import random

    rng = random.Random(5)
    q = open_queue_backend(URL, name, asynchronous=True)
    producer = open_queue_backend(URL, name, asynchronous=True)
    try:
        await q.publish([("held", b"", {})])
        [held] = await q.receive("c", 1, 30.0, 5.0)
        seen: list[str] = []
        for i in range(40):
            receiving = asyncio.ensure_future(q.receive("c", 3, 30.0, 5.0))
            await asyncio.sleep(rng.uniform(0, 0.02))
            await producer.publish([(f"m{i}", b"", {})])
            await asyncio.sleep(rng.uniform(0, 0.01))
            receiving.cancel()
            try:
                for m in await receiving:
                    seen.append(m.id)
                    assert await q.ack(m.receipt, "c") is True
            except asyncio.CancelledError:
                pass
        for m in await receive_all(Client(q, True), "c", 40 - len(seen), wait=2.0):
            seen.append(m.id)
            assert await q.ack(m.receipt, "c") is True
        assert sorted(seen) == sorted(f"m{i}" for i in range(40))
        assert await q.ack(held.receipt, "c") is True  # the channel was never closed
    finally:
        await q.drop()
        await q.close()
        await producer.close()


def test_sync_ack_from_another_thread_while_a_receive_waits(name: str) -> None:
    """A worker's handler thread acks while its main thread waits in receive: the ack is
    handed to the waiting thread and done at once, not after the wait."""
    q = open_queue_backend(URL, name, asynchronous=False)
    try:
        q.publish([("a", b"", {})])
        [m] = q.receive("c", 1, 30.0, 5.0)
        waiting = threading.Event()
        done = threading.Event()
        result: list[Any] = []

        def wait_long() -> None:
            waiting.set()
            result.append(q.receive("c", 1, 30.0, 30.0))
            done.set()

        waiter = threading.Thread(target=wait_long)
        waiter.start()
        waiting.wait(5)
        time.sleep(0.3)  # into its wait (an earlier ack would be fine as well)
        assert q.ack(m.receipt, "c") is True
        assert not done.is_set()  # the ack did not wait for the receive's 30 s
        assert q.stats().ready == 0  # nor does a request that needs a reply
        q.publish([("b", b"", {})])  # and a publish wakes the waiting receive
        assert done.wait(20)
        waiter.join(5)
        assert ids(result[0]) == ["b"]
    finally:
        q.drop()
        q.close()


def test_sync_many_threads_one_client(name: str) -> None:
    q = open_queue_backend(URL, name, asynchronous=False)
    total = 150
    seen: list[str] = []
    mutex = threading.Lock()
    errors: list[BaseException] = []

    def consume(consumer: str) -> None:
        try:
            while True:
                batch = q.receive(consumer, 2, 30.0, 1.0)
                if not batch:
                    return
                for m in batch:
                    with mutex:
                        seen.append(m.id)
                    assert q.ack(m.receipt, consumer) is True
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=consume, args=(f"c{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for start in range(0, total, 10):  # published while they wait
            q.publish([(f"m{i}", b"", {}) for i in range(start, start + 10)])
        for t in threads:
            t.join(60)
        assert errors == []
        assert sorted(seen) == sorted(f"m{i}" for i in range(total))
    finally:
        q.drop()
        q.close()


# -- consumer death, lost connections -------------------------------------------------------

CONSUMER = r"""
import sys, time
from jobfence.backends import open_queue_backend

url, name, flavour = sys.argv[1:4]
if flavour == "sync":
    q = open_queue_backend(url, name, asynchronous=False)
    [m] = q.receive("victim", 1, 30.0, 20.0)
    print("GOT", m.id, m.delivery, flush=True)
    time.sleep(120)
else:
    import asyncio
    async def main():
        q = open_queue_backend(url, name, asynchronous=True)
        [m] = await q.receive("victim", 1, 30.0, 20.0)
        print("GOT", m.id, m.delivery, flush=True)
        await asyncio.sleep(120)
    asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_killed_consumers_message_goes_to_another(
    make: Factory, flavour: str, name: str
) -> None:
    q = make()
    await q.publish([("job", b"payload", {})])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, URL, name, flavour],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        assert line.split() == ["GOT", "job", "1"]
        assert await q.receive("other", 1, 30.0, 0) == []  # held by the live consumer
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        [m] = await q.receive("other", 1, 30.0, 20.0)
        assert (m.id, m.body, m.delivery) == ("job", b"payload", 2)
        assert await q.ack(m.receipt, "other") is True
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


async def test_ack_after_the_connection_dropped_is_refused(make: Factory) -> None:
    with FaultProxy(PORT) as proxy:
        q = make(url=proxy.url_for(URL, PORT))
        direct = make()
        await q.publish([("a", b"1", {}), ("b", b"2", {})])
        first = await q.receive("c", 2, 30.0, 5.0)
        assert ids(first) == ["a", "b"]
        proxy.reset()  # the broker sees the connection die and requeues both
        assert await q.ack(first[0].receipt, "c") is False
        assert await q.renew([(first[1].receipt, "c", 30.0)]) == [False]
        assert await q.nack(first[1].receipt, "c", 0, "x") is False
        again = await receive_all(direct, "d", 2)
        assert [(m.id, m.delivery) for m in again] == [("a", 2), ("b", 2)]
        # the dropped client connects again on its next call
        await q.publish([("c", b"3", {})])
        assert ids(await q.receive("c", 1, 30.0, 5.0)) == ["c"]
        assert await q.ack(first[0].receipt, "c") is False  # still the old channel's


async def test_a_waiting_receive_ends_when_the_connection_drops(
    make: Factory, flavour: str
) -> None:
    import pika.exceptions

    # the driver's error (pika's while it reads) or ConnectionError (aiormq's are ones too)
    lost = (ConnectionError, pika.exceptions.AMQPError) if flavour == "sync" else ConnectionError
    with FaultProxy(PORT) as proxy:
        q = make(url=proxy.url_for(URL, PORT))
        await q.install()
        started = time.monotonic()
        receiving = asyncio.ensure_future(q.receive("c", 1, 30.0, 60.0))
        await asyncio.sleep(0.3)  # into its wait
        proxy.reset()
        with pytest.raises(lost):
            await asyncio.wait_for(receiving, 30)
        assert time.monotonic() - started < 60.0  # not after the whole wait
        await q.publish([("a", b"", {})])  # connects again
        assert ids(await q.receive("c", 1, 30.0, 5.0)) == ["a"]


async def test_close_ends_a_waiting_receive(make: Factory) -> None:
    q = make()
    await q.install()
    started = time.monotonic()
    receiving = asyncio.ensure_future(q.receive("c", 1, 30.0, 60.0))
    await asyncio.sleep(0.3)  # into its wait
    await q.close()
    assert await asyncio.wait_for(receiving, 30) == []
    assert time.monotonic() - started < 60.0


async def test_a_hanging_link_fails_within_the_timeout(make: Factory) -> None:
    with FaultProxy(PORT) as proxy:
        q = make(url=proxy.url_for(URL, PORT), timeout=0.5, connect_timeout=0.5)
        direct = make()
        await q.publish([("a", b"1", {})])
        [m] = await q.receive("c", 1, 30.0, 5.0)
        proxy.stall()
        started = time.monotonic()
        assert await q.ack(m.receipt, "c") is False  # no reply: not known to be acked
        assert time.monotonic() - started < 10.0  # bounded by the deadline, not by TCP
        with pytest.raises(TimeoutError):  # a new connection cannot be opened either
            await q.publish([("b", b"2", {})])
        # the broker keeps a hung connection until its heartbeats fail; cut it instead
        proxy.reset()
        [again] = await receive_all(direct, "d", 1)
        assert (again.id, again.delivery) == ("a", 2)
        proxy.resume()
        await q.publish([("b", b"2", {})])  # and the client connects again
        assert ids(await direct.receive("d", 1, 30.0, 5.0)) == ["b"]


def test_an_idle_sync_client_keeps_its_connection(name: str) -> None:
    """pika answers heartbeats only while something reads: the heartbeat thread does, so a
    client holding a delivery through a long handler (no calls for several heartbeat
    intervals) keeps it."""
    q = open_queue_backend(URL, name, asynchronous=False, heartbeat=1)
    try:
        q.publish([("a", b"", {})])
        [m] = q.receive("c", 1, 30.0, 5.0)
        time.sleep(4.0)  # idle for four heartbeat intervals: two missed would close it
        assert q.renew([(m.receipt, "c", 30.0)]) == [True]
        assert q.ack(m.receipt, "c") is True
    finally:
        q.drop()
        q.close()
    assert not [t for t in threading.enumerate() if t.name == "jobfence-rabbitmq-heartbeat"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_after_fork_the_child_uses_its_own_connection(name: str) -> None:
    q = open_queue_backend(URL, name, asynchronous=False)
    try:
        q.publish([("parent", b"", {})])
        [m] = q.receive("p", 1, 30.0, 5.0)
        pid = os.fork()
        if pid == 0:  # the child: never touches the parent's connection
            code = 1
            try:
                q.after_fork()
                q.publish([("child", b"", {})])
                q.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert q.ack(m.receipt, "p") is True  # the parent's connection is intact
        assert ids(q.receive("p", 5, 30.0, 5.0)) == ["child"]
    finally:
        q.drop()
        q.close()


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True])
def test_configuration_errors(asynchronous: bool) -> None:
    def open_(url: str = URL, name: str = "jf-conf", **options: Any) -> Any:
        return open_queue_backend(url, name, asynchronous=asynchronous, **options)

    with pytest.raises(ConfigurationError) as caught:
        open_(prefetch=5)
    assert caught.value.argument == "prefetch"
    with pytest.raises(ConfigurationError) as caught:
        open_(URL + "?bogus=1")
    assert caught.value.argument == "bogus"
    with pytest.raises(ConfigurationError) as caught:
        open_(heartbeat="soon")
    assert caught.value.argument == "heartbeat"
    with pytest.raises(ConfigurationError) as caught:
        open_(cafile="/ca.pem")  # TLS option on amqp://
    assert caught.value.argument == "cafile"
    for bad in ("orders.dead", "orders.delay.500", "-x", ""):
        with pytest.raises(ConfigurationError) as caught:
            open_(name=bad)
        assert caught.value.argument == "name"
    backend = open_(timeout="2.5", heartbeat=10)
    assert backend._settings.timeouts.request == 2.5
    assert backend._settings.heartbeat == 10
    assert backend._settings.vhost == "/"
    assert open_("amqp://u:p@h/%2F")._settings.vhost == "/"
    assert open_("amqp://u:p@h/prod")._settings.vhost == "prod"
    assert open_("amqps://u:p@h/")._settings.port == 5671
    assert open_("amqps://u:p@h/")._settings.tls is not None


async def test_headers_that_do_not_fit_are_refused(make: Factory) -> None:
    """Reserved names, names longer than an AMQP field name, and headers too large for one
    frame (which would make RabbitMQ close the connection) are refused before sending."""
    q = make()
    await q.publish([("first", b"", {})])
    [held] = await q.receive("c", 1, 30.0, 5.0)
    bad = [
        {"x-jobfence-error": "v"},
        {"x-delivery-count": "1"},
        {"x-death": "v"},
        {"x-first-death-queue": "v"},
        {"n" * 129: "v"},
        {f"h{i}": "v" * 4000 for i in range(40)},  # 160 kB
    ]
    for headers in bad:
        with pytest.raises(ConfigurationError) as caught:
            await q.publish([("a", b"", headers)])
        assert caught.value.argument == "headers"
    big = {f"h{i:02}": "é" * 700 for i in range(64)}  # 64 headers of 1400 bytes: they fit
    await q.publish([("big", b"", big)])
    [m] = await q.receive("c", 1, 30.0, 5.0)
    assert (m.id, m.headers) == ("big", big)
    assert await q.dead_letter(m.receipt, "c", "é" * 5000) is True  # 10 kB of error
    [dead] = await q.dead_letters(1)
    assert dead.error == "é" * 4096  # cut to 8192 bytes
    assert await q.ack(held.receipt, "c") is True  # the connection lived through it all
