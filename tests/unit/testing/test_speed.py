"""The fast scheduler keeps asyncio's view of each task, and idle renewers sleep.

At a point the scheduler may step another task's coroutine itself (no event loop round in
between): that task must still see its own context variables and be asyncio's current task.
An async renewer with no lease waits until a lease is added instead of waking every
``IDLE_WAIT`` virtual second, so a long virtual pause costs a few steps.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

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
