"""jobfence.testing virtual time: long ttls, backoff and visibility cost no wall time."""

from __future__ import annotations

import asyncio
from typing import Any

import jobfence
from jobfence import testing
from jobfence.testing import Simulation
from jobfence.testing._sim import EPOCH


def test_a_lease_of_an_hour_expires_in_virtual_time() -> None:
    seen: dict[str, Any] = {}

    async def first(sim: Simulation) -> None:
        lease = await sim.locks().acquire("res", ttl=3600, renew=False)
        seen["first"] = (sim.now(), lease.token)
        await sim.sleep(7200)  # holds it past its ttl
        seen["first_lost"] = lease.lost

    async def second(sim: Simulation) -> None:
        lease = await sim.locks().acquire("res", ttl=30)  # waits for the expiry
        seen["second"] = (sim.now(), lease.token)
        await lease.release()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(first, sim)
        sim.spawn(second, sim)
        await sim.join()
        seen["end"] = sim.now()

    assert testing.explore(scenario, schedules=1).ok
    assert seen["first"][0] == 0.0 and seen["second"][0] == 3600.0
    assert seen["second"][1] > seen["first"][1]
    assert seen["first_lost"] is True and seen["end"] == 7200.0


class _Top:
    """An rng whose ``uniform(a, b)`` is ``b``: the backoff's full ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_retry_backoff_of_ten_minutes_is_slept_in_virtual_time() -> None:
    attempts: list[float] = []

    async def job(sim: Simulation) -> None:
        @jobfence.retry_unit(attempts=3, backoff=600, max_backoff=600, rng=_Top())
        async def unit() -> None:
            attempts.append(sim.now())
            if len(attempts) < 3:
                raise ConnectionResetError("transient")

        await unit()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()

    assert testing.explore(scenario, schedules=1).ok
    assert attempts == [0.0, 600.0, 1200.0]


def test_a_queue_visibility_of_an_hour_passes_in_virtual_time() -> None:
    deliveries: list[tuple[int, float]] = []

    async def forgetful(sim: Simulation, queue: Any) -> None:
        (message,) = await queue.receive(visibility=3600)
        deliveries.append((message.delivery, sim.now()))  # never acked: it comes back

    async def patient(sim: Simulation, queue: Any) -> None:
        await sim.sleep(1)
        (message,) = await queue.receive(wait=86_400, visibility=60)
        deliveries.append((message.delivery, sim.now()))
        await message.ack()

    async def scenario(sim: Simulation) -> None:
        queue = sim.queue()
        await queue.publish("job")
        sim.spawn(forgetful, sim, queue)
        sim.spawn(patient, sim, queue)
        await sim.join()

    assert testing.explore(scenario, schedules=1).ok
    assert deliveries == [(1, 0.0), (2, 3600.0)]


def test_sleeping_tasks_wake_in_deadline_order() -> None:
    woke: list[tuple[str, float]] = []

    async def sleeper(sim: Simulation, seconds: float, how: str) -> None:
        if how == "asyncio":
            await asyncio.sleep(seconds)
        else:
            await sim.sleep(seconds)
        woke.append((sim.current().name, sim.now()))  # type: ignore[union-attr]

    async def scenario(sim: Simulation) -> None:
        woke.clear()
        for name, seconds, how in [("a", 30, "sim"), ("b", 10, "asyncio"), ("c", 20, "sim")]:
            sim.spawn(sleeper, sim, seconds, how, name=name)
        sim.spawn(sleeper, sim, 5, "asyncio", name="d")
        await sim.join()

    for strategy in ("fifo", "random"):
        assert testing.explore(scenario, schedules=5, strategy=strategy).ok
        assert woke == [("d", 5.0), ("b", 10.0), ("c", 20.0), ("a", 30.0)]


def test_the_clock_is_virtual_during_a_schedule_and_restored_after() -> None:
    seen: dict[str, float] = {}
    before = testing.get_clock()

    async def scenario(sim: Simulation) -> None:
        clock = testing.get_clock()
        seen["start"] = clock.monotonic()
        await asyncio.sleep(123.5)
        seen["mono"] = clock.monotonic()
        seen["wall"] = clock.time()
        seen["now"] = sim.now()

    assert testing.explore(scenario, schedules=2).ok
    assert seen == {"start": 0.0, "mono": 123.5, "wall": EPOCH + 123.5, "now": 123.5}
    assert testing.get_clock() is before


def test_wait_for_and_timeout_run_on_virtual_time_and_their_tasks_are_controlled() -> None:
    seen: list[Any] = []

    async def slow(sim: Simulation) -> str:
        await testing.point("slow")
        await asyncio.sleep(10)
        await testing.point("slow")
        return "done"

    async def job(sim: Simulation) -> None:
        try:
            seen.append(await asyncio.wait_for(slow(sim), 4))
        except TimeoutError:
            seen.append(("wait_for timed out", sim.now()))
        try:
            async with asyncio.timeout(3):
                seen.append(await slow(sim))
        except TimeoutError:
            seen.append(("timeout", sim.now()))
        seen.append(await asyncio.wait_for(slow(sim), 60))

    async def scenario(sim: Simulation) -> None:
        seen.clear()
        sim.spawn(job, sim)
        sim.spawn(slow, sim)
        await sim.join()
        seen.append(sorted({p for p in sim.picks}))

    for _ in range(2):
        assert testing.explore(scenario, schedules=8, seed=2).ok
        assert seen[:3] == [("wait_for timed out", 4.0), ("timeout", 7.0), "done"]
    assert "t1.1" in seen[3] or "t1.2" in seen[3]  # wait_for's inner task is a candidate
