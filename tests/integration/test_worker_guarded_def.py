"""A blocking ``Worker`` whose handler is a ``guarded(inbox=Inbox(url))`` plain function: the
claims and completions run on the worker's event loop through the asyncio inbox of the same
URL (batched across the handlers where the backend batches), only the function in the
handler threads; every rule of the guard holds. Real Redis, PostgreSQL and SQLite (the queue
and the inbox on the same backend)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence._guard_worker import run_guarded_in_worker, worker_guard
from jobfence.backends._sql.inbox import SQLInboxBackend
from jobfence.backends._sql.inbox_async import AsyncSQLInboxBackend
from jobfence.backends.postgres.inbox import PostgresInboxBackend
from jobfence.backends.postgres.inbox_async import AsyncPostgresInboxBackend
from jobfence.backends.redis.inbox import RedisInboxBackend
from jobfence.backends.redis.inbox_async import AsyncRedisInboxBackend
from jobfence.backends.sqlite.inbox import SQLiteInboxBackend
from jobfence.backends.sqlite.inbox_async import AsyncSQLiteInboxBackend
from jobfence.worker import _HandlerThreads
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["redis", "postgres", "sqlite"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return {
        "redis": REDIS_URL,
        "postgres": POSTGRES_URL,
        "sqlite": f"sqlite:///{tmp_path}/jobs.db",
    }[request.param]


class Calls:
    """Counts the inbox backend's claim calls (a batch counts once), on the asyncio backend
    classes (the worker's loop) and on the blocking ones (a handler thread)."""

    def __init__(self) -> None:
        self.loop_claims = 0
        self.loop_completions = 0
        self.thread_claims = 0


LOOP_BACKENDS = (
    AsyncSQLInboxBackend,
    AsyncPostgresInboxBackend,
    AsyncSQLiteInboxBackend,
    AsyncRedisInboxBackend,
)
THREAD_BACKENDS = (SQLInboxBackend, PostgresInboxBackend, SQLiteInboxBackend, RedisInboxBackend)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Spies on the inbox backends' claim and completion calls (the real calls are made)."""
    counted = Calls()

    def spy(cls: type, name: str, field: str) -> None:
        if name not in cls.__dict__:
            return
        original = cls.__dict__[name]

        def bump() -> None:
            setattr(counted, field, getattr(counted, field) + 1)

        if inspect.iscoroutinefunction(original):

            async def counting_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                bump()
                return await original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting_async)
        else:

            def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
                bump()
                return original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting)

    for cls in LOOP_BACKENDS:
        spy(cls, "claim", "loop_claims")
        spy(cls, "claim_many", "loop_claims")
        spy(cls, "complete", "loop_completions")
        spy(cls, "complete_many", "loop_completions")
    for sync_cls in THREAD_BACKENDS:
        spy(sync_cls, "claim", "thread_claims")
        spy(sync_cls, "claim_many", "thread_claims")
    return counted


class Processed(logging.Handler):
    """Set ``done`` once the worker logged ``n`` messages processed (acked), or ``refused``
    messages deferred."""

    def __init__(self, n: int, *, refused: int = 0) -> None:
        super().__init__(logging.DEBUG)
        self.n, self.refused = n, refused
        self.processed = self.deferred = 0
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.endswith(") processed"):
            self.processed += 1
        elif "refused for now" in record.msg:
            self.deferred += 1
        if (self.n and self.processed >= self.n) or (
            self.refused and self.deferred >= self.refused
        ):
            self.done.set()


@pytest.fixture
def clients(url: str) -> Iterator[tuple[jobfence.Queue, jobfence.Inbox]]:
    name = "wg-" + uuid.uuid4().hex[:10]
    queue = jobfence.Queue(url, name)
    queue.install()
    inbox = jobfence.Inbox(url, table="jf_wg_" + uuid.uuid4().hex[:8])
    inbox.install()
    try:
        yield queue, inbox
    finally:
        queue.drop()
        queue.close()
        inbox.drop()
        inbox.close()


def drain(queue: jobfence.Queue, handler: Any, done: Processed, **options: Any) -> Any:
    """Run a Worker on ``queue`` until ``done`` is set, then stop it; its stats."""
    logger = logging.getLogger("jobfence.worker")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(done)
    worker = jobfence.Worker(queue, handler, handle_signals=False, **options)
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.run()))
    thread.start()
    try:
        assert done.done.wait(60), (done.processed, done.deferred, worker.stats)
    finally:
        worker.stop()
        thread.join(60)
        logger.removeHandler(done)
        logger.setLevel(level)
    assert not thread.is_alive()
    return outcome[0]


def test_claims_on_the_loop_batched_results_stored_and_replayed(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls, url: str
) -> None:
    queue, inbox = clients
    n = 40
    ran: list[str] = []
    seen: list[bool] = []
    lock = threading.Lock()

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> dict[str, Any]:
        with lock:
            ran.append(message.id)
            seen.append(
                jobfence.current_message() is message
                and jobfence.current_claim().key == message.id
                and not jobfence.current_claim().lost
            )
        return {"n": message.body["n"], "thread": threading.current_thread().name}

    ids = queue.publish_many([{"n": i} for i in range(n)])
    stats = drain(queue, handle, Processed(n), concurrency=8)
    assert stats.processed == n and stats.duplicates == 0 and stats.retried == 0
    assert sorted(ran) == sorted(ids) and all(seen)
    # the inbox steps ran on the worker's loop, none in a handler thread
    assert calls.thread_claims == 0
    assert 0 < calls.loop_claims <= n and 0 < calls.loop_completions <= n, vars(calls)
    # batched across the handlers: fewer round trips than messages
    assert calls.loop_claims < n and calls.loop_completions < n
    for i, message_id in enumerate(ids):  # each result stored by its claim
        claim = inbox.claim(message_id)
        assert claim.state.value == "completed"
        assert claim.result["n"] == i and claim.result["thread"].startswith("jobfence-worker")

    # the same ids again (a redelivery or a duplicate publish): replayed, not run, counted
    for i, message_id in enumerate(ids[:10]):
        queue.publish({"n": i}, id=message_id)
    ran.clear()
    stats = drain(queue, handle, Processed(10), concurrency=8)
    assert ran == []
    assert stats.processed == 10 and stats.duplicates == 10


def test_an_exception_releases_the_claim_and_the_retry_succeeds_once(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls
) -> None:
    queue, inbox = clients
    tries: dict[int, int] = {}
    applied: list[int] = []
    lock = threading.Lock()

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> int:
        n = message.body["n"]
        with lock:
            tries[n] = tries.get(n, 0) + 1
            if n == 0 and tries[n] == 1:
                raise RuntimeError("the first try of message 0 fails")
            applied.append(n)
        return n

    ids = queue.publish_many([{"n": i} for i in range(5)])
    stats = drain(queue, handle, Processed(5), concurrency=8, backoff=0)
    assert sorted(applied) == [0, 1, 2, 3, 4]  # each effect once
    assert tries[0] == 2 and stats.retried == 1 and stats.processed == 5
    assert stats.duplicates == 0 and stats.dead_lettered == 0
    assert calls.thread_claims == 0 and calls.loop_claims > 0
    assert inbox.claim(ids[0]).result == 0


def test_a_claim_held_by_another_owner_defers_the_message_uncounted(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls
) -> None:
    queue, inbox = clients
    ran: list[str] = []

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> None:
        ran.append(message.id)

    message_id = queue.publish({"n": 1})
    held = inbox.claim(message_id, ttl=60)  # another worker's claim, in progress
    calls.thread_claims = 0
    try:
        stats = drain(queue, handle, Processed(0, refused=1), concurrency=8, backoff=0)
    finally:
        held.release()
    assert ran == []
    assert stats.deferred == 1 and stats.retried == 0 and stats.processed == 0
    assert stats.dead_lettered == 0
    assert calls.thread_claims == 0 and calls.loop_claims > 0


def test_a_function_cut_off_at_the_stop_keeps_its_claim_and_its_result_is_stored(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls
) -> None:
    queue, inbox = clients
    started, go_on = threading.Event(), threading.Event()

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> str:
        started.set()
        assert go_on.wait(60)
        return "done"

    message_id = queue.publish({"n": 1})
    worker = jobfence.Worker(queue, handle, handle_signals=False, shutdown_timeout=0)
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.run()))
    thread.start()
    given_back = threading.Event()

    class GivenBack(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "given back" in record.msg:
                given_back.set()

    watch = GivenBack(logging.INFO)
    logger = logging.getLogger("jobfence.worker")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(watch)
    try:
        assert started.wait(60)
        worker.stop()  # no time to finish: the message is given back at once
        assert given_back.wait(60)
    finally:
        go_on.set()  # the function returns only now, its message given back
        thread.join(60)
        logger.removeHandler(watch)
        logger.setLevel(level)
    assert not thread.is_alive()
    stats = outcome[0]
    assert stats.given_back == 1 and stats.processed == 0
    # run() returned after the function did, its result stored by its own claim
    claim = inbox.claim(message_id)
    assert claim.state.value == "completed" and claim.result == "done"
    assert calls.loop_completions == 1


def test_messages_waiting_for_a_thread_are_claimed_and_at_the_stop_go_back_unclaimed(
    clients: tuple[jobfence.Queue, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one handler thread and a prefetch of one, the second message is claimed while the
    first one's function runs (its claim in the same batches as the others'); the worker
    stops before a thread takes it: its function never runs, its claim is released and the
    message given back without counting the delivery; the next run handles it once."""
    queue, inbox = clients
    claimed: set[str] = set()
    claimed_changed = threading.Condition()

    def spy(cls: type, name: str) -> None:
        original = cls.__dict__[name]

        async def recording(self: Any, *args: Any) -> Any:
            answer = await original(self, *args)
            items = args[0] if name == "claim_many" else [args]
            records = answer if name == "claim_many" else [answer]
            with claimed_changed:
                claimed.update(
                    item[0] for item, rec in zip(items, records, strict=True) if rec.mine
                )
                claimed_changed.notify_all()
            return answer

        monkeypatch.setattr(cls, name, recording)

    for cls in LOOP_BACKENDS:
        for name in ("claim", "claim_many"):
            if name in cls.__dict__:
                spy(cls, name)

    ran: list[tuple[str, int]] = []
    started, go_on = threading.Event(), threading.Event()

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> str:
        ran.append((message.id, message.delivery))
        started.set()
        assert go_on.wait(60)
        return message.id

    given_back = threading.Event()

    class GivenBack(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "given back" in record.msg:
                given_back.set()

    watch = GivenBack(logging.INFO)
    logger = logging.getLogger("jobfence.worker")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(watch)
    ids = queue.publish_many([{"n": 1}, {"n": 2}])
    worker = jobfence.Worker(queue, handle, handle_signals=False, concurrency=1, prefetch=1)
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.run()))
    thread.start()
    try:
        assert started.wait(60)
        first = ran[0][0]
        (waiting,) = [i for i in ids if i != first]
        with claimed_changed:  # claimed while the first one's function runs
            assert claimed_changed.wait_for(lambda: waiting in claimed, 20), claimed
        worker.stop()
        assert given_back.wait(60)  # the waiting one, while the first one still runs
    finally:
        go_on.set()
        thread.join(60)
        logger.removeHandler(watch)
        logger.setLevel(level)
    assert not thread.is_alive()
    stats = outcome[0]
    assert ran == [(first, 1)]  # the waiting message's function never ran
    assert stats.processed == 1 and stats.given_back == 1 and stats.retried == 0
    taken = inbox.claim(waiting)  # released at the stop: taken over at once
    assert taken.state.value == "new" and taken.attempt == 2
    taken.release()

    stats = drain(queue, handle, Processed(1), concurrency=1, prefetch=1)
    assert ran == [(first, 1), (waiting, 1)]  # once each; the give-back counted no delivery
    assert stats.processed == 1 and stats.duplicates == 0
    assert inbox.claim(waiting).result == waiting and inbox.claim(first).result == first


def test_an_async_worker_runs_a_guarded_def_the_same_way(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls, url: str
) -> None:
    queue, inbox = clients
    n = 20
    ran: list[str] = []
    all_ran = threading.Event()

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> int:
        assert jobfence.current_message() is message
        ran.append(message.id)
        if len(ran) == n:
            all_ran.set()
        return int(message.body["n"])

    ids = queue.publish_many([{"n": i} for i in range(n)])

    async def main() -> Any:
        aqueue = jobfence.AsyncQueue(url, queue.name)
        worker = jobfence.AsyncWorker(aqueue, handle, handle_signals=False)
        running = asyncio.ensure_future(worker.run())
        try:
            await asyncio.wait_for(asyncio.to_thread(all_ran.wait, 60), 60)
        finally:
            worker.stop()
            stats = await running
            await aqueue.close()
        return stats

    stats = asyncio.run(main())
    assert sorted(ran) == sorted(ids) and stats.processed == n
    assert calls.thread_claims == 0 and 0 < calls.loop_claims < n
    assert inbox.claim(ids[-1]).result == n - 1


def test_which_guarded_handlers_take_the_loop_path(url: str) -> None:
    inbox = jobfence.Inbox(url)
    locks = jobfence.Locks(REDIS_URL)
    try:

        def fn(message: Any) -> None:
            pass

        assert worker_guard(jobfence.guarded(inbox=inbox)(fn)) is not None
        assert worker_guard(jobfence.guarded(inbox=inbox, key="k:{message.id}")(fn)) is not None
        # a lock, a limit or retries: the whole guarded call runs in the handler thread
        assert worker_guard(jobfence.guarded(inbox=inbox, locks=locks, lock="l")(fn)) is None
        assert worker_guard(jobfence.guarded(inbox=inbox, locks=locks, limit=("t", 2))(fn)) is None
        assert worker_guard(jobfence.guarded(inbox=inbox, attempts=3)(fn)) is None
        assert worker_guard(jobfence.guarded(locks=locks, lock="l")(fn)) is None
        assert worker_guard(fn) is None
        memory = jobfence.Inbox("memory://")  # its store is the client's own
        assert worker_guard(jobfence.guarded(inbox=memory)(fn)) is None
        memory.close()
    finally:
        inbox.close()
        locks.close()


def test_the_guarded_span_and_metrics_as_in_the_thread(
    clients: tuple[jobfence.Queue, jobfence.Inbox], calls: Calls
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from jobfence import telemetry

    queue, inbox = clients
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    seen: dict[str, int] = {}

    @jobfence.guarded(inbox=inbox)
    def handle(message: Any) -> None:
        seen[message.id] = trace.get_current_span().get_span_context().span_id

    ids = queue.publish_many([{"n": i} for i in range(3)])
    telemetry.configure(meter_provider=meters, tracer_provider=tracers)
    try:
        drain(queue, handle, Processed(3))
    finally:
        telemetry.configure()
    guarded = [s for s in spans.get_finished_spans() if s.name == "jobfence.guarded"]
    assert len(guarded) == 3
    for span in guarded:  # the function ran inside its call's span
        assert span.attributes is not None
        key = span.attributes["jobfence.key"]
        assert key in ids and span.attributes["jobfence.function"].endswith("handle")
        assert seen[str(key)] == span.context.span_id
    data = reader.get_metrics_data()
    new_claims = sum(
        point.value
        for rm in (data.resource_metrics if data is not None else [])
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "jobfence.inbox.claims"
        for point in metric.data.data_points
        if dict(point.attributes).get("outcome") == "new"
    )
    assert new_claims == 3
    meters.shutdown()
    tracers.shutdown()
    assert calls.thread_claims == 0 and calls.loop_claims > 0


def test_a_call_cancelled_after_its_outcome_came_back_still_stores_its_result(
    clients: tuple[jobfence.Queue, jobfence.Inbox],
) -> None:
    """The function returned and its outcome reached the worker's loop, but the call was
    cancelled (a stop cutting handlers off) before it resumed: the claim is still completed
    with the function's result (by the call's finishing task), not left to expire with a
    run of the function lost."""
    _queue, inbox = clients
    ran: list[int] = []

    @jobfence.guarded(inbox=inbox, key="cut-{n}")
    def handle(n: int) -> str:
        ran.append(n)
        return f"done {n}"

    guard = worker_guard(handle)
    assert guard is not None

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop_inbox = guard.open_inbox()
        calls: list[asyncio.Task[Any]] = []

        class CancelledOnDelivery(_HandlerThreads):
            def _deliver(self) -> None:
                super()._deliver()  # the outcome handed to the awaiting call ...
                calls[0].cancel()  # ... which is cancelled before it resumes

        pool = CancelledOnDelivery(loop, 1, "jobfence-test")
        finishing: set[asyncio.Task[None]] = set()
        try:
            call = loop.create_task(
                run_guarded_in_worker(guard, loop_inbox, pool, (7,), {}, finishing)
            )
            calls.append(call)
            with pytest.raises(asyncio.CancelledError):
                await call
            assert len(finishing) == 1
            await asyncio.wait_for(asyncio.wait(list(finishing)), 30)
        finally:
            pool.shutdown()
            await loop_inbox.close()

    asyncio.run(scenario())
    assert ran == [7]
    claim = inbox.claim("cut-7")
    assert claim.state.value == "completed" and claim.result == "done 7"
