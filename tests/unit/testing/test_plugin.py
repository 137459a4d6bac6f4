"""The pytest plugin, through the pytest11 entry point of the installed package: a failing
exploration prints its seed, and ``--jobfence-seed=N`` replays exactly that schedule."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]

INNER = """
from jobfence import testing

async def job(db, qty):
    row = await db.read(1)
    await testing.point("think")
    await db.write(1, stock=row["stock"] - qty)

async def scenario(sim):
    db = sim.table("inventory", {1: {"stock": 10}})
    sim.spawn(job(db, 5))
    sim.spawn(job(db, 3))
    await sim.join()
    sim.check(db.get(1)["stock"] == 2, "lost update")

def test_inventory(request):
    report = testing.explore(scenario, schedules=500, seed=7, shrink=False, stop_on_failure=False)
    print("RAN", report.schedules, "TAPE", report.failures[0].tape if report.failures else None)
    report.assert_ok()
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest_subprocess("-s", "-p", "no:randomly", "-p", "no:cacheprovider", *args)


def test_a_failure_prints_its_seed_and_the_seed_replays_it(pytester: pytest.Pytester) -> None:
    first = _run(pytester)
    first.assert_outcomes(failed=1)
    out = first.stdout.str()
    seed = int(re.search(r"--jobfence-seed=(\d+)", out).group(1))  # type: ignore[union-attr]
    tape = re.search(r"TAPE (.*)", out).group(1)  # type: ignore[union-attr]
    assert seed >= 7  # schedule i of an explore with seed=7 has seed 7 + i
    assert f"test_inner.py::test_inventory --jobfence-seed={seed}" in out  # the replay command

    again = _run(pytester, f"--jobfence-seed={seed}")
    again.assert_outcomes(failed=1)
    out = again.stdout.str()
    ran = int(re.search(r"RAN (\d+)", out).group(1))  # type: ignore[union-attr]
    assert ran == (1 if seed == 7 else 2)  # schedule 0 (FIFO, it records the points), then N
    assert f"TAPE {tape}" in out


def test_the_schedules_option_overrides_the_count(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--jobfence-schedules=1")
    result.assert_outcomes(passed=1)  # FIFO alone never interleaves the two jobs
    assert "RAN 1 " in result.stdout.str()


def test_bad_option_values_are_refused(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--jobfence-seed=-3")
    assert result.ret != 0
    assert "expected an int >= 0" in result.stderr.str()
