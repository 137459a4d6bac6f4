"""A lease's life from grant to release, on the in-process backend: renewals isolated per
client and never quiet, late grants given back, waits that ride out transient errors, fast and
honest exits, retryable releases, and leases nobody references any more given back."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
import jobfence.testing
from jobfence._core.compat import BoundedCaller
from jobfence._core.lease_state import LeaseState
from jobfence._core.url import parse_url
from jobfence.backends.memory.locks import AsyncMemoryLockBackend, MemoryLockBackend
from jobfence.locks import EXIT_RELEASE_WAIT
from jobfence.testing import ManualClock, hooked, set_hook

ROOT = Path(__file__).resolve().parents[2]


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def restore_hook() -> Iterator[None]:
    old = set_hook(None)
    try:
        yield
    finally:
        set_hook(old)


class _Renewals:
    """A hook that counts the renewals that carry ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = threading.Semaphore(0)

    def __call__(self, point: str, **info: Any) -> None:
        if point == "lock.renew" and self.name in info["names"]:
            self.count.release()

    def wait(self, renewals: int, timeout: float = 5.0) -> bool:
        """Whether ``renewals`` more renewals were sent within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        return all(
            self.count.acquire(timeout=max(0.0, deadline - time.monotonic()))
            for _ in range(renewals)
        )


def _until(predicate: Any, timeout: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


# -- 1. renewals are isolated per client ----------------------------------------------------
def test_clients_whose_renewals_hang_delay_no_other_clients_leases(restore_hook: None) -> None:
    """More clients than there used to be shared renewal threads (4) hang in their renewals;
    a healthy client's lease in the same process keeps being renewed."""
    url = _url()
    release_hung = threading.Event()
    healthy_renewals = threading.Semaphore(0)

    def hook(point: str, **info: Any) -> None:
        if point != "lock.renew":
            return
        if any(name.startswith("stalled") for name in info["names"]):
            release_hung.wait(10)  # this client's connection hangs
        elif "healthy" in info["names"]:
            healthy_renewals.release()

    stalled = [jobfence.Locks(url) for _ in range(6)]
    healthy = jobfence.Locks(url)
    set_hook(hook)
    try:
        for i, client in enumerate(stalled):
            assert client.try_acquire(f"stalled-{i}", ttl=0.3) is not None
        lease = healthy.try_acquire("healthy", ttl=0.6)
        assert lease is not None
        for _ in range(10):  # about 2 s: more than 3 ttls
            assert healthy_renewals.acquire(timeout=3), "the healthy lease was not renewed"
        assert lease.held
        assert lease.release()
    finally:
        release_hung.set()
        for client in [*stalled, healthy]:
            client.close()


def test_a_call_given_up_before_it_started_is_never_made() -> None:
    caller = BoundedCaller("jobfence-test-call", workers=1)
    hang, made = threading.Event(), []
    try:
        with pytest.raises(TimeoutError):
            caller.call(lambda: hang.wait(10), 0.05)  # occupies the worker
        with pytest.raises(TimeoutError):
            caller.call(lambda: made.append("late"), 0.05)  # queued behind it, given up
        hang.set()
        assert caller.call(lambda: "next", 5) == "next"  # the worker moved on ...
        assert made == []  # ... without making the call given up on
    finally:
        hang.set()
        caller.close()


def test_a_call_that_hangs_does_not_hold_up_the_next_one_of_the_same_caller() -> None:
    """Only one connection may be stuck: the next renewal goes out on a new worker (up to a
    few), so a single hung call does not cost the client its other leases."""
    caller = BoundedCaller("jobfence-test-call", workers=2)
    hang = threading.Event()
    try:
        with pytest.raises(TimeoutError):
            caller.call(lambda: hang.wait(10), 0.05)
        assert caller.call(lambda: "answered", 5) == "answered"
        with pytest.raises(TimeoutError):
            caller.call(lambda: hang.wait(10), 0.05)
        with pytest.raises(TimeoutError):  # both workers hang: no third thread
            caller.call(lambda: "queued", 0.05)
    finally:
        hang.set()
        caller.close()


class _UnreachableForRenewalsBackend(MemoryLockBackend):
    """Renewals never get through; the server's clock runs late, so a lease outlives the
    holder's (conservative) local deadline there by 10x its ttl."""

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        return super().acquire(name, owner, ttl * 10, wait=wait)

    def renew(self, items: Any) -> list[bool]:
        raise ConnectionError("unreachable")


def test_a_lease_the_renewer_gave_up_on_is_given_back() -> None:
    """A renewal still on its way may extend a lease the holder gave up on; the owner-checked
    release after giving up undoes that, and frees the name at once."""
    url = _url()
    backend = _UnreachableForRenewalsBackend(parse_url(url))
    with jobfence.Locks(backend) as locks, jobfence.Locks(url) as other:
        lease = locks.try_acquire("x", ttl=0.3)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        assert lost.wait(3)
        taken: list[Any] = []
        assert _until(lambda: taken.append(other.try_acquire("x", ttl=5)) or taken[-1], 1.0)
        assert taken[-1].release()


def test_an_unanswered_renewal_caps_every_later_deadline_at_its_ttl() -> None:
    """A renewal with ttl 3 got no answer: it may land any time later and leave the server
    with 3 s. An extend to 60 s must not make the holder count on more than 3 s."""
    clock = ManualClock(100.0)
    state = LeaseState(3.0, 100.0, clock=clock)
    clock.set(101.0)
    assert state.renewal_sent(101.0) == 3.0
    clock.set(102.5)
    assert state.renewal_failed(102.5)  # retried, but the request may still be on its way
    state.extend_started()
    state.extend_done(102.5, 60.0)
    assert state.ttl == 60.0  # later renewals carry the new ttl ...
    assert state.effective_ttl == 3.0
    assert state.expires_at == 105.5  # ... but the local deadline counts 3 s
    assert state.next_renew == 103.5
    state.renewal_sent(103.5)
    state.renewal_done(True)
    assert state.expires_at == 106.5


def test_an_unanswered_extend_caps_later_deadlines_at_its_ttl() -> None:
    clock = ManualClock(100.0)
    state = LeaseState(30.0, 100.0, clock=clock)
    state.extend_started()
    state.extend_done(None, 1.0, answered=False)  # extend(1) raised: it may still land
    assert state.ttl == 30.0 and state.expires_at == 130.0  # no deadline moved
    state.renewal_sent(110.0)
    state.renewal_done(True)
    assert state.expires_at == 111.0  # counted with 1 s, not 30 s


# -- 3. acquire never returns a lease that is already lost ----------------------------------
class _SlowReplyBackend(MemoryLockBackend):
    """The first grants' replies take ``delay`` seconds to arrive."""

    def __init__(self, url: str, slow: int, delay: float) -> None:
        super().__init__(parse_url(url))
        self.slow, self.delay = slow, delay
        self.tokens: list[int] = []

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        token = super().acquire(name, owner, ttl, wait=wait)
        if token is not None:
            self.tokens.append(token)
            if self.slow > 0:
                self.slow -= 1
                time.sleep(self.delay)
        return token


def test_a_grant_that_arrives_after_its_ttl_is_given_back_and_the_wait_goes_on() -> None:
    url = _url()
    backend = _SlowReplyBackend(url, slow=1, delay=0.4)
    with jobfence.Locks(backend) as locks:
        lease = locks.acquire("x", ttl=0.3, timeout=5)
        assert lease.held and not lease.lost
        # the late grant was given back, then taken anew (tokens are floored at the clock)
        assert len(backend.tokens) == 2 and backend.tokens[0] < backend.tokens[1]
        assert lease.token == backend.tokens[1]
        assert lease.release()


def test_a_grant_that_arrives_after_the_timeout_and_its_ttl_raises_lock_timeout() -> None:
    url = _url()
    backend = _SlowReplyBackend(url, slow=10, delay=0.4)
    with jobfence.Locks(backend) as locks:
        with pytest.raises(jobfence.LockTimeout):
            locks.acquire("x", ttl=0.3, timeout=0.2)
        assert backend.store.leases == {}  # given back, not left to block the name


def test_try_acquire_gives_back_a_grant_that_came_too_late() -> None:
    backend = _SlowReplyBackend(_url(), slow=1, delay=0.4)
    with jobfence.Locks(backend) as locks:
        assert locks.try_acquire("x", ttl=0.3) is None
        assert backend.store.leases == {}
        lease = locks.try_acquire("x", ttl=0.3)
        assert lease is not None and lease.held and lease.release()


# -- 4. a waiting acquire rides out transient errors -----------------------------------------
class _FlakyWaitBackend(MemoryLockBackend):
    def __init__(self, url: str, failures: int, error: type[Exception] = ConnectionError) -> None:
        super().__init__(parse_url(url))
        self.failures, self.error = failures, error

    def wait(self, name: str, owner: str, timeout: float) -> int | None:
        if self.failures > 0:
            self.failures -= 1
            raise self.error("the server is restarting")
        return super().wait(name, owner, timeout)


def test_a_waiter_retries_transient_errors_and_gets_the_lease() -> None:
    url = _url()
    with jobfence.Locks(url) as holder, jobfence.Locks(_FlakyWaitBackend(url, 3)) as waiter:
        held = holder.try_acquire("x", ttl=0.5, renew=False)
        assert held is not None
        lease = waiter.acquire("x", ttl=5, timeout=10)
        assert lease.held and lease.token > held.token
        assert lease.release()


def test_a_waiter_whose_backend_keeps_failing_times_out_with_the_error_chained() -> None:
    url = _url()
    with jobfence.Locks(url) as holder, jobfence.Locks(_FlakyWaitBackend(url, 10**6)) as waiter:
        held = holder.try_acquire("x", ttl=30)
        assert held is not None
        started = time.monotonic()
        with pytest.raises(jobfence.LockTimeout) as info:
            waiter.acquire("x", ttl=5, timeout=0.5)
        assert time.monotonic() - started < 5
        assert isinstance(info.value.__cause__, jobfence.BackendError)
        assert isinstance(info.value.__cause__.__cause__, ConnectionError)
        assert held.release()


def test_a_waiter_does_not_retry_an_error_that_is_not_transient() -> None:
    url = _url()
    with (
        jobfence.Locks(url) as holder,
        jobfence.Locks(_FlakyWaitBackend(url, 1, ValueError)) as waiter,
    ):
        held = holder.try_acquire("x", ttl=30)
        assert held is not None
        with pytest.raises(jobfence.BackendError) as info:
            waiter.acquire("x", ttl=5, timeout=10)
        assert isinstance(info.value.__cause__, ValueError)
        assert held.release()


class _LostReplyBackend(MemoryLockBackend):
    """The first waiting acquire is granted on the server, but its reply is lost, and so is
    the connection of the wait after it: the next acquire finds the lease granted."""

    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.first_sent: float | None = None
        self.waits = 0

    def wait(self, name: str, owner: str, timeout: float) -> int | None:
        self.waits += 1
        if self.waits == 1:
            raise ConnectionError("connection lost")
        return super().wait(name, owner, timeout)

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        if self.first_sent is None and wait is not None:
            self.first_sent = time.monotonic()
            super().acquire(name, owner, ttl, wait=wait)
            raise ConnectionError("reply lost")
        return super().acquire(name, owner, ttl, wait=wait)


def test_a_grant_whose_reply_was_lost_counts_from_the_call_that_made_it() -> None:
    backend = _LostReplyBackend(_url())
    with jobfence.Locks(backend) as locks:
        lease = locks.acquire("x", ttl=5, timeout=5)
        assert backend.first_sent is not None
        # the retry found the lease granted by the lost call: its ttl runs from that call
        assert lease.state.expires_at <= backend.first_sent + 5
        assert lease.release()


# -- 5. leaving a lost lease is fast and says LockLost ----------------------------------------
class _HangingReleaseBackend(MemoryLockBackend):
    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.go = threading.Event()

    def release(self, name: str, owner: str) -> bool:
        self.go.wait(10)  # the backend cannot be reached
        return super().release(name, owner)


def test_leaving_the_block_of_a_lost_lease_is_fast_even_if_the_release_hangs() -> None:
    backend = _HangingReleaseBackend(_url())
    locks = jobfence.Locks(backend)
    lost = threading.Event()
    try:
        with pytest.raises(jobfence.LockLost), locks.acquire("x", ttl=0.3, timeout=5) as lease:
            lease.on_lost(lambda _lease: lost.set())
            assert MemoryLockBackend.force_release(backend, "x")
            assert lost.wait(3)
            known = time.monotonic()
        assert time.monotonic() - known < EXIT_RELEASE_WAIT + 1.0
    finally:
        backend.go.set()
        locks.close()


class _FailingReleaseBackend(MemoryLockBackend):
    def __init__(self, url: str, failures: int = 10**6) -> None:
        super().__init__(parse_url(url))
        self.failures = failures

    def release(self, name: str, owner: str) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("unreachable")
        return super().release(name, owner)


def test_leaving_a_lost_lease_raises_lock_lost_with_the_release_error_chained() -> None:
    backend = _FailingReleaseBackend(_url())
    with jobfence.Locks(backend) as locks:
        with pytest.raises(jobfence.LockLost) as info, locks.acquire("x", ttl=5) as lease:
            lost = threading.Event()
            lease.on_lost(lambda _lease: lost.set())
            assert MemoryLockBackend.force_release(backend, "x")
            with pytest.raises(jobfence.LockLost):
                lease.extend()  # finds it gone
            assert lost.is_set()
        assert isinstance(info.value.__cause__, jobfence.BackendError)
        assert isinstance(info.value.__cause__.__cause__, ConnectionError)


def test_a_held_lease_whose_release_fails_at_the_end_of_its_block_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The block ran under a held lease; only the early give-back failed: the work is not
    reported as failed, the failure is logged, and release() can be called again."""
    backend = _FailingReleaseBackend(_url(), failures=1)
    with jobfence.Locks(backend) as locks:
        with (
            caplog.at_level(logging.WARNING, logger="jobfence"),
            locks.acquire("x", ttl=5) as lease,
        ):
            pass
        assert any(
            "releasing 'x' at the end of its block failed" in r.getMessage() for r in caplog.records
        )
        assert lease.release()  # tried again: given back
        assert backend.store.leases == {}


def test_a_release_that_failed_can_be_called_again() -> None:
    backend = _FailingReleaseBackend(_url(), failures=1)
    with jobfence.Locks(backend) as locks:
        lease = locks.try_acquire("x", ttl=30)
        assert lease is not None
        with pytest.raises(jobfence.BackendError):
            lease.release()
        assert lease.release()  # the name is free now, not blocked for the ttl
        assert backend.store.leases == {}
        assert not lease.release()  # released: nothing left to give back


def test_on_lost_runs_when_the_release_at_the_end_of_a_failing_block_finds_the_lease_gone() -> None:
    url = _url()
    with jobfence.Locks(url) as locks, jobfence.Locks(url) as admin:
        called: list[Any] = []
        with pytest.raises(ValueError), locks.acquire("x", ttl=30, renew=False) as lease:
            lease.on_lost(called.append)
            assert admin.force_release("x")
            raise ValueError("the body failed")
        assert called == [lease] and lease.lost


class _HangingReleaseAsyncBackend(AsyncMemoryLockBackend):
    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.go = asyncio.Event()

    async def release(self, name: str, owner: str) -> bool:
        try:
            await asyncio.wait_for(self.go.wait(), 10)
        except TimeoutError:
            pass
        return await super().release(name, owner)


async def test_async_lock_lost_comes_soon_after_the_loss_even_if_the_release_hangs() -> None:
    backend = _HangingReleaseAsyncBackend(_url())
    locks = jobfence.AsyncLocks(backend)
    lost_at: list[float] = []
    try:
        with pytest.raises(jobfence.LockLost):
            async with locks.acquire("x", ttl=0.3, timeout=5) as lease:
                lease.on_lost(lambda _lease: lost_at.append(time.monotonic()))
                assert await AsyncMemoryLockBackend.force_release(backend, "x")
                await asyncio.sleep(30)  # cancelled when the renewer finds the lease gone
        assert lost_at and time.monotonic() - lost_at[0] < EXIT_RELEASE_WAIT + 1.0
    finally:
        backend.go.set()
        await locks.close()


# -- 6. renewal is never quiet ---------------------------------------------------------------
def test_failing_renewals_are_logged_with_the_name_and_the_time_left(
    restore_hook: None, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [3]

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and "flaky" in info["names"] and failures[0] > 0:
            failures[0] -= 1
            raise ConnectionError("blip")

    with jobfence.Locks(_url()) as locks, caplog.at_level(logging.WARNING, logger="jobfence"):
        set_hook(hook)
        lease = locks.try_acquire("flaky", ttl=1.5)
        assert lease is not None
        assert _until(lambda: failures[0] == 0, 5)
        assert lease.held  # a retry got through
        assert lease.release()
    warned = [
        r.getMessage() for r in caplog.records if "renewing the lease on 'flaky'" in r.getMessage()
    ]
    assert warned, "a failing renewal was not logged"
    assert "lost in" in warned[0] and "ConnectionError" in warned[0]
    assert len(warned) == 1  # three failures in a row, one line (rate-limited)


class _WrongCountBackend(MemoryLockBackend):
    """A backend bug: the first batched renewal answers no results at all."""

    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.broken = True

    def renew(self, items: Any) -> list[bool]:
        if self.broken:
            self.broken = False
            return []
        return super().renew(items)


class _WrongCountAsyncBackend(AsyncMemoryLockBackend):
    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.broken = True

    async def renew(self, items: Any) -> list[bool]:
        if self.broken:
            self.broken = False
            return []
        return await super().renew(items)


def test_a_renewer_that_fails_marks_its_leases_lost_says_so_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _WrongCountBackend(_url())
    with caplog.at_level(logging.WARNING, logger="jobfence"), jobfence.Locks(backend) as locks:
        lease = locks.try_acquire("x", ttl=0.6)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        assert lost.wait(3), "the holder was not told"
        with pytest.raises(jobfence.LockLost, match="renewer failed"):
            lease.check()
        assert _until(lambda: backend.store.leases == {}, 3)  # given back
        renewals = _Renewals("y")
        with hooked(renewals):
            later = locks.try_acquire("y", ttl=0.3)  # the renewer still works for later leases
            assert later is not None
            assert renewals.wait(6)  # renewed for more than three ttls
        assert later.held and later.release()
    assert any("renewer" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_an_async_renewer_that_fails_cancels_the_block_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _WrongCountAsyncBackend(_url())
    locks = jobfence.AsyncLocks(backend)
    try:
        with caplog.at_level(logging.WARNING, logger="jobfence"):
            with pytest.raises(jobfence.LockLost, match="renewer failed"):
                async with locks.acquire("x", ttl=0.6):
                    await asyncio.sleep(10)
            renewals = _Renewals("y")
            with hooked(renewals):
                later = await locks.try_acquire("y", ttl=0.3)
                assert later is not None
                assert await asyncio.to_thread(renewals.wait, 6)  # more than three ttls
            assert later.held and await later.release()
        assert any("renewer" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        await locks.close()


def test_a_slow_on_lost_callback_delays_no_other_lease() -> None:
    url = _url()
    with jobfence.Locks(url) as locks, jobfence.Locks(url) as admin:
        first = locks.try_acquire("first", ttl=0.6)
        second = locks.try_acquire("second", ttl=0.6)
        assert first is not None and second is not None
        in_callback, go = threading.Event(), threading.Event()

        def slow(_lease: Any) -> None:
            in_callback.set()
            go.wait(10)

        first.on_lost(slow)
        renewals = _Renewals("second")
        try:
            assert admin.force_release("first")
            assert in_callback.wait(3)
            with hooked(renewals):  # while the callback runs, for more than two ttls:
                assert renewals.wait(8), "a slow on_lost callback held up the renewer"
            assert second.held
        finally:
            go.set()
        assert second.release()


def test_a_lease_taken_without_renewal_says_so_when_it_runs_out() -> None:
    with jobfence.Locks(_url()) as locks:
        lease = locks.try_acquire("x", ttl=0.2, renew=False)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        assert lost.wait(3)
        with pytest.raises(jobfence.LockLost) as info:
            lease.check()
        assert "renew=False" in str(info.value)
        assert "renewal" not in str(info.value)


# -- 15. a lease nobody holds is not kept alive ----------------------------------------------
def test_a_renewed_lease_dropped_without_release_is_given_back_with_a_warning() -> None:
    url = _url()
    with jobfence.Locks(url) as locks, jobfence.Locks(url) as other:

        def take_and_forget() -> None:
            lease = locks.try_acquire("x", ttl=0.6)
            assert lease is not None  # an early return: never released

        with pytest.warns(ResourceWarning, match="without release"):
            take_and_forget()
            gc.collect()
        assert _until(lambda: len(locks._renewer) == 0, 3)
        taken: list[Any] = []
        assert _until(lambda: taken.append(other.try_acquire("x", ttl=5)) or taken[-1], 3)
        assert taken[-1].release()


async def test_an_async_lease_dropped_without_release_is_given_back_without_a_tick() -> None:
    """The renewer holds another lease, so it sleeps until that one is due; the clock stands
    still, so no tick ever comes: the collection itself wakes the renewer to give the
    dropped lease back, and another client's waiting acquire gets it."""
    url = _url()
    with ManualClock() as clock:
        locks, other = jobfence.AsyncLocks(url), jobfence.AsyncLocks(url)
        try:
            kept = await locks.try_acquire("kept", ttl=30)
            assert kept is not None
            # the renewer looked at it and sleeps until it is due (10 s away)
            assert await clock.wait_for_waiters_async(1)

            async def take_and_forget() -> None:
                lease = await locks.try_acquire("x", ttl=30)
                assert lease is not None  # an early return: never released

            with pytest.warns(ResourceWarning, match="without release"):
                await take_and_forget()
                gc.collect()
            # a guard in real seconds: without the wake-up it would wait for ever
            taken = await asyncio.wait_for(other.acquire("x", ttl=30), 10)
            assert clock.monotonic() == 0.0  # no time passed: no tick gave it back
            assert len(locks._renewer) == 1 and kept.held
            assert await taken.release() and await kept.release()
        finally:
            await locks.close()
            await other.close()


def test_a_lease_taken_without_renewal_may_be_dropped_it_ends_with_its_ttl() -> None:
    url = _url()
    with jobfence.Locks(url) as locks, jobfence.Locks(url) as other:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            assert locks.try_acquire("x", ttl=30, renew=False) is not None
            gc.collect()
            assert _until(lambda: len(locks._renewer) == 0, 3)  # forgotten by the renewer ...
        assert other.try_acquire("x", ttl=5) is None  # ... but still held: a plain ttl lease


def test_a_dropped_lease_without_renewal_is_not_given_back_by_close_either() -> None:
    url = _url()
    with jobfence.Locks(url) as other:
        locks = jobfence.Locks(url)
        assert locks.try_acquire("x", ttl=30, renew=False) is not None
        gc.collect()  # collected, and closed before the renewer looked: the same answer
        locks.close()
        assert other.try_acquire("x", ttl=5) is None  # still held until its ttl


class _SlowReleaseAsyncBackend(AsyncMemoryLockBackend):
    def __init__(self, url: str) -> None:
        super().__init__(parse_url(url))
        self.gate = asyncio.Event()

    async def release(self, name: str, owner: str) -> bool:
        await self.gate.wait()  # in flight
        return await super().release(name, owner)


def test_only_a_release_that_never_waits_is_marked_so_not_an_override() -> None:
    """memory://'s release answers without waiting: a lease awaits it without a task of its
    own. A subclass overriding it (and maybe waiting) does not inherit the mark, so its
    release runs in a task a cancelled caller cannot cut off (the test below)."""
    assert getattr(AsyncMemoryLockBackend(parse_url(_url())).release, "answers_at_once", False)
    assert not getattr(_SlowReleaseAsyncBackend(_url()).release, "answers_at_once", False)


async def test_an_async_release_on_memory_runs_in_the_callers_task() -> None:
    locks = jobfence.AsyncLocks(_url())
    try:
        lease = await locks.try_acquire("x", ttl=30)
        assert lease is not None
        tasks = len(asyncio.all_tasks())
        assert await lease.release() is True
        assert len(asyncio.all_tasks()) == tasks and not locks._cleanups
        assert await lease.release() is False
    finally:
        await locks.close()


async def test_an_async_release_cancelled_in_flight_finishes_and_a_retry_answers_true() -> None:
    backend = _SlowReleaseAsyncBackend(_url())
    locks = jobfence.AsyncLocks(backend)
    try:
        lease = await locks.try_acquire("x", ttl=30)
        assert lease is not None
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lease.release(), 0.1)
        backend.gate.set()
        assert await lease.release() is True
        assert backend.store.leases == {}
        assert await lease.release() is False
    finally:
        await locks.close()


# -- 14. a test that leaks a client fails ----------------------------------------------------
def test_the_leak_check_fails_a_test_that_leaves_a_client_open(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_leak.py").write_text(
        "import jobfence\n\n"
        "def test_leaks():\n"
        "    jobfence.Locks('memory://leak').try_acquire('x', ttl=5)\n\n"
        "def test_closes():\n"
        "    with jobfence.Locks('memory://ok') as locks:\n"
        "        assert locks.try_acquire('x', ttl=5).release()\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=120,
    )
    # the leaking test itself passes; its teardown is the error
    assert "2 passed, 1 error" in result.stdout, result.stdout + result.stderr
    assert "left lock clients open" in result.stdout


def test_on_lost_runs_at_once_for_a_lease_expired_before_the_renewer_marked_it() -> None:
    """``lost`` already says True once the local deadline passed; ``on_lost`` must agree and
    run the callback in the caller, not wait for the renewer (late under load)."""
    clock = ManualClock(1000.0)
    with jobfence.testing.clocked(clock), jobfence.Locks(f"memory://{uuid.uuid4().hex}") as locks:
        lease = locks.try_acquire("x", ttl=5, renew=False)
        assert lease is not None
        clock.advance(10)  # past the ttl; nothing renews it, and no renewer has looked
        assert lease.lost
        called: list[Any] = []
        lease.on_lost(called.append)
        assert called == [lease]
