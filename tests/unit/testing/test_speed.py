"""The fast scheduler keeps asyncio's view of each task, and idle renewers sleep.

At a point the scheduler may step another task's coroutine itself (no event loop round in
between): that task must still see its own context variables and be asyncio's current task.
An async renewer sleeps until its next lease is due (or, with none, until a lease is added)
instead of waking every ``IDLE_WAIT`` virtual second, so a long virtual pause costs a few
steps; what it must act on at once wakes it (a lease dropped without release, an extend to a
shorter ttl). A client's close does not wait out its timeouts for background work that can
never go on as the schedule ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any

import pytest

from jobfence import testing
from jobfence.testing import Simulation

_WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="unset")


def test_each_task_sees_its_own_context_and_is_the_current_task_after_every_switch() -> None:
    wrong: list[Any] = []
    switches: list[int] = []

    async def job(sim: Simulation, label: str) -> None:
        _WHO.set(label)
        me = asyncio.current_task()
        last = None
        for _ in range(15):
            await testing.point("p")
            picks = len(sim.picks)
            if _WHO.get() != label or asyncio.current_task() is not me:
                wrong.append((label, _WHO.get()))
            if sim.current() is None or sim.current().atask is not me:  # type: ignore[union-attr]
                wrong.append((label, "sim.current()"))
            last = picks
        switches.append(last or 0)

    async def scenario(sim: Simulation) -> None:
        for label in ("a", "b", "c"):
            sim.spawn(job, sim, label)
        await sim.join()

    report = testing.explore(scenario, schedules=40, seed=1)
    assert report.ok, report
    assert wrong == []
    assert max(switches) > 10  # the tasks did switch at their points


def test_an_idle_renewer_does_not_wake_every_second_through_a_long_pause() -> None:
    waits: list[float] = []

    async def job(sim: Simulation, locks: Any) -> None:
        lease = await locks.acquire("job", ttl=30)
        await lease.release()  # from here on its client's renewer has nothing to renew
        await sim.sleep(600)

    async def scenario(sim: Simulation) -> None:
        clock = testing.get_clock()
        wait_async = clock.wait_async

        async def counted(event: Any, timeout: float) -> bool:
            waits.append(timeout)
            return await wait_async(event, timeout)

        clock.wait_async = counted  # type: ignore[method-assign]
        try:
            sim.spawn(job, sim, sim.locks())
            await sim.join()
        finally:
            del clock.wait_async
        assert sim.now() >= 600

    assert testing.explore(scenario, schedules=1).ok
    # the renewer looked once as the lease was added; idle, it waited for an add() alone
    assert len(waits) < 5, waits


def test_a_dropped_lease_is_given_back_at_once_while_the_renewer_holds_another() -> None:
    """The renewer holding a lease sleeps until that lease is due (10 virtual seconds), with
    no tick in between: a lease dropped without release wakes it, and is given back at the
    same virtual moment (a waiting acquire of another client gets it)."""
    taken_at: list[float] = []

    async def job(sim: Simulation, locks: Any, other: Any) -> None:
        kept = await locks.acquire("kept", ttl=30)

        async def take_and_forget() -> None:
            assert await locks.acquire("x", ttl=30) is not None  # never released

        await take_and_forget()
        gc.collect()
        lease = await other.acquire("x", ttl=30)
        taken_at.append(sim.now())
        await lease.release()
        await kept.release()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, sim.locks(), sim.locks())
        await sim.join()

    with pytest.warns(ResourceWarning, match="without release"):
        report = testing.explore(scenario, schedules=3)
    assert report.ok, report
    assert taken_at == [0.0, 0.0, 0.0]


def test_an_extend_to_a_shorter_ttl_is_renewed_in_time() -> None:
    """The renewer sleeps until the next check it saw (10 s for a ttl of 30); an extend to a
    ttl of 3 wakes it, so the lease is renewed every second and held through a long
    sleep."""
    held: list[bool] = []

    async def job(sim: Simulation, locks: Any) -> None:
        lease = await locks.acquire("x", ttl=30)
        await lease.extend(3)
        await sim.sleep(20)
        held.append(lease.held)
        await lease.release()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, sim.locks())
        await sim.join()

    report = testing.explore(scenario, schedules=3)
    assert report.ok, report
    assert held == [True, True, True]


def test_a_clients_close_does_not_wait_for_background_work_parked_at_a_point() -> None:
    """A holder paused past its ttl leaves its renewal and the give-back of its lost lease
    parked at their points when the schedule ends; nothing is decided any more, so they are
    cancelled before the clients close instead of each close waiting its timeout out (in
    virtual time: loop rounds)."""
    timed_out: list[float | None] = []

    async def job(locks: Any) -> None:
        lease = await locks.acquire("job", ttl=30)
        await testing.point("work")
        await lease.release()

    async def scenario(sim: Simulation) -> None:
        for _ in range(2):
            sim.spawn(job, sim.locks())
        await sim.join()

    real_wait = asyncio.wait

    async def counted(fs: Any, *, timeout: float | None = None, **kw: Any) -> Any:
        done, pending = await real_wait(fs, timeout=timeout, **kw)
        if pending:  # it timed out
            timed_out.append(timeout)
        return done, pending

    asyncio.wait = counted  # type: ignore[assignment]
    try:
        report = testing.explore(
            scenario, schedules=5, faults=[testing.faults.pause_past_ttl("work", seconds=300)]
        )
    finally:
        asyncio.wait = real_wait  # type: ignore[assignment]
    assert report.ok, report
    assert report.schedules == 5
    # the renewal of the paused holder timed out (its limit: the 20 s left of its lease);
    # no close's wait for background work (5 s) did
    assert 5.0 not in timed_out and 20.0 in timed_out, timed_out


def test_a_renewer_starts_only_when_its_first_lease_is_due() -> None:
    """A lease released before its first renewal (a third of its ttl) costs no renewer at
    all; one held longer is renewed from then on, through many ttls."""
    started: list[bool] = []
    held: list[bool] = []

    async def quick(locks: Any) -> None:
        lease = await locks.acquire("quick", ttl=30)
        await lease.release()
        started.append(locks._renewer.running)

    async def long(sim: Simulation, locks: Any) -> None:
        lease = await locks.acquire("long", ttl=30)
        await sim.sleep(100)  # past three ttls: renewed every 10 s
        held.append(lease.held and locks._renewer.running)
        await lease.release()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(quick, sim.locks())
        sim.spawn(long, sim, sim.locks())
        await sim.join()

    report = testing.explore(scenario, schedules=3)
    assert report.ok, report
    assert started == [False, False, False]
    assert held == [True, True, True]


def test_a_schedule_leaves_no_reference_cycle_for_the_garbage_collector() -> None:
    """Once a schedule ended, its simulation, tasks and tables are freed at once (no cycle
    among them waits for the garbage collector, whose rounds over thousands of schedules'
    leftovers cost more than a small schedule's share of the rest)."""
    sims: list[weakref.ref[Simulation]] = []
    tables: list[weakref.ref[Any]] = []

    async def job(db: testing.SimTable) -> None:
        for i in range(4):
            if i % 2:
                await db.read("row")
            else:
                await testing.point("p")

    async def scenario(sim: Simulation) -> None:
        sims.append(weakref.ref(sim))
        db = sim.table("t", {"row": {"n": 0}})
        tables.append(weakref.ref(db))
        for _ in range(3):
            sim.spawn(job(db))
        await sim.join()

    gc.collect()
    gc.disable()
    try:
        testing.explore(scenario, schedules=20, seed=1).assert_ok()
        alive = [ref for ref in sims + tables if ref() is not None]
    finally:
        gc.enable()
    assert len(sims) == 20
    assert alive == []
