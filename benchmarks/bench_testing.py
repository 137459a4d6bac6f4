#!/usr/bin/env python3
"""The race-testing toolkit (``jobfence.testing``): schedules per second, and schedules to a bug.

Reported, not asserted; every figure is printed next to its goal.

1. Throughput: ``explore()`` schedules per second, all in memory, for 2 and 3 tasks x 5, 10
   and 20 points each (alternately ``await testing.point("p")`` and a read of a simulated
   table's row), under the strategies random, pct and fifo; plus two realistic rows: 2 tasks,
   each with its own ``sim.locks()`` client (``memory://``), 3 rounds of ``try_acquire`` + a
   point + ``release``, which shows what real jobfence clients cost under the simulator; and
   2 tasks taking a renewed lease (ttl 30) for a fenced write, the first holder paused 300
   virtual seconds (``pause_past_ttl``) so the other takes over: renewers, a waiting acquire
   and long stretches of virtual time (goal: 2,000 schedules/s).
   Median (and min-max) of ``--rounds`` interleaved rounds of ``--schedules`` schedules, after
   a warm-up. Goal: 10,000 schedules/s for 2-3 tasks x up to 20 points.
2. Time to the first failure with ``faults="auto"``, for two classic bugs:

   (a) the lost update: a naive job reads the row, computes, writes; on a transient error it
       sleeps (``sim.sleep(0.1)``) and re-sends the same stale write, up to 3 attempts. Two
       jobs on one row (stock 10, orders 5 and 3); checks: final stock == 2 and
       ``no_lost_update()``;
   (b) duplicate processing: a plain consumer loop on ``sim.queue()`` (receive one message,
       visibility 30 s, wait 60 s; ``sim.effect("charge", id)``; ack; stop when nothing
       comes), two workers, one message; check: ``exactly_once("charge", expected=[id])``.

   Schedules and wall time until ``explore()`` returns the failure, without shrinking
   (``shrink=False``: how many schedules it took to hit the bug) and with it (what a test
   pays, shrinking's re-runs included), over ``--runs`` runs: median and min-max. Goal: at most
   50 schedules and under 1 s each.
3. Where the time goes: one cProfile run of the 2 x 20 random case (top 15 by own time, and
   the shares of the simulator, asyncio, the random generator and the scenario itself); a
   least-squares split of section 1's random rows into a cost per schedule and a cost per
   point; and the task switches per schedule against what a bare asyncio hand-off between
   two tasks costs on this machine (the floor for any scheduler running tasks on asyncio).

Usage: ``python benchmarks/bench_testing.py [--schedules 1000] [--rounds 5] [--runs 5]
[--no-profile] [--quick] [--cpu] [--only-throughput]`` (``--quick``: a few seconds, every
row, small counts; ``--cpu``: section 1 per CPU second, for a machine shared with other work;
``--only-throughput``: section 1 alone)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jobfence
from jobfence import testing

Scenario = Callable[[testing.Simulation], Awaitable[None]]

GOAL_RATE = 10_000  # schedules per second, 2-3 tasks x up to 20 points
GOAL_LEASES = 2_000  # schedules per second, renewed leases and long virtual pauses
GOAL_SCHEDULES = 50  # schedules until the first failure
GOAL_SECONDS = 1.0  # wall time until the first failure
STRATEGIES = ("random", "pct", "fifo")
LOCK_ROUNDS = 3
LOCK_LABEL = f"2 tasks x {LOCK_ROUNDS} rounds of sim.locks() try_acquire + point + release"
PAUSE = 300.0  # virtual seconds the first holder stops for: 10 ttls of 30 s
LEASE_LABEL = f"2 tasks: acquire (ttl 30, renewed) + fenced write, holder paused {PAUSE:g} s"


def label(tasks: int, points: int) -> str:
    return f"{tasks} tasks x {points} points"


# -- scenarios --------------------------------------------------------------------------------
@dataclass
class Probe:
    """What the schedules of one scenario did: how many ran (shrinking's re-runs included),
    the points hit by those that got to their end, and how often the task going on from a
    point was another one than at the point before (a task switch)."""

    started: int = 0
    finished: int = 0
    points: int = 0
    switches: int = 0
    last: object = None  # the task that went on from the last point

    def begin(self) -> None:
        self.started += 1
        self.last = None

    def went_on(self, who: object) -> None:
        if who is not self.last:
            self.switches += 1
            self.last = who

    def end(self, sim: testing.Simulation) -> None:
        self.finished += 1
        self.points += sum(sim.hits.values())

    @property
    def points_each(self) -> float:
        return self.points / self.finished if self.finished else 0.0


def synthetic(tasks: int, points: int, probe: Probe, switches: bool = False) -> Scenario:
    """``tasks`` tasks hitting ``points`` points each: ``testing.point("p")`` and reads of a
    simulated table's row, alternately (and with ``switches``, counting the task switches)."""

    async def job(db: testing.SimTable) -> None:
        me = object()
        for i in range(points):
            if i % 2:
                await db.read("row")
            else:
                await testing.point("p")
            if switches:
                probe.went_on(me)

    async def scenario(sim: testing.Simulation) -> None:
        probe.begin()
        db = sim.table("t", {"row": {"n": 0}})
        for _ in range(tasks):
            sim.spawn(job(db))
        await sim.join()
        probe.end(sim)

    return scenario


def with_locks(probe: Probe) -> Scenario:
    """2 tasks, each with its own ``sim.locks()`` client, ``LOCK_ROUNDS`` times: take the
    lock if it is free, a point inside, give it back."""

    async def job(locks: Any) -> None:
        for _ in range(LOCK_ROUNDS):
            lease = await locks.try_acquire("job", ttl=30)
            if lease is None:  # the other task holds it: this round is lost
                continue
            await testing.point("work")
            await lease.release()

    async def scenario(sim: testing.Simulation) -> None:
        probe.begin()
        for _ in range(2):
            sim.spawn(job(sim.locks()))
        await sim.join()
        probe.end(sim)

    return scenario


def with_leases(probe: Probe) -> Scenario:
    """2 tasks, each with its own ``sim.locks()`` client: take the lease (ttl 30, renewed in
    the background by the client's renewer), write the row with the lease's fencing token
    to a ``fenced=True`` table, give it back. Run with a ``pause_past_ttl`` fault of
    ``PAUSE`` virtual seconds on the first holder after it took the lease (its renewer stops
    with it), so the other one takes over and the paused one's write is refused: long
    stretches of virtual time, with renewers and a waiting acquire in them."""

    async def job(locks: Any, db: testing.SimTable) -> None:
        lease = await locks.acquire("job", ttl=30)
        await testing.point("work")  # where the fault pauses the first holder
        try:
            await db.write("row", token=lease.token, n=1)
        except jobfence.StaleToken:
            pass  # paused past its ttl: the other holder wrote with a newer token
        await lease.release()

    async def scenario(sim: testing.Simulation) -> None:
        probe.begin()
        db = sim.table("t", {"row": {"n": 0}}, fenced=True)
        for _ in range(2):
            sim.spawn(job, sim.locks(), db)
        await sim.join()
        probe.end(sim)

    return scenario


LEASE_FAULTS = [testing.faults.pause_past_ttl("work", seconds=PAUSE)]


async def _retrying(sim: testing.Simulation, call: Callable[[], Awaitable[Any]]) -> Any:
    """The naive client's retry: up to 3 attempts, 0.1 s apart, the same request each time."""
    for attempt in range(3):
        try:
            return await call()
        except ConnectionError:  # what a transient fault raises (testing.InjectedFault)
            if attempt == 2:
                raise
            await sim.sleep(0.1)
    raise AssertionError("unreachable")


def lost_update(probe: Probe) -> Scenario:
    """(a) Two naive read-compute-write jobs on one row: stock 10, orders 5 and 3."""

    async def naive_job(sim: testing.Simulation, db: testing.SimTable, qty: int) -> None:
        row = await _retrying(sim, lambda: db.read("stock"))
        stock = row["stock"] - qty
        await _retrying(sim, lambda: db.write("stock", stock=stock))  # stale on a retry

    async def scenario(sim: testing.Simulation) -> None:
        probe.begin()
        db = sim.table("inventory", {"stock": {"stock": 10}})
        sim.spawn(naive_job(sim, db, 5))
        sim.spawn(naive_job(sim, db, 3))
        await sim.join()
        row = db.get("stock")
        assert row is not None
        sim.check(row["stock"] == 2, f"stock is {row['stock']}, expected 2")
        probe.end(sim)

    return scenario


MESSAGE_ID = "order-1"


def duplicate(probe: Probe) -> Scenario:
    """(b) Two plain consumer loops on one queue, one message, a charge per delivery."""

    async def consumer(sim: testing.Simulation, queue: Any) -> None:
        while True:
            got = await queue.receive(visibility=30, wait=60)
            if not got:
                return
            message = got[0]
            await sim.effect("charge", message.id)
            await message.ack()

    async def scenario(sim: testing.Simulation) -> None:
        probe.begin()
        await sim.queue().publish({"order": 1}, id=MESSAGE_ID)
        sim.spawn(consumer(sim, sim.queue()))
        sim.spawn(consumer(sim, sim.queue()))
        await sim.join()
        probe.end(sim)

    return scenario


BUGS: list[tuple[str, Callable[[Probe], Scenario], Callable[[], list[testing.Checker]]]] = [
    ("(a) lost update", lost_update, lambda: [testing.no_lost_update()]),
    (
        "(b) duplicate processing",
        duplicate,
        lambda: [testing.exactly_once("charge", expected=[MESSAGE_ID])],
    ),
]


# -- printing ---------------------------------------------------------------------------------
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a markdown table, the first column left-aligned and the others right-aligned."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def spread(values: Sequence[float], fmt: str) -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


# -- 1. throughput ----------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    strategy: str
    probe: Probe
    scenario: Scenario
    rates: list[float]
    faults: Any = None


def cases() -> list[Case]:
    out = []
    for tasks in (2, 3):
        for points in (5, 10, 20):
            for strategy in STRATEGIES:
                probe = Probe()
                scenario = synthetic(tasks, points, probe)
                out.append(Case(label(tasks, points), strategy, probe, scenario, []))
    probe = Probe()
    out.append(Case(LOCK_LABEL, "random", probe, with_locks(probe), []))
    probe = Probe()
    out.append(Case(LEASE_LABEL, "random", probe, with_leases(probe), [], LEASE_FAULTS))
    return out


#: ``--cpu``: rates from the process's CPU time, not wall time (on a machine shared with
#: other work, wall time counts the time others had the CPU)
CPU_TIME = False


def rate(case: Case, schedules: int) -> float:
    """Schedules per second of one ``explore`` run (its own wall time, or CPU time)."""
    started = time.process_time()
    report = testing.explore(
        case.scenario, schedules=schedules, strategy=case.strategy, faults=case.faults
    )
    cpu = time.process_time() - started
    if not report.ok:  # a broken benchmark scenario, not a figure
        raise RuntimeError(f"{case.name} ({case.strategy}) failed: {report}")
    return report.schedules / (cpu if CPU_TIME else report.seconds)


def throughput(schedules: int, rounds: int) -> list[Case]:
    all_cases = cases()
    for case in all_cases:  # warm-up: imports, first clients; counts the points per schedule
        rate(case, max(schedules // 10, 20))
    for i in range(rounds):  # interleaved, the order shifted by one each round
        shift = i % len(all_cases)
        for case in all_cases[shift:] + all_cases[:shift]:
            case.rates.append(rate(case, schedules))
    clock = "CPU" if CPU_TIME else "wall"
    print(
        f"\n## 1. Schedules per second ({clock} time), in memory (median of {rounds} "
        f"interleaved round(s) of {schedules} schedules)\n"
    )
    rows = []
    for case in all_cases:
        med = statistics.median(case.rates)
        goal = GOAL_LEASES if case.name == LEASE_LABEL else GOAL_RATE
        met = "met" if med >= goal else "below"
        rows.append(
            (
                case.name,
                case.strategy,
                f"{case.probe.points_each:.0f}",
                f"{med:,.0f}",
                spread(case.rates, ",.0f"),
                f"{1e6 / med:.0f}",
                f"{med / goal:.0%} of {goal:,} ({met})",
            )
        )
    markdown_table(
        (
            "scenario",
            "strategy",
            "points/schedule",
            "schedules/s",
            "min-max",
            "µs/schedule",
            "of the goal (schedules/s)",
        ),
        rows,
    )
    return all_cases


def split_cost(all_cases: list[Case]) -> tuple[float, float]:
    """Least squares of µs/schedule against points/schedule over the random synthetic rows:
    (µs per schedule, µs per point)."""
    xs, ys = [], []
    for case in all_cases:
        if case.strategy == "random" and case.name not in (LOCK_LABEL, LEASE_LABEL):
            xs.append(case.probe.points_each)
            ys.append(1e6 / statistics.median(case.rates))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


# -- 2. time to the first failure -------------------------------------------------------------
@dataclass
class Hunt:
    schedules: int  # schedules explore() ran to the failure (shrinking's re-runs not counted)
    runs: int  # scenario runs, shrinking's re-runs included
    seconds: list[float]
    failure: testing.Failure | None


def hunt(
    make: Callable[[Probe], Scenario],
    checks: Callable[[], list[testing.Checker]],
    shrink: bool,
    runs: int,
    budget: int,
) -> Hunt:
    probe = Probe()
    scenario = make(probe)
    testing.explore(scenario, schedules=budget, faults="auto", checks=checks(), shrink=shrink)
    seconds: list[float] = []
    report = None
    for _ in range(runs):  # after one warm-up run: imports, the memory backends' first use
        probe.started = 0
        started = time.perf_counter()
        report = testing.explore(
            scenario, schedules=budget, faults="auto", checks=checks(), shrink=shrink
        )
        seconds.append(time.perf_counter() - started)
    assert report is not None
    failure = report.failures[0] if report.failures else None
    return Hunt(report.schedules, probe.started, seconds, failure)


def first_failures(runs: int, budget: int = 1000) -> None:
    print(
        f'\n## 2. Until the first failure, faults="auto" (wall time: median and min-max of '
        f"{runs} run(s), after a warm-up)\n"
    )
    rows = []
    details = []
    for name, make, checks in BUGS:
        raw = hunt(make, checks, False, runs, budget)
        shrunk = hunt(make, checks, True, runs, budget)
        found = raw.failure is not None and shrunk.failure is not None
        check = raw.failure.check if raw.failure is not None else "-"
        met = found and raw.schedules <= GOAL_SCHEDULES and max(shrunk.seconds) < GOAL_SECONDS
        rows.append(
            (
                name,
                "yes" if found else f"no, not in {budget} schedules",
                check,
                str(raw.schedules),
                f"{statistics.median(raw.seconds) * 1e3:.1f}",
                spread([s * 1e3 for s in raw.seconds], ".1f"),
                str(shrunk.runs),
                f"{statistics.median(shrunk.seconds) * 1e3:.1f}",
                spread([s * 1e3 for s in shrunk.seconds], ".1f"),
                "met" if met else "NOT met",
            )
        )
        for what, outcome in (("without shrinking", raw), ("shrunk", shrunk)):
            if outcome.failure is not None:
                f = outcome.failure
                details.append(
                    f"- {name}, {what}: schedule {f.index} (seed {f.seed}): {f.check}: "
                    f"{f.message}; tape `{f.tape}`"
                )
    markdown_table(
        (
            "bug",
            "found",
            "failed check",
            "schedules to it",
            "ms",
            "min-max",
            "schedules incl. shrinking",
            "ms with shrinking",
            "min-max",
            f"goal: <= {GOAL_SCHEDULES} schedules, < {GOAL_SECONDS:g} s",
        ),
        rows,
    )
    print()
    for line in details:
        print(line)


# -- 3. profile -------------------------------------------------------------------------------
AREAS = (
    ("the simulator (jobfence.testing)", ("jobfence/testing/",)),
    ("asyncio (loop, tasks, futures, contexts)", ("asyncio", "_contextvars", "_asyncio")),
    ("the random generator", ("random.py", "_random")),
    ("the scenario itself (this script)", (os.path.basename(__file__),)),
)


def _where(key: tuple[str, int, str]) -> str:
    path, line, func = key
    if path == "~":
        return func
    parts = path.replace(os.sep, "/").split("/")
    short = "/".join(parts[-2:]) if "jobfence" in parts else parts[-1]
    return f"{short}:{line}({func})"


def _area(key: tuple[str, int, str]) -> str:
    where = f"{key[0]} {key[2]}".replace(os.sep, "/")
    for name, marks in AREAS:
        if any(mark in where for mark in marks):
            return name
    return "other"


def hand_off(n: int = 20_000) -> float:
    """µs per hand-off between two bare asyncio tasks, each waking the other through a future
    and waiting on one of its own: the least a task switch costs on asyncio."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[None] | None] = [None, None]

        async def player(me: int) -> None:
            for _ in range(n):
                other = waiting[1 - me]
                if other is not None:
                    waiting[1 - me] = None
                    other.set_result(None)
                fut = waiting[me] = loop.create_future()
                await fut
            other = waiting[1 - me]
            if other is not None:
                other.set_result(None)

        started = time.perf_counter()
        await asyncio.gather(player(0), player(1))
        return (time.perf_counter() - started) / (2 * n) * 1e6

    return statistics.median(asyncio.run(main()) for _ in range(3))


def profile(schedules: int, fixed: float, per_point: float) -> None:
    probe = Probe()
    scenario = synthetic(2, 20, probe, switches=True)
    testing.explore(scenario, schedules=50)
    profiler = cProfile.Profile()
    profiler.enable()
    report = testing.explore(scenario, schedules=schedules, strategy="random")
    profiler.disable()
    stats = pstats.Stats(profiler)
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(e[2] for e in entries.values())
    top = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
    print(
        f"\n## 3. Where the time goes: 2 tasks x 20 points, random, {schedules} schedules "
        f"under cProfile ({report.seconds:.2f} s profiled; the profiler inflates every call, "
        "so read the shares)\n"
    )
    rows = [
        (
            _where(key),
            str(calls),
            f"{tt * 1e3:.0f}",
            f"{tt / total:.1%}",
            f"{ct * 1e3:.0f}",
        )
        for key, (_cc, calls, tt, ct, _callers) in top
    ]
    markdown_table(("function", "calls", "own ms", "share", "cumulative ms"), rows)
    shares: dict[str, float] = {}
    for key, entry in entries.items():
        area = _area(key)
        shares[area] = shares.get(area, 0.0) + entry[2]
    points = probe.points_each
    switches = probe.switches / probe.finished
    floor = hand_off()
    print()
    print(
        "- own time by area: "
        + ", ".join(
            f"{name} {value / total:.0%}"
            for name, value in sorted(shares.items(), key=lambda kv: -kv[1])
        )
    )
    print(
        f"- without the profiler, the random rows fit {fixed:.0f} µs per schedule + "
        f"{per_point:.1f} µs per point (least squares): {fixed + per_point * points:.0f} µs "
        f"for the {points:.0f} points of 2 x 20, against the {1e6 / GOAL_RATE:.0f} µs per "
        f"schedule that {GOAL_RATE:,}/s allows"
    )
    print(
        f"- of those points, {switches:.1f} per schedule hand over to the other task; a bare "
        f"asyncio hand-off between two tasks (a future each way) takes {floor:.1f} µs here, so "
        f"about {switches * floor:.0f} µs per schedule is asyncio's own floor for tasks "
        "switching at points"
    )


# -- main -------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000, help="per round and row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="runs of each bug hunt")
    parser.add_argument("--profile-schedules", type=int, default=2000)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument(
        "--cpu", action="store_true", help="section 1 in schedules per CPU second (shared machine)"
    )
    parser.add_argument("--only-throughput", action="store_true", help="section 1 alone")
    args = parser.parse_args()
    global CPU_TIME
    CPU_TIME = args.cpu
    if args.quick:
        args.schedules, args.rounds, args.runs, args.profile_schedules = 100, 1, 2, 200
    for name in ("schedules", "rounds", "runs", "profile_schedules"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    print(
        f"# jobfence.testing: python {sys.version.split()[0]}, jobfence "
        f"{jobfence.__version__}, {os.cpu_count()} CPUs"
    )
    all_cases = throughput(args.schedules, args.rounds)
    fixed, per_point = split_cost(all_cases)
    if args.only_throughput:
        print(f"\n- fit: {fixed:.0f} µs per schedule + {per_point:.1f} µs per point")
        return
    first_failures(args.runs)
    if not args.no_profile:
        profile(args.profile_schedules, fixed, per_point)


if __name__ == "__main__":
    main()
