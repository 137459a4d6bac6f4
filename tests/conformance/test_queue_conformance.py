"""The queue contract, run against every queue backend (``specs.py``), sync and async.

Each test uses a queue of its own (named after the test's namespace), dropped afterwards. The
timing tests use visibilities and delays of about a second: they check that a message comes
back after its visibility or delay and not before, never how fast anything is.

The specs are written once, in ``test_queue_conformance.py``, over ``AsyncQueue``;
``test_queue_conformance_sync.py`` is generated from it by ``tools/conformance_twins.py`` and
runs them over ``Queue`` as plain sync code on the test's own thread. Code that differs
between the flavours sits in ``if ASYNC:`` / ``else:`` branches.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, MessageLost
from jobfence._core.flavour import ASYNC
from tests.conformance import flow_async
from tests.conformance.conftest import AsyncQueueEnv

if ASYNC:
    import asyncio

pytestmark = pytest.mark.timeout(120)


def _visibility(qenv_async: AsyncQueueEnv) -> bool:
    return bool(qenv_async.queue().capabilities.visibility_timeout)


async def _receive_all(
    queue: Any, n: int, *, wait: float = 5.0, **kw: Any
) -> list[jobfence.AsyncMessage]:
    """Receive until ``n`` deliveries came (or ``wait`` seconds passed without one)."""
    got: list[jobfence.AsyncMessage] = []
    while len(got) < n:
        batch = await queue.receive(n - len(got), wait=wait, **kw)
        if not batch:
            break
        got.extend(batch)
    return got


async def test_publish_receive_ack_round_trip(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    body = {"order_id": 7, "product_id": 1, "qty": 5, "note": "café ✓"}
    msg_id = await q.publish(body, id="order:7", headers={"tenant": "acme"})
    assert msg_id == "order:7"
    (m,) = await _receive_all(q, 1)
    assert (m.id, m.body, m.delivery, m.queue) == ("order:7", body, 1, qenv_async.name)
    assert m.headers.get("tenant") == "acme"
    assert m.raw and isinstance(m.raw, bytes)
    await m.ack()
    assert m.finished == "acked"
    assert await q.receive(wait=0) == []
    stats = await q.stats()
    assert stats.ready in (0, None) and stats.in_flight in (0, None)
    assert stats.dead in (0, None)


async def test_ids_default_to_new_random_ones_and_duplicates_are_delivered_twice(
    qenv_async: AsyncQueueEnv,
) -> None:
    q = qenv_async.queue()
    generated = await q.publish({"n": 1})
    assert generated and isinstance(generated, str)
    await q.publish({"n": 2}, id="same")
    await q.publish({"n": 3}, id="same")
    got = await _receive_all(q, 3)
    assert sorted(m.id for m in got) == sorted([generated, "same", "same"])
    assert all(m.delivery == 1 for m in got)
    for m in got:
        await m.ack()


async def test_one_consumer_receives_in_publish_order(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    ids = await q.publish_many([{"n": i} for i in range(20)], ids=[f"m{i:02d}" for i in range(20)])
    for i in range(20, 25):
        ids.append(await q.publish({"n": i}, id=f"m{i:02d}"))
    got: list[jobfence.AsyncMessage] = []
    while len(got) < 25:
        batch = await q.receive(7, wait=5)
        assert batch, f"only {len(got)} of 25 delivered"
        assert len(batch) <= 7
        got.extend(batch)
    assert [m.id for m in got] == ids
    assert [m.body["n"] for m in got] == list(range(25))
    for m in got:
        await m.ack()


async def test_a_delivery_is_hidden_from_other_consumers_while_visible(
    qenv_async: AsyncQueueEnv,
) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish({"n": 1}, id="only")
    (m,) = await _receive_all(a, 1, visibility=30)
    assert await b.receive(wait=0.3) == []
    await m.ack()


async def test_unacked_delivery_comes_back_after_its_visibility(qenv_async: AsyncQueueEnv) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish({"n": 1}, id="vis")
    (first,) = await _receive_all(a, 1, visibility=1.0)
    received_at = time.monotonic()
    if not _visibility(qenv_async):
        # RabbitMQ: a delivery stays with its live consumer whatever the visibility; it comes
        # back when the consumer's channel closes (the next test)
        assert await b.receive(wait=1.5) == []
        await first.ack()
        assert await b.receive(wait=0.3) == []
        return
    (second,) = await _receive_all(b, 1, wait=10)
    assert time.monotonic() - received_at >= 0.9  # not before its visibility passed
    assert (second.id, second.delivery) == ("vis", 2)
    assert second.receipt != first.receipt
    with pytest.raises(MessageLost):
        await first.ack()  # the old delivery is not the consumer's any more
    assert first.lost
    with pytest.raises(MessageLost):
        first.check()
    await second.ack()  # the new delivery was not touched by the failed ack
    assert await b.receive(wait=0) == []


async def test_unacked_delivery_comes_back_when_its_consumer_closes(
    qenv_async: AsyncQueueEnv,
) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish({"n": 1}, id="closer")
    (m,) = await _receive_all(a, 1, visibility=1.0, renew=True)
    assert m.delivery == 1
    await a.close()  # gives back the renewed delivery (RabbitMQ: the channel closes)
    (again,) = await _receive_all(b, 1, wait=10)
    assert (again.id, again.delivery) == ("closer", 2)
    await again.ack()


async def test_extend_keeps_a_delivery_hidden_past_its_visibility(
    qenv_async: AsyncQueueEnv,
) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish({"n": 1}, id="ext")
    (m,) = await _receive_all(a, 1, visibility=2.0)
    # each extend gives 2 s, ample for one 0.3 s receive even on a loaded machine; the loop
    # outlives the first visibility, so only the extends keep the delivery hidden
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        await m.extend(2.0)
        assert await b.receive(wait=0.3) == []
    await m.ack()
    assert await b.receive(wait=0) == []


async def test_renew_true_keeps_a_delivery_hidden_by_the_renewer(qenv_async: AsyncQueueEnv) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish({"n": 1}, id="renewed")
    (m,) = await _receive_all(a, 1, visibility=0.6, renew=True)
    assert await b.receive(wait=2.0) == []  # > 3 visibilities: only renewals kept it
    assert not m.lost
    await m.ack()


async def test_extend_after_the_visibility_passed_is_refused(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="late")
    (m,) = await _receive_all(q, 1, visibility=0.5)
    await flow_async.sleep(0.8)  # let the visibility pass (the behaviour under test)
    # RabbitMQ: the delivery is the consumer's while its channel lives
    if not _visibility(qenv_async):
        await m.extend(5)
        await m.ack()
        return
    with pytest.raises(MessageLost):
        await m.extend(5)
    assert m.lost
    (again,) = await _receive_all(q, 1)
    assert again.delivery == 2
    await again.ack()


async def test_nack_without_delay_redelivers_at_once_with_the_error(
    qenv_async: AsyncQueueEnv,
) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="nack0")
    (m,) = await _receive_all(q, 1)
    assert await m.nack(0, ValueError("boom")) is True
    assert m.finished == "nacked"
    (again,) = await _receive_all(q, 1, wait=5)
    assert (again.id, again.delivery) == ("nack0", 2)
    assert again.last_error is not None and "boom" in again.last_error
    await again.ack()


async def test_nack_with_a_delay_is_not_redelivered_before_it(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="nackd")
    (m,) = await _receive_all(q, 1)
    nacked_at = time.monotonic()
    assert await m.nack(1.0, "later")
    assert await q.receive(wait=0.3) == []
    (again,) = await _receive_all(q, 1, wait=10)
    assert time.monotonic() - nacked_at >= 0.9
    assert (again.id, again.delivery) == ("nackd", 2)
    await again.ack()


async def test_defer_gives_back_without_counting_the_delivery(qenv_async: AsyncQueueEnv) -> None:
    """A deferral ("not now") does not use up a delivery and keeps the last real error; a
    nack after it counts on from there."""
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="defer0")
    (m,) = await _receive_all(q, 1)
    assert await m.nack(0, ValueError("the real failure")) is True
    (m,) = await _receive_all(q, 1, wait=5)
    assert m.delivery == 2
    for _ in range(3):  # refused three times: never counted
        assert await m.defer(0) is True
        assert m.finished == "deferred"
        (m,) = await _receive_all(q, 1, wait=5)
        assert (m.id, m.delivery, m.body) == ("defer0", 2, {"n": 1})
        assert m.last_error is not None and "the real failure" in m.last_error
    assert await m.nack(0, "second failure")
    (m,) = await _receive_all(q, 1, wait=5)
    assert m.delivery == 3 and "second failure" in (m.last_error or "")
    await m.ack()
    assert await q.receive(wait=0.3) == []


async def test_defer_with_a_delay_is_not_redelivered_before_it(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="deferd", headers={"h": "v"})
    (m,) = await _receive_all(q, 1)
    deferred_at = time.monotonic()
    assert await m.defer(1.0)
    assert await q.receive(wait=0.3) == []
    (again,) = await _receive_all(q, 1, wait=10)
    assert time.monotonic() - deferred_at >= 0.9
    assert (again.id, again.delivery, again.last_error) == ("deferd", 1, None)
    assert again.headers.get("h") == "v"
    with pytest.raises(ConfigurationError):  # finished: no second give-back
        await m.defer(0)
    await again.ack()


async def test_a_defer_of_a_delivery_that_is_no_longer_its_consumers_is_refused(
    qenv_async: AsyncQueueEnv,
) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="deferlost")
    (m,) = await _receive_all(q, 1, visibility=0.5)
    if not _visibility(qenv_async):
        # RabbitMQ: the delivery stays the consumer's while its channel lives, whatever the
        # visibility, so the give-back is still its own and still uncounted
        await flow_async.sleep(0.8)  # let the visibility pass (the behaviour under test)
        assert await m.defer(0) is True
        (again,) = await _receive_all(q, 1, wait=10)
        assert (again.id, again.delivery) == ("deferlost", 1)
        await again.ack()
        return
    (again,) = await _receive_all(q, 1, wait=10)  # the visibility passed: redelivered
    assert again.delivery == 2
    assert await m.defer(0) is False  # the old delivery cannot give it back uncounted
    await again.ack()


async def test_publish_with_a_delay(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    published_at = time.monotonic()
    await q.publish({"n": 1}, id="later", delay=1.0)
    await q.publish({"n": 2}, id="now")
    (first,) = await _receive_all(q, 1)
    assert first.id == "now"
    (second,) = await _receive_all(q, 1, wait=10)
    assert second.id == "later"
    assert time.monotonic() - published_at >= 0.9
    await first.ack()
    await second.ack()


async def test_dead_letters_keep_the_error_and_can_be_requeued(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1}, id="poison", headers={"h": "v"})
    await q.publish({"n": 2}, id="fine")
    got = await _receive_all(q, 2)
    poison = next(m for m in got if m.id == "poison")
    fine = next(m for m in got if m.id == "fine")
    assert await poison.dead_letter(RuntimeError("bad payload")) is True
    await fine.ack()
    assert await q.receive(wait=0.3) == []
    stats = await q.stats()
    assert stats.dead in (1, None)
    (dead,) = await q.dead_letters()
    assert dead.id == "poison" and dead.deliveries == 1
    assert dead.error is not None and "bad payload" in dead.error
    assert dead.headers.get("h") == "v"
    assert await q.requeue_dead() == 1
    (back,) = await _receive_all(q, 1, wait=10)
    assert (back.id, back.delivery, back.body) == ("poison", 1, {"n": 1})
    await back.ack()
    assert await q.dead_letters() == []


async def test_requeue_dead_by_id(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish_many([{"n": 1}, {"n": 2}], ids=["d1", "d2"])
    for m in await _receive_all(q, 2):
        assert await m.dead_letter("no")
    assert sorted(d.id for d in await q.dead_letters()) == ["d1", "d2"]
    assert await q.requeue_dead(["d2"]) == 1
    (back,) = await _receive_all(q, 1, wait=10)
    assert back.id == "d2"
    await back.ack()
    assert [d.id for d in await q.dead_letters()] == ["d1"]


async def test_queues_with_other_names_are_separate(qenv_async: AsyncQueueEnv) -> None:
    a = qenv_async.queue()
    other = qenv_async.queue(name=qenv_async.name + ".other")
    await a.publish({"n": 1}, id="mine")
    await other.publish({"n": 2}, id="theirs")
    (m,) = await _receive_all(other, 1)
    assert m.id == "theirs"
    assert await other.receive(wait=0.2) == []
    (mine,) = await _receive_all(a, 1)
    assert mine.id == "mine"
    await m.ack()
    await mine.ack()


async def test_concurrent_consumers_get_each_message_once(qenv_async: AsyncQueueEnv) -> None:
    n = 60
    publisher = qenv_async.queue()
    await publisher.publish_many([{"n": i} for i in range(n)], ids=[f"c{i}" for i in range(n)])
    seen: list[tuple[str, int]] = []

    async def consume(queue: Any) -> None:
        while True:
            batch = await queue.receive(5, wait=1.0, visibility=60)
            if not batch:
                return
            for m in batch:
                seen.append((m.id, m.delivery))
                await m.ack()

    consumers = [qenv_async.queue() for _ in range(4)]
    actors = [flow_async.spawn(lambda c=c: consume(c)) for c in consumers]
    for actor in actors:
        await flow_async.result(actor, 60)
    assert sorted(i for i, _ in seen) == sorted(f"c{i}" for i in range(n))
    assert all(d == 1 for _, d in seen)


async def test_a_waiting_receive_is_woken_by_a_publish(qenv_async: AsyncQueueEnv) -> None:
    consumer, producer = qenv_async.queue(), qenv_async.queue()
    await consumer.receive(wait=0)  # connections and tables are set up before the clock starts
    started = time.monotonic()
    waiting = flow_async.spawn(lambda: consumer.receive(wait=20))
    await flow_async.sleep(0.3)  # the receive is waiting by now (if not, it finds the message)
    await producer.publish({"n": 1}, id="wake")
    (m,) = await flow_async.result(waiting, 20)
    assert m.id == "wake"
    # woken well before its 20 s wait ran out (a receiver that only polled at the end, or
    # slept through the publish, would take the whole wait)
    assert time.monotonic() - started < 10
    await m.ack()


async def test_purge_deletes_every_message(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish_many([{"n": i} for i in range(5)])
    await q.publish({"n": 9}, delay=60)
    (m,) = await _receive_all(q, 1)
    assert await m.dead_letter("x")
    await q.purge()
    assert await q.receive(wait=0.3) == []
    assert await q.dead_letters() == []


async def test_a_finished_message_cannot_be_finished_again(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    await q.publish({"n": 1})
    (m,) = await _receive_all(q, 1)
    await m.ack()
    with pytest.raises(ConfigurationError):
        await m.ack()
    with pytest.raises(ConfigurationError):
        await m.nack()


async def test_bad_input_is_refused_with_the_argument_named(qenv_async: AsyncQueueEnv) -> None:
    q = qenv_async.queue()
    cases: list[tuple[str, Any]] = [
        ("max_messages", lambda: q.receive(0)),
        ("max_messages", lambda: q.receive(True)),
        ("visibility", lambda: q.receive(visibility=0)),
        ("wait", lambda: q.receive(wait=-1)),
        ("delay", lambda: q.publish({}, delay=-1)),
        ("headers", lambda: q.publish({}, headers={"a": 1})),
        ("id", lambda: q.publish({}, id="")),
        ("body", lambda: q.publish(object())),
        ("ids", lambda: q.publish_many([1, 2], ids=["x"])),
    ]
    for argument, call in cases:
        with pytest.raises(ConfigurationError) as info:
            await call()
        assert info.value.argument == argument, (argument, info.value)
    for bad in ("", "-x", "a b", "x" * 129, 5):
        with pytest.raises(ConfigurationError) as info:
            jobfence.AsyncQueue(qenv_async.url, bad)  # type: ignore[arg-type]
        assert info.value.argument == "name"
    assert await q.receive(wait=0) == []  # nothing was published by the refused calls


async def test_worker_processes_each_message_once_and_dead_letters_poison(
    qenv_async: AsyncQueueEnv,
) -> None:
    """The worker on this backend: a guarded handler (inbox keyed on the message id by
    default) with duplicates published on purpose, a transient failure and a poison message."""
    q = qenv_async.queue(visibility=5)
    n = 12
    ids = [f"w{i}" for i in range(n)]
    await q.publish_many([{"n": i} for i in range(n)], ids=ids)
    await q.publish_many([{"n": 0}, {"n": 1}], ids=["w0", "w1"])  # duplicates
    await q.publish({"n": -1}, id="poison")
    effects: list[str] = []
    namespace = qenv_async.namespace
    inbox_url = f"memory://{namespace}"

    def record(message: Any) -> int:
        if message.body["n"] == -1:
            raise ValueError("poison")
        if message.body["n"] == 3 and message.delivery == 1:
            raise ConnectionError("transient")
        effects.append(message.id)
        return int(message.body["n"])

    inbox = jobfence.AsyncInbox(inbox_url)
    if ASYNC:

        @jobfence.guarded(inbox=inbox)
        async def handler(message: Any) -> int:
            return record(message)

    else:
        handler = jobfence.guarded(inbox=inbox)(record)
    worker = jobfence.AsyncWorker(q, handler, concurrency=4, max_deliveries=2, backoff=0.05)

    def finished() -> bool:
        s = worker.stats
        return s.processed + s.dead_lettered >= n + 3

    async def stop_when_finished() -> None:
        deadline = time.monotonic() + 60
        while not finished() and time.monotonic() < deadline:
            await flow_async.sleep(0.05)
        worker.stop()

    stopper = flow_async.spawn(stop_when_finished)
    stats = await worker.run()  # (the sync worker runs on the test's own thread)
    await flow_async.result(stopper, 70)
    assert sorted(effects) == sorted(ids), "every message's effect exactly once"
    assert stats.processed == n + 2 and stats.duplicates == 2
    assert stats.retried >= 2  # the transient failure and the poison's first delivery
    assert stats.dead_lettered == 1
    assert stats.in_flight == 0
    (dead,) = await q.dead_letters()
    assert dead.id == "poison" and "poison" in (dead.error or "")
    await inbox.close()


async def test_a_stopping_worker_gives_back_what_its_def_handler_did_not_start_uncounted(
    qenv_async: AsyncQueueEnv,
) -> None:
    """A plain ``def`` handler at concurrency 1 with three messages received behind it (the
    prefetch; streamed on RabbitMQ): a stop lets the running one finish and be acked, and the
    three that never started come back with their delivery not used up."""
    q = qenv_async.queue(visibility=30)
    ids = [f"s{i}" for i in range(4)]
    await q.publish_many([{"n": i} for i in range(4)], ids=ids)
    started: list[str] = []
    began = threading.Event()
    release = threading.Event()

    def handler(message: Any) -> None:
        started.append(message.id)
        began.set()
        assert release.wait(30)

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, prefetch=3)

    async def stop_when_all_received() -> None:
        assert await flow_async.wait_event(began, 30)
        deadline = time.monotonic() + 30
        while worker.stats.received < 4 and time.monotonic() < deadline:
            await flow_async.sleep(0.02)
        worker.stop()
        release.set()

    stopper = flow_async.spawn(stop_when_all_received)
    stats = await worker.run()  # (the sync worker runs on the test's own thread)
    await flow_async.result(stopper, 40)
    assert len(started) == 1 and stats.received == 4, stats
    assert stats.processed == 1 and stats.given_back == 3, stats
    got = await _receive_all(qenv_async.queue(), 3)
    assert sorted(m.id for m in got) == sorted(set(ids) - set(started))
    assert [m.delivery for m in got] == [1, 1, 1]  # never ran: not counted
    for m in got:
        await m.ack()


async def test_ack_many_acks_each_delivery_once_and_only_the_owners(
    qenv_async: AsyncQueueEnv,
) -> None:
    a, b = qenv_async.queue(), qenv_async.queue()
    await a.publish_many([{"n": i} for i in range(4)], ids=[f"am{i}" for i in range(4)])
    mine = await _receive_all(a, 3)
    (other,) = await _receive_all(b, 1)
    items = [(m.receipt, a.consumer) for m in mine]
    items += [(mine[0].receipt, a.consumer)]  # named twice: acked once
    items += [(other.receipt, a.consumer)]  # not this consumer's delivery
    items += [("not-a-receipt", a.consumer)]
    results = await a.backend.ack_many(items)
    assert results == [True, True, True, False, False, False]
    await other.ack()  # untouched by the refused item
    assert await a.receive(wait=0.2) == []


async def test_concurrent_acks_share_round_trips(qenv_async: AsyncQueueEnv) -> None:
    """AsyncQueue batches concurrent acks into ack_many calls; the sync Queue acks each
    message with its own ``ack`` call (it has no event loop to gather them on)."""
    q = qenv_async.queue()
    await q.publish_many([{"n": i} for i in range(8)])
    got = await _receive_all(q, 8)
    calls: list[int] = []
    backend = q.backend
    real = backend.ack_many

    async def counting(items: Any) -> list[bool]:
        calls.append(len(items))
        return list(await real(items))

    backend.ack_many = counting
    if ASYNC:
        await asyncio.gather(*(m.ack() for m in got))
        assert sum(calls) == 8 and len(calls) < 8  # batched: fewer round trips than acks
    else:
        actors = [flow_async.spawn(m.ack) for m in got]  # acks from eight threads at once
        for actor in actors:
            flow_async.result(actor, 30)
        assert calls == []
    assert all(m.finished == "acked" for m in got)
    assert await q.receive(wait=0.2) == []


if ASYNC:  # only an async queue backend streams

    async def test_a_streaming_client_gives_back_what_it_did_not_return_when_it_closes(
        qenv_async: AsyncQueueEnv,
    ) -> None:
        a, b = qenv_async.queue(), qenv_async.queue()
        await a.publish_many([{"n": i} for i in range(5)], ids=[f"s{i}" for i in range(5)])
        await a.backend.stream(5)  # a worker's hint: a pushing server subscribes
        (held,) = await a.receive(1, wait=5, renew=True)
        await a.close()  # the renewed delivery is nacked; pushed ones go back with the channel
        got = await _receive_all(b, 5, wait=10)
        assert sorted(m.id for m in got) == [f"s{i}" for i in range(5)]
        # its second delivery at least (RabbitMQ: a delivery pushed back to a client that was
        # still subscribed, then returned with its channel, counts too)
        assert next(m for m in got if m.id == held.id).delivery >= 2
        for m in got:
            await m.ack()

    async def test_ending_a_stream_hands_back_what_was_pushed_and_not_received(
        qenv_async: AsyncQueueEnv,
    ) -> None:
        """What a worker does as it stops: the subscription ends and whatever the server
        pushed that no receive returned is handed back to the caller, who defers it: nothing
        is left with the client to go back counted when it closes (a pulling backend hands
        back nothing and its messages stay queued)."""
        a, b = qenv_async.queue(), qenv_async.queue()
        ids = [f"u{i}" for i in range(5)]
        await a.publish_many([{"n": i} for i in range(5)], ids=ids)
        # it says whether the server pushes from now on (the worker then leaves the bound on
        # unacknowledged deliveries to the server's window): RabbitMQ's does, the rest pull
        assert await a.backend.stream(5) is (a.backend.kind == "rabbitmq")
        (first,) = await a.receive(1, wait=5)
        await first.ack()
        pushed = await a._unstream()
        assert {m.id for m in pushed} <= set(ids[1:])
        assert all(m.delivery == 1 for m in pushed)
        for m in pushed:
            assert await m.defer(0)
        await a.close()  # holding nothing: nothing goes back counted
        got = await _receive_all(b, 4, wait=10)
        assert sorted(m.id for m in got) == ids[1:]
        assert [m.delivery for m in got] == [1, 1, 1, 1]
        for m in got:
            await m.ack()


async def test_names_lists_the_queues_that_hold_messages(qenv_async: AsyncQueueEnv) -> None:
    async def names(**kw: Any) -> list[str]:
        return list(await jobfence.AsyncQueue.names(qenv_async.url, **kw))

    a = qenv_async.queue()
    other = qenv_async.queue(name=qenv_async.name + ".other")
    await a.publish({"n": 1})
    await other.publish({"n": 2})
    if qenv_async.spec.backend == "rabbitmq":
        with pytest.raises(ConfigurationError, match="management API"):
            await names()
        return
    # other tests' queues may share the table, namespace or store: look for these two
    found = await names(limit=100_000)
    assert {qenv_async.name, qenv_async.name + ".other"} <= set(found)
    assert found == sorted(found)
    assert len(await names(limit=1)) == 1
    await other.purge()
    assert qenv_async.name + ".other" not in await names(limit=100_000)
    with pytest.raises(ConfigurationError) as caught:
        await names(limit=0)
    assert caught.value.argument == "limit"
