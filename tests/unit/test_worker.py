"""The worker loop on the in-process queue: concurrency, acks, retries, dead letters, renewal,
lost deliveries, shutdown, stats, logging, bad input. (Every queue backend runs the worker end
to end in the conformance suite; real processes and SIGKILL in tests/acceptance.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError
from jobfence.testing import hooked

pytestmark = pytest.mark.timeout(60)


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


async def _run_until(worker: jobfence.AsyncWorker, done: Any, limit: float = 20.0) -> None:
    """Run ``worker`` until ``done()`` is true, then stop it and wait for run() to return."""

    async def watch() -> None:
        deadline = time.monotonic() + limit
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        worker.stop()

    watcher = asyncio.ensure_future(watch())
    await worker.run()
    await watcher
    assert done(), worker.stats


async def test_acks_after_the_handler_and_never_runs_more_than_concurrency() -> None:
    q = jobfence.AsyncQueue(_url(), "c", visibility=10)
    await q.publish_many([{"n": i} for i in range(12)])
    running = 0
    peak = 0
    release = asyncio.Event()
    seen: list[int] = []

    async def handler(message: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        stats = await q.stats()
        assert stats.in_flight is not None and stats.in_flight >= 1  # not acked before it ends
        if len(seen) < 3:
            await release.wait() if running < 3 else release.set()
        seen.append(message.body["n"])
        running -= 1

    worker = jobfence.AsyncWorker(q, handler, concurrency=3)
    await _run_until(worker, lambda: worker.stats.processed == 12)
    assert peak == 3
    assert sorted(seen) == list(range(12))
    assert (await q.stats()).in_flight == 0
    await q.close()


@pytest.mark.parametrize("fail", [False, True], ids=["ack", "nack"])
async def test_a_slot_frees_when_its_handler_returns_not_when_its_ack_is_answered(
    fail: bool,
) -> None:
    """concurrency=1: the first message's ack (or nack) is held at the I/O hook; the second
    handler starts meanwhile, and the first message is settled once the hook lets it go."""
    q = jobfence.AsyncQueue(_url(), "slots", visibility=10)
    await q.publish_many([{"n": 0}, {"n": 1}])
    second_started = asyncio.Event()
    settle = asyncio.Event()
    held: list[str] = []
    started: list[int] = []

    async def hook(point: str, **info: Any) -> None:
        if point in ("queue.ack", "queue.nack") and not held:
            held.append(point)
            await settle.wait()

    async def handler(message: Any) -> None:
        started.append(message.body["n"])
        if len(started) == 2:
            second_started.set()
            return
        if fail:
            raise RuntimeError("first one fails")

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, handle_signals=False, backoff=30)
    with hooked(hook):
        run = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(second_started.wait(), 10)
        # the second handler ran while the first message's settlement was still held
        assert held == ["queue.nack" if fail else "queue.ack"]
        assert worker.stats.retried == 0  # the first message is not settled yet
        settle.set()
        await _run_until_stats(worker, lambda s: s.processed + s.retried == 2)
        worker.stop()
        await run
    assert worker.stats.processed == (1 if fail else 2)
    assert worker.stats.retried == (1 if fail else 0)


async def test_a_message_whose_ack_is_under_way_takes_no_room_from_the_receives() -> None:
    """concurrency=1, prefetch=0: room for one message. While the first message's ack is held
    at the I/O hook, the worker receives and runs the second one (the settling message does not
    hold the room), and the first is acked once the hook lets it go."""
    q = jobfence.AsyncQueue(_url(), "settling", visibility=10)
    await q.publish_many([{"n": 0}, {"n": 1}])
    second_started = asyncio.Event()
    held: list[int] = []

    async def hook(point: str, **info: Any) -> None:
        if point == "queue.ack" and not held:
            held.append(False)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(second_started.wait(), 5)
            held[0] = second_started.is_set()  # the second ran while this ack was held

    async def handler(message: Any) -> None:
        if message.body["n"] == 1:
            second_started.set()

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, prefetch=0, handle_signals=False)
    with hooked(hook):
        await _run_until(worker, lambda: worker.stats.processed == 2)
    assert held == [True]
    assert worker.stats.processed == 2 and worker.stats.lost == 0
    await q.close()


async def test_settling_messages_beyond_the_room_hold_back_the_receives() -> None:
    """The settling messages that take no room are bounded: with every ack held, a worker with
    room for one (concurrency=1, prefetch=0) runs two messages, then receives no more until an
    ack is answered; then the rest run and all are acked once."""
    q = jobfence.AsyncQueue(_url(), "bounded", visibility=10)
    await q.publish_many([{"n": i} for i in range(5)])
    release = asyncio.Event()
    two_held = asyncio.Event()
    held = 0
    ran: list[int] = []

    async def hook(point: str, **info: Any) -> None:
        nonlocal held
        if point == "queue.ack" and not release.is_set():
            held += 1
            if held == 2:
                two_held.set()
            await release.wait()

    async def handler(message: Any) -> None:
        ran.append(message.body["n"])

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, prefetch=0, handle_signals=False)
    with hooked(hook):
        run = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(two_held.wait(), 10)
        # nothing signals "did not receive": give a wrongly unbounded worker time to run more
        await asyncio.sleep(0.3)
        assert len(ran) == 2 and held == 2 and worker.stats.in_flight == 2, (ran, held)
        release.set()
        await _run_until_stats(worker, lambda s: s.processed == 5)
        worker.stop()
        await run
    assert sorted(ran) == list(range(5)) and worker.stats.processed == 5
    await q.close()


async def _run_until_stats(worker: jobfence.AsyncWorker, done: Any, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not done(worker.stats) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert done(worker.stats), worker.stats


async def test_an_exception_redelivers_with_backoff_then_dead_letters() -> None:
    q = jobfence.AsyncQueue(_url(), "r")
    await q.publish({"n": 1}, id="always-fails")
    deliveries: list[tuple[int, float]] = []

    async def handler(message: Any) -> None:
        deliveries.append((message.delivery, time.monotonic()))
        raise RuntimeError(f"attempt {message.delivery}")

    worker = jobfence.AsyncWorker(q, handler, max_deliveries=3, backoff=0.2, max_backoff=0.3)
    await _run_until(worker, lambda: worker.stats.dead_lettered == 1)
    assert [d for d, _ in deliveries] == [1, 2, 3]
    # the second redelivery waited at least half of min(0.2 * 2, 0.3) (jitter is 50-100%)
    assert deliveries[2][1] - deliveries[1][1] >= 0.15
    assert worker.stats.retried == 2 and worker.stats.processed == 0
    (dead,) = await q.dead_letters()
    assert dead.id == "always-fails" and dead.deliveries == 3
    assert dead.error == "RuntimeError: attempt 3"
    await q.close()


async def test_a_message_delivered_too_often_is_dead_lettered_without_running() -> None:
    q = jobfence.AsyncQueue(_url(), "d")
    await q.publish({"n": 1}, id="crashy")
    for _ in range(2):  # two consumers "died" holding it: give it back unacked
        (m,) = await q.receive()
        await m.nack(0)
    ran: list[str] = []

    async def handler(message: Any) -> None:
        ran.append(message.id)

    worker = jobfence.AsyncWorker(q, handler, max_deliveries=2)
    await _run_until(worker, lambda: worker.stats.dead_lettered == 1)
    assert ran == []
    (dead,) = await q.dead_letters()
    assert dead.deliveries == 3 and "delivered 3 times" in (dead.error or "")
    await q.close()


async def test_a_long_handler_keeps_its_message_by_renewal() -> None:
    url = _url()
    q = jobfence.AsyncQueue(url, "long", visibility=0.3)
    other = jobfence.AsyncQueue(url, "long")
    await q.publish({"n": 1}, id="slow")
    stolen: list[Any] = []

    async def handler(message: Any) -> None:
        deadline = time.monotonic() + 1.5  # five visibilities
        while time.monotonic() < deadline:
            stolen.extend(await other.receive(wait=0.1))
        assert not message.lost

    worker = jobfence.AsyncWorker(q, handler, visibility=0.3)
    await _run_until(worker, lambda: worker.stats.processed == 1)
    assert stolen == []
    assert worker.stats.lost == 0
    assert await other.receive(wait=0) == []
    await q.close()
    await other.close()


async def test_a_busy_worker_waits_for_the_next_message_instead_of_polling() -> None:
    """While a handler runs and the queue is empty, the worker's next receive waits for a
    message (the server wakes it) instead of asking again and again; a message published
    meanwhile still starts at once in the free slot."""
    q = jobfence.AsyncQueue(_url(), "busy")
    await q.publish({"n": 1}, id="slow")
    started = {"slow": asyncio.Event(), "quick": asyncio.Event()}
    release = asyncio.Event()
    receives = 0
    polled = -1

    def count(point: str, **info: Any) -> None:
        nonlocal receives
        if point == "queue.receive":
            receives += 1

    async def handler(message: Any) -> None:
        started[message.id].set()
        if message.id == "slow":
            await release.wait()

    async def scenario() -> None:
        nonlocal polled
        await asyncio.wait_for(started["slow"].wait(), 10)
        before = receives
        await asyncio.sleep(0.5)  # a window to count receives in, not a synchronisation
        polled = receives - before
        await q.publish({"n": 2}, id="quick")
        await asyncio.wait_for(started["quick"].wait(), 10)  # "slow" is still running
        release.set()

    worker = jobfence.AsyncWorker(q, handler, concurrency=2)
    with hooked(count):
        running = asyncio.ensure_future(scenario())
        await _run_until(worker, lambda: worker.stats.processed == 2 or running.done())
        await running
    assert worker.stats.processed == 2
    assert 0 <= polled <= 3  # one waiting receive (RECEIVE_WAIT 1 s), not a busy loop
    await q.close()


async def test_a_lost_delivery_cancels_an_async_handler_and_is_not_acked() -> None:
    url = _url()
    q = jobfence.AsyncQueue(url, "lost", visibility=0.3)
    await q.publish({"n": 1}, id="lost-one")
    cancelled = asyncio.Event()
    started = asyncio.Event()

    def fail_renewals(point: str, **info: Any) -> None:
        if point == "queue.renew":
            raise ConnectionError("renewal cut off")

    async def handler(message: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            worker.stop()
            raise

    worker = jobfence.AsyncWorker(q, handler, visibility=0.3)
    with hooked(fail_renewals):
        await _run_until(worker, lambda: worker.stats.lost >= 1)
    assert started.is_set() and cancelled.is_set()
    assert worker.stats.processed == 0
    # not acked: the message comes back to the next consumer, as a redelivery
    again = jobfence.AsyncQueue(url, "lost")
    (m,) = await again.receive(wait=5)
    assert m.id == "lost-one" and m.delivery >= 2
    await m.ack()
    await q.close()
    await again.close()


async def test_stop_gives_back_unfinished_messages_after_the_shutdown_timeout() -> None:
    url = _url()
    q = jobfence.AsyncQueue(url, "stop", visibility=30)
    await q.publish_many([{"n": 1}, {"n": 2}], ids=["fast", "stuck"])
    started = asyncio.Event()

    async def handler(message: Any) -> None:
        if message.id == "stuck":
            started.set()
            await asyncio.sleep(60)

    worker = jobfence.AsyncWorker(q, handler, concurrency=2, shutdown_timeout=0.2)
    run = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert stats.given_back == 1 and stats.in_flight == 0
    # given back at once: the 30 s visibility does not hold it
    again = jobfence.AsyncQueue(url, "stop")
    (m,) = await again.receive(wait=2)
    assert (m.id, m.delivery) == ("stuck", 2)
    await m.ack()
    await q.close()
    await again.close()


def test_sync_worker_runs_plain_handlers_in_threads_with_the_current_message() -> None:
    q = jobfence.Queue(_url(), "sync")
    q.publish_many([{"n": i} for i in range(6)], ids=[f"s{i}" for i in range(6)])
    seen: dict[str, str] = {}
    threads: set[str] = set()
    worker = jobfence.Worker(q, lambda m: None, concurrency=2)

    def handler(message: Any) -> None:
        seen[message.id] = jobfence.current_message().id
        threads.add(threading.current_thread().name)
        if len(seen) == 6:
            worker.stop()  # stop() from inside a handler

    worker = jobfence.Worker(q, handler, concurrency=2)
    stats = worker.run()
    assert stats.processed == 6
    assert seen == {f"s{i}": f"s{i}" for i in range(6)}
    assert threads and all(t.startswith("jobfence-worker") for t in threads)
    assert jobfence.current_message() is None
    q.close()


async def test_a_handler_thread_takes_the_next_message_without_waiting_for_the_loop() -> None:
    """A plain handler: the received messages waiting for a thread are already in the
    threads' queue, so a thread that returns runs the next one while the loop is busy (here:
    blocked until then); the loop only settles the outcomes."""
    q = jobfence.AsyncQueue(_url(), "ahead", visibility=30)
    await q.publish_many([{"n": 0}, {"n": 1}], ids=["first", "second"])
    loop = asyncio.get_running_loop()
    loop_blocked = threading.Event()
    second_ran = threading.Event()
    ran_while_blocked: list[bool] = []

    def block_loop() -> None:
        loop_blocked.set()
        ran_while_blocked.append(second_ran.wait(5))

    def handler(message: Any) -> None:
        if message.id == "first":
            loop.call_soon_threadsafe(block_loop)
            assert loop_blocked.wait(10)
        else:
            second_ran.set()

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, handle_signals=False)
    await _run_until(worker, lambda: worker.stats.processed == 2)
    assert ran_while_blocked == [True]
    await q.close()


async def test_a_handler_thread_runs_no_waiting_message_once_the_worker_is_stopping() -> None:
    """concurrency=1, prefetch=3: the first handler stops the worker and returns while the
    loop is busy (blocked until the thread has taken every waiting call); the thread runs
    none of them, and they go back without using up a delivery."""
    url = _url()
    q = jobfence.AsyncQueue(url, "waiting", visibility=30)
    await q.publish_many([{"n": i} for i in range(4)], ids=[f"w{i}" for i in range(4)])
    loop = asyncio.get_running_loop()
    loop_blocked = threading.Event()
    ran: list[str] = []

    def block_loop() -> None:
        loop_blocked.set()
        jobs = worker._pool._jobs  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while not jobs.empty() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the thread has taken every waiting call

    def handler(message: Any) -> None:
        ran.append(message.id)
        if len(ran) == 1:
            loop.call_soon_threadsafe(block_loop)
            assert loop_blocked.wait(10)
            worker.stop()

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, prefetch=3, handle_signals=False)
    stats = await asyncio.wait_for(worker.run(), 30)
    assert len(ran) == 1 and stats.processed == 1, (ran, stats)
    assert stats.given_back == 3 and stats.in_flight == 0
    back = await q.receive(max_messages=10, wait=2)
    assert sorted(m.id for m in back) == sorted({f"w{i}" for i in range(4)} - set(ran))
    assert all(m.delivery == 1 for m in back)  # never ran: not counted
    for m in back:
        await m.ack()
    await q.close()


def _spy_on_sync_backend(queue: jobfence.Queue) -> list[tuple[str, int]]:
    """Record the blocking backend's receive and ack calls of ``queue`` (verb, items)."""
    calls: list[tuple[str, int]] = []
    backend = queue.backend
    receive, ack, ack_many = backend.receive, backend.ack, backend.ack_many

    def spy_receive(*args: Any) -> Any:
        calls.append(("receive", 1))
        return receive(*args)

    def spy_ack(*args: Any) -> Any:
        calls.append(("ack", 1))
        return ack(*args)

    def spy_ack_many(items: Any) -> Any:
        calls.append(("ack_many", len(items)))
        return ack_many(items)

    backend.receive, backend.ack, backend.ack_many = spy_receive, spy_ack, spy_ack_many
    return calls


def _run_sync_until_processed(worker: jobfence.Worker, n: int) -> jobfence.WorkerStats:
    def watch() -> None:
        deadline = time.monotonic() + 20
        while worker.stats.processed < n and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.stop()

    watcher = threading.Thread(target=watch)
    watcher.start()
    stats = worker.run()
    watcher.join()
    return stats


def test_sync_worker_on_a_url_runs_the_asyncio_client_of_the_queue() -> None:
    """A Queue opened from a URL: each run opens the asyncio client of that URL (the same
    queue) on the worker's loop and closes it after; the blocking client is not called."""
    q = jobfence.Queue(_url(), "native")
    q.publish_many([{"n": i} for i in range(10)])
    calls = _spy_on_sync_backend(q)
    seen: list[int] = []
    worker = jobfence.Worker(q, lambda m: seen.append(m.body["n"]), concurrency=3)
    stats = _run_sync_until_processed(worker, 10)
    assert stats.processed == 10 and stats.in_flight == 0
    q.publish_many([{"n": i} for i in range(10, 20)])
    stats = _run_sync_until_processed(worker, 20)  # a fresh client on the run's new loop
    assert stats.processed == 20 and stats.in_flight == 0
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10, 20))
    assert calls == []
    assert worker._worker.queue is worker._aqueue  # restored after each run
    assert [m.body["n"] for m in q.receive(5, wait=0)] == []  # everything was acked
    q.close()


def test_sync_worker_on_a_backend_object_calls_it_in_threads_with_batched_acks() -> None:
    """A Queue on a backend object of the caller's has no asyncio twin to open: the worker
    calls its blocking backend in threads, one ``ack_many`` per batch of acks."""
    url = _url()
    owner = jobfence.Queue(url, "threads")
    q = jobfence.Queue(owner.backend, "threads")
    q.publish_many([{"n": i} for i in range(12)])
    calls = _spy_on_sync_backend(q)
    release = threading.Event()

    def handler(message: Any) -> None:
        release.wait(5)  # the first handlers finish together: their acks share a batch

    worker = jobfence.Worker(q, handler, concurrency=4)
    threading.Timer(0.3, release.set).start()
    stats = _run_sync_until_processed(worker, 12)
    assert stats.processed == 12
    assert ("receive", 1) in calls
    acked = [n for verb, n in calls if verb == "ack_many"]
    assert sum(acked) == 12 and len(acked) < 12
    assert not any(verb == "ack" for verb, _n in calls)
    owner.close()


def test_guarded_without_a_key_uses_the_message_id_and_counts_duplicates() -> None:
    url = _url()
    q = jobfence.Queue(url, "dup")
    inbox = jobfence.Inbox(url)
    for _ in range(3):
        q.publish({"n": 1}, id="order:1")
    calls: list[str] = []

    @jobfence.guarded(inbox=inbox)
    def handler(message: Any) -> str:
        assert jobfence.current_claim().key == "order:1"
        calls.append(message.id)
        return "done"

    worker = jobfence.Worker(q, handler, concurrency=1)

    def watch() -> None:
        while worker.stats.processed < 3:
            time.sleep(0.01)
        worker.stop()

    watcher = threading.Thread(target=watch)
    watcher.start()
    stats = worker.run()
    watcher.join()
    assert calls == ["order:1"]
    assert stats.processed == 3 and stats.duplicates == 2
    with pytest.raises(ConfigurationError) as info:
        handler(object())  # outside a worker there is no message id to key on
    assert info.value.argument == "key"
    inbox.close()
    q.close()


async def test_log_lines_name_the_message(caplog: pytest.LogCaptureFixture) -> None:
    q = jobfence.AsyncQueue(_url(), "log")
    await q.publish({"n": 1}, id="logged")

    async def handler(message: Any) -> None:
        if message.delivery == 1:
            raise ValueError("first time")

    worker = jobfence.AsyncWorker(q, handler, backoff=0)
    with caplog.at_level(logging.WARNING, logger="jobfence.worker"):
        await _run_until(worker, lambda: worker.stats.processed == 1)
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert "'logged'" in record.getMessage() and "ValueError: first time" in record.getMessage()
    assert (record.message_id, record.delivery, record.queue) == ("logged", 1, "log")  # type: ignore[attr-defined]
    await q.close()


def test_bad_arguments_are_refused_with_the_argument_named() -> None:
    aq = jobfence.AsyncQueue(_url(), "bad")
    q = jobfence.Queue(_url(), "bad")

    async def handler(message: Any) -> None:
        pass

    cases: list[tuple[str, Any]] = [
        ("queue", lambda: jobfence.AsyncWorker(q, handler)),  # type: ignore[arg-type]
        ("queue", lambda: jobfence.Worker(aq, handler)),  # type: ignore[arg-type]
        ("handler", lambda: jobfence.AsyncWorker(aq, 5)),  # type: ignore[arg-type]
        ("concurrency", lambda: jobfence.AsyncWorker(aq, handler, concurrency=0)),
        ("concurrency", lambda: jobfence.AsyncWorker(aq, handler, concurrency=1.5)),
        ("max_deliveries", lambda: jobfence.AsyncWorker(aq, handler, max_deliveries=0)),
        ("visibility", lambda: jobfence.AsyncWorker(aq, handler, visibility=-1)),
        ("backoff", lambda: jobfence.AsyncWorker(aq, handler, backoff=-1)),
        ("shutdown_timeout", lambda: jobfence.AsyncWorker(aq, handler, shutdown_timeout="x")),
        ("prefetch", lambda: jobfence.AsyncWorker(aq, handler, prefetch=-1)),
    ]
    for argument, make in cases:
        with pytest.raises(ConfigurationError) as info:
            make()
        assert info.value.argument == argument
    q.close()
