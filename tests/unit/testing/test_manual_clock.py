"""jobfence.testing.ManualClock: time that moves only when the test moves it, waking the
sleeps and waits (sync and async, any thread) whose deadline an advance reaches."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

import jobfence
from jobfence.testing import Clock, ManualClock, clocked, get_clock, hooked

#: real seconds a test waits for a thread or task to get somewhere (never reached when it works)
BOUND = 10.0


def test_time_stands_still_until_advanced_or_set() -> None:
    clock = ManualClock(100.0, epoch=1_000.0)
    assert isinstance(clock, Clock)
    assert clock.monotonic() == 100.0 and clock.time() == 1_100.0
    assert clock.monotonic() == 100.0  # reading it moves nothing
    assert clock.advance(2.5) == 102.5 and clock.monotonic() == 102.5
    assert clock.set(110.0) == 110.0 and clock.time() == 1_110.0
    assert clock.advance(0) == 110.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(109.0)
    assert clock.monotonic() == 110.0
    assert ManualClock().time() == 1_700_000_000.0  # a fixed date by default


def test_a_sleeping_thread_wakes_only_when_an_advance_reaches_its_deadline() -> None:
    clock = ManualClock()
    woke = threading.Event()
    thread = threading.Thread(target=lambda: (clock.sleep(10), woke.set()), daemon=True)
    thread.start()
    assert clock.wait_for_waiters(1, BOUND) and clock.waiting == 1
    assert clock.next_deadline == 10.0
    clock.advance(9.5)
    assert clock.waiting == 1 and not woke.is_set()  # (the wake-up is immediate: see below)
    clock.advance(0.5)
    assert woke.wait(BOUND)
    thread.join(BOUND)
    assert clock.waiting == 0 and clock.next_deadline is None
    assert clock.sleeps == [10]


def test_a_sync_wait_returns_when_its_event_is_set_or_its_deadline_is_reached() -> None:
    clock = ManualClock()
    event = threading.Event()
    results: list[bool] = []

    def wait() -> None:
        results.append(clock.wait(event, 5))

    first = threading.Thread(target=wait, daemon=True)
    first.start()
    assert clock.wait_for_waiters(1, BOUND)
    clock.advance(5)  # the deadline: the event is not set
    first.join(BOUND)
    assert results == [False] and clock.monotonic() == 5.0

    second = threading.Thread(target=wait, daemon=True)
    second.start()
    assert clock.wait_for_waiters(1, BOUND)
    event.set()  # no time passes
    second.join(BOUND)
    assert results == [False, True] and clock.monotonic() == 5.0
    assert clock.wait(event, 5) is True  # set already: no wait
    assert clock.wait(threading.Event(), 0) is False  # no timeout: no wait
    assert clock.waits == [5, 5, 0]


def test_one_advance_wakes_every_deadline_it_reaches_and_no_other() -> None:
    clock = ManualClock()
    woken: list[float] = []
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        with lock:
            woken.append(seconds)

    threads = [threading.Thread(target=sleep, args=(s,), daemon=True) for s in (3, 1, 2, 9)]
    for thread in threads:
        thread.start()
    assert clock.wait_for_waiters(4, BOUND)
    clock.advance(3)
    assert clock.wait_for_waiters(1, BOUND) and not clock.wait_for_waiters(2, 0)
    for thread in threads[:3]:
        thread.join(BOUND)
    assert sorted(woken) == [1, 2, 3] and clock.next_deadline == 9.0
    clock.set(clock.next_deadline)
    threads[3].join(BOUND)
    assert sorted(woken) == [1, 2, 3, 9]


async def test_async_sleeps_and_waits_wake_by_the_clock_or_the_event() -> None:
    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.asleep(30))
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait_async(event, 60))
    assert await clock.wait_for_waiters_async(2, BOUND)
    clock.advance(29)
    await asyncio.sleep(0)
    assert not sleeper.done() and not waiter.done()
    clock.advance(1)
    await asyncio.wait_for(sleeper, BOUND)
    assert not waiter.done()
    event.set()
    assert await asyncio.wait_for(waiter, BOUND) is True
    assert clock.monotonic() == 30.0 and clock.waiting == 0

    timed_out = asyncio.ensure_future(clock.wait_async(asyncio.Event(), 10))
    assert await clock.wait_for_waiters_async(1, BOUND)
    clock.advance(10)
    assert await asyncio.wait_for(timed_out, BOUND) is False
    assert clock.sleeps == [30] and clock.waits == [60, 10]


async def test_a_cancelled_async_sleep_stops_counting_as_waiting() -> None:
    clock = ManualClock()
    task = asyncio.ensure_future(clock.asleep(5))
    assert await clock.wait_for_waiters_async(1, BOUND)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.waiting == 0


async def test_an_advance_from_another_thread_wakes_a_task_on_the_loop() -> None:
    clock = ManualClock()
    task = asyncio.ensure_future(clock.asleep(1))
    assert await clock.wait_for_waiters_async(1, BOUND)
    threading.Thread(target=clock.advance, args=(1,)).start()
    await asyncio.wait_for(task, BOUND)


def test_auto_advance_moves_the_time_instead_of_blocking() -> None:
    clock = ManualClock(auto_advance=True)
    clock.sleep(2)
    assert clock.wait(threading.Event(), 3) is False
    event = threading.Event()
    event.set()
    assert clock.wait(event, 100) is True  # a set event moves nothing
    assert clock.monotonic() == 5.0 and clock.sleeps == [2] and clock.waits == [3]

    async def run() -> None:
        await clock.asleep(4)
        assert await clock.wait_async(asyncio.Event(), 6) is False

    asyncio.run(run())
    assert clock.monotonic() == 15.0


def test_sleeps_call_the_hook_like_the_real_clock() -> None:
    seen: list[tuple[str, Any]] = []
    clock = ManualClock(auto_advance=True)
    with hooked(lambda point, **info: seen.append((point, info))):
        clock.sleep(1.5)
        asyncio.run(clock.asleep(0))
    assert seen == [("sleep", {"seconds": 1.5}), ("sleep", {"seconds": 0})]


def test_it_installs_itself_as_a_context_manager_and_through_clocked() -> None:
    before = get_clock()
    with ManualClock() as clock:
        assert get_clock() is clock
        with pytest.raises(RuntimeError), ManualClock() as inner:
            assert get_clock() is inner
            raise RuntimeError("boom")
        assert get_clock() is clock
    assert get_clock() is before
    with clocked(ManualClock()) as clock:
        assert get_clock() is clock
    assert get_clock() is before


def test_it_drives_a_memory_lease_and_a_waiting_acquire() -> None:
    """An hour-long lease runs out by an advance; a sync acquire waiting in a thread is
    handed the name when the time reaches the expiry, and times out by the clock."""
    with ManualClock(1_000.0) as clock:
        locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
        try:
            held = locks.try_acquire("job", ttl=3600, renew=False)
            assert held is not None and held.expires_in == 3600
            got: list[Any] = []

            def wait_for_it() -> None:
                try:
                    got.append(locks.acquire("job", ttl=60, timeout=7200, renew=False))
                except BaseException as exc:  # reported below
                    got.append(exc)

            waiter = threading.Thread(target=wait_for_it, daemon=True)
            waiter.start()
            assert clock.wait_for_waiters(1, BOUND)
            clock.advance(3599)
            assert held.held and not got
            clock.advance(1)
            waiter.join(BOUND)
            assert not waiter.is_alive() and held.lost
            assert isinstance(got[0], jobfence.Lease) and got[0].token > held.token

            def time_out() -> None:
                try:
                    locks.acquire("job", ttl=60, timeout=30, renew=False)
                except BaseException as exc:  # reported below
                    got.append(exc)

            # the lease just granted is watched for its expiry by the renewer's thread, which
            # sleeps on this clock too: count its sleep first, then wait for one more (the
            # waiter's), so the advance cannot come before the waiter has started waiting
            assert clock.wait_for_waiters(1, BOUND)
            others = clock.waiting
            waiter = threading.Thread(target=time_out, daemon=True)
            waiter.start()
            assert clock.wait_for_waiters(others + 1, BOUND)
            clock.advance(30)
            waiter.join(BOUND)
            assert isinstance(got[-1], jobfence.LockTimeout)
        finally:
            locks.close()
