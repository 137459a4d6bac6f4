# Generated from test_queue_conformance.py by tools/conformance_twins.py: do not edit.
# Edit the async specs and run: python tools/conformance_twins.py
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
from tests.conformance import flow
from tests.conformance.conftest import QueueEnv

pytestmark = pytest.mark.timeout(120)


def _visibility(qenv: QueueEnv) -> bool:
    return bool(qenv.queue().capabilities.visibility_timeout)


def _receive_all(queue: Any, n: int, *, wait: float = 5.0, **kw: Any) -> list[jobfence.Message]:
    """Receive until ``n`` deliveries came (or ``wait`` seconds passed without one)."""
    got: list[jobfence.Message] = []
    while len(got) < n:
        batch = queue.receive(n - len(got), wait=wait, **kw)
        if not batch:
            break
        got.extend(batch)
    return got


def test_publish_receive_ack_round_trip(qenv: QueueEnv) -> None:
    q = qenv.queue()
    body = {"order_id": 7, "product_id": 1, "qty": 5, "note": "café ✓"}
    msg_id = q.publish(body, id="order:7", headers={"tenant": "acme"})
    assert msg_id == "order:7"
    (m,) = _receive_all(q, 1)
    assert (m.id, m.body, m.delivery, m.queue) == ("order:7", body, 1, qenv.name)
    assert m.headers.get("tenant") == "acme"
    assert m.raw and isinstance(m.raw, bytes)
    m.ack()
    assert m.finished == "acked"
    assert q.receive(wait=0) == []
    stats = q.stats()
    assert stats.ready in (0, None) and stats.in_flight in (0, None)
    assert stats.dead in (0, None)


def test_ids_default_to_new_random_ones_and_duplicates_are_delivered_twice(
    qenv: QueueEnv,
) -> None:
    q = qenv.queue()
    generated = q.publish({"n": 1})
    assert generated and isinstance(generated, str)
    q.publish({"n": 2}, id="same")
    q.publish({"n": 3}, id="same")
    got = _receive_all(q, 3)
    assert sorted(m.id for m in got) == sorted([generated, "same", "same"])
    assert all(m.delivery == 1 for m in got)
    for m in got:
        m.ack()


def test_one_consumer_receives_in_publish_order(qenv: QueueEnv) -> None:
    q = qenv.queue()
    ids = q.publish_many([{"n": i} for i in range(20)], ids=[f"m{i:02d}" for i in range(20)])
    for i in range(20, 25):
        ids.append(q.publish({"n": i}, id=f"m{i:02d}"))
    got: list[jobfence.Message] = []
    while len(got) < 25:
        batch = q.receive(7, wait=5)
        assert batch, f"only {len(got)} of 25 delivered"
        assert len(batch) <= 7
        got.extend(batch)
    assert [m.id for m in got] == ids
    assert [m.body["n"] for m in got] == list(range(25))
    for m in got:
        m.ack()


def test_a_delivery_is_hidden_from_other_consumers_while_visible(
    qenv: QueueEnv,
) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish({"n": 1}, id="only")
    (m,) = _receive_all(a, 1, visibility=30)
    assert b.receive(wait=0.3) == []
    m.ack()


def test_unacked_delivery_comes_back_after_its_visibility(qenv: QueueEnv) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish({"n": 1}, id="vis")
    (first,) = _receive_all(a, 1, visibility=1.0)
    received_at = time.monotonic()
    if not _visibility(qenv):
        # RabbitMQ: a delivery stays with its live consumer whatever the visibility; it comes
        # back when the consumer's channel closes (the next test)
        assert b.receive(wait=1.5) == []
        first.ack()
        assert b.receive(wait=0.3) == []
        return
    (second,) = _receive_all(b, 1, wait=10)
    assert time.monotonic() - received_at >= 0.9  # not before its visibility passed
    assert (second.id, second.delivery) == ("vis", 2)
    assert second.receipt != first.receipt
    with pytest.raises(MessageLost):
        first.ack()  # the old delivery is not the consumer's any more
    assert first.lost
    with pytest.raises(MessageLost):
        first.check()
    second.ack()  # the new delivery was not touched by the failed ack
    assert b.receive(wait=0) == []


def test_unacked_delivery_comes_back_when_its_consumer_closes(
    qenv: QueueEnv,
) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish({"n": 1}, id="closer")
    (m,) = _receive_all(a, 1, visibility=1.0, renew=True)
    assert m.delivery == 1
    a.close()  # gives back the renewed delivery (RabbitMQ: the channel closes)
    (again,) = _receive_all(b, 1, wait=10)
    assert (again.id, again.delivery) == ("closer", 2)
    again.ack()


def test_extend_keeps_a_delivery_hidden_past_its_visibility(
    qenv: QueueEnv,
) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish({"n": 1}, id="ext")
    (m,) = _receive_all(a, 1, visibility=2.0)
    # each extend gives 2 s, ample for one 0.3 s receive even on a loaded machine; the loop
    # outlives the first visibility, so only the extends keep the delivery hidden
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        m.extend(2.0)
        assert b.receive(wait=0.3) == []
    m.ack()
    assert b.receive(wait=0) == []


def test_renew_true_keeps_a_delivery_hidden_by_the_renewer(qenv: QueueEnv) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish({"n": 1}, id="renewed")
    (m,) = _receive_all(a, 1, visibility=0.6, renew=True)
    assert b.receive(wait=2.0) == []  # > 3 visibilities: only renewals kept it
    assert not m.lost
    m.ack()


def test_extend_after_the_visibility_passed_is_refused(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="late")
    (m,) = _receive_all(q, 1, visibility=0.5)
    flow.sleep(0.8)  # let the visibility pass (the behaviour under test)
    # RabbitMQ: the delivery is the consumer's while its channel lives
    if not _visibility(qenv):
        m.extend(5)
        m.ack()
        return
    with pytest.raises(MessageLost):
        m.extend(5)
    assert m.lost
    (again,) = _receive_all(q, 1)
    assert again.delivery == 2
    again.ack()


def test_nack_without_delay_redelivers_at_once_with_the_error(
    qenv: QueueEnv,
) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="nack0")
    (m,) = _receive_all(q, 1)
    assert m.nack(0, ValueError("boom")) is True
    assert m.finished == "nacked"
    (again,) = _receive_all(q, 1, wait=5)
    assert (again.id, again.delivery) == ("nack0", 2)
    assert again.last_error is not None and "boom" in again.last_error
    again.ack()


def test_nack_with_a_delay_is_not_redelivered_before_it(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="nackd")
    (m,) = _receive_all(q, 1)
    nacked_at = time.monotonic()
    assert m.nack(1.0, "later")
    assert q.receive(wait=0.3) == []
    (again,) = _receive_all(q, 1, wait=10)
    assert time.monotonic() - nacked_at >= 0.9
    assert (again.id, again.delivery) == ("nackd", 2)
    again.ack()


def test_defer_gives_back_without_counting_the_delivery(qenv: QueueEnv) -> None:
    """A deferral ("not now") does not use up a delivery and keeps the last real error; a
    nack after it counts on from there."""
    q = qenv.queue()
    q.publish({"n": 1}, id="defer0")
    (m,) = _receive_all(q, 1)
    assert m.nack(0, ValueError("the real failure")) is True
    (m,) = _receive_all(q, 1, wait=5)
    assert m.delivery == 2
    for _ in range(3):  # refused three times: never counted
        assert m.defer(0) is True
        assert m.finished == "deferred"
        (m,) = _receive_all(q, 1, wait=5)
        assert (m.id, m.delivery, m.body) == ("defer0", 2, {"n": 1})
        assert m.last_error is not None and "the real failure" in m.last_error
    assert m.nack(0, "second failure")
    (m,) = _receive_all(q, 1, wait=5)
    assert m.delivery == 3 and "second failure" in (m.last_error or "")
    m.ack()
    assert q.receive(wait=0.3) == []


def test_defer_with_a_delay_is_not_redelivered_before_it(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="deferd", headers={"h": "v"})
    (m,) = _receive_all(q, 1)
    deferred_at = time.monotonic()
    assert m.defer(1.0)
    assert q.receive(wait=0.3) == []
    (again,) = _receive_all(q, 1, wait=10)
    assert time.monotonic() - deferred_at >= 0.9
    assert (again.id, again.delivery, again.last_error) == ("deferd", 1, None)
    assert again.headers.get("h") == "v"
    with pytest.raises(ConfigurationError):  # finished: no second give-back
        m.defer(0)
    again.ack()


def test_a_defer_of_a_delivery_that_is_no_longer_its_consumers_is_refused(
    qenv: QueueEnv,
) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="deferlost")
    (m,) = _receive_all(q, 1, visibility=0.5)
    if not _visibility(qenv):
        # RabbitMQ: the delivery stays the consumer's while its channel lives, whatever the
        # visibility, so the give-back is still its own and still uncounted
        flow.sleep(0.8)  # let the visibility pass (the behaviour under test)
        assert m.defer(0) is True
        (again,) = _receive_all(q, 1, wait=10)
        assert (again.id, again.delivery) == ("deferlost", 1)
        again.ack()
        return
    (again,) = _receive_all(q, 1, wait=10)  # the visibility passed: redelivered
    assert again.delivery == 2
    assert m.defer(0) is False  # the old delivery cannot give it back uncounted
    again.ack()


def test_publish_with_a_delay(qenv: QueueEnv) -> None:
    q = qenv.queue()
    published_at = time.monotonic()
    q.publish({"n": 1}, id="later", delay=1.0)
    q.publish({"n": 2}, id="now")
    (first,) = _receive_all(q, 1)
    assert first.id == "now"
    (second,) = _receive_all(q, 1, wait=10)
    assert second.id == "later"
    assert time.monotonic() - published_at >= 0.9
    first.ack()
    second.ack()


def test_dead_letters_keep_the_error_and_can_be_requeued(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish({"n": 1}, id="poison", headers={"h": "v"})
    q.publish({"n": 2}, id="fine")
    got = _receive_all(q, 2)
    poison = next(m for m in got if m.id == "poison")
    fine = next(m for m in got if m.id == "fine")
    assert poison.dead_letter(RuntimeError("bad payload")) is True
    fine.ack()
    assert q.receive(wait=0.3) == []
    stats = q.stats()
    assert stats.dead in (1, None)
    (dead,) = q.dead_letters()
    assert dead.id == "poison" and dead.deliveries == 1
    assert dead.error is not None and "bad payload" in dead.error
    assert dead.headers.get("h") == "v"
    assert q.requeue_dead() == 1
    (back,) = _receive_all(q, 1, wait=10)
    assert (back.id, back.delivery, back.body) == ("poison", 1, {"n": 1})
    back.ack()
    assert q.dead_letters() == []


def test_requeue_dead_by_id(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish_many([{"n": 1}, {"n": 2}], ids=["d1", "d2"])
    for m in _receive_all(q, 2):
        assert m.dead_letter("no")
    assert sorted(d.id for d in q.dead_letters()) == ["d1", "d2"]
    assert q.requeue_dead(["d2"]) == 1
    (back,) = _receive_all(q, 1, wait=10)
    assert back.id == "d2"
    back.ack()
    assert [d.id for d in q.dead_letters()] == ["d1"]


def test_queues_with_other_names_are_separate(qenv: QueueEnv) -> None:
    a = qenv.queue()
    other = qenv.queue(name=qenv.name + ".other")
    a.publish({"n": 1}, id="mine")
    other.publish({"n": 2}, id="theirs")
    (m,) = _receive_all(other, 1)
    assert m.id == "theirs"
    assert other.receive(wait=0.2) == []
    (mine,) = _receive_all(a, 1)
    assert mine.id == "mine"
    m.ack()
    mine.ack()


def test_concurrent_consumers_get_each_message_once(qenv: QueueEnv) -> None:
    n = 60
    publisher = qenv.queue()
    publisher.publish_many([{"n": i} for i in range(n)], ids=[f"c{i}" for i in range(n)])
    seen: list[tuple[str, int]] = []

    def consume(queue: Any) -> None:
        while True:
            batch = queue.receive(5, wait=1.0, visibility=60)
            if not batch:
                return
            for m in batch:
                seen.append((m.id, m.delivery))
                m.ack()

    consumers = [qenv.queue() for _ in range(4)]
    actors = [flow.spawn(lambda c=c: consume(c)) for c in consumers]
    for actor in actors:
        flow.result(actor, 60)
    assert sorted(i for i, _ in seen) == sorted(f"c{i}" for i in range(n))
    assert all(d == 1 for _, d in seen)


def test_a_waiting_receive_is_woken_by_a_publish(qenv: QueueEnv) -> None:
    consumer, producer = qenv.queue(), qenv.queue()
    consumer.receive(wait=0)  # connections and tables are set up before the clock starts
    started = time.monotonic()
    waiting = flow.spawn(lambda: consumer.receive(wait=20))
    flow.sleep(0.3)  # the receive is waiting by now (if not, it finds the message)
    producer.publish({"n": 1}, id="wake")
    (m,) = flow.result(waiting, 20)
    assert m.id == "wake"
    # woken well before its 20 s wait ran out (a receiver that only polled at the end, or
    # slept through the publish, would take the whole wait)
    assert time.monotonic() - started < 10
    m.ack()


def test_purge_deletes_every_message(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish_many([{"n": i} for i in range(5)])
    q.publish({"n": 9}, delay=60)
    (m,) = _receive_all(q, 1)
    assert m.dead_letter("x")
    q.purge()
    assert q.receive(wait=0.3) == []
    assert q.dead_letters() == []


def test_a_finished_message_cannot_be_finished_again(qenv: QueueEnv) -> None:
    q = qenv.queue()
    q.publish({"n": 1})
    (m,) = _receive_all(q, 1)
    m.ack()
    with pytest.raises(ConfigurationError):
        m.ack()
    with pytest.raises(ConfigurationError):
        m.nack()


def test_bad_input_is_refused_with_the_argument_named(qenv: QueueEnv) -> None:
    q = qenv.queue()
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
            call()
        assert info.value.argument == argument, (argument, info.value)
    for bad in ("", "-x", "a b", "x" * 129, 5):
        with pytest.raises(ConfigurationError) as info:
            jobfence.Queue(qenv.url, bad)  # type: ignore[arg-type]
        assert info.value.argument == "name"
    assert q.receive(wait=0) == []  # nothing was published by the refused calls


def test_worker_processes_each_message_once_and_dead_letters_poison(
    qenv: QueueEnv,
) -> None:
    """The worker on this backend: a guarded handler (inbox keyed on the message id by
    default) with duplicates published on purpose, a transient failure and a poison message."""
    q = qenv.queue(visibility=5)
    n = 12
    ids = [f"w{i}" for i in range(n)]
    q.publish_many([{"n": i} for i in range(n)], ids=ids)
    q.publish_many([{"n": 0}, {"n": 1}], ids=["w0", "w1"])  # duplicates
    q.publish({"n": -1}, id="poison")
    effects: list[str] = []
    namespace = qenv.namespace
    inbox_url = f"memory://{namespace}"

    def record(message: Any) -> int:
        if message.body["n"] == -1:
            raise ValueError("poison")
        if message.body["n"] == 3 and message.delivery == 1:
            raise ConnectionError("transient")
        effects.append(message.id)
        return int(message.body["n"])

    inbox = jobfence.Inbox(inbox_url)
    handler = jobfence.guarded(inbox=inbox)(record)
    worker = jobfence.Worker(q, handler, concurrency=4, max_deliveries=2, backoff=0.05)

    def finished() -> bool:
        s = worker.stats
        return s.processed + s.dead_lettered >= n + 3

    def stop_when_finished() -> None:
        deadline = time.monotonic() + 60
        while not finished() and time.monotonic() < deadline:
            flow.sleep(0.05)
        worker.stop()

    stopper = flow.spawn(stop_when_finished)
    stats = worker.run()  # (the sync worker runs on the test's own thread)
    flow.result(stopper, 70)
    assert sorted(effects) == sorted(ids), "every message's effect exactly once"
    assert stats.processed == n + 2 and stats.duplicates == 2
    assert stats.retried >= 2  # the transient failure and the poison's first delivery
    assert stats.dead_lettered == 1
    assert stats.in_flight == 0
    (dead,) = q.dead_letters()
    assert dead.id == "poison" and "poison" in (dead.error or "")
    inbox.close()


def test_a_stopping_worker_gives_back_what_its_def_handler_did_not_start_uncounted(
    qenv: QueueEnv,
) -> None:
    """A plain ``def`` handler at concurrency 1 with three messages received behind it (the
    prefetch; streamed on RabbitMQ): a stop lets the running one finish and be acked, and the
    three that never started come back with their delivery not used up."""
    q = qenv.queue(visibility=30)
    ids = [f"s{i}" for i in range(4)]
    q.publish_many([{"n": i} for i in range(4)], ids=ids)
    started: list[str] = []
    began = threading.Event()
    release = threading.Event()

    def handler(message: Any) -> None:
        started.append(message.id)
        began.set()
        assert release.wait(30)

    worker = jobfence.Worker(q, handler, concurrency=1, prefetch=3)

    def stop_when_all_received() -> None:
        assert flow.wait_event(began, 30)
        deadline = time.monotonic() + 30
        while worker.stats.received < 4 and time.monotonic() < deadline:
            flow.sleep(0.02)
        worker.stop()
        release.set()

    stopper = flow.spawn(stop_when_all_received)
    stats = worker.run()  # (the sync worker runs on the test's own thread)
    flow.result(stopper, 40)
    assert len(started) == 1 and stats.received == 4, stats
    assert stats.processed == 1 and stats.given_back == 3, stats
    got = _receive_all(qenv.queue(), 3)
    assert sorted(m.id for m in got) == sorted(set(ids) - set(started))
    assert [m.delivery for m in got] == [1, 1, 1]  # never ran: not counted
    for m in got:
        m.ack()


def test_ack_many_acks_each_delivery_once_and_only_the_owners(
    qenv: QueueEnv,
) -> None:
    a, b = qenv.queue(), qenv.queue()
    a.publish_many([{"n": i} for i in range(4)], ids=[f"am{i}" for i in range(4)])
    mine = _receive_all(a, 3)
    (other,) = _receive_all(b, 1)
    items = [(m.receipt, a.consumer) for m in mine]
    items += [(mine[0].receipt, a.consumer)]  # named twice: acked once
    items += [(other.receipt, a.consumer)]  # not this consumer's delivery
    items += [("not-a-receipt", a.consumer)]
    results = a.backend.ack_many(items)
    assert results == [True, True, True, False, False, False]
    other.ack()  # untouched by the refused item
    assert a.receive(wait=0.2) == []


def test_concurrent_acks_share_round_trips(qenv: QueueEnv) -> None:
    """AsyncQueue batches concurrent acks into ack_many calls; the sync Queue acks each
    message with its own ``ack`` call (it has no event loop to gather them on)."""
    q = qenv.queue()
    q.publish_many([{"n": i} for i in range(8)])
    got = _receive_all(q, 8)
    calls: list[int] = []
    backend = q.backend
    real = backend.ack_many

    def counting(items: Any) -> list[bool]:
        calls.append(len(items))
        return list(real(items))

    backend.ack_many = counting
    actors = [flow.spawn(m.ack) for m in got]  # acks from eight threads at once
    for actor in actors:
        flow.result(actor, 30)
    assert calls == []
    assert all(m.finished == "acked" for m in got)
    assert q.receive(wait=0.2) == []


def test_names_lists_the_queues_that_hold_messages(qenv: QueueEnv) -> None:
    def names(**kw: Any) -> list[str]:
        return list(jobfence.Queue.names(qenv.url, **kw))

    a = qenv.queue()
    other = qenv.queue(name=qenv.name + ".other")
    a.publish({"n": 1})
    other.publish({"n": 2})
    if qenv.spec.backend == "rabbitmq":
        with pytest.raises(ConfigurationError, match="management API"):
            names()
        return
    # other tests' queues may share the table, namespace or store: look for these two
    found = names(limit=100_000)
    assert {qenv.name, qenv.name + ".other"} <= set(found)
    assert found == sorted(found)
    assert len(names(limit=1)) == 1
    other.purge()
    assert qenv.name + ".other" not in names(limit=100_000)
    with pytest.raises(ConfigurationError) as caught:
        names(limit=0)
    assert caught.value.argument == "limit"
