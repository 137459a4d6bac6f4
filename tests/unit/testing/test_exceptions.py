"""An exception in the scenario's own code -- escaping a spawned job or the scenario itself,
a ConfigurationError included -- is a failure of its schedule, reported with its seed and
tape and replayed with the same exception; it never escapes explore()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobfence import ConfigurationError, testing
from jobfence.testing import Simulation, faults


class _Meteor(BaseException):
    """Not an Exception: what a scenario's own code may still raise."""


def _assert_replays(failure: testing.Failure) -> BaseException:
    error = failure.error
    assert error is not None and failure.check == "exception", failure
    again = failure.replay().failures[0]
    assert again.check == "exception" and again.message == failure.message
    assert type(again.error) is type(error) and str(again.error) == str(error)
    return error


def test_a_jobfence_call_the_job_gets_wrong_is_a_failure_with_its_seed() -> None:
    """claim_in on something that is no connection: ConfigurationError in the job, on the
    schedule (seed 1) whose auto fault makes the job go down that path."""

    async def job(db: testing.SimTable, inbox: Any) -> None:
        try:
            await db.write("k", n=1)
        except testing.InjectedFault:  # "on failure, record it elsewhere" -- wrongly
            await inbox.claim_in({"not": "a connection"}, "k")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim.table("t"), sim.inbox())
        await sim.join()

    report = testing.explore(scenario, schedules=50, seed=40, faults="auto")
    (failure,) = report.failures
    assert failure.seed == 41 and str(failure.tape) == "- | transient(db.write[t]#1)"
    assert failure.message.startswith("t1 raised ConfigurationError(")
    error = _assert_replays(failure)
    assert isinstance(error, ConfigurationError) and error.argument == "conn"
    assert "pytest --jobfence-seed=41" in str(failure)
    with pytest.raises(AssertionError) as raised:
        report.assert_ok()
    assert raised.value.__cause__ is error  # the job's traceback comes with the report


@pytest.mark.parametrize(
    "make",
    [
        lambda: ValueError("boom"),
        lambda: ConfigurationError("bad", argument="x"),
        lambda: _Meteor("meteor"),
    ],
    ids=["ValueError", "ConfigurationError", "BaseException"],
)
def test_an_exception_the_scenario_raises_is_a_failure_that_replays(
    make: Callable[[], BaseException],
) -> None:
    error = make()

    async def job(sim: Simulation) -> None:
        try:
            await testing.point("p")
        except testing.InjectedFault:
            return

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()
        if sim.faults:  # the scenario's own bug, on the schedules with a fault
            raise make()

    report = testing.explore(scenario, schedules=10, faults=[faults.transient("p")])
    (failure,) = report.failures
    assert failure.seed == 0 and failure.message == f"the scenario raised {error!r}"
    assert repr(_assert_replays(failure)) == repr(error)
    assert str(failure.tape) == "- | transient(p#1)"


def test_a_job_raising_a_base_exception_of_its_own_is_a_failure() -> None:
    async def job(sim: Simulation) -> None:
        await testing.point("p")
        raise _Meteor("from a job")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()

    (failure,) = testing.explore(scenario, schedules=5).failures
    assert isinstance(_assert_replays(failure), _Meteor)
    assert failure.message == "t1 raised _Meteor('from a job')"


def test_explore_still_raises_for_its_own_bad_arguments() -> None:
    def not_async(sim: Simulation) -> None:
        pass

    with pytest.raises(ConfigurationError) as info:
        testing.explore(not_async, schedules=2)  # type: ignore[arg-type]
    assert info.value.argument == "scenario"
    with pytest.raises(ConfigurationError):
        testing.explore(not_async, schedules=0)  # type: ignore[arg-type]
