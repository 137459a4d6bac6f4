"""The Redis queue backend (Redis Streams) against the real Redis of tests/servers.py: every
semantic of the queue backend contract, sync and async, plus what is Redis's own -- waiting
without polling, re-sent scripts after a lost reply, the keys it keeps, a consumer killed
mid-message.

Each test works on a queue of its own (a fresh uuid name) and drops it at the end. The async
backend runs on an event loop in a thread of its own, behind a thin blocking view, so that one
test body drives both flavours (threads included).
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from jobfence.backends import open_queue_backend
from jobfence.backends.redis import queue as sync_queue_module
from jobfence.backends.redis import queue_async as async_queue_module
from jobfence.backends.redis.queue import RedisQueueBackend
from jobfence.errors import ConfigurationError
from tests.reliability._redis_server import RedisServer
from tests.servers import REDIS_URL

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
#: commands a connection sends while it opens (not the backend's own requests)
_HANDSHAKE = {"CLIENT", "SELECT", "HELLO", "AUTH", "PING"}


# -- flavours ------------------------------------------------------------------------------
class LoopThread:
    """An event loop running in a thread: the async backend's home in these tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="queue-loop")
        self.thread.daemon = True
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class AsyncView:
    """The blocking face of an ``AsyncRedisQueueBackend``: every coroutine method runs on the
    loop thread and is waited for; everything else is the backend's own attribute."""

    def __init__(self, backend: Any, loop: LoopThread) -> None:
        self.backend = backend
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.backend, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(attr(*args, **kwargs))

        return call


class CountingConnection(redis.Connection):
    """A blocking connection that records the name of every command it sends."""

    sent: list[str] = []

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.sent.append(str(args[0]).upper())
        super().send_command(*args, **kwargs)


class CountingAsyncConnection(redis.asyncio.Connection):
    """The asyncio twin of :class:`CountingConnection` (same record)."""

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.sent.append(str(args[0]).upper())
        await super().send_command(*args, **kwargs)


def _requests() -> list[str]:
    """The commands the counting connections sent since the last reset, minus handshakes."""
    return [name for name in CountingConnection.sent if name not in _HANDSHAKE]


Make = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(flavour: str) -> Iterator[Make]:
    """``make(name=None, counted=False, **options)``: a queue backend of ``flavour`` (a fresh
    queue name unless given); ``counted`` routes its commands through the counting
    connections. Every backend made is dropped and closed at the end."""
    loop = LoopThread() if flavour == "async" else None
    made: list[Any] = []

    def factory(name: str | None = None, *, counted: bool = False, **options: Any) -> Any:
        name = name or "t" + uuid.uuid4().hex[:16]
        if counted:
            options["connection_class"] = (
                CountingAsyncConnection if loop is not None else CountingConnection
            )
        backend = open_queue_backend(REDIS_URL, name, asynchronous=loop is not None, **options)
        view = backend if loop is None else AsyncView(backend, loop)
        made.append(view)
        return view

    CountingConnection.sent = []
    try:
        yield factory
    finally:
        for view in made:
            try:
                view.drop()
            finally:
                view.close()
        if loop is not None:
            loop.stop()


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def _messages(*ids: str) -> list[tuple[str, bytes, dict[str, str]]]:
    return [(i, f"body of {i}".encode(), {"n": i}) for i in ids]


def _counts(q: Any) -> tuple[int | None, ...]:
    """``stats()`` as a tuple (ready, delayed, in_flight, dead)."""
    s = q.stats()
    return (s.ready, s.delayed, s.in_flight, s.dead)


def _key(q: Any, suffix: str) -> str:
    """The key of queue backend ``q`` ending in ``:<suffix>``."""
    [key] = [k for k in q.keys if k.endswith(f":{suffix}")]
    return key


def _wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def _blocked_in_xread(raw: redis.Redis, client_name: str) -> bool:
    """Whether the client named ``client_name`` is blocked in ``XREAD`` on the server."""
    for client in raw.client_list():
        if client.get("name") == client_name and client.get("cmd") == "xread":
            return "b" in client.get("flags", "")
    return False


# -- publish, receive, ack -----------------------------------------------------------------
def test_a_published_message_is_received_once_and_acked_away(make: Make, raw: redis.Redis) -> None:
    q = make()
    before = time.time()
    q.publish([("order:7", b"\x00\xff binary \n body", {"trace": "abc", "k": "v"})])
    assert _counts(q) == (1, 0, 0, 0)
    [m] = q.receive("c1", 10, 30, 0)
    assert (m.id, m.body, m.headers, m.delivery, m.last_error) == (
        "order:7",
        b"\x00\xff binary \n body",
        {"trace": "abc", "k": "v"},
        1,
        None,
    )
    assert m.published_at is not None and abs(m.published_at - before) < 60  # server clock
    assert q.receive("c2", 10, 30, 0) == []  # in flight: nobody else gets it
    assert _counts(q) == (0, 0, 1, 0)
    assert q.ack(m.receipt, "c2") is False  # not c2's delivery
    assert q.ack(m.receipt, "c1") is True
    assert q.ack(m.receipt, "c1") is False  # a second ack: the delivery is finished
    assert _counts(q) == (0, 0, 0, 0)
    # acked entries leave the stream and every in-flight record: nothing piles up
    stream, in_flight, owners = _key(q, "s"), _key(q, "f"), _key(q, "o")
    assert raw.xlen(stream) == 0 and raw.zcard(in_flight) == 0 and raw.hlen(owners) == 0
    assert raw.xpending(stream, "jobfence")["pending"] == 0
    assert q.ack("not-a-receipt", "c1") is False


def test_receive_delivers_in_publish_order_across_batches(make: Make) -> None:
    q = make()
    ids = [f"m{i}" for i in range(30)]
    q.publish(_messages(*ids[:20]))
    q.publish(_messages(*ids[20:]))
    got: list[str] = []
    while len(got) < len(ids):
        batch = q.receive("solo", 7, 30, 0)
        assert 0 < len(batch) <= 7
        got += [m.id for m in batch]
        for m in batch:
            assert q.ack(m.receipt, "solo")
    assert got == ids


def test_a_batch_is_one_script_run_in_publish_order(make: Make) -> None:
    """``publish`` of 100 messages (each with its id and headers, the batch delayed or not) is
    ONE command -- one ``EVALSHA`` -- and they are delivered in publish order."""
    q = make(counted=True)
    batch = [(f"m{i}", f"body {i}".encode(), {"n": str(i)}) for i in range(100)]
    CountingConnection.sent.clear()
    q.publish(batch)
    assert _requests() == ["EVALSHA"]
    got = q.receive("c", 100, 30, 0)
    assert [(m.id, m.body, m.headers) for m in got] == batch
    CountingConnection.sent.clear()
    q.publish([(f"d{i}", b"", {}) for i in range(100)], 30.0)
    assert _requests() == ["EVALSHA"]


def test_ids_are_not_unique_a_message_published_twice_is_delivered_twice(make: Make) -> None:
    q = make()
    q.publish([("same", b"1", {}), ("same", b"2", {})])
    q.publish([("same", b"3", {})])
    got = q.receive("c", 10, 30, 0)
    assert [(m.id, m.body, m.delivery) for m in got] == [
        ("same", b"1", 1),
        ("same", b"2", 1),
        ("same", b"3", 1),
    ]
    assert len({m.receipt for m in got}) == 3
    assert all(q.ack(m.receipt, "c") for m in got)


def test_wait_zero_never_blocks_and_an_empty_wait_returns_nothing_after_the_wait(
    make: Make,
) -> None:
    q = make(counted=True)
    assert q.receive("c", 5, 30, 0) == []
    assert _requests() == ["EVALSHA"]  # one script run, no XREAD
    started = time.monotonic()
    assert q.receive("c", 5, 30, 0.4) == []
    assert time.monotonic() - started >= 0.39


# -- redelivery: visibility, renewal, nack ---------------------------------------------------
def test_a_delivery_whose_visibility_passed_goes_to_another_consumer_and_the_old_receipt_is_refused(
    make: Make,
) -> None:
    q = make()
    waiter = make(q.name, counted=True, timeout=30)  # one XREAD may block for 24 s
    q.publish(_messages("m"))
    [first] = q.receive("A", 1, 0.5, 0)
    assert q.receive("B", 1, 0.5, 0) == []
    CountingConnection.sent = []
    started = time.monotonic()
    [second] = waiter.receive("B", 1, 30, 20)
    assert time.monotonic() - started < 15  # woken when the visibility passed, not at 20 s
    # one wait: script, XREAD BLOCK until the deadline the script reported, script
    assert _requests().count("EVALSHA") <= 3 and len(_requests()) <= 5
    assert (second.id, second.delivery) == ("m", 2)
    assert second.receipt != first.receipt
    assert q.ack(first.receipt, "A") is False
    assert q.nack(first.receipt, "A", 0, "late") is False
    assert q.renew([(first.receipt, "A", 30)]) == [False]
    assert q.dead_letter(first.receipt, "A", "late") is False
    assert _counts(q) == (0, 0, 1, 0)  # the new delivery is untouched
    assert q.receive("A", 1, 30, 0) == []
    assert q.ack(second.receipt, "B") is True
    assert q.ack(first.receipt, "A") is False  # still refused once B finished it
    assert _counts(q) == (0, 0, 0, 0)


def test_the_same_consumer_gets_its_expired_delivery_again_with_a_new_receipt(make: Make) -> None:
    q = make()
    q.publish(_messages("m"))
    [first] = q.receive("A", 1, 0.3, 0)
    [again] = q.receive("A", 1, 30, 5)
    assert again.delivery == 2 and again.receipt != first.receipt
    assert q.ack(first.receipt, "A") is False
    assert q.ack(again.receipt, "A") is True


def test_renew_keeps_a_delivery_hidden_and_a_late_renew_fails(make: Make) -> None:
    q = make()
    q.publish(_messages("kept", "late"))
    [kept] = q.receive("A", 1, 1.0, 0)
    for _ in range(5):  # 1.5 s in all, longer than the visibility
        time.sleep(0.3)
        assert q.renew([(kept.receipt, "A", 1.0)]) == [True]
        assert [m.id for m in q.receive("B", 1, 0.6, 0)] in (["late"], [])
    assert q.ack(kept.receipt, "A") is True
    # "late" went to B above; let its visibility pass without renewing it
    [late] = q.receive("A", 1, 0.3, 5)
    assert late.id == "late"
    time.sleep(0.5)
    assert q.renew([(late.receipt, "A", 30)]) == [False]  # passed, though nobody took it yet
    [again] = q.receive("B", 1, 30, 0)
    assert (again.id, again.delivery) == ("late", late.delivery + 1)
    assert q.ack(again.receipt, "B")


def test_an_expired_delivery_nobody_took_yet_can_still_be_acked(make: Make) -> None:
    q = make()
    q.publish(_messages("slow"))
    [m] = q.receive("A", 1, 0.2, 0)
    time.sleep(0.3)
    assert q.renew([(m.receipt, "A", 30)]) == [False]
    assert q.ack(m.receipt, "A") is True  # the work is done: no redelivery
    assert q.receive("B", 1, 30, 0) == []
    assert _counts(q) == (0, 0, 0, 0)


def test_a_cancelled_async_wait_strands_nothing() -> None:
    """An asyncio receive cancelled while it blocks in XREAD has taken nothing: XREAD only
    waits, so the next message goes to the next consumer as a first delivery."""

    async def main() -> None:
        q = open_queue_backend(REDIS_URL, "t" + uuid.uuid4().hex[:16], asynchronous=True)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(q.receive("gone", 1, 30, 10), 0.3)
            await q.publish(_messages("after"))
            [m] = await q.receive("other", 1, 30, 0)
            assert (m.id, m.delivery) == ("after", 1)
            assert await q.ack(m.receipt, "other")
        finally:
            await q.drop()
            await q.close()

    asyncio.run(main())


def test_renew_of_many_receipts_is_one_round_trip_and_owner_checked(make: Make) -> None:
    q = make(counted=True)
    q.publish(_messages("a", "b", "c"))
    a, b, c = q.receive("A", 3, 30, 0)
    CountingConnection.sent = []
    result = q.renew(
        [
            (a.receipt, "A", 60),
            (b.receipt, "someone-else", 60),
            ("1-0:1", "A", 60),
            (c.receipt, "A", 60),
            ("garbage", "A", 60),
        ]
    )
    assert result == [True, False, False, True, False]
    assert _requests() == ["EVALSHA"]
    assert q.renew([]) == []


def test_nack_gives_a_message_back_at_once_or_after_its_delay(make: Make) -> None:
    q = make(counted=True, timeout=30)  # one XREAD may block for 24 s
    q.publish(_messages("m"))
    [m] = q.receive("A", 1, 30, 0)
    assert q.nack(m.receipt, "B", 0, "not mine") is False
    assert q.nack(m.receipt, "A", 0, "boom") is True
    assert q.nack(m.receipt, "A", 0, "twice") is False
    [again] = q.receive("A", 1, 30, 0)
    assert (again.id, again.body, again.headers, again.delivery, again.last_error) == (
        "m",
        m.body,
        m.headers,
        2,
        "boom",
    )
    assert again.published_at == m.published_at  # the original publish time
    started = time.monotonic()
    assert q.nack(again.receipt, "A", 0.6, None) is True
    assert q.receive("A", 1, 30, 0) == []
    assert _counts(q) == (0, 1, 0, 0)
    CountingConnection.sent = []
    [third] = q.receive("A", 1, 30, 20)
    assert 0.55 <= time.monotonic() - started < 15  # not before its delay, woken when due
    assert _requests().count("EVALSHA") <= 3  # woken at the due time, not by polling
    assert (third.delivery, third.last_error) == (3, None)
    assert q.ack(third.receipt, "A")


def test_a_delayed_publish_is_not_delivered_before_its_delay(make: Make) -> None:
    q = make(timeout=30)  # one XREAD may block for 24 s
    started = time.monotonic()
    q.publish(_messages(*(f"d{i}" for i in range(15))), delay=0.5)
    q.publish(_messages("now"))
    assert [m.id for m in q.receive("c", 10, 30, 0)] == ["now"]
    assert _counts(q) == (0, 15, 1, 0)
    got: list[Any] = []
    while len(got) < 15:
        got += q.receive("c", 20, 30, 20)
    assert 0.45 <= time.monotonic() - started < 15  # not before the delay, woken when due
    # messages due in the same millisecond keep their publish order (more than ten of them)
    assert [m.id for m in got] == [f"d{i}" for i in range(15)]
    assert all(m.delivery == 1 for m in got)


# -- dead letters ----------------------------------------------------------------------------
def test_dead_letters_are_listed_oldest_first_and_requeued(make: Make) -> None:
    q = make()
    q.publish(_messages("m1", "m2", "m3"))
    m1, m2, m3 = q.receive("A", 3, 30, 0)
    assert q.nack(m1.receipt, "A", 0, "first try")
    [m1] = q.receive("A", 1, 30, 0)
    assert q.dead_letter(m1.receipt, "B", "not B's") is False
    assert q.dead_letter(m1.receipt, "A", "final") is True
    assert q.dead_letter(m2.receipt, "A", None) is True
    assert q.dead_letter(m2.receipt, "A", None) is False
    assert _counts(q) == (0, 0, 1, 2)
    dead = q.dead_letters(10)
    assert [(d.id, d.body, d.headers, d.deliveries, d.error) for d in dead] == [
        ("m1", b"body of m1", {"n": "m1"}, 2, "final"),
        ("m2", b"body of m2", {"n": "m2"}, 1, None),
    ]
    assert all(d.dead_at is not None for d in dead)
    assert [d.id for d in q.dead_letters(1)] == ["m1"]
    assert q.dead_letters(0) == []
    assert q.requeue_dead(["nothing-like-it"]) == 0
    assert q.requeue_dead([]) == 0
    assert q.requeue_dead(["m2"]) == 1
    assert [d.id for d in q.dead_letters(10)] == ["m1"]
    [back] = q.receive("A", 1, 30, 0)
    assert (back.id, back.delivery, back.last_error, back.body) == ("m2", 1, None, m2.body)
    assert q.requeue_dead() == 1
    [back1] = q.receive("A", 1, 30, 0)
    assert (back1.id, back1.delivery) == ("m1", 1)
    assert _counts(q) == (0, 0, 3, 0)
    for m in (m3, back, back1):
        assert q.ack(m.receipt, "A")


def test_requeue_dead_pages_through_many_dead_letters(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (sync_queue_module, async_queue_module):
        monkeypatch.setattr(module, "REQUEUE_PAGE", 2)
    q = make()
    ids = ["d0", "d1", "dup", "d3", "dup", "d5"]
    q.publish(_messages(*ids))
    for m in q.receive("A", 10, 30, 0):
        assert q.dead_letter(m.receipt, "A", "x")
    assert q.requeue_dead(["d1", "d5", "dup"]) == 4  # across pages, both copies of "dup"
    assert [d.id for d in q.dead_letters(10)] == ["d0", "d3"]
    assert q.requeue_dead(None) == 2
    assert _counts(q) == (6, 0, 0, 0)
    assert sorted(m.id for m in q.receive("A", 10, 30, 0)) == sorted(ids)


def test_max_dead_letters_trims_the_oldest(make: Make) -> None:
    q = make(max_dead_letters=2)
    q.publish(_messages("a", "b", "c"))
    for m in q.receive("A", 3, 30, 0):
        assert q.dead_letter(m.receipt, "A", None)
    assert [d.id for d in q.dead_letters(10)] == ["b", "c"]


# -- stats, purge, drop, isolation -----------------------------------------------------------
def test_stats_count_every_state_and_purge_deletes_them_all(make: Make, raw: redis.Redis) -> None:
    q = make()
    q.publish(_messages("r1", "r2", "f1", "x1"))
    q.publish(_messages("later"), delay=60)
    f1, x1 = q.receive("A", 2, 30, 0)[:2]
    assert q.dead_letter(x1.receipt, "A", "dead")
    assert _counts(q) == (2, 1, 1, 1)
    assert q.purge() == 5
    assert _counts(q) == (0, 0, 0, 0)
    assert q.ack(f1.receipt, "A") is False
    assert q.dead_letters(10) == []
    assert q.receive("A", 10, 30, 0) == []
    q.publish(_messages("after"))  # the queue works on after a purge
    [m] = q.receive("A", 1, 30, 0)
    assert (m.id, m.delivery) == ("after", 1)
    assert q.ack(m.receipt, "A")
    q.drop()
    assert raw.exists(*q.keys) == 0
    prefix = q.keys[0][: -len("s")]
    assert list(raw.scan_iter(match=prefix.replace("{", "[{]").replace("}", "[}]") + "*")) == []


def test_install_creates_the_stream_and_group_and_is_idempotent(
    make: Make, raw: redis.Redis
) -> None:
    q = make()
    q.install()
    q.install()
    [group] = raw.xinfo_groups(q.keys[0])
    assert group["name"] == b"jobfence"


def test_two_queue_names_never_see_each_others_messages(make: Make) -> None:
    one, two = make(), make()
    one.publish(_messages("for-one"))
    two.publish(_messages("for-two"))
    two.publish(_messages("later-two"), delay=60)
    [m] = one.receive("c", 10, 30, 0)
    assert m.id == "for-one"
    assert one.dead_letter(m.receipt, "c", "x")
    assert _counts(one) == (0, 0, 0, 1)
    assert _counts(two) == (1, 1, 0, 0)
    assert two.dead_letters(10) == []
    assert one.purge() == 1
    assert [m.id for m in two.receive("c", 10, 30, 0)] == ["for-two"]


def test_namespaces_keep_queues_of_the_same_name_apart(make: Make) -> None:
    name = "t" + uuid.uuid4().hex[:16]
    first, second = make(name), make(name, namespace="other-ns")
    first.publish(_messages("x"))
    assert second.receive("c", 1, 30, 0) == []
    assert second.keys[0].startswith("other-ns:q:{")


def test_every_key_of_a_queue_is_in_one_cluster_slot(make: Make) -> None:
    q = make("orders:eu.1-b")
    assert len({key_slot(key.encode()) for key in q.keys}) == 1
    assert all("{orders:eu.1-b}" in key for key in q.keys)


# -- many consumers, waiting -----------------------------------------------------------------
def test_many_consumers_in_threads_get_each_message_exactly_once(make: Make) -> None:
    name = "t" + uuid.uuid4().hex[:16]
    publisher = make(name)
    ids = [f"m{i}" for i in range(300)]
    consumers = [make(name) for _ in range(8)]
    got: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consume(index: int) -> None:
        q = consumers[index]
        try:
            while True:
                with lock:
                    if len(got) >= len(ids):
                        return
                batch = q.receive(f"worker-{index}", 5, 30, 0.3)
                for m in batch:
                    assert q.ack(m.receipt, f"worker-{index}")
                with lock:
                    got.extend(m.id for m in batch)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(consumers))]
    for thread in threads:
        thread.start()
    for start in range(0, len(ids), 50):
        publisher.publish(_messages(*ids[start : start + 50]))
    for thread in threads:
        thread.join(50)
    assert errors == []
    assert sorted(got) == sorted(ids)  # every message once: none lost, none twice
    assert _counts(publisher) == (0, 0, 0, 0)


def test_an_idle_waiter_sends_three_commands_per_wait(make: Make) -> None:
    q = make(counted=True)
    started = time.monotonic()
    assert q.receive("c", 1, 30, 1.5) == []
    assert time.monotonic() - started >= 1.45
    # a script run, one XREAD BLOCK for the whole wait, a last script run: no polling
    assert _requests() == ["EVALSHA", "XREAD", "EVALSHA"]


def test_a_waiting_receive_is_woken_by_a_publish_from_another_client(
    make: Make, raw: redis.Redis
) -> None:
    client_name = "jfq-" + uuid.uuid4().hex[:12]
    waiter = make(counted=True, client_name=client_name)
    publisher = make(waiter.name)
    got: list[Any] = []
    took: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        got.extend(waiter.receive("w", 1, 30, 20))
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        _wait_until(lambda: _blocked_in_xread(raw, client_name), "the waiter blocks in XREAD")
    finally:
        publisher.publish(_messages("wake"))
        thread.join(30)
    assert [m.id for m in got] == ["wake"]
    assert took[0] < 20  # woken by the publish, not at the end of its wait
    assert _requests() == ["EVALSHA", "XREAD", "EVALSHA"]  # no polling meanwhile


def test_a_consumer_killed_mid_message_loses_it_to_another_after_the_visibility(
    make: Make, flavour: str
) -> None:
    q = make()
    q.publish(_messages("job"))
    code = (
        "import asyncio, sys, time\n"
        "from jobfence.backends import open_queue_backend\n"
        "url, name, flavour = sys.argv[1:4]\n"
        "if flavour == 'sync':\n"
        "    q = open_queue_backend(url, name, asynchronous=False)\n"
        "    m = q.receive('victim', 1, 1.5, 10)\n"
        "else:\n"
        "    q = open_queue_backend(url, name, asynchronous=True)\n"
        "    m = asyncio.run(q.receive('victim', 1, 1.5, 10))\n"
        "print('RECEIVED', m[0].receipt, flush=True)\n"
        "time.sleep(3600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    victim = subprocess.Popen(
        [sys.executable, "-c", code, REDIS_URL, q.name, flavour],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert victim.stdout is not None
        line = victim.stdout.readline().split()
        assert line[:1] == ["RECEIVED"], victim.stderr.read() if victim.stderr else ""
        receipt = line[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        assert q.receive("survivor", 1, 30, 0) == []  # still within its visibility
        [m] = q.receive("survivor", 1, 30, 10)
        assert (m.id, m.delivery) == ("job", 2)
        assert q.ack(receipt, "victim") is False
        assert q.ack(m.receipt, "survivor") is True
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.communicate(timeout=10)


# -- fork ------------------------------------------------------------------------------------
def _child_uses_the_queue(backend: Any, out: Any) -> None:
    try:
        backend.after_fork()
        if inspect.iscoroutinefunction(backend.receive):

            async def work() -> list[Any]:
                await backend.publish(_messages("from-child"))
                return await backend.receive("child", 10, 30, 0)

            got = asyncio.run(work())
        else:
            backend.publish(_messages("from-child"))
            got = backend.receive("child", 10, 30, 0)
        out.put(sorted(m.id for m in got))
    except BaseException as exc:
        out.put(repr(exc))


def test_a_forked_child_opens_its_own_connections(make: Make) -> None:
    q = make()
    q.publish(_messages("from-parent"))
    backend = getattr(q, "backend", q)
    out: Any = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(
        target=_child_uses_the_queue, args=(backend, out)
    )
    child.start()
    assert out.get(timeout=30) == ["from-child", "from-parent"]
    child.join(10)
    assert _counts(q) == (0, 0, 2, 0)  # the parent's client still works


# -- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"no_such_option": 1}, "no_such_option"),
        ({"max_dead_letters": -1}, "max_dead_letters"),
        ({"max_dead_letters": "many"}, "max_dead_letters"),
        ({"namespace": ""}, "namespace"),
        ({"decode_responses": True}, "decode_responses"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_bad_options_are_configuration_errors_naming_them(
    options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_queue_backend(REDIS_URL, "q", asynchronous=False, **options)
    assert info.value.argument == argument


def test_bad_names_and_url_options() -> None:
    with pytest.raises(ConfigurationError) as info:
        open_queue_backend(REDIS_URL, "-bad name", asynchronous=True)
    assert info.value.argument == "name"
    backend = open_queue_backend(
        REDIS_URL + "?namespace=urlns&max_dead_letters=3", "q", asynchronous=False
    )
    try:
        assert isinstance(backend, RedisQueueBackend)
        assert backend.keys[0] == "urlns:q:{q}:s" and backend.max_dead_letters == 3
    finally:
        backend.close()


# -- lost replies ----------------------------------------------------------------------------
class ReplyLosingConnection(redis.Connection):
    """Once armed with a marker, drops the connection right after the server answered the
    next request carrying it: the script ran, its reply never arrives, and redis-py's retry
    sends it again on a new connection."""

    armed: bytes | None = None
    fired = 0
    _pending = False

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        armed = ReplyLosingConnection.armed
        self._pending = armed is not None and any(
            armed in (a if isinstance(a, bytes) else str(a).encode()) for a in args
        )
        super().send_command(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().read_response(*args, **kwargs)
        if self._pending and ReplyLosingConnection.armed is not None:
            ReplyLosingConnection.armed = None
            ReplyLosingConnection.fired += 1
            self.disconnect()
            raise redis.ConnectionError("injected: the reply was lost on the way back")
        return response


@pytest.fixture
def lossy() -> Iterator[Any]:
    q = open_queue_backend(
        REDIS_URL,
        "t" + uuid.uuid4().hex[:16],
        asynchronous=False,
        connection_class=ReplyLosingConnection,
    )
    yield q
    q.drop()
    q.close()


def _lose_next_reply_of(marker: str) -> int:
    ReplyLosingConnection.armed = marker.encode()
    return ReplyLosingConnection.fired


def test_resent_scripts_after_a_lost_reply_answer_the_same_and_change_nothing_again(
    lossy: Any,
) -> None:
    q = lossy
    fired = _lose_next_reply_of("unique-publish")
    q.publish(_messages("unique-publish"))
    assert ReplyLosingConnection.fired == fired + 1
    assert _counts(q) == (1, 0, 0, 0)  # published once

    fired = _lose_next_reply_of("consumer-A")
    [m] = q.receive("consumer-A", 5, 30, 0)  # the re-send returns the first send's delivery
    assert ReplyLosingConnection.fired == fired + 1
    assert (m.id, m.delivery) == ("unique-publish", 1)
    assert q.receive("consumer-B", 5, 30, 0) == []

    fired = _lose_next_reply_of(m.receipt)
    assert q.nack(m.receipt, "consumer-A", 0, "boom") is True
    assert ReplyLosingConnection.fired == fired + 1
    assert _counts(q) == (1, 0, 0, 0)  # given back once, not twice

    [m2] = q.receive("consumer-A", 5, 30, 0)
    assert (m2.delivery, m2.last_error) == (2, "boom")
    fired = _lose_next_reply_of(m2.receipt)
    assert q.dead_letter(m2.receipt, "consumer-A", "dead") is True
    assert ReplyLosingConnection.fired == fired + 1
    assert _counts(q) == (0, 0, 0, 1)

    fired = _lose_next_reply_of("requeue-marker")
    assert q.requeue_dead(["unique-publish", "requeue-marker"]) == 1
    assert ReplyLosingConnection.fired == fired + 1
    assert _counts(q) == (1, 0, 0, 0)

    [m3] = q.receive("consumer-A", 5, 30, 0)
    fired = _lose_next_reply_of(m3.receipt)
    assert q.ack(m3.receipt, "consumer-A") is True  # the first send acked
    assert ReplyLosingConnection.fired == fired + 1
    assert _counts(q) == (0, 0, 0, 0)

    q.publish(_messages("p1", "p2"), delay=60)
    fired = _lose_next_reply_of(q.name)
    assert q.purge() == 2
    assert ReplyLosingConnection.fired == fired + 1


def _fixed_call_ids(monkeypatch: pytest.MonkeyPatch, *ids: str) -> None:
    """The next script calls of both flavours carry ``ids``, in order."""
    given = iter(ids)
    for module in (sync_queue_module, async_queue_module):
        monkeypatch.setattr(module, "_call_id", lambda: next(given))


def test_a_publish_records_its_call_id_in_mx_alone_and_its_resend_publishes_nothing(
    make: Make, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish's answer (how many messages) follows from its arguments, so its call is
    recorded by one ``ZADD NX`` in ``:mx``, with no result in ``:m``; a re-send (the same
    call id and messages) finds it and publishes nothing."""
    q = make()
    _fixed_call_ids(monkeypatch, "c0ffee01", "c0ffee01")
    q.publish(_messages("a", "b"))
    q.publish(_messages("a", "b"))  # the re-send
    assert _counts(q) == (2, 0, 0, 0)
    m_key, mx_key = _key(q, "m"), _key(q, "mx")
    assert raw.hlen(m_key) == 0
    expires = raw.zscore(mx_key, "c0ffee01")
    assert expires is not None and expires > int(raw.time()[0]) * 1000


def test_a_publish_that_fails_is_not_recorded_so_its_resend_publishes(
    make: Make, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call is recorded before its messages are appended: a call that then fails (here
    the stream key holds a string) takes its record back, and a re-send runs it again."""
    q = make()
    _fixed_call_ids(monkeypatch, "bad00001", "bad00001")
    raw.set(_key(q, "s"), "not a stream")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        q.publish(_messages("a"))
    assert raw.zscore(_key(q, "mx"), "bad00001") is None
    raw.delete(_key(q, "s"))
    q.publish(_messages("a"))
    assert _counts(q) == (1, 0, 0, 0)


def test_one_publish_in_16_forgets_expired_call_records(
    make: Make, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishes whose call id ends in ``0`` (one in 16 random ids) forget expired records
    of ``:m`` and ``:mx``; the others leave them to those (a publish adds one record, a
    forgetting publish removes up to 64)."""
    q = make()
    m_key, mx_key = _key(q, "m"), _key(q, "mx")
    raw.zadd(mx_key, {"old-1": 1, "old-2": 2})
    raw.hset(m_key, mapping={"old-1": "1", "old-2": "1"})
    _fixed_call_ids(monkeypatch, "aaaa0001", "aaaa0010")
    q.publish(_messages("a"))
    assert raw.zcard(mx_key) == 3 and raw.hlen(m_key) == 2
    q.publish(_messages("b"))
    assert set(raw.zrange(mx_key, 0, -1)) == {b"aaaa0001", b"aaaa0010"}
    assert raw.hlen(m_key) == 0
    assert _counts(q) == (2, 0, 0, 0)


def test_a_publish_after_the_script_cache_was_flushed_loads_its_script_again(
    flavour: str,
) -> None:
    """The publish script is sent by its digest, packed once with the queue's keys on the
    asyncio client: a server that lost its scripts (``SCRIPT FLUSH``, here on a server of
    this test's own) answers ``NOSCRIPT``, and the publish loads the script and runs it."""
    with RedisServer() as server:
        loop = LoopThread() if flavour == "async" else None
        backend = open_queue_backend(server.url, "flushed", asynchronous=loop is not None)
        q = backend if loop is None else AsyncView(backend, loop)
        try:
            q.publish(_messages("a"))
            admin = redis.Redis.from_url(server.url)
            admin.script_flush()
            q.publish(_messages("b"))
            q.publish(_messages("c"))
            assert [m.id for m in q.receive("c", 10, 30, 0)] == ["a", "b", "c"]
            admin.close()
        finally:
            q.close()
            if loop is not None:
                loop.stop()


class AsyncReplyLosingConnection(redis.asyncio.Connection):
    """The asyncio twin of :class:`ReplyLosingConnection` (the same marker and count)."""

    _pending = False

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        armed = ReplyLosingConnection.armed
        self._pending = armed is not None and any(
            armed in (a if isinstance(a, bytes) else str(a).encode()) for a in args
        )
        await super().send_command(*args, **kwargs)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = await super().read_response(*args, **kwargs)
        if self._pending and ReplyLosingConnection.armed is not None:
            ReplyLosingConnection.armed = None
            ReplyLosingConnection.fired += 1
            await self.disconnect()
            raise redis.ConnectionError("injected: the reply was lost on the way back")
        return response


def test_an_async_publish_resent_after_a_lost_reply_publishes_once() -> None:
    """The asyncio client sends the publish script with its digest and keys packed once;
    redis-py's re-send after a lost reply sends the same call, which publishes nothing."""
    loop = LoopThread()
    backend = open_queue_backend(
        REDIS_URL,
        "t" + uuid.uuid4().hex[:16],
        asynchronous=True,
        connection_class=AsyncReplyLosingConnection,
    )
    q = AsyncView(backend, loop)
    try:
        fired = _lose_next_reply_of("async-publish")
        q.publish(_messages("async-publish", "second"))
        assert ReplyLosingConnection.fired == fired + 1
        assert _counts(q) == (2, 0, 0, 0)
        assert [m.id for m in q.receive("c", 10, 30, 0)] == ["async-publish", "second"]
    finally:
        try:
            q.drop()
        finally:
            q.close()
            loop.stop()
