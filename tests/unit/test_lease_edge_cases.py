"""Lease edge cases found in review: races between extend and renewal, cancellation that
must not leak, interrupted acquires, hung renewals, losses noticed late, closed clients."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.memory.locks import AsyncMemoryLockBackend, MemoryLockBackend
from jobfence.testing import set_hook


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def restore_hook() -> Iterator[None]:
    old = set_hook(None)
    try:
        yield
    finally:
        set_hook(old)


def test_an_extend_racing_a_renewal_never_leaves_two_holders(restore_hook: None) -> None:
    """The renewer sends ttl 0.6, an extend(30) lands first, the renewal lands after it: the
    server now ends the lease 0.6 s later. The holder must not believe it holds it for 30 s."""
    url = _url()
    locks, other = jobfence.Locks(url), jobfence.Locks(url)
    renewing, go = threading.Event(), threading.Event()
    first = [True]

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and first[0]:
            first[0] = False
            renewing.set()
            assert go.wait(5)

    set_hook(hook)
    lease = locks.try_acquire("x", ttl=0.6)
    assert lease is not None
    assert renewing.wait(5)  # a renewal with ttl 0.6 is in flight
    lease.extend(30)
    go.set()  # ... and lands after the extend
    time.sleep(1.0)  # past the 0.6 s the server was left with by the late renewal
    stolen = other.try_acquire("x", ttl=5)
    assert not (stolen is not None and lease.held), "two holders at once"
    assert stolen is None and lease.held  # the renewer re-renewed with the new ttl at once
    assert lease.release()
    locks.close()
    other.close()


async def test_a_loss_found_by_extend_does_not_cancel_code_after_the_block() -> None:
    locks = jobfence.AsyncLocks(_url())
    with pytest.raises(jobfence.LockLost):
        async with locks.acquire("x", ttl=5) as lease:
            assert await locks.force_release("x")
            await lease.extend()  # finds the lease gone: LockLost, raised right here
    await asyncio.sleep(0.01)  # must not raise a stray CancelledError
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await locks.close()


async def test_a_loss_found_by_the_renewer_cancels_only_the_block() -> None:
    locks = jobfence.AsyncLocks(_url())
    with pytest.raises(jobfence.LockLost):
        async with locks.acquire("x", ttl=0.3):
            assert await locks.force_release("x")
            await asyncio.sleep(10)
    await asyncio.sleep(0.01)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await locks.close()


class _RecordingBackend(AsyncMemoryLockBackend):
    def __init__(self) -> None:
        super().__init__(parse_url(_url()))
        self.waits: list[float | None] = []

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        self.waits.append(wait)
        return await super().acquire(name, owner, ttl, wait=wait)


async def test_a_waiter_keeps_its_queue_place_only_a_few_poll_intervals() -> None:
    """A waiter that dies must drop out of the queue soon, whatever its timeout."""
    backend = _RecordingBackend()
    locks = jobfence.AsyncLocks(backend, poll_interval=0.05)
    held = await locks.try_acquire("x", ttl=5)
    assert held is not None
    with pytest.raises(jobfence.LockTimeout):
        await locks.acquire("x", ttl=5, timeout=0.3)
    waits = [w for w in backend.waits if w is not None]
    assert waits and max(waits) <= 3 * 0.05 + 1e-9
    await locks.close()


class _ReplyLostBackend(MemoryLockBackend):
    """Grants the lease, then the reply is lost."""

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        super().acquire(name, owner, ttl, wait=wait)
        raise ConnectionError("reply lost")


def test_an_acquire_whose_reply_was_lost_gives_the_lease_back() -> None:
    backend = _ReplyLostBackend(parse_url(_url()))
    locks = jobfence.Locks(backend)
    with pytest.raises(jobfence.BackendError):
        locks.try_acquire("x", ttl=30)
    assert backend.store.leases == {}  # released, not left to block the name for 30 s
    assert MemoryLockBackend.acquire(backend, "x", "someone", 5) is not None
    locks.close()


def test_a_hung_renewal_does_not_hide_a_loss(restore_hook: None) -> None:
    locks = jobfence.Locks(_url())
    hang = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew":
            hang.wait(10)  # the backend stops answering

    set_hook(hook)
    lease = locks.try_acquire("x", ttl=0.6)
    assert lease is not None
    lost = threading.Event()
    lease.on_lost(lambda _l: lost.set())
    try:
        assert lost.wait(3), "on_lost did not fire while the renewal hung"
        with pytest.raises(jobfence.LockLost):
            lease.check()
    finally:
        hang.set()
        locks.close()


def test_a_loss_first_noticed_at_block_end_still_runs_on_lost() -> None:
    """With renew=False nothing checks the server while the block runs: the release at the
    end is the first to find the lease gone. The holder must still be told."""
    url = _url()
    locks, admin = jobfence.Locks(url), jobfence.Locks(url)
    called: list[Any] = []
    lease = locks.acquire("x", ttl=30, renew=False)
    with pytest.raises(jobfence.LockLost) as info, lease:
        lease.on_lost(called.append)
        assert admin.force_release("x")
    assert called == [lease]
    assert "None" not in str(info.value) and "not held" in str(info.value)
    assert lease.lost
    locks.close()
    admin.close()


def test_closing_the_client_marks_held_leases_lost() -> None:
    locks = jobfence.Locks(_url())
    lease = locks.try_acquire("x", ttl=5)
    assert lease is not None
    called: list[Any] = []
    lease.on_lost(called.append)
    locks.close()
    assert called == [lease] and lease.lost
    with pytest.raises(jobfence.LockLost, match="closed"):
        lease.check()


class _SwallowingBackend(AsyncMemoryLockBackend):
    """A backend whose wait swallows cancellation (as asyncio.wait_for could before 3.12)."""

    def __init__(self) -> None:
        super().__init__(parse_url(_url()))

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        try:
            await asyncio.sleep(timeout)
        except asyncio.CancelledError:
            pass  # swallowed
        return None


async def test_a_waiter_stops_even_if_a_library_swallowed_its_cancellation() -> None:
    backend = _SwallowingBackend()
    locks = jobfence.AsyncLocks(backend, poll_interval=0.05)
    held = await locks.try_acquire("x", ttl=5)
    assert held is not None
    task = asyncio.create_task(locks.acquire("x", ttl=5, timeout=None))
    await asyncio.sleep(0.1)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    try:
        assert task in done and task.cancelled(), "the waiter went on waiting"
    finally:
        if not task.done():  # stop it for good: give it the lease
            await held.release()
            await asyncio.wait({task}, timeout=5)
    await locks.close()


class _SlowReplyExtendBackend(MemoryLockBackend):
    """extend() is applied at once, but its reply is held back until ``reply`` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.applied, self.reply = threading.Event(), threading.Event()

    def extend(self, name: str, owner: str, ttl: float) -> bool:
        ok = super().extend(name, owner, ttl)
        if ttl > 10:  # the caller's extend(30), not a renewal
            self.applied.set()
            assert self.reply.wait(5)
        return ok


def test_a_renewal_sent_while_an_extend_is_in_flight_never_leaves_two_holders(
    restore_hook: None,
) -> None:
    """extend(30) is applied on the server first; a renewal carrying the old ttl (0.6) is
    sent and applied after it, and answers first; then the extend's reply arrives. The server
    ends the lease 0.6 s after the renewal: the holder must not count on 30 s."""
    url = _url()
    backend = _SlowReplyExtendBackend(url)
    locks, other = jobfence.Locks(backend), jobfence.Locks(url)
    renewed = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and backend.applied.is_set():
            renewed.set()

    set_hook(hook)
    lease = locks.try_acquire("x", ttl=0.6)
    assert lease is not None
    extender = threading.Thread(target=lease.extend, args=(30,))
    extender.start()
    assert backend.applied.wait(5)  # the extend is applied; its reply is held back
    assert renewed.wait(5)  # the renewer sent a renewal with ttl 0.6 meanwhile
    time.sleep(0.05)  # ... which lands after the extend
    backend.reply.set()
    extender.join(5)
    time.sleep(1.0)  # past the 0.6 s the late renewal left on the server
    stolen = other.try_acquire("x", ttl=5)
    assert not (stolen is not None and lease.held), "two holders at once"
    assert lease.held and stolen is None  # re-renewed with the new ttl at once
    assert lease.release()
    locks.close()
    other.close()


async def test_async_on_lost_coroutines_run_to_the_end_and_their_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import gc
    import logging

    locks = jobfence.AsyncLocks(f"memory://{uuid.uuid4().hex}")
    lease = await locks.try_acquire("job", ttl=10)
    assert lease is not None
    finished = asyncio.Event()

    suspended = asyncio.Event()

    async def slow(_lease: Any) -> None:
        # wait on a future that nothing but this task refers to (the timer holds a weak
        # reference): only jobfence's strong reference keeps the task from being collected
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        ref = weakref.ref(fut)

        def wake() -> None:
            alive = ref()
            if alive is not None and not alive.done():
                alive.set_result(None)

        loop.call_later(0.05, wake)
        suspended.set()
        await fut
        finished.set()

    async def broken(_lease: Any) -> None:
        raise RuntimeError("callback bug")

    lease.on_lost(slow)
    lease.on_lost(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="jobfence"):
            await locks.backend.force_release("job")
            with pytest.raises(jobfence.LockLost):
                await lease.extend()  # finds the lease gone: runs the callbacks
            await asyncio.wait_for(suspended.wait(), 60)
            gc.collect()  # a task nothing holds on to would be destroyed here
            await asyncio.wait_for(finished.wait(), 60)
            for _ in range(3):
                await asyncio.sleep(0)
        assert any(
            "on_lost callback for 'job' raised" in r.getMessage() and r.exc_info
            for r in caplog.records
        )
    finally:
        await locks.close()
