"""``jobfence.testing.scenarios`` with ``url=``: each scenario's table in real PostgreSQL and
SQLite, for async and plain functions. The naive version fails with the same check as in
memory, its failing tape replays to the same tape and message, two runs give the same
report; jobfence's version passes. The functions are those of the in-memory tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import scenarios
from tests.servers import POSTGRES_URL
from tests.unit.testing import test_scenarios as in_memory
from tests.unit.testing import test_scenarios_sync as in_memory_sync

Run = Callable[..., testing.Report]

#: the scenarios with a table (slot_fired_twice has none; dual_write refuses url)
WITH_TABLE = (
    "lost_update",
    "duplicate_delivery",
    "lost_ack",
    "paused_holder",
    "commit_unknown",
    "check_then_act",
    "over_limit",
)
#: name -> (run, naive, fixed, check, message) for async functions, then plain ones
ASYNC = {c[0]: (c[1], c[2], c[3], c[4], c[5]) for c in in_memory.CASES if c[0] in WITH_TABLE}
SYNC = {
    c[0]: (c[1], c[2], c[3], ASYNC[c[0]][3], ASYNC[c[0]][4])
    for c in in_memory_sync.SYNC_CASES
    if c[0] in WITH_TABLE
}
#: schedules for jobfence's version: a transaction held across a point (an inbox claim, a
#: fence) makes the other task's statement wait for its lock, which costs real time
FIXED_SCHEDULES = 10
#: options of a naive run: on PostgreSQL the naive order of commit_unknown keeps its
#: transaction (and the row's lock) open across the effect's point, so with two workers the
#: failing schedule has a statement waiting for a parked task's lock, whose replay rests on
#: real timing; one worker (its order delivered again) makes the same failure without it
NAIVE_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("commit_unknown", "postgresql"): {"workers": 1},
}
MATRIX = [
    pytest.param(kind, name, db, id=f"{kind}-{name}-{db}")
    for kind in ("async", "plain")
    for name in WITH_TABLE
    for db in ("postgresql", "sqlite")
]


def _url(db: str, tmp_path: Path) -> str:
    return POSTGRES_URL if db == "postgresql" else f"sqlite:///{tmp_path / 'scenario.db'}"


def _case(kind: str, name: str) -> tuple[Run, Any, Any, str, str]:
    return (ASYNC if kind == "async" else SYNC)[name]


def _summary(report: testing.Report) -> tuple[Any, ...]:
    return (
        report.ok,
        report.schedules,
        [(f.check, f.message, f.tape) for f in report.failures],
    )


@pytest.mark.parametrize(("kind", "name", "db"), MATRIX)
def test_the_naive_version_fails_as_in_memory_and_replays_identically(
    kind: str, name: str, db: str, tmp_path: Path
) -> None:
    run, naive, _fixed, check, message = _case(kind, name)
    url = _url(db, tmp_path)
    options = NAIVE_OPTIONS.get((name, db), {})
    report = run(naive, url=url, **options)
    assert not report.ok, name
    failure = report.failures[0]
    assert (failure.check, message in failure.message) == (check, True), failure.message
    for _ in range(5):
        again = failure.replay().failures[0]
        assert (again.check, again.message, again.tape) == (
            failure.check,
            failure.message,
            failure.tape,
        )
    assert _summary(run(naive, url=url, **options)) == _summary(report)


@pytest.mark.parametrize(("kind", "name", "db"), MATRIX)
def test_the_jobfence_version_passes(kind: str, name: str, db: str, tmp_path: Path) -> None:
    run, _naive, fixed, _check, _message = _case(kind, name)
    report = run(fixed, url=_url(db, tmp_path), schedules=FIXED_SCHEDULES)
    report.assert_ok()
    assert report.schedules == FIXED_SCHEDULES


def test_the_table_is_real_and_an_overlap_sqlite_refuses_is_an_outcome(tmp_path: Path) -> None:
    # two transactions that read, then write: SQLite refuses the second writer at once
    # (database is locked); the job ends with that conflict, an outcome, not a bug
    kinds: set[str] = set()
    errors: list[Exception] = []

    async def overlap(ctx: scenarios.TableContext) -> None:
        kinds.add(type(ctx.table).__name__)
        try:
            async with ctx.table.transaction() as tx:
                await tx.read(ctx.key)
                await ctx.point("think")
                await tx.write(ctx.key, by=ctx.worker)
        except Exception as exc:
            errors.append(exc)
            raise

    report = scenarios.check_then_act(overlap, url=_url("sqlite", tmp_path), schedules=20)
    report.assert_ok()
    assert kinds == {"RealTable"}
    assert errors and all(jobfence.is_conflict(e) for e in errors), errors


@pytest.mark.parametrize(
    "url",
    [3, "", "memory://x", "mysql://root@127.0.0.1:3306/test", "redis://127.0.0.1:6379/0"],
)
def test_a_bad_url_is_refused_before_any_schedule(url: Any) -> None:
    for name in WITH_TABLE:
        run, _naive, fixed, _check, _message = ASYNC[name]
        with pytest.raises(jobfence.ConfigurationError) as exc:
            run(fixed, url=url)
        assert exc.value.argument == "url", name
        assert "sqlite:///" in str(exc.value) and "postgresql://" in str(exc.value), name
        assert "None" in str(exc.value), name


def test_dual_write_refuses_a_url(tmp_path: Path) -> None:
    with pytest.raises(jobfence.ConfigurationError) as exc:
        scenarios.dual_write(in_memory.with_outbox, url=_url("sqlite", tmp_path))
    assert exc.value.argument == "url"
    assert "must be None" in str(exc.value)
    scenarios.dual_write(in_memory.with_outbox, url=None, schedules=3).assert_ok()
