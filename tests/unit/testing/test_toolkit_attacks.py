"""The race-testing toolkit under hostile input: printed faults and tapes that must read back
as what ran, task names a tape cannot tell apart from its placeholders."""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from jobfence import ConfigurationError
from jobfence.testing import Simulation, Tape, explore, faults, replay, scenarios
from jobfence.testing.faults import Fault, parse


@pytest.mark.parametrize("seconds", [1234567.0, 0.1234567, 3600.5, 1e-7, 86399.999])
def test_a_pause_reads_back_with_the_seconds_it_was_given(seconds: float) -> None:
    """``str(fault)`` is what a failure prints and ``testing.replay`` reads back: a pause of
    1234567 s printed as ``1.23457e+06s`` replayed a pause of 1234570 s."""
    fault = faults.pause_past_ttl("lock.renew", seconds=seconds, task="t1")
    assert parse(str(fault)) == fault
    tape = Tape(("t2", "t1"), (fault, faults.crash("db.write", 2)))
    assert Tape.parse(str(tape)) == tape


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, math.nan])
def test_a_pause_of_no_finite_length_is_refused(seconds: float) -> None:
    """An endless pause cannot be printed as a tape that reads back (``+infs``): refused,
    naming the argument (a process that never goes on is a ``crash``)."""
    with pytest.raises(ConfigurationError, match="seconds") as caught:
        faults.pause_past_ttl("lock.renew", seconds=seconds)
    assert caught.value.argument == "seconds"


def test_a_placeholder_pick_keeps_its_place_in_a_parsed_tape() -> None:
    """``-`` in a tape's picks takes the FIFO choice at its decision: reading the tape back
    dropped it, so every later pick moved one decision earlier."""
    tape = Tape.parse("- t2 | transient(db.write#1)")
    assert tape.picks == ("-", "t2")
    assert str(tape) == "- t2 | transient(db.write#1)"
    assert Tape.parse("-") == Tape(())
    assert Tape.parse("- | crash(x#1)") == Tape((), (Fault("crash", "x"),))


def test_the_placeholder_pick_follows_its_decision_in_a_replay() -> None:
    """Three tasks reach a point each: the tape ``- t3`` keeps FIFO at the first decision
    and picks t3 at the second; read as ``t3`` it picked t3 at the first."""
    orders: list[list[str]] = []

    async def scenario(sim: Simulation) -> None:
        order: list[str] = []
        orders.append(order)

        async def job(name: str) -> None:
            await sim.effect("step", name)
            order.append(name)

        for name in ("t1", "t2", "t3"):
            sim.spawn(job, name, name=name)
        await sim.join()

    fifo = replay(scenario, "")
    assert fifo.ok, fifo
    placeholder = replay(scenario, "- t3")
    assert placeholder.ok, placeholder
    direct = replay(scenario, "t3")
    assert direct.ok, direct
    assert orders[1] != orders[2], orders
    assert orders[1][0] == orders[0][0]


def test_a_task_cannot_be_named_like_the_placeholder_pick() -> None:
    """A task named ``-`` would be taken for the FIFO placeholder in a printed tape."""
    errors: list[BaseException] = []

    async def scenario(sim: Simulation) -> None:
        async def job() -> None:
            pass

        try:
            sim.spawn(job, name="-")
        except ConfigurationError as exc:
            errors.append(exc)

    assert explore(scenario, schedules=1).ok
    assert len(errors) == 1 and errors[0].argument == "name"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("sql", "point", "table"),
    [
        ("(SELECT a FROM t) UNION (SELECT a FROM u)", "db.read", "t"),
        ("  ( select 1 )", "db.read", None),
        ("/* q */ (WITH x AS (SELECT 1) SELECT * FROM x)", "db.read", "x"),
        ("TABLE orders", "db.read", "orders"),
        ('DELETE FROM "s"."a.b" WHERE id = 1', "db.write", "a.b"),
        ("INSERT INTO `shop`.`orders` VALUES (1)", "db.write", "orders"),
    ],
)
def test_a_parenthesised_or_quoted_statement_gets_its_point_and_table(
    sql: str, point: str, table: str | None
) -> None:
    """A parenthesised query (SQLAlchemy writes unions so) was a ``db.write``, where
    ``faults="auto"`` then tried ``commit_unknown`` on a read; ``TABLE t`` is a read too;
    a quoted table name holding a dot was cut at the dot."""
    from jobfence.testing.connections import statement_point, table_named

    assert statement_point(sql) == point
    assert table_named(sql) == table


# -- functions that would run no code ----------------------------------------------------------
async def _agen_job(ctx: object) -> AsyncIterator[int]:
    yield 1
    raise AssertionError("never reached: the scenario passed without running it")


def _gen_job(ctx: object) -> Iterator[int]:
    yield 1


@pytest.mark.parametrize("fn", [_agen_job, _gen_job])
def test_a_scenario_refuses_a_generator_function_that_would_run_no_code(fn: Any) -> None:
    """An ``async def`` with ``yield`` is no coroutine function: it ran as a thread task,
    whose call made a generator and returned, and the scenario passed without the job's
    body ever running."""
    with pytest.raises(ConfigurationError, match="generator") as caught:
        scenarios.lost_update(fn, schedules=2)
    assert caught.value.argument == "fn"


@pytest.mark.parametrize("fn", [_agen_job, _gen_job])
def test_spawn_refuses_a_generator_function(fn: Any) -> None:
    errors: list[ConfigurationError] = []

    async def scenario(sim: Simulation) -> None:
        try:
            sim.spawn(fn, None)
        except ConfigurationError as exc:
            errors.append(exc)

    assert explore(scenario, schedules=1).ok
    assert len(errors) == 1 and errors[0].argument == "job", errors


def test_a_thread_task_returning_a_coroutine_fails_the_schedule() -> None:
    """``sim.spawn(lambda: job())`` with ``job`` an ``async def``: the lambda runs in a
    thread, returns the coroutine, and nothing awaits it; the job never ran, yet the schedule
    passed (a "never awaited" warning at best)."""
    ran: list[bool] = []

    async def job() -> None:
        ran.append(True)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(lambda: job())
        await sim.join()

    report = explore(scenario, schedules=1)
    assert not ran
    assert [f.check for f in report.failures] == ["exception"], report
    assert "ConfigurationError" in report.failures[0].message
    assert "coroutine" in report.failures[0].message


# -- a thread task that blocks outside the simulation -----------------------------------------
def test_a_thread_task_blocked_outside_the_simulation_fails_its_schedule() -> None:
    """A plain function waiting for something the simulation does not know (a real
    ``threading.Event``, a lock, ``queue.get``) never reaches a point: the loop waited for it
    forever and ``explore`` never returned. It fails the schedule after
    ``sim.thread_timeout`` real seconds, naming the task."""
    never = threading.Event()
    out: list[Any] = []
    done = threading.Event()

    async def scenario(sim: Simulation) -> None:
        sim.thread_timeout = 0.3

        def stuck() -> None:
            never.wait()

        sim.spawn(stuck, name="stuck")
        await sim.join()

    def run() -> None:
        try:
            out.append(explore(scenario, schedules=1))
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    try:
        assert done.wait(60), "explore never returned"
    finally:
        never.set()  # the blocked thread ends
    report = out[0]
    assert [f.check for f in report.failures] == ["budget"], report
    assert "stuck" in report.failures[0].message
    assert "outside the simulation" in report.failures[0].message


@pytest.mark.parametrize(
    "text",
    ["pause_past_ttl(x#1+1..2s)", "pause_past_ttl(x#1+-s)", "pause_past_ttl(x#1+e+s)"],
)
def test_a_fault_with_unreadable_seconds_is_a_configuration_error(text: str) -> None:
    """A hand-edited tape's pause: a ``ValueError`` from ``float()`` escaped ``parse``
    (and ``testing.replay``), where every other malformed fault is a ConfigurationError."""
    with pytest.raises(ConfigurationError, match="seconds") as caught:
        parse(text)
    assert caught.value.argument == "fault"
    with pytest.raises(ConfigurationError):
        Tape.parse(f"t1 | {text}")
