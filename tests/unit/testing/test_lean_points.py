"""The lean path of a point: a point with no fault, reached by the task being stepped, decides
inline (no gate object); anything else (a fault planned, a trail recorded, other work ready)
goes the full way. Both must make the same decisions, and the lean one must keep what
asyncio's tasks rely on: real futures awaited between points, cancellation and timeouts of a
task parked at a point, the current task.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jobfence import testing
from jobfence.testing import Simulation


def _tapes(scenario: Any, strategy: str, faults: Any = None) -> list[tuple[str, ...]]:
    """The picks of schedules 0-24 (every schedule made to fail at its end, so the report
    lists them all)."""

    async def failing(sim: Simulation) -> None:
        await scenario(sim)
        sim.check(False, "the end")

    report = testing.explore(
        failing,
        schedules=25,
        seed=3,
        strategy=strategy,
        faults=faults,
        stop_on_failure=False,
        shrink=False,
    )
    assert len(report.failures) == 25, report
    return [f.tape.picks for f in report.failures]


def _three_tasks(sim_points: int = 12) -> Any:
    async def job(sim: Simulation, db: Any) -> None:
        for i in range(sim_points):
            if i % 3 == 2:
                await db.read("row")
            else:
                await testing.point("p")

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {"row": {"n": 0}})
        for _ in range(3):
            sim.spawn(job, sim, db)
        await sim.join()

    return scenario


def test_the_lean_path_decides_as_the_full_path_does() -> None:
    # a fault that is never hit makes every point of the schedule take the full way
    never = [testing.faults.transient("no.such.point")]
    for strategy in ("random", "pct", "fifo"):
        lean = _tapes(_three_tasks(), strategy)
        full = _tapes(_three_tasks(), strategy, never)
        assert lean == full, strategy
        assert any(len(picks) > 10 for picks in lean)  # decisions were made


def test_a_task_awaits_real_futures_between_lean_points() -> None:
    seen: list[tuple[str, Any]] = []

    async def job(sim: Simulation, label: str, box: dict[str, asyncio.Future[str]]) -> None:
        me = asyncio.current_task()
        for i in range(6):
            await testing.point("p")
            if i == 2:
                # a future only the loop resolves: the task waits in asyncio, not at a point
                fut = asyncio.get_running_loop().create_future()
                box[label] = fut
                asyncio.get_running_loop().call_later(1.0, fut.set_result, label)
                seen.append((label, await fut))
                await asyncio.sleep(0.5)
            if asyncio.current_task() is not me:
                seen.append((label, "wrong current task"))

    async def scenario(sim: Simulation) -> None:
        box: dict[str, asyncio.Future[str]] = {}
        tasks = [sim.spawn(job, sim, label, box) for label in ("a", "b", "c")]
        await sim.join()
        sim.check(all(t.done and t.error is None for t in tasks), "every job ended")
        sim.check(sim.now() >= 1.5, f"virtual time moved: {sim.now()}")

    report = testing.explore(scenario, schedules=60, seed=5)
    assert report.ok, report
    assert seen and all(label == got for label, got in seen), seen[:5]
    assert len(seen) == 60 * 3


def test_cancelling_a_task_parked_at_a_lean_point() -> None:
    outcomes: list[tuple[str, bool]] = []
    parked_at: list[str | None] = []

    async def victim(sim: Simulation, db: Any) -> None:
        for _ in range(100):
            await testing.point("v")
            await db.read("row")  # a point of a table: the gate on_point returns
            await sim.sleep(1)

    async def killer(sim: Simulation, target: list[Any]) -> None:
        for _ in range(3):
            await testing.point("k")
        parked_at.append(target[0].parked_at)
        target[0].atask.cancel()
        await testing.point("k")

    async def scenario(sim: Simulation) -> None:
        target: list[Any] = []
        v = sim.spawn(victim, sim, sim.table("t", {"row": {"n": 0}}))
        target.append(v)
        sim.spawn(killer, sim, target)
        await sim.join()
        outcomes.append((type(v.error).__name__, v in sim.parked))

    report = testing.explore(scenario, schedules=40, seed=2)
    assert report.ok, report
    assert outcomes == [("CancelledError", False)] * 40
    # cancelled where it waited at one of its points, often, at both kinds
    assert parked_at.count("v") >= 3 and parked_at.count("db.read") >= 3, parked_at


def test_a_timeout_ends_a_task_looping_over_lean_points() -> None:
    ends: list[str] = []

    async def looper(sim: Simulation) -> None:
        try:
            async with asyncio.timeout(5):
                while True:
                    await testing.point("loop")
                    await sim.sleep(1)
        except TimeoutError:
            ends.append(f"timeout at {sim.now():g}")

    async def other(sim: Simulation) -> None:
        for _ in range(20):
            await testing.point("other")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(looper, sim)
        sim.spawn(other, sim)
        await sim.join()

    report = testing.explore(scenario, schedules=30, seed=4)
    assert report.ok, report
    assert ends == ["timeout at 5"] * 30


def _uneven(sim_points: tuple[int, ...] = (3, 9, 6, 12)) -> Any:
    """Tasks of different lengths: they end at different moments, most of them while
    another task's driver steps them."""

    async def job(n: int) -> None:
        for _ in range(n):
            await testing.point("p")

    async def scenario(sim: Simulation) -> None:
        for n in sim_points:
            sim.spawn(job, n)
        await sim.join()

    return scenario


def _uneven_tapes(strategy: str, checks: list[Any]) -> list[tuple[str, ...]]:
    async def failing(sim: Simulation) -> None:
        await _uneven()(sim)
        sim.check(False, "the end")

    report = testing.explore(
        failing,
        schedules=25,
        seed=7,
        strategy=strategy,
        checks=checks,
        stop_on_failure=False,
        shrink=False,
    )
    assert len(report.failures) == 25, report
    return [f.tape.picks for f in report.failures]


def test_the_decision_after_a_job_ends_is_the_one_the_idle_loop_makes() -> None:
    # a checker (one that never fails) makes every decision after a job's end wait for the
    # idle loop, as before; without it the step that ended the job decides at once
    for strategy in ("random", "pct", "fifo"):
        at_once = _uneven_tapes(strategy, [])
        by_loop = _uneven_tapes(strategy, [testing.single_holder()])
        assert at_once == by_loop, strategy
        assert any(len(picks) > 15 for picks in at_once)


def test_every_task_is_done_in_asyncio_after_join_and_awaiting_one_works() -> None:
    seen: list[Any] = []

    async def job(n: int) -> int:
        for _ in range(n):
            await testing.point("p")
        return n

    async def waiter(sim: Simulation, other: Any) -> None:
        await testing.point("w")
        seen.append(("awaited", await other.atask))  # its asyncio task, awaited directly

    async def scenario(sim: Simulation) -> None:
        tasks = [sim.spawn(job, n) for n in (2, 5, 4)]
        sim.spawn(waiter, sim, tasks[1])
        results = await sim.join()
        await asyncio.sleep(0)  # the drivers of jobs that ended last finish their tasks
        seen.append(("results", results[:3]))
        seen.append(("done", all(t.atask.done() for t in sim.tasks)))

    report = testing.explore(scenario, schedules=30, seed=9)
    assert report.ok, report
    assert seen.count(("results", [2, 5, 4])) == 30
    assert seen.count(("done", True)) == 30
    assert seen.count(("awaited", None)) == 30  # the driver's asyncio task ends with None


def test_a_read_of_a_simulated_table_decides_inline(monkeypatch: Any) -> None:
    """A table's read reached by the task being stepped takes the lean path (no info dict,
    no gate, no ``on_point``), and still records what the task read; with a fault planned it
    goes the full way."""
    reached: list[str] = []
    full = Simulation.on_point

    def counting(self: Simulation, point: str, info: dict[str, Any]) -> Any:
        reached.append(point)
        return full(self, point, info)

    monkeypatch.setattr(Simulation, "on_point", counting)
    seen: list[tuple[str, int]] = []

    async def job(sim: Simulation, db: Any, label: str) -> None:
        for _ in range(4):
            row = await db.read("row")
            seen.append((label, row["n"]))
        await db.write("row", n=row["n"] + 1)

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {"row": {"n": 0}})
        for label in ("a", "b"):
            sim.spawn(job, sim, db, label)
        await sim.join()
        # the versions each task read are recorded as the full way records them
        sim.check(set(db._read) == {("t1", "row"), ("t2", "row")}, f"{db._read}")

    testing.explore(scenario, schedules=20, seed=4).assert_ok()
    assert len(seen) == 20 * 8 and {n for _, n in seen} <= {0, 1}
    # only schedule 0's reads went the full way (it records the trail auto faults plan from)
    assert reached.count("db.read") == 8
    assert reached.count("db.write") == 20 * 2
    reached.clear()
    never = [testing.faults.transient("no.such.point")]
    testing.explore(scenario, schedules=5, seed=4, faults=never).assert_ok()
    assert reached.count("db.read") == 5 * 8


def test_the_points_of_a_plain_schedule_decide_inline_and_switch_without_a_loop_round(
    monkeypatch: Any,
) -> None:
    """3 tasks x 20 points, in memory: after each task's first point (reached while the
    others' first steps are still ready in the loop, so decided the full way), every point
    is decided inline by ``lean_point``, which returns what the task awaits (the done future
    ``sim.passed`` when it goes on, no gate); the tasks switch inside the slice, so a
    schedule takes a handful of loop rounds whatever its length; and the tapes are those of
    the full way (forced by a fault that is never hit)."""
    from jobfence.testing import _sim
    from jobfence.testing._loop import SimLoop

    counts = {"points": 0, "went_on": 0, "switched": 0, "full": 0, "gates": 0, "rounds": 0}
    lean_point = _sim.Simulation.lean_point
    gate_await = _sim._Gate.__await__
    run_once = SimLoop._run_once

    def counting_lean_point(self: Simulation, point: str) -> Any:
        step = lean_point(self, point)
        counts["points"] += 1
        if step is None:
            pass
        elif step is self.passed:
            counts["went_on"] += 1
        elif getattr(step, "__name__", "") == "_lean_switch":
            counts["switched"] += 1
        else:
            counts["full"] += 1
        return step

    def counting_gate(self: Any) -> Any:
        counts["gates"] += 1
        return gate_await(self)

    def counting_run_once(self: SimLoop) -> None:
        counts["rounds"] += 1
        run_once(self)

    def scenario(tapes: list[str]) -> Any:
        async def job(db: Any) -> None:
            for i in range(20):
                if i % 2:
                    await db.read("row")
                else:
                    await testing.point("p")

        async def run(sim: Simulation) -> None:
            db = sim.table("t", {"row": {"n": 0}})
            for _ in range(3):
                sim.spawn(job(db))
            await sim.join()
            tapes.append(" ".join(sim.picks))

        return run

    never = [testing.faults.transient("no.such.point")]
    for strategy in ("random", "pct", "fifo"):
        full: list[str] = []
        report = testing.explore(
            scenario(full), schedules=40, seed=11, strategy=strategy, faults=never
        )
        assert report.ok, report
        for key in counts:
            counts[key] = 0
        monkeypatch.setattr(_sim.Simulation, "lean_point", counting_lean_point)
        monkeypatch.setattr(_sim._Gate, "__await__", counting_gate)
        monkeypatch.setattr(SimLoop, "_run_once", counting_run_once)
        lean: list[str] = []
        report = testing.explore(scenario(lean), schedules=40, seed=11, strategy=strategy)
        monkeypatch.undo()
        assert report.ok, report
        assert lean == full, strategy
        assert any(len(tape.split()) > 30 for tape in lean) or strategy == "fifo"
        # schedule 0 records its trail: every point of it goes the full way (lean_point
        # answers None); in the others, each task's first point goes the full way (the
        # other tasks' first steps are ready then), every other point is decided inline
        assert counts["points"] == 40 * 3 * 20, counts
        assert counts["full"] == 39 * 3, counts
        assert counts["went_on"] + counts["switched"] == 39 * 3 * 19, counts
        assert counts["gates"] == 60 + 39 * 3, counts  # schedule 0's points, first points
        if strategy == "random":  # a switch at most points (pct's come at its change points)
            assert counts["switched"] >= 39 * 3 * 5, counts
        elif strategy == "pct":
            assert counts["switched"] >= 20, counts
        # a few loop rounds per schedule (schedule 0's included), not one per switch
        assert counts["rounds"] <= 40 * 3, counts
