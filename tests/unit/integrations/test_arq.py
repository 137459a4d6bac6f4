"""``jobfence.integrations.arq``: guarded arq tasks run by arq's own ``Worker`` (in this
process, in burst mode, on the local Redis with a queue of the test's own), or called with a
``ctx`` like the one arq passes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import arq
import pytest
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.worker import Worker, func

import jobfence
from jobfence.errors import ConfigurationError, FingerprintMismatch, LockTimeout
from jobfence.integrations import arq as jfarq

# arq's Worker.close() calls redis-py's deprecated close()
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated close:DeprecationWarning")

REDIS = RedisSettings.from_dsn("redis://127.0.0.1:6379/0")


@pytest.fixture
async def inbox() -> AsyncIterator[jobfence.AsyncInbox]:
    box = jobfence.AsyncInbox(f"memory://{uuid.uuid4().hex}")
    yield box
    await box.close()


@pytest.fixture
async def locks() -> AsyncIterator[jobfence.AsyncLocks]:
    client = jobfence.AsyncLocks(f"memory://{uuid.uuid4().hex}")
    yield client
    await client.close()


@pytest.fixture
async def pool() -> AsyncIterator[tuple[ArqRedis, str]]:
    queue = f"jf-arq-unit-{uuid.uuid4().hex[:12]}"
    redis = await create_pool(REDIS, default_queue_name=queue)
    yield redis, queue
    keys = [k async for k in redis.scan_iter(match=f"{queue}*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


def worker(queue: str, *functions: Any, **options: Any) -> Worker:
    """arq's own worker for ``queue``, run in this process until the queue is empty."""
    settings: dict[str, Any] = {"burst": True, "poll_delay": 0.05, "handle_signals": False}
    settings.update(options)
    return Worker(
        functions=list(functions),
        redis_settings=REDIS,
        queue_name=queue,
        keep_result=60,
        **settings,
    )


async def run_burst(w: Worker) -> None:
    try:
        await asyncio.wait_for(w.main(), 30)
    finally:
        await w.close()


async def test_the_default_key_is_the_job_id_so_a_rerun_of_the_job_returns_the_stored_result(
    pool: tuple[ArqRedis, str], inbox: jobfence.AsyncInbox
) -> None:
    redis, queue = pool
    runs: list[tuple[str, int, str | None]] = []

    @jfarq.guarded(inbox=inbox)
    async def charge(ctx: dict[str, Any], order_id: int, amount: int) -> dict[str, Any]:
        runs.append((ctx["job_id"], ctx["job_try"], jfarq.job_key()))
        return {"order_id": order_id, "charged": amount}

    job_id = f"charge-{uuid.uuid4().hex}"
    job = await redis.enqueue_job("charge", 7, 30, _job_id=job_id)
    assert job is not None
    await run_burst(worker(queue, func(charge, name="charge")))
    assert await job.result(timeout=5) == {"order_id": 7, "charged": 30}
    assert runs == [(job_id, 1, f"arq:{job_id}")]
    stored = await inbox.claim(f"arq:{job_id}")  # the key is the arq job id
    assert (stored.state.value, stored.result) == ("completed", {"order_id": 7, "charged": 30})

    # arq refuses the same _job_id while its result is kept; once it is gone (keep_result
    # passed), the job can run again under its id: a duplicate, answered from the inbox
    await redis.delete(f"arq:result:{job_id}")
    again = await redis.enqueue_job("charge", 7, 30, _job_id=job_id)
    assert again is not None
    await run_burst(worker(queue, func(charge, name="charge")))
    assert await again.result(timeout=5) == {"order_id": 7, "charged": 30}
    assert len(runs) == 1  # not run a second time
    assert jfarq.job_key() is None  # outside a task


async def test_templates_and_fingerprint_see_the_arguments_after_ctx(
    pool: tuple[ArqRedis, str], inbox: jobfence.AsyncInbox, locks: jobfence.AsyncLocks
) -> None:
    redis, queue = pool
    runs: list[tuple[int, int]] = []
    seen: list[str | None] = []

    @jfarq.guarded(
        locks=locks,
        inbox=inbox,
        lock="product:{product_id}",
        key="order:{order_id}",
        fingerprint=True,  # hashes order_id, product_id, qty: never ctx (a Redis pool)
    )
    async def place(ctx: dict[str, Any], order_id: int, product_id: int, qty: int) -> int:
        lease = jobfence.current_lease()
        seen.append(None if lease is None else lease.name)
        runs.append((order_id, qty))
        return qty

    w = worker(queue, func(place, name="place"))
    first = await redis.enqueue_job("place", 1, 9, qty=5)
    dup = await redis.enqueue_job("place", 1, 9, qty=5)  # another job for the same order
    assert first is not None and dup is not None
    await run_burst(w)
    assert await first.result(timeout=5) == 5
    assert await dup.result(timeout=5) == 5  # the stored result
    assert runs == [(1, 5)] and seen == ["product:9"]
    # enqueued once the first has run: jobs enqueued in the same millisecond run in any order
    other = await redis.enqueue_job("place", order_id=1, product_id=9, qty=6)
    assert other is not None
    w2 = worker(queue, func(place, name="place"))
    await run_burst(w2)
    with pytest.raises(FingerprintMismatch):  # the same key with other arguments
        await other.result(timeout=5)
    info = await other.result_info()
    assert info is not None and (info.success, info.job_try) == (False, 1)
    assert (w.jobs_complete, w.jobs_failed) == (2, 0)
    assert (w2.jobs_complete, w2.jobs_failed, w2.jobs_retried) == (0, 1, 0)  # never retried


async def test_a_claim_in_progress_is_retried_by_arq_after_its_expiry_without_using_a_try(
    pool: tuple[ArqRedis, str], inbox: jobfence.AsyncInbox
) -> None:
    redis, queue = pool
    held = await inbox.claim("order:7", ttl=2, renew=True)  # another worker is on it
    assert held.state.value == "new"
    tries: list[int] = []

    @jfarq.guarded(inbox=inbox, key="order:{order_id}", retry_delay=30)
    async def ship(ctx: dict[str, Any], order_id: int) -> str:
        tries.append(ctx["job_try"])
        return f"shipped {order_id}"

    job = await redis.enqueue_job("ship", 7)
    assert job is not None
    enqueued = await redis.zscore(queue, job.job_id)
    w = worker(queue, func(ship, name="ship"), max_tries=1)
    running = asyncio.ensure_future(run_burst(w))
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while w.jobs_retried < 2:  # ClaimInProgress became arq.Retry, more than max_tries
            assert asyncio.get_running_loop().time() < deadline, "the job was never retried"
            await asyncio.sleep(0.02)
        assert tries == []  # refused before the task body ran
        rescheduled = await redis.zscore(queue, job.job_id)
        assert rescheduled is not None and enqueued is not None
        # arq moved it on by the claim's expiry (at most 2 s, plus jitter), not retry_delay
        assert enqueued + 100 <= rescheduled <= enqueued + 2 * 1100 + 500 + 5000
        await held.release()  # the other worker gave up its claim
        await running
    finally:
        running.cancel()
    assert await job.result(timeout=5) == "shipped 7"
    assert tries == [1]  # the same job, still its first try: refusals do not use tries
    assert w.jobs_complete == 1 and w.jobs_retried >= 2


async def test_a_lock_timeout_raises_arq_retry_with_the_delay(
    inbox: jobfence.AsyncInbox, locks: jobfence.AsyncLocks
) -> None:
    @jfarq.guarded(locks=locks, lock="report:{day}", timeout=0, retry_delay=2.5)
    async def report(ctx: dict[str, Any], day: str) -> str:
        raise AssertionError("must not run while another worker holds the lock")

    async with locks.acquire("report:monday", ttl=30):
        with pytest.raises(arq.Retry) as info:
            await report({"job_id": "j-1", "job_try": 1}, "monday")
    # the lease's expiry (30 s) plus jitter, not the retry_delay
    assert 25_000 <= info.value.defer_score <= 30 * 1100 + 500
    assert isinstance(info.value.__cause__, LockTimeout)


async def test_in_process_retries_pass_through_as_guarded_retry(
    inbox: jobfence.AsyncInbox,
) -> None:
    calls: list[int] = []

    class Blink(Exception):
        pass

    policy = jobfence.RetryPolicy(attempts=3, backoff=0, retry_on=(Blink,))

    @jfarq.guarded(inbox=inbox, retry=policy)
    async def flaky(ctx: dict[str, Any]) -> int:
        calls.append(1)
        if len(calls) < 3:
            raise Blink("the database blinked")
        return len(calls)

    assert await flaky({"job_id": "j-2", "job_try": 1}) == 3
    assert await flaky({"job_id": "j-2", "job_try": 2}) == 3  # a duplicate now
    assert len(calls) == 3


async def test_bad_configuration_is_refused_when_decorating(
    inbox: jobfence.AsyncInbox,
) -> None:
    def sync_task(ctx: dict[str, Any], n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:
        jfarq.guarded(inbox=inbox)(sync_task)
    assert info.value.argument == "fn"

    async def no_ctx(*, n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:
        jfarq.guarded(inbox=inbox)(no_ctx)
    assert info.value.argument == "fn"

    async def task(ctx: dict[str, Any], n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:  # ctx is not a template argument
        jfarq.guarded(inbox=inbox, key="job:{ctx}")(task)
    assert info.value.argument == "key"
    with pytest.raises(ConfigurationError) as info:
        jfarq.guarded(inbox=inbox, retry_delay=-1)
    assert info.value.argument == "retry_delay"
    sync_inbox = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
    try:
        with pytest.raises(ConfigurationError) as info:
            jfarq.guarded(inbox=sync_inbox)(task)
        assert info.value.argument == "inbox"
    finally:
        sync_inbox.close()


async def test_a_cancelled_run_gives_its_lease_and_claim_back(
    inbox: jobfence.AsyncInbox, locks: jobfence.AsyncLocks
) -> None:
    """arq cancels running jobs on SIGTERM and runs them again: the next run must not wait
    for the cancelled one's claim_ttl."""
    started = asyncio.Event()

    @jfarq.guarded(locks=locks, inbox=inbox, lock="export:{day}", claim_ttl=60)
    async def export(ctx: dict[str, Any], day: str) -> None:
        started.set()
        await asyncio.sleep(3600)

    running = asyncio.ensure_future(export({"job_id": "e-1", "job_try": 1}, "monday"))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    again = await inbox.claim("arq:e-1", ttl=5)
    assert (again.state.value, again.attempt) == ("new", 2)
    lease = await locks.try_acquire("export:monday", ttl=5)
    assert lease is not None
    await lease.release()
