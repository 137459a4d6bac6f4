"""jobfence.testing checkers: each finds its violation at the step it happens, and passes a
correct scenario."""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults


def _after(reached: list[str], sim: Simulation) -> Any:
    """A point after the step under test, then a mark: a check that runs at every step
    stops the task at that point, before the mark."""

    async def go_on() -> None:
        await testing.point("after")
        reached.append(sim.current().name)  # type: ignore[union-attr]

    return go_on()


# -- exactly_once --------------------------------------------------------------------------


def _charging(reached: list[str], dedupe: bool) -> Any:
    async def job(sim: Simulation, inbox: Any) -> None:
        if dedupe:
            claim = await inbox.claim("order:1", ttl=60)
            if claim.state is not jobfence.ClaimState.NEW:
                return
            await sim.effect("charge", "order:1")
            await claim.complete("ok")
        else:
            await sim.effect("charge", "order:1")
        await _after(reached, sim)

    async def scenario(sim: Simulation) -> None:
        reached.clear()
        inbox = sim.inbox()
        sim.spawn(job, sim, inbox)
        sim.spawn(job, sim, inbox)
        await sim.join()

    return scenario


def test_exactly_once_stops_the_schedule_at_the_second_effect() -> None:
    reached: list[str] = []
    checks = [testing.exactly_once("charge")]
    report = testing.explore(_charging(reached, dedupe=False), schedules=5, checks=checks)
    failure = report.failures[0]
    assert failure.check == "exactly_once" and failure.index == 0
    assert failure.message == "charge applied more than once for 'order:1'"
    assert reached == ["t1"]  # t2 was stopped at its next point, after its charge


def test_exactly_once_passes_a_deduplicated_effect_and_checks_expected_at_the_end() -> None:
    reached: list[str] = []
    checks = [testing.exactly_once("charge", expected=["order:1"])]
    report = testing.explore(
        _charging(reached, dedupe=True), schedules=200, strategy="exhaustive", checks=checks
    )
    assert report.ok and report.exhausted
    missing = [testing.exactly_once("charge", expected=["order:1", "order:2"])]
    failure = testing.explore(_charging(reached, dedupe=True), schedules=3, checks=missing)
    assert failure.failures[0].message == "no effect for 'order:2'"


def test_exactly_once_reads_a_list_the_scenario_appends_to() -> None:
    sent: list[str] = []

    async def job(sim: Simulation) -> None:
        await testing.point("send")
        sent.append("mail:1")

    async def scenario(sim: Simulation) -> None:
        sent.clear()
        sim.spawn(job, sim)
        sim.spawn(job, sim)
        await sim.join()

    report = testing.explore(scenario, schedules=3, checks=[testing.exactly_once(sent)])
    assert report.failures[0].message == "effect applied more than once for 'mail:1'"


# -- no_lost_update --------------------------------------------------------------------------


def _stock(reached: list[str], versioned: bool) -> Any:
    async def job(sim: Simulation, db: testing.SimTable, qty: int) -> None:
        @jobfence.retry_unit(attempts=5)
        async def unit() -> None:
            row = await db.read("stock")
            assert row is not None
            if versioned:
                await db.update("stock", row["version"], stock=row["stock"] - qty)
            else:
                await db.write("stock", stock=row["stock"] - qty)

        await unit()
        await _after(reached, sim)

    async def scenario(sim: Simulation) -> None:
        reached.clear()
        db = sim.table("inventory", {"stock": {"stock": 10}})
        sim.spawn(job, sim, db, 5)
        sim.spawn(job, sim, db, 3)
        await sim.join()

    return scenario


def test_no_lost_update_stops_the_schedule_at_the_lost_write() -> None:
    reached: list[str] = []
    checks = [testing.no_lost_update()]
    report = testing.explore(_stock(reached, versioned=False), schedules=50, checks=checks)
    failure = report.failures[0]
    assert failure.check == "no_lost_update"
    assert "from version 1 it read, over version 2" in failure.message
    writer = failure.message.split()[0]
    assert writer not in reached  # stopped at its next point, not at the end
    replayed = testing.replay(_stock(reached, versioned=False), failure.tape, checks=checks)
    assert replayed.failures[0].message == failure.message and writer not in reached


def test_no_lost_update_passes_versioned_updates() -> None:
    reached: list[str] = []
    report = testing.explore(
        _stock(reached, versioned=True),
        schedules=300,
        strategy="exhaustive",
        checks=[testing.no_lost_update()],
    )
    assert report.ok and report.exhausted


# -- single_holder ---------------------------------------------------------------------------


def _sections(reached: list[str], locked: bool, with_lease: bool) -> Any:
    async def job(sim: Simulation) -> None:
        if not locked:
            async with sim.critical("stock"):
                await testing.point("inside")
                await _after(reached, sim)
            return
        lease = await sim.locks().acquire("stock", ttl=10)
        async with lease, sim.critical("stock", lease=lease if with_lease else None):
            await testing.point("inside")
            await _after(reached, sim)

    async def scenario(sim: Simulation) -> None:
        reached.clear()
        sim.spawn(job, sim)
        sim.spawn(job, sim)
        await sim.join()

    return scenario


def test_single_holder_stops_the_schedule_when_a_second_task_enters() -> None:
    reached: list[str] = []
    checks = [testing.single_holder()]
    report = testing.explore(_sections(reached, False, False), schedules=5, checks=checks)
    failure = report.failures[0]
    assert failure.check == "single_holder" and failure.index == 0
    assert failure.message == "t1, t2 are inside the critical section 'stock' at once"
    assert reached == []


def test_single_holder_passes_a_lock_and_counts_a_lease_only_while_it_is_valid() -> None:
    reached: list[str] = []
    checks = [testing.single_holder("stock")]
    assert testing.explore(_sections(reached, True, False), schedules=30, checks=checks).ok
    # paused past its ttl inside the section: the next holder enters while t1 is still
    # there. Counted by its task alone, that is two holders ...
    pause = [faults.pause_past_ttl("inside", seconds=60)]
    report = testing.explore(
        _sections(reached, True, False), schedules=1, faults=pause, checks=checks, shrink=False
    )
    assert report.failures[0].check == "single_holder"
    # ... with lease=, a holder whose lease has run out does not count
    report = testing.explore(
        _sections(reached, True, True), schedules=1, faults=pause, checks=checks, shrink=False
    )
    assert report.ok, report


def test_single_holder_name_limits_it_to_one_section() -> None:
    reached: list[str] = []
    checks = [testing.single_holder("another")]
    assert testing.explore(_sections(reached, False, False), schedules=5, checks=checks).ok


# -- fencing_monotonic -----------------------------------------------------------------------


def _fenced_writes(reached: list[str], fenced: bool) -> Any:
    async def job(sim: Simulation, db: testing.SimTable) -> None:
        lease = await sim.locks().acquire("stock", ttl=10)
        await testing.point("work")  # where the fault pauses t1
        try:
            await db.write("stock", token=lease.token, by=sim.current().name)  # type: ignore[union-attr]
        except jobfence.StaleToken:
            pass
        await _after(reached, sim)
        await lease.release()

    async def scenario(sim: Simulation) -> None:
        reached.clear()
        db = sim.table("inventory", {"stock": {"by": None}}, fenced=fenced)
        sim.spawn(job, sim, db)
        sim.spawn(job, sim, db)
        await sim.join()

    return scenario


def test_fencing_monotonic_stops_the_schedule_at_the_stale_write() -> None:
    reached: list[str] = []
    pause = [faults.pause_past_ttl("work", seconds=60)]
    checks = [testing.fencing_monotonic()]
    report = testing.explore(
        _fenced_writes(reached, False), schedules=1, faults=pause, checks=checks, shrink=False
    )
    failure = report.failures[0]
    assert failure.check == "fencing_monotonic"
    assert failure.message.startswith("t1 wrote inventory['stock'] with token")
    assert "after t2 had written with token" in failure.message
    assert reached == ["t2"]  # t1 stopped at its next point after the stale write


def test_fencing_monotonic_passes_a_fenced_table() -> None:
    reached: list[str] = []
    pause = [faults.pause_past_ttl("work", seconds=60)]
    checks = [testing.fencing_monotonic()]
    report = testing.explore(
        _fenced_writes(reached, True), schedules=1, faults=pause, checks=checks, shrink=False
    )
    assert report.ok, report
    assert sorted(reached) == ["t1", "t2"]


# -- sim.check, sim.watch, custom checkers ---------------------------------------------------


def test_sim_check_fails_the_schedule_with_its_message() -> None:
    async def scenario(sim: Simulation) -> None:
        sim.check(True, "never")
        sim.check(sim.now() < 0, "time went forward")

    failure = testing.explore(scenario, schedules=2).failures[0]
    assert (failure.check, failure.message) == ("check", "time went forward")


def test_sim_watch_adds_a_checker_from_inside_the_scenario() -> None:
    reached: list[str] = []

    async def scenario(sim: Simulation) -> None:
        sim.watch(testing.exactly_once("charge"))
        await _charging(reached, dedupe=False)(sim)

    failure = testing.explore(scenario, schedules=2).failures[0]
    assert failure.check == "exactly_once" and reached == ["t1"]


class _Raising(testing.Checker):
    """A checker with a bug: it raises while virtual time is under one second."""

    name = "raising"

    def step(self, sim: Simulation) -> str | None:
        if sim.now() < 1:
            raise ZeroDivisionError("a bug in the checker")
        return None


def test_a_checker_that_raises_fails_the_schedule_even_if_the_jobs_catch_exceptions() -> None:
    async def careless(sim: Simulation) -> None:
        try:
            await testing.point("x")
        except Exception:  # a job that logs and carries on
            pass
        await sim.sleep(5)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(careless, sim)
        await sim.join()

    report = testing.explore(scenario, schedules=2, checks=[_Raising()])
    failure = report.failures[0]
    assert failure.check == "raising"
    assert "ZeroDivisionError('a bug in the checker')" in failure.message


class _RaisingAtTheEnd(testing.Checker):
    name = "raising_at_the_end"

    def end(self, sim: Simulation) -> str | None:
        raise KeyError("missing")


def test_a_checker_that_raises_at_the_end_fails_the_schedule_under_its_name() -> None:
    async def scenario(sim: Simulation) -> None:
        sim.spawn(testing.point, "x")
        await sim.join()

    failure = testing.explore(scenario, schedules=2, checks=[_RaisingAtTheEnd()]).failures[0]
    assert (failure.check, failure.message) == (
        "raising_at_the_end",
        "the checker raised KeyError('missing')",
    )


def test_a_job_that_catches_base_exception_cannot_hide_a_violation() -> None:
    async def stubborn(sim: Simulation) -> None:
        for _ in range(5):
            try:
                await sim.effect("charge", "order:1")
                await testing.point("after")
            except BaseException:  # what a careless job does
                pass

    async def scenario(sim: Simulation) -> None:
        sim.spawn(stubborn, sim)
        await sim.join()

    report = testing.explore(scenario, schedules=2, checks=[testing.exactly_once("charge")])
    assert report.failures[0].check == "exactly_once"


def test_a_check_failing_in_the_last_task_leaves_no_pending_task_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def job(sim: Any) -> None:
        await sim.effect("x", 1)
        await sim.effect("x", 1)  # the second one is the violation, at its own step
        await testing.point("after")

    async def scenario(sim: Any) -> None:
        sim.spawn(job(sim))

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        report = testing.explore(scenario, schedules=3, checks=[testing.exactly_once("x")])
        gc.collect()
    assert report.failures[0].check == "exactly_once"
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
