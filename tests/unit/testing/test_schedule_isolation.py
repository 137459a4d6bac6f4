"""The schedules of one ``explore`` share one event loop: what a schedule leaves behind on it
(a callback queued with ``call_soon`` that queues another, a timer, an asyncio task a job
started and never awaited) must not run in the next schedule, nor change its tape.

Each test runs the same explore twice, once with a scenario that leaves such things behind
and once with one that does not, and compares every schedule's picks; and it checks that
nothing a schedule left behind ran once the next schedule had started."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from jobfence import testing
from jobfence.testing import Simulation


def _scenario(log: list[Any], leave: frozenset[str]) -> Any:
    """Three jobs of four points each. As the schedule ends, what ``leave`` names: a
    ``"chain"`` of callbacks (each queues the next, for longer than the loop runs on after
    the scenario's end), a ``"timer"``, a ``"task"`` the last job to end starts, which steps
    through ``asyncio.sleep(0)`` a few times and then reaches points (the next schedule
    would count it as a task of its own, with picks of its own)."""

    async def straggler(tag: int) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        for _ in range(3):
            log.append(("straggler", tag))
            await testing.point("p")

    async def job(sim: Simulation, last: list[int]) -> None:
        for _ in range(4):
            await testing.point("p")
        last[0] -= 1
        if "task" in leave and last[0] == 0:
            asyncio.get_running_loop().create_task(straggler(sim.id))

    async def scenario(sim: Simulation) -> None:
        log.append(("start", sim.id))
        last = [3]
        for _ in range(3):
            sim.spawn(job, sim, last)
        await sim.join()
        log.append(("picks", " ".join(sim.picks)))
        loop = asyncio.get_running_loop()
        tag = sim.id
        if "chain" in leave:

            def chain(depth: int) -> None:
                log.append(("callback", tag))
                if depth < 20:
                    loop.call_soon(chain, depth + 1)

            loop.call_soon(chain, 0)
        if "timer" in leave:
            loop.call_later(0.5, log.append, ("timer", tag))

    return scenario


def _late(log: list[Any]) -> list[Any]:
    """Entries a schedule's leftovers wrote after the next schedule started."""
    current = None
    late = []
    for entry in log:
        if entry[0] == "start":
            current = entry[1]
        elif entry[0] in ("callback", "timer", "straggler") and entry[1] != current:
            late.append(entry)
    return late


@pytest.mark.parametrize(
    "leave",
    [{"chain"}, {"timer"}, {"task"}, {"chain", "timer", "task"}],
    ids=lambda leave: "+".join(sorted(leave)),
)
def test_what_a_schedule_leaves_on_the_loop_does_not_reach_the_next_one(leave: set[str]) -> None:
    for strategy in ("random", "fifo", "pct"):
        clean: list[Any] = []
        testing.explore(_scenario(clean, frozenset()), schedules=30, seed=5, strategy=strategy)
        messy: list[Any] = []
        report = testing.explore(
            _scenario(messy, frozenset(leave)), schedules=30, seed=5, strategy=strategy
        )
        assert report.ok, report
        assert _late(messy) == [], strategy
        picks_clean = [e[1] for e in clean if e[0] == "picks"]
        picks_messy = [e[1] for e in messy if e[0] == "picks"]
        assert len(picks_messy) == 30
        assert picks_messy == picks_clean, strategy


def test_every_schedule_starts_with_the_random_module_in_the_same_state() -> None:
    """Jobs' draws from the ``random`` module (a backoff's jitter) are the same in every run
    of a schedule: each schedule starts from one state, whatever the one before drew (some
    draw nothing, some a few numbers, some leave a ``gauss()`` value kept, one reseeds the
    generator, one draws 700 words, past a regeneration of its state), and the caller's
    state is back once explore returns."""
    starts: list[Any] = []

    async def job(n: int) -> None:
        await testing.point("p")
        kind = n % 6
        if kind == 1:
            random.random()
        elif kind == 2:
            random.gauss(0, 1)  # keeps its pair's second value for the next call
        elif kind == 3:
            random.seed(n)
        elif kind == 4:
            for _ in range(700):
                random.getrandbits(32)
        elif kind == 5:
            random.setstate(random.getstate())  # a restore to where it is: no change

    async def scenario(sim: Simulation) -> None:
        starts.append(random.getstate())
        sim.spawn(job, sim.id)
        await sim.join()

    random.seed(12345)
    random.random()
    before = random.getstate()
    testing.explore(scenario, schedules=40, seed=3).assert_ok()
    assert random.getstate() == before
    assert len(starts) == 40
    assert all(state == starts[0] for state in starts)
    random.seed(0)
    assert starts[0] == random.getstate()
