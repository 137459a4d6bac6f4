"""The same seed gives the same tape: the picks of the schedules of a few fixed explores,
against digests recorded before the scheduler's fast paths changed (a change of any pick,
of the draws behind them or of the order tasks reach their points shows here)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from jobfence import testing
from jobfence.testing import Simulation


def _mixed(tasks: int, points: int, tapes: list[str]) -> Any:
    """``tasks`` tasks, each ``points`` points: ``testing.point`` and a simulated table's
    read, alternately (the benchmark's synthetic scenario)."""

    async def job(db: testing.SimTable) -> None:
        for i in range(points):
            if i % 2:
                await db.read("row")
            else:
                await testing.point("p")

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {"row": {"n": 0}})
        for _ in range(tasks):
            sim.spawn(job(db))
        await sim.join()
        tapes.append(" ".join(sim.picks))

    return scenario


def _locks(tapes: list[str]) -> Any:
    """Two tasks with a ``sim.locks()`` client each, three rounds of take-if-free, a point,
    give back."""

    async def job(locks: Any) -> None:
        for _ in range(3):
            lease = await locks.try_acquire("job", ttl=30)
            if lease is None:
                continue
            await testing.point("work")
            await lease.release()

    async def scenario(sim: Simulation) -> None:
        for _ in range(2):
            sim.spawn(job(sim.locks()))
        await sim.join()
        tapes.append(" ".join(sim.picks))

    return scenario


def _digest(tapes: list[str]) -> str:
    return hashlib.sha256("\n".join(tapes).encode()).hexdigest()[:16]


CASES = [
    ("mixed", "random"),
    ("mixed", "pct"),
    ("mixed", "fifo"),
    ("mixed", "exhaustive"),
    ("locks", "random"),
    ("locks", "exhaustive"),
]
#: sha256 (first 16 hex digits) of the 60 tapes of explore(schedules=60, seed=11)
EXPECTED = {
    ("mixed", "random"): "60c2444ba0c8a6dc",
    ("mixed", "pct"): "67c6d3016a1b7f47",
    ("mixed", "fifo"): "ceebe7d3d49179d6",
    ("mixed", "exhaustive"): "413da8424978dacf",
    ("locks", "random"): "103e0c9945051328",
    ("locks", "exhaustive"): "4f31b4e10813dbd2",
}


@pytest.mark.parametrize(("kind", "strategy"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_the_tapes_of_fixed_seeds_are_those_recorded(kind: str, strategy: str) -> None:
    tapes: list[str] = []
    scenario = _mixed(3, 20, tapes) if kind == "mixed" else _locks(tapes)
    testing.explore(scenario, schedules=60, seed=11, strategy=strategy).assert_ok()
    assert len(tapes) == 60
    assert _digest(tapes) == EXPECTED[(kind, strategy)]


def test_the_schedules_of_one_explore_share_a_store_name_never_the_stores() -> None:
    """The schedules of one explore use one ``memory://`` store name (their clients' URL is
    parsed once), and each starts with none of the stores the one before made: a lease a
    schedule leaves held is free in the next."""
    names: list[str] = []
    taken: list[bool] = []

    async def scenario(sim: Simulation) -> None:
        names.append(sim.namespace)
        lease = await sim.locks().try_acquire("left-held", ttl=3600, renew=False)
        taken.append(lease is not None)  # never released: the schedule's store is dropped

    testing.explore(scenario, schedules=4, strategy="fifo").assert_ok()
    assert taken == [True, True, True, True]
    assert len(set(names)) == 1
