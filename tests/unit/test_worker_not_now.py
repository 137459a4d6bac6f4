""" "Not now" is not a failure: the worker defers a refused message (``NotNow``: another worker
holds its claim or lease, or this one lost them) without using up a delivery, after the
holder's known expiry; only handler failures count toward ``max_deliveries``, and a dead
letter says the last real failure. A claim whose release failed is taken over at once by a
redelivery handled by the same inbox. On the in-process queue and inbox (every queue backend
runs ``defer`` in the conformance suite; real processes, SIGKILL and a crashed PostgreSQL in
tests/reliability/test_worker_not_now.py)."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
import uuid
from typing import Any

import pytest

import jobfence
from jobfence import ClaimInProgress, ClaimLost, LockLost, LockTimeout, NotNow
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


def _in(seconds: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


def test_the_not_now_refusals_carry_the_marker_and_a_retry_after_hint() -> None:
    claim = ClaimInProgress("busy", key="k", owner="o", expires_at=_in(20))
    assert isinstance(claim, NotNow) and claim.retry_after is not None
    assert 18 < claim.retry_after <= 20
    assert ClaimInProgress("busy", key="k", expires_at=_in(-5)).retry_after == 0.0
    assert ClaimInProgress("busy", key="k").retry_after is None
    timeout = LockTimeout("held", name="n", expires_in=7.5)
    assert isinstance(timeout, NotNow) and isinstance(timeout, TimeoutError)
    assert timeout.retry_after == 7.5
    assert LockLost("gone", name="n").retry_after is None
    assert isinstance(LockLost("gone"), NotNow) and isinstance(ClaimLost("gone"), NotNow)
    assert not isinstance(jobfence.FingerprintMismatch("x"), NotNow)
    assert NotNow("limit reached", retry_after=3).retry_after == 3.0


async def test_a_refused_message_is_deferred_uncounted_and_never_dead_lettered() -> None:
    """Refused more times than max_deliveries: it still runs, at its first delivery."""
    q = jobfence.AsyncQueue(_url(), "refused")
    await q.publish({"n": 1}, id="busy")
    seen: list[int] = []

    async def handler(message: Any) -> None:
        seen.append(message.delivery)
        if len(seen) <= 5:
            raise ClaimInProgress(
                "'busy' is being processed by another worker", key="busy", expires_at=_in(0.05)
            )

    worker = jobfence.AsyncWorker(q, handler, max_deliveries=2, backoff=0.05)
    await _run_until(worker, lambda: worker.stats.processed == 1)
    assert seen == [1] * 6  # six deliveries, each the first: none was used up
    assert worker.stats.deferred == 5
    assert worker.stats.retried == 0 and worker.stats.dead_lettered == 0
    assert await q.dead_letters() == []
    await q.close()


async def test_a_dead_letter_says_the_last_real_failure_not_the_refusals() -> None:
    q = jobfence.AsyncQueue(_url(), "mixed")
    await q.publish({"n": 1}, id="mixed")
    seen: list[int] = []

    async def handler(message: Any) -> None:
        seen.append(message.delivery)
        if len(seen) == 1:
            raise ValueError("the real failure")
        raise LockTimeout("'res' is held by another worker", name="res", expires_in=0.01)

    worker = jobfence.AsyncWorker(q, handler, max_deliveries=2, backoff=0.05)
    await _run_until(worker, lambda: worker.stats.deferred >= 3)
    assert seen[:4] == [1, 2, 2, 2]  # the refusals never count
    assert worker.stats.dead_lettered == 0 and worker.stats.retried == 1
    (m,) = await q.receive(wait=5)
    assert m.delivery == 2 and m.last_error == "ValueError: the real failure"
    await m.ack()
    await q.close()


async def test_a_refusal_comes_back_after_the_holders_expiry() -> None:
    q = jobfence.AsyncQueue(_url(), "later")
    await q.publish({"n": 1}, id="later")
    times: list[float] = []

    async def handler(message: Any) -> None:
        times.append(time.monotonic())
        if len(times) == 1:
            raise ClaimInProgress("busy", key="later", expires_at=_in(1.0))

    worker = jobfence.AsyncWorker(q, handler, backoff=0.01)
    await _run_until(worker, lambda: worker.stats.processed == 1)
    assert times[1] - times[0] >= 0.9  # not before the claim's expiry (backoff is 0.01 s)
    await q.close()


async def test_unstarted_messages_are_deferred_uncounted_at_a_stop() -> None:
    url = _url()
    q = jobfence.AsyncQueue(url, "stopping")
    await q.publish_many([{"n": i} for i in range(4)], ids=[f"m{i}" for i in range(4)])
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(message: Any) -> None:
        started.set()
        await release.wait()

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, prefetch=3)
    run = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    while worker.stats.received < 4:  # the other three wait in the worker's buffer
        await asyncio.sleep(0.01)
    worker.stop()
    release.set()
    stats = await asyncio.wait_for(run, 10)
    assert stats.processed == 1 and stats.given_back == 3
    again = jobfence.AsyncQueue(url, "stopping")
    got = await again.receive(3, wait=2)
    assert sorted(m.delivery for m in got) == [1, 1, 1]  # never ran: not counted
    for m in got:
        await m.ack()
    await q.close()
    await again.close()


def test_a_claim_whose_release_failed_is_taken_over_at_once_by_the_redelivery() -> None:
    """The guard's function fails and its claim's release fails too (the backend is down):
    the redelivery, handled by the same inbox, releases that claim first and runs -- it does
    not wait out the claim's ttl (30 s), nor back off into the dead letters."""
    q = jobfence.Queue(_url(), "takeover")
    q.publish({"n": 1}, id="order:1")
    inbox = jobfence.Inbox(_url())
    runs: list[int] = []

    @jobfence.guarded(inbox=inbox)  # the default claim_ttl
    def handler(message: Any) -> str:
        runs.append(message.delivery)
        if message.delivery == 1:
            raise ConnectionError("the effect's transaction was aborted")
        return "done"

    failed_once: list[str] = []

    def down_once(point: str, **info: Any) -> None:
        if point == "inbox.release" and not failed_once:
            failed_once.append(info["key"])
            raise ConnectionError("the server is down")

    worker = jobfence.Worker(q, handler, max_deliveries=3, backoff=0.05, max_backoff=0.1)

    def stop_when_done() -> None:
        deadline = time.monotonic() + 20
        while worker.stats.processed + worker.stats.dead_lettered < 1:
            assert time.monotonic() < deadline, worker.stats
            time.sleep(0.01)
        worker.stop()

    stopper = threading.Thread(target=stop_when_done)
    with hooked(down_once):
        stopper.start()
        stats = worker.run()
    stopper.join()
    assert failed_once == ["order:1"]
    assert runs == [1, 2] and stats.processed == 1
    assert stats.deferred == 0 and stats.dead_lettered == 0
    info = inbox.claim_info("order:1")
    assert info is not None and info.state is jobfence.ClaimState.COMPLETED
    inbox.close()
    q.close()


def test_a_try_acquire_refusal_in_the_guard_names_the_holders_expiry() -> None:
    locks = jobfence.Locks(_url())
    held = locks.acquire("res:1", ttl=20)

    @jobfence.guarded(locks=locks, lock="res:{n}", timeout=0)
    def job(n: int) -> None:
        raise AssertionError("must not run")

    with pytest.raises(LockTimeout) as refused:
        job(1)
    assert refused.value.retry_after is not None and 15 < refused.value.retry_after <= 20
    held.release()
    locks.close()


def test_defaults_never_dead_letter_a_message_that_only_met_a_holder() -> None:
    """The defaults checked together: a refusal is never counted, so max_deliveries, backoff
    and visibility do not matter to it; what does is that a deferral reaches past every
    default holder's expiry (else it comes back early, is refused and deferred again: still
    uncounted) and that every queue can delay that long."""
    from jobfence._core.inbox_support import DEFAULT_CLAIM_TTL as INBOX_TTL
    from jobfence.backends.rabbitmq.common import MAX_DELAY_MS
    from jobfence.guard import DEFAULT_CLAIM_TTL as GUARD_TTL
    from jobfence.locks_async import DEFAULT_TTL as LOCK_TTL
    from jobfence.worker import MAX_DEFER

    assert max(INBOX_TTL, GUARD_TTL, LOCK_TTL) <= MAX_DEFER
    assert MAX_DEFER * 1.1 + 0.5 <= MAX_DELAY_MS / 1000  # the longest deferral, with jitter
    worker = jobfence.Worker(jobfence.Queue(_url(), "defaults"), lambda m: None)
    for hint in (None, 0.0, GUARD_TTL, INBOX_TTL, LOCK_TTL):
        for _ in range(50):
            delay = worker._worker._not_now_delay(hint)
            floor = worker.backoff if hint is None else hint
            assert floor <= delay <= floor * 1.1 + 0.5


def _failing_releases() -> Any:
    def hook(point: str, **info: Any) -> None:
        if point == "inbox.release" and not hook.on:  # type: ignore[attr-defined]
            raise ConnectionError("the server is down")

    hook.on = False  # type: ignore[attr-defined]
    return hook


def test_a_failed_release_is_sent_again_by_the_next_claim_of_any_key() -> None:
    url = _url()
    mine, other = jobfence.Inbox(url), jobfence.Inbox(url)
    claim = mine.claim("k1", ttl=30, renew=True)
    hook = _failing_releases()
    with hooked(hook):
        with pytest.raises(jobfence.BackendError):
            claim.release()
        assert other.claim("k1").state is jobfence.ClaimState.IN_PROGRESS
        hook.on = True  # the server is back
        mine.claim("k2").release()  # this inbox's next claim frees k1 first
    taken = other.claim("k1")
    assert taken.state is jobfence.ClaimState.NEW  # at once, not after the 30 s ttl
    taken.release()
    mine.close()
    other.close()


def test_a_late_release_never_frees_a_claim_that_is_someone_elses_now() -> None:
    url = _url()
    mine, other = jobfence.Inbox(url), jobfence.Inbox(url)
    claim = mine.claim("k1", ttl=30, renew=True)
    with hooked(_failing_releases()), pytest.raises(jobfence.BackendError):
        claim.release()
    assert other.forget("k1")  # an operator cleared it; another worker claims it now
    theirs = other.claim("k1", ttl=30)
    assert theirs.state is jobfence.ClaimState.NEW
    mine.claim("k2").release()  # sends the late release of k1: owner-checked, a no-op
    info = other.claim_info("k1")
    assert info is not None and info.state is jobfence.ClaimState.IN_PROGRESS
    assert info.owner == theirs.owner
    theirs.release()
    mine.close()
    other.close()
