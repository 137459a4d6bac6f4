"""jobfence.testing: bad input to every public entry point is a ConfigurationError naming
the argument."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from jobfence import ConfigurationError, testing
from jobfence.testing import Simulation, Tape, faults


async def _nothing(sim: Simulation) -> None:
    pass


def _raises(argument: str, call: Callable[[], Any]) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        call()
    assert info.value.argument == argument, info.value
    return info.value


@pytest.mark.parametrize(
    ("argument", "options"),
    [
        ("schedules", {"schedules": 0}),
        ("schedules", {"schedules": 1.5}),
        ("schedules", {"schedules": True}),
        ("seed", {"seed": -1}),
        ("strategy", {"strategy": "x"}),
        ("faults", {"faults": 42}),
        ("faults", {"faults": "everything"}),
        ("faults", {"faults": [faults.crash("x"), "y"]}),
        ("checks", {"checks": [1]}),
        ("checks", {"checks": testing.no_lost_update()}),  # one checker, not a list
        ("checks", {"checks": None}),
        ("depth", {"depth": 0}),
        ("depth", {"depth": 4}),
        ("max_preemptions", {"max_preemptions": -1}),
        ("max_steps", {"max_steps": 0}),
        ("max_time", {"max_time": 0}),
        ("max_time", {"max_time": -5}),
        ("max_time", {"max_time": "1h"}),
        ("max_time", {"max_time": float("nan")}),
    ],
)
def test_explore_names_the_bad_argument(argument: str, options: dict[str, Any]) -> None:
    error = _raises(argument, lambda: testing.explore(_nothing, **options))
    assert argument in str(error)


def test_explore_refuses_a_scenario_that_is_not_an_async_function() -> None:
    _raises("scenario", lambda: testing.explore(42))  # type: ignore[arg-type]

    def plain(sim: Simulation) -> None:
        pass

    error = _raises("scenario", lambda: testing.explore(plain, schedules=3))  # type: ignore[arg-type]
    assert "not an awaitable" in str(error)


def test_replay_names_the_bad_argument() -> None:
    _raises("tape", lambda: testing.replay(_nothing, 42))  # type: ignore[arg-type]
    _raises("fault", lambda: testing.replay(_nothing, "t1 | nonsense"))
    _raises("max_steps", lambda: testing.replay(_nothing, "t1", max_steps=0))
    _raises("max_time", lambda: testing.replay(_nothing, "t1", max_time=-1))
    _raises("checks", lambda: testing.replay(_nothing, "t1", checks=[object()]))  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        ("kind", lambda: faults.Fault("x", "db.write")),
        ("point", lambda: faults.transient("")),
        ("point", lambda: faults.transient("a#b")),  # its text form could not be read back
        ("point", lambda: faults.crash(None)),  # type: ignore[arg-type]
        ("nth", lambda: faults.transient("x", 0)),
        ("nth", lambda: faults.transient("x", True)),
        ("nth", lambda: faults.crash("x", 1.0)),  # type: ignore[arg-type]
        ("task", lambda: faults.crash("x", task="")),
        ("task", lambda: faults.crash("x", task=3)),  # type: ignore[arg-type]
        ("task", lambda: faults.crash("x", task="t1 t2")),
        # faults only some points can carry (elsewhere they would do nothing at all)
        ("point", lambda: faults.commit_unknown("inbox.complete")),
        ("point", lambda: faults.Fault("commit_unknown", "db.read")),
        ("point", lambda: faults.lost_ack(point="queue.nack")),
        ("seconds", lambda: faults.crash("x").__class__("crash", "x", 1, None, 5)),
        ("seconds", lambda: faults.pause_past_ttl("x", seconds=0)),
        ("seconds", lambda: faults.pause_past_ttl("x", seconds=-1)),
        ("seconds", lambda: faults.pause_past_ttl("x", seconds="1")),  # type: ignore[arg-type]
        ("kinds", lambda: faults.auto(kinds=[])),
        ("kinds", lambda: faults.auto(kinds=["transient", "meteor"])),
        ("depth", lambda: faults.auto(depth=3)),
        ("depth", lambda: faults.auto(depth=0)),
        ("fault", lambda: faults.parse("transient(db.write)")),
        ("fault", lambda: Tape.parse("t1 t2 | crash")),
    ],
)
def test_faults_name_the_bad_argument(argument: str, call: Callable[[], Any]) -> None:
    _raises(argument, call)


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        ("effects", lambda: testing.exactly_once(42)),  # type: ignore[arg-type]
        ("effects", lambda: testing.exactly_once("")),
        ("expected", lambda: testing.exactly_once("charge", expected=3)),  # type: ignore[arg-type]
        ("expected", lambda: testing.exactly_once("charge", expected="order:1")),
        ("table", lambda: testing.no_lost_update("inventory")),
        ("table", lambda: testing.fencing_monotonic(42)),
        ("name", lambda: testing.single_holder(42)),  # type: ignore[arg-type]
        ("name", lambda: testing.single_holder("")),
    ],
)
def test_checkers_name_the_bad_argument(argument: str, call: Callable[[], Any]) -> None:
    _raises(argument, call)


def _in_scenario(action: Callable[[Simulation], Any]) -> Callable[[Simulation], Any]:
    async def scenario(sim: Simulation) -> None:
        result = action(sim)
        if hasattr(result, "__await__"):
            await result

    return scenario


async def _job() -> None:
    pass


def _twice(sim: Simulation) -> None:
    sim.spawn(_job, name="worker")
    sim.spawn(_job, name="worker")


async def _critical_in_main(sim: Simulation) -> None:
    async with sim.critical("stock"):
        pass


@pytest.mark.parametrize(
    ("argument", "action"),
    [
        ("job", lambda sim: sim.spawn(42)),
        ("job", lambda sim: sim.spawn("t1")),
        ("args", lambda sim: sim.spawn(_job(), 1)),  # arguments for a coroutine object
        ("name", _twice),
        ("name", lambda sim: sim.spawn(_job, name="two words")),
        ("name", lambda sim: sim.spawn(_job, name="")),
        ("name", _critical_in_main),
        ("name", lambda sim: sim.table("")),
        ("rows", lambda sim: sim.table("t", {1: 5})),
        ("url", lambda sim: sim.table("t", url="mongodb://localhost/x")),
        ("url", lambda sim: sim.table("t", url=42)),
        ("name", lambda sim: testing.point("")),
        ("name", lambda sim: testing.point(7)),
        ("kind", lambda sim: sim.effect("", "k")),
    ],
)
def test_the_sim_names_the_bad_argument(argument: str, action: Callable[[Simulation], Any]) -> None:
    """Inside the scenario, the error is the scenario's: a failure of the schedule."""
    _fails_with(argument, testing.explore(_in_scenario(action), schedules=2))


def _fails_with(argument: str, report: testing.Report) -> ConfigurationError:
    """The report's failure is a ConfigurationError naming ``argument``, and replays."""
    (failure,) = report.failures
    error = failure.error
    assert failure.check == "exception" and isinstance(error, ConfigurationError), failure
    assert error.argument == argument, error
    assert failure.seed == 0 and repr(error) in failure.message
    again = failure.replay().failures[0].error
    assert type(again) is type(error) and str(again) == str(error)
    return error


def test_a_configuration_error_inside_a_job_is_a_failure_not_taken_for_an_outcome() -> None:
    """A jobfence error ending a job is an outcome; a ConfigurationError there says the job's
    code is wrong: the schedule fails with it, as with any bug."""

    async def job(sim: Simulation, db: testing.SimTable) -> None:
        await db.write("k", version=3)  # the version column is the table's own

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t")
        sim.spawn(job, sim, db)
        await sim.join()

    _fails_with("values", testing.explore(scenario, schedules=2))

    async def effect_job(sim: Simulation) -> None:
        await testing.point("x")
        await sim.effect("x(1)", 1)  # a point's name cannot hold parentheses

    async def scenario2(sim: Simulation) -> None:
        sim.spawn(effect_job, sim)
        await sim.join()

    _fails_with("kind", testing.explore(scenario2, schedules=2))


def test_replaying_a_failure_without_a_scenario() -> None:
    from jobfence.testing import Failure

    failure = Failure(0, 0, "check", "m", Tape(()), Tape(()), 0)
    _raises("failure", failure.replay)


def test_explore_refuses_to_run_inside_an_event_loop_or_another_scenario() -> None:
    async def from_async_code() -> None:
        _raises("scenario", lambda: testing.explore(_nothing, schedules=2))
        _raises("scenario", lambda: testing.replay(_nothing, "-"))

    asyncio.run(from_async_code())
    inner: list[Any] = []

    async def nested(sim: Simulation) -> None:
        try:
            testing.explore(_nothing, schedules=1)
        except ConfigurationError as exc:
            inner.append(exc.argument)
        await testing.point("still controlled")  # the outer simulation is still installed
        inner.append(sim.hits)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(nested, sim)
        await sim.join()

    assert testing.explore(scenario, schedules=1).ok
    assert inner == ["scenario", {"still controlled": 1}]
