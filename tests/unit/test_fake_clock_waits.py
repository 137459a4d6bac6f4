"""Every wait goes through the clock: under a ManualClock whose waits advance its time, a
scenario of minutes with 60 s leases on ``memory://`` (renewals, a waiter handed the lease,
an unrenewed lease expiring, a waiter timing out) runs without waiting for real."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

import jobfence
from jobfence.testing import Clock, ManualClock, clocked, hooked, set_clock

TTL = 60.0
#: real seconds the scenarios may take: far less than one ttl, which real waits would need
REAL_BOUND = 20.0


async def _scenario(clock: ManualClock) -> None:
    renewed: list[Any] = []
    with hooked(lambda point, **info: renewed.append(point) if point == "lock.renew" else None):
        async with jobfence.AsyncLocks(f"memory://{uuid.uuid4().hex}") as locks:
            first = await locks.acquire("job", ttl=TTL)  # renewed by the client's renewer
            waiter = asyncio.ensure_future(locks.acquire("job", ttl=TTL, timeout=10 * TTL))
            started = clock.monotonic()
            for _ in range(100_000):  # the holder works for five minutes of the clock
                if clock.monotonic() - started >= 5 * TTL:
                    break
                await clock.asleep(1)
            assert first.held and not waiter.done()
            assert len(renewed) >= 5  # kept alive by renewals every ttl / 3

            assert await first.release()  # handed to the waiter
            second = await waiter
            assert second.token > first.token

            third = await locks.try_acquire("other", ttl=TTL, renew=False)
            assert third is not None
            expires = clock.monotonic() + TTL
            for _ in range(100_000):  # nobody renews it: it runs out by the clock
                if third.lost:
                    break
                await clock.asleep(1)
            assert third.lost and clock.monotonic() >= expires

            with pytest.raises(jobfence.LockTimeout):  # waits out its timeout by the clock
                await locks.acquire("job", ttl=TTL, timeout=2 * TTL)
            assert second.held  # still renewed
            successor = await locks.try_acquire("other", ttl=TTL, renew=False)
            assert successor is not None and successor.token > third.token


async def test_an_async_scenario_of_minutes_runs_without_waiting() -> None:
    real = time.monotonic()
    with clocked(ManualClock(50_000.0, auto_advance=True)) as clock:
        await asyncio.wait_for(_scenario(clock), REAL_BOUND)
    assert clock.monotonic() - 50_000.0 >= 7 * TTL  # minutes of the clock ...
    assert clock.waits  # ... went by in the waits, not in real time
    assert time.monotonic() - real < REAL_BOUND


def test_a_sync_waiter_is_handed_an_expired_lease_by_the_clock() -> None:
    clock = ManualClock(50_000.0, auto_advance=True)
    old = set_clock(clock)
    outcome: list[Any] = []
    locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    try:
        started = clock.monotonic()  # (the client's renewer moves the clock too: read it first)
        crashed = locks.try_acquire("job", ttl=TTL, renew=False)  # a holder that died
        assert crashed is not None

        def wait_for_it() -> None:
            try:
                outcome.append(locks.acquire("job", ttl=TTL, timeout=10 * TTL, renew=False))
            except BaseException as exc:  # reported below
                outcome.append(exc)

        worker = threading.Thread(target=wait_for_it, daemon=True)
        worker.start()
        worker.join(REAL_BOUND)
        assert not worker.is_alive(), "the waiter waited for real"
        lease = outcome[0]
        assert isinstance(lease, jobfence.Lease), lease
        assert lease.token > crashed.token and crashed.lost
        assert clock.monotonic() - started >= TTL
    finally:
        locks.close()
        set_clock(old)


def test_the_default_clock_waits_for_real_and_returns_whether_the_event_is_set() -> None:
    clock = Clock()
    event = threading.Event()
    assert clock.wait(event, 0) is False and clock.wait(event, -1) is False
    threading.Timer(0.01, event.set).start()
    assert clock.wait(event, 30) is True  # returns when set, not after the timeout


async def test_the_default_clock_waits_for_an_asyncio_event() -> None:
    clock = Clock()
    event = asyncio.Event()
    assert await clock.wait_async(event, 0) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await clock.wait_async(event, 30) is True


def test_a_clock_without_the_wait_methods_is_refused() -> None:
    class Old:  # the four methods a clock needed before waits went through it
        def monotonic(self) -> float:
            return 0.0

        def time(self) -> float:
            return 0.0

        def sleep(self, seconds: float) -> None:
            pass

        async def asleep(self, seconds: float) -> None:
            pass

    with pytest.raises(jobfence.ConfigurationError) as info:
        set_clock(Old())  # type: ignore[arg-type]
    assert info.value.argument == "clock"
    assert "wait, wait_async" in str(info.value)
