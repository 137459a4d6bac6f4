"""The replay rules of jobfence.testing: --jobfence-seed takes the seed, a shrunk tape is never
longer than the original and fails with the same check and message, a tape's trailing FIFO
picks are left out (past its end every decision is FIFO), and a failure says what each
injected fault did to its job."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest

from jobfence import testing
from jobfence.testing import Simulation, faults

EXPLORE = importlib.import_module("jobfence.testing.explore")


def _loops(loops: int) -> Any:
    """t1 gives up when its first point ``a`` fails; t2 and t3 loop over ``b`` and stop at
    a failure there. Only the fault at ``a`` matters; a fault at ``b`` ends a loop early
    (so dropping it makes the schedule longer)."""

    async def job(sim: Simulation, name: str, done: set[str]) -> None:
        try:
            await testing.point("a")
        except testing.InjectedFault:
            if name == "t1":
                return
        for _ in range(loops):
            try:
                await testing.point("b")
            except testing.InjectedFault:
                return
        done.add(name)

    async def scenario(sim: Simulation) -> None:
        done: set[str] = set()
        for name in ("t1", "t2", "t3"):
            sim.spawn(job, sim, name, done)
        await sim.join()
        sim.check("t1" in done, "t1 lost")

    return scenario


LOOP_FAULTS = [faults.transient("a", task="t1"), faults.transient("b"), faults.transient("b", 2)]


def test_a_shrunk_tape_is_never_longer_than_the_original() -> None:
    report = testing.explore(_loops(2), schedules=20, strategy="fifo", faults=LOOP_FAULTS)
    failure = report.failures[0]
    assert failure.message == "t1 lost"
    # dropping the faults at b lengthens the schedule: those steps are not taken
    assert len(failure.tape.picks) <= len(failure.original.picks)
    assert failure.tape.faults and len(failure.tape.faults) < len(LOOP_FAULTS)
    again = testing.replay(_loops(2), str(failure.tape)).failures[0]
    assert (again.check, again.message, again.tape) == ("check", "t1 lost", failure.tape)


def _three_in_order(log: list[str]) -> Any:
    async def job(sim: Simulation, log: list[str]) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        for step in range(2):
            await testing.point("step")
            log.append(f"{name}.{step}")

    async def scenario(sim: Simulation) -> None:
        log.clear()
        for _ in range(3):
            sim.spawn(job, sim, log)
        await sim.join()
        sim.check(log[0].startswith("t1"), f"{log[0]} ran first")

    return scenario


def test_the_tape_ends_at_its_last_deviation_and_fifo_goes_on_after_it() -> None:
    log: list[str] = []
    report = testing.explore(_three_in_order(log), schedules=50, seed=3)
    failure = report.failures[0]
    assert failure.check == "check" and failure.message.endswith("ran first")
    first = failure.tape.picks[0]
    # one switch is enough: the shrunk tape is that pick alone, the rest is FIFO
    assert failure.tape.picks == (first,) and failure.deviations == 1
    assert len(failure.original.picks) > 1
    replayed = testing.replay(_three_in_order(log), failure.tape)
    assert replayed.failures[0].tape == failure.tape
    # past the tape, FIFO: the task picked first runs on, then the others in spawn order
    rest = [name for name in ("t1", "t2", "t3") if name != first]
    assert [entry.split(".")[0] for entry in log[::2]] == [first, *rest]


def test_a_failure_under_fifo_has_an_empty_tape_and_keeps_its_original() -> None:
    log: list[str] = []

    async def scenario(sim: Simulation) -> None:
        await _three_in_order(log)(sim)
        sim.check(False, "always")

    failure = testing.explore(scenario, schedules=5).failures[0]
    assert (failure.index, failure.message, str(failure.tape)) == (0, "always", "-")
    assert len(failure.original.picks) > 0 and failure.original.picks[0] == "t1"
    assert f"before shrinking: {len(failure.original.picks)} picks" in str(failure)


def test_an_unknown_pick_and_an_exhausted_tape_are_fifo() -> None:
    log: list[str] = []
    assert testing.replay(_three_in_order(log), "nobody nobody").ok
    fifo = list(log)
    assert testing.replay(_three_in_order(log), "-").ok
    assert log == fifo and [entry[:2] for entry in fifo[:2]] == ["t1", "t1"]


def _raises_per_fault() -> Any:
    """A job raises ValueError naming the points that failed in it: with both faults the
    message differs from the one a single fault gives."""

    async def job(sim: Simulation) -> None:
        failed = []
        for name in ("a", "b"):
            try:
                await testing.point(name)
            except testing.InjectedFault:
                failed.append(name)
        if failed:
            raise ValueError(f"failed at {'+'.join(failed)}")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()

    return scenario


def test_shrinking_keeps_the_exception_message_not_only_its_type() -> None:
    both = [faults.transient("a"), faults.transient("b")]
    report = testing.explore(_raises_per_fault(), schedules=1, faults=both)
    failure = report.failures[0]
    assert failure.check == "exception"
    assert str(failure.error) == "failed at a+b"  # a single fault would say "failed at a"
    assert set(failure.tape.faults) == set(both)


def _crash_at_the_lock() -> Any:
    async def job(sim: Simulation, locks: Any, done: list[str]) -> None:
        lease = await locks.acquire("job:1", ttl=10)
        await lease.release()
        done.append(sim.current().name)  # type: ignore[union-attr]

    async def scenario(sim: Simulation) -> None:
        locks = sim.locks()
        done: list[str] = []
        sim.spawn(job, sim, locks, done)
        sim.spawn(job, sim, locks, done)
        await sim.join()
        sim.check(len(done) == 2, f"done: {done}")

    return scenario


def test_a_job_killed_by_an_injected_fault_is_reported_as_such() -> None:
    crash = faults.crash("lock.acquire", 2)
    failure = testing.explore(_crash_at_the_lock(), schedules=1, faults=[crash]).failures[0]
    assert failure.message == "done: ['t1']" and failure.error is None
    assert failure.injected == ("t2 crashed at crash(lock.acquire#2) (injected)",)
    assert "  t2 crashed at crash(lock.acquire#2) (injected)\n" in str(failure)


def test_under_auto_faults_a_failure_names_the_injected_fault_and_the_job_s_error() -> None:
    report = testing.explore(_crash_at_the_lock(), schedules=100, faults="auto")
    failure = report.failures[0]
    assert failure.check == "check" and failure.error is None
    (line,) = failure.injected
    assert line.endswith("(injected)") or "(injected) and ended in" in line
    assert "[job:1]#" in line  # the auto fault is aimed at the lock by name
    assert line in str(failure) and line in str(report)


def test_a_job_ending_in_an_injected_error_shows_it() -> None:
    async def job(sim: Simulation, db: Any) -> None:
        await db.write("k", n=1)

    async def scenario(sim: Simulation) -> None:
        db = sim.table("orders")
        sim.spawn(job, sim, db)
        await sim.join()
        sim.check(db.get("k") is not None, "k never written")

    fault = faults.transient("db.write", target="orders")
    failure = testing.explore(scenario, schedules=1, faults=[fault]).failures[0]
    assert failure.message == "k never written" and failure.error is None
    (line,) = failure.injected
    assert line.startswith("t1 got transient(db.write[orders]#1) (injected) and ended in ")
    assert "InjectedFault(" in line and line in str(failure)


def test_replay_seed_is_the_seed_not_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    report = testing.explore(_three_in_order(log), schedules=50, seed=100, shrink=False)
    failure = report.failures[0]
    assert failure.seed == 100 + failure.index
    assert f"schedule {failure.index} (seed {failure.seed}) failed" in str(failure)
    assert f"pytest --jobfence-seed={failure.seed}," in str(failure)
    # the index is not a seed of this explore: it runs as usual, every schedule
    monkeypatch.setattr(EXPLORE, "_REPLAY_SEED", failure.index)
    assert testing.explore(_loops(1), schedules=30, seed=100).schedules == 30
    monkeypatch.setattr(EXPLORE, "_REPLAY_SEED", failure.seed)
    again = testing.explore(_three_in_order(log), schedules=50, seed=100, shrink=False)
    assert again.schedules == 2  # schedule 0, then the one of that seed
    assert (again.failures[0].seed, again.failures[0].tape) == (failure.seed, failure.tape)


def test_explore_reads_the_options_the_plugin_module_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = importlib.import_module("jobfence_pytest")  # the plugin module pytest loaded
    assert sys.modules["jobfence_pytest"] is plugin
    log: list[str] = []
    monkeypatch.setattr(plugin, "schedules", 4)
    assert testing.explore(_loops(1), schedules=50, seed=100).schedules == 4
    monkeypatch.setattr(plugin, "schedules", None)
    found = testing.explore(_three_in_order(log), schedules=50, seed=100, shrink=False)
    monkeypatch.setattr(plugin, "replay_seed", found.failures[0].seed)
    again = testing.explore(_three_in_order(log), schedules=50, seed=100, shrink=False)
    assert again.schedules == 2 and again.failures[0].tape == found.failures[0].tape
