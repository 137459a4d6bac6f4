"""jobfence.testing scheduling: FIFO, exhaustive, random, PCT, background tasks, setup code."""

from __future__ import annotations

import asyncio
from math import factorial
from typing import Any

import pytest

from jobfence import testing
from jobfence.testing import Simulation, faults


def _stepper(log: list[tuple[str, int]], name: str, points: int) -> Any:
    async def job() -> None:
        for i in range(points):
            log.append((name, i))
            await testing.point(f"{name}.{i}")
        log.append((name, points))

    return job


def _tasks_scenario(
    tasks: int, points: int, runs: list[tuple[tuple[str, ...], int, tuple[Any, ...]]]
) -> Any:
    """``tasks`` tasks that each pass ``points`` points and never block; every schedule
    appends (its picks, its deviations, the order things happened in)."""

    async def scenario(sim: Simulation) -> None:
        log: list[tuple[str, int]] = []
        for t in range(tasks):
            sim.spawn(_stepper(log, "ABCDE"[t], points))
        await sim.join()
        runs.append((tuple(sim.picks), sim.deviations, tuple(log)))

    return scenario


def test_fifo_never_deviates_and_runs_each_task_to_completion_in_spawn_order() -> None:
    runs: list[Any] = []
    report = testing.explore(_tasks_scenario(3, 3, runs), schedules=5, strategy="fifo")
    assert report.ok and report.schedules == 5 and len(runs) == 5
    # each task runs to its first point as it starts; from there on, one at a time
    expected = (
        ("A", 0), ("B", 0), ("C", 0),
        ("A", 1), ("A", 2), ("A", 3),
        ("B", 1), ("B", 2), ("B", 3),
        ("C", 1), ("C", 2), ("C", 3),
    )  # fmt: skip
    for picks, deviations, log in runs:
        assert deviations == 0
        assert log == expected
        assert set(picks) <= {"t1", "t2", "t3"}


def test_the_first_schedule_of_every_strategy_is_fifo() -> None:
    fifo: list[Any] = []
    testing.explore(_tasks_scenario(2, 2, fifo), schedules=1, strategy="fifo")
    for strategy in ("random", "pct", "exhaustive"):
        runs: list[Any] = []
        testing.explore(_tasks_scenario(2, 2, runs), schedules=3, strategy=strategy, seed=7)
        assert runs[0] == fifo[0], strategy


@pytest.mark.parametrize(("tasks", "points"), [(2, 2), (2, 3), (3, 1), (3, 2)])
def test_exhaustive_enumerates_every_interleaving_exactly_once(tasks: int, points: int) -> None:
    runs: list[Any] = []
    report = testing.explore(
        _tasks_scenario(tasks, points, runs), schedules=1000, strategy="exhaustive"
    )
    # after every task ran to its first point, the rest of each task (``points`` steps)
    # interleave: (tasks * points)! / (points!)^tasks orders
    expected = factorial(tasks * points) // factorial(points) ** tasks
    walked = runs[1:]  # runs[0] is the FIFO schedule every exploration starts with
    assert report.ok and report.exhausted
    assert report.schedules == 1 + expected == len(runs)
    assert len({picks for picks, _, _ in walked}) == expected  # distinct tapes
    assert len({log for _, _, log in walked}) == expected  # distinct behaviours


def test_exhaustive_reports_not_exhausted_when_the_schedules_run_out() -> None:
    runs: list[Any] = []
    report = testing.explore(_tasks_scenario(2, 2, runs), schedules=4, strategy="exhaustive")
    assert report.ok and report.schedules == 4 and not report.exhausted
    assert "exhausted" not in str(report)


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_max_preemptions_bounds_the_exhaustive_walk(bound: int) -> None:
    every: list[Any] = []
    testing.explore(_tasks_scenario(2, 3, every), schedules=1000, strategy="exhaustive")
    within = {picks for picks, deviations, _ in every[1:] if deviations <= bound}
    runs: list[Any] = []
    report = testing.explore(
        _tasks_scenario(2, 3, runs), schedules=1000, strategy="exhaustive", max_preemptions=bound
    )
    assert report.exhausted
    assert all(deviations <= bound for _, deviations, _ in runs)
    assert {picks for picks, _, _ in runs[1:]} == within
    assert len(runs) - 1 == len(within) < len(every) - 1
    if bound == 0:
        assert len(within) == 1  # FIFO only


def test_random_with_a_seed_is_reproducible() -> None:
    def tapes(seed: int) -> list[Any]:
        runs: list[Any] = []
        testing.explore(_tasks_scenario(3, 2, runs), schedules=30, seed=seed)
        return runs

    first = tapes(11)
    assert tapes(11) == first
    assert tapes(12) != first
    assert len({picks for picks, _, _ in first}) > 5  # it does explore


def _half_done_scenario() -> Any:
    """A bug of depth 2: t2 must run after t1's first step and before its second (t1 has to
    be preferred at one decision and t2 at the next)."""
    state: dict[str, int] = {}

    async def writer() -> None:
        await testing.point("a")
        state["flag"] = 1
        await testing.point("b")
        state["flag"] = 0

    async def reader(sim: Simulation) -> None:
        await testing.point("c")
        sim.check(state["flag"] != 1, "saw the half-done state")

    async def scenario(sim: Simulation) -> None:
        state["flag"] = 0
        sim.spawn(writer)
        sim.spawn(reader, sim)
        await sim.join()

    return scenario


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_pct_runs_at_each_depth(depth: int) -> None:
    runs: list[Any] = []
    report = testing.explore(_tasks_scenario(3, 2, runs), schedules=20, strategy="pct", depth=depth)
    assert report.ok and report.schedules == 20 and report.strategy == "pct"
    assert len({picks for picks, _, _ in runs}) > 1


def test_pct_depth_2_finds_a_bug_that_needs_one_priority_change() -> None:
    # depth 1 (fixed priorities) runs one task to its end before the other: never the bug
    assert testing.explore(_half_done_scenario(), schedules=100, strategy="pct", depth=1).ok
    report = testing.explore(_half_done_scenario(), schedules=100, strategy="pct", depth=2)
    assert not report.ok
    failure = report.failures[0]
    assert failure.check == "check" and failure.message == "saw the half-done state"
    assert failure.index < 30
    assert failure.tape.picks == ("t1", "t2")


def test_points_inside_background_tasks_are_controlled() -> None:
    """A lease's renewer is a task the job's client starts: its lock.renew points are
    decisions too (named t1.1, t1.2... after the process that started them)."""
    picked: set[str] = set()
    renews: list[int] = []

    async def holder(sim: Simulation) -> None:
        locks = sim.locks()
        lease = await locks.acquire("res", ttl=3)
        await sim.sleep(10)
        assert not lease.lost
        await lease.release()

    async def ticker(sim: Simulation) -> None:
        for _ in range(10):
            await sim.sleep(1)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(holder, sim)
        sim.spawn(ticker, sim)
        await sim.join()
        picked.update(sim.picks)
        renews.append(sim.hits["lock.renew"])

    assert testing.explore(scenario, schedules=10, seed=3).ok
    assert all(n >= 3 for n in renews)  # 10 s of a 3 s lease
    assert any(name.startswith("t1.") for name in picked)


def test_the_scenario_s_own_setup_is_never_faulted() -> None:
    outcome: dict[str, Any] = {}

    async def job(sim: Simulation) -> None:
        try:
            await testing.point("x")
        except testing.InjectedFault as exc:
            outcome["job"] = exc.fault

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {1: {"n": 0}})
        await testing.point("x")  # the scenario's hits are not counted
        await testing.point("x")
        await db.write(1, n=1)  # nor faulted
        await sim.effect("mail", 1)
        sim.spawn(job, sim)
        await sim.join()
        outcome["hits"] = dict(sim.hits)

    fault = faults.transient("x", nth=1)
    extra = [faults.transient("db.write"), faults.crash("effect.mail")]
    assert testing.explore(scenario, schedules=1, faults=[fault, *extra]).ok
    assert outcome == {"job": fault, "hits": {"x": 1}}
    # faults="auto" only tries the points the spawned tasks hit
    trail: list[str] = []

    async def recorded(sim: Simulation) -> None:
        await scenario(sim)
        trail.extend(str(f) for f in sim.faults)

    assert testing.explore(recorded, schedules=50, faults="auto").ok
    assert trail and all("(x#1" in f for f in trail)


def test_a_task_cancelled_where_it_waits_is_no_candidate_any_more() -> None:
    """Cancelled while parked at a point, a task must leave the candidates: a decision must
    never pick a task that has ended."""
    bad: list[Any] = []

    async def victim(sim: Simulation, ended: list[int]) -> None:
        try:
            await testing.point("a")
            await testing.point("b")
        except asyncio.CancelledError:
            ended.append(len(sim.picks))
            raise

    async def killer(sim: Simulation, target: Any) -> None:
        await testing.point("k")
        target.atask.cancel()
        for _ in range(4):
            await testing.point("k")

    async def scenario(sim: Simulation) -> None:
        ended: list[int] = []
        target = sim.spawn(victim, sim, ended)
        sim.spawn(killer, sim, target)
        sim.spawn(killer, sim, sim.spawn(victim, sim, []))
        results = await sim.join()
        if ended and "t1" in sim.picks[ended[0] :]:
            bad.append(tuple(sim.picks))
        assert all(isinstance(r, (asyncio.CancelledError, type(None))) for r in results)

    report = testing.explore(scenario, schedules=100, seed=1)
    assert report.ok, report
    assert bad == []


def test_nested_spawns_are_processes_of_their_own() -> None:
    """A task may spawn tasks: each is a process of its own (t2, t3 in spawn order), which
    the parent may join, and which a crash of the parent does not take down."""
    seen: list[Any] = []

    async def child(log: list[str], label: str) -> str:
        await testing.point("child")
        log.append(label)
        return label

    async def parent(sim: Simulation, log: list[str]) -> None:
        first = sim.spawn(child, log, "c1")
        second = sim.spawn(child(log, "c2"))
        assert (first.name, second.name) == ("t2", "t3")
        await testing.point("parent")  # where the crash hits, before the children ran
        assert await sim.join(first, second) == ["c1", "c2"]
        log.append("parent")

    def scenario_with(log: list[str]) -> Any:
        async def scenario(sim: Simulation) -> None:
            log.clear()
            sim.spawn(parent, sim, log)
            await sim.join()
            seen.append(([t.name for t in sim.tasks], sorted(log)))

        return scenario

    log: list[str] = []
    assert testing.explore(scenario_with(log), schedules=10).ok
    assert all(s == (["t1", "t2", "t3"], ["c1", "c2", "parent"]) for s in seen)
    seen.clear()
    report = testing.explore(scenario_with(log), schedules=1, faults=[faults.crash("parent")])
    assert report.ok and seen == [(["t1", "t2", "t3"], ["c1", "c2"])]


def test_a_reseeded_random_strategy_draws_as_a_new_one_of_that_seed() -> None:
    """explore keeps one random strategy and reseeds it for each schedule: after
    ``reseed(seed)`` it picks, and draws inline, what ``Random(seed)`` does, whatever it drew
    before."""
    from types import SimpleNamespace

    from jobfence.testing.strategies import Random

    candidates = [SimpleNamespace(name=f"t{i}") for i in range(1, 6)]
    kept = Random(3)
    for seed in (0, 1, 7, 12345, 2**40 + 5):
        for n in range(2, 6):  # leave it mid-way through its draws
            kept.choose(candidates[:n], 0)
        kept.reseed(seed)
        fresh = Random(seed)
        assert kept._rng.getstate() == fresh._rng.getstate()
        picks = [kept.choose(candidates[: 2 + i % 4], i) for i in range(60)]
        assert picks == [fresh.choose(candidates[: 2 + i % 4], i) for i in range(60)]
        assert kept._getrandbits is not None
        assert kept._getrandbits(7) == fresh._getrandbits(7)  # the inline draw's generator
