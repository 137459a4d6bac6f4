"""jobfence.testing: the blocking view of a simulated table (``table.sync``) in thread tasks.

The same verbs, points, faults and history as the async table, and the sync ``fence``,
``versioned_update``, ``Inbox.claim_in`` and ``Outbox.add`` accept the view and its
transactions."""

from __future__ import annotations

from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, StaleToken, StaleVersion
from jobfence.testing import Simulation, explore, faults, no_lost_update, replay
from jobfence.testing.table import SyncTable


def _naive_increment(sim: Simulation, db: SyncTable) -> None:
    row = db.read(1)
    assert row is not None
    db.write(1, n=row["n"] + 1)


def _versioned_increment(db: SyncTable) -> None:
    while True:
        row = db.read(1)
        assert row is not None
        try:
            with db.transaction() as tx:
                jobfence.versioned_update(
                    tx, "counter", {"id": 1}, row["version"], {"n": row["n"] + 1}
                )
            return
        except StaleVersion:
            continue


def test_the_naive_read_then_write_in_threads_loses_an_update() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}})
        sim.spawn(_naive_increment, sim, db.sync)
        sim.spawn(_naive_increment, sim, db.sync)
        await sim.join()
        sim.check(db.get(1) == {"n": 2, "version": 3}, f"lost update: {db.get(1)}")

    report = explore(scenario, schedules=50, seed=3)
    assert not report.ok
    failure = report.failures[0]
    assert "lost update" in failure.message
    for _ in range(5):  # the failing tape replays the same way
        again = replay(scenario, failure.tape)
        assert [f.message for f in again.failures] == [failure.message]


def test_versioned_update_on_the_view_keeps_every_update() -> None:
    seen: list[tuple[str, ...]] = []

    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}})
        for _ in range(3):
            sim.spawn(_versioned_increment, db.sync)
        await sim.join()
        seen.append(tuple(sim.picks))
        sim.check(db.get(1)["n"] == 3, f"got {db.get(1)}")  # type: ignore[index]
        sim.check(db.sync.rows() == db.rows(), "the view shows the table's rows")

    report = explore(scenario, schedules=60, seed=1, checks=[no_lost_update()])
    assert report.ok, report
    assert len(set(seen)) > 5  # the decisions went various ways


def test_claim_in_and_fence_on_the_views_transactions() -> None:
    applied: list[str] = []

    def handler(sim: Simulation, db: SyncTable, inbox: Any, token: int) -> None:
        with db.transaction() as tx:
            jobfence.fence(tx, "counter:1", token)
            if inbox.claim_in(tx, "msg-1"):
                row = tx.read(1)
                assert row is not None
                tx.write(1, n=row["n"] + 1)
                applied.append(sim.current().name)  # type: ignore[union-attr]

    async def scenario(sim: Simulation) -> None:
        applied.clear()
        db = sim.table("counter", {1: {"n": 0}})
        inbox = jobfence.Inbox(f"memory://{sim.namespace}")
        try:
            t1 = sim.spawn(handler, sim, db.sync, inbox, 1)
            t2 = sim.spawn(handler, sim, db.sync, inbox, 2)
            await sim.join()
        finally:
            inbox.close()
        # the key is applied once, whoever commits first; a stale token never applies it
        sim.check(db.get(1)["n"] == 1, f"applied {db.get(1)}")  # type: ignore[index]
        errors = [t.error for t in (t1, t2) if t.error is not None]
        sim.check(
            all(isinstance(e, (StaleToken, jobfence.ConflictError)) for e in errors), f"{errors}"
        )

    report = explore(scenario, schedules=60, seed=2)
    assert report.ok, report


def test_a_transient_fault_hits_the_thread_before_the_statement() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}})
        task = sim.spawn(lambda: db.sync.write(1, n=5))
        await sim.join()
        sim.check(isinstance(task.error, jobfence.testing.InjectedFault), f"{task.error!r}")
        sim.check(db.get(1) == {"n": 0, "version": 1}, "nothing written")

    report = explore(scenario, schedules=1, faults=[faults.transient("db.write")])
    assert report.ok, report


def test_commit_unknown_at_the_views_commit_commits_then_raises() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}})

        def job() -> None:
            with db.sync.transaction() as tx:
                tx.write(1, n=7)

        task = sim.spawn(job)
        await sim.join()
        sim.check(isinstance(task.error, jobfence.testing.InjectedFault), f"{task.error!r}")
        sim.check(db.get(1) == {"n": 7, "version": 2}, f"committed: {db.get(1)}")

    report = explore(scenario, schedules=1, faults=[faults.commit_unknown("db.commit")])
    assert report.ok, report


def test_the_flavours_do_not_mix() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}})
        with pytest.raises(ConfigurationError, match=r"table\.sync"):
            jobfence.versioned_update(db, "counter", {"id": 1}, 1, {"n": 1})
        with pytest.raises(ConfigurationError, match="async functions take the table"):
            await jobfence.versioned_update_async(db.sync, "counter", {"id": 1}, 1, {"n": 1})

        async def async_task() -> None:
            db.sync.read(1)

        sim.spawn(async_task)
        await sim.join()

    report = explore(scenario, schedules=1)
    # a ConfigurationError ending a job is a bug of the scenario: the schedule fails
    assert [f.check for f in report.failures] == ["exception"]
    assert isinstance(report.failures[0].error, ConfigurationError)
    assert "for thread tasks" in str(report.failures[0].error)


def test_outbox_add_on_the_views_transaction_adds_the_rows_at_its_commit() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("orders", {1: {"state": "new"}})
        outbox = sim.outbox(sync=True)

        def place(fail: bool) -> None:
            with db.sync.transaction() as tx:
                tx.write(1, state="placed")
                outbox.add(tx, queue="mail", body={"order": 1})
                if fail:  # an expected outcome of a job (a jobfence error): rolls back
                    raise jobfence.ConflictError("rolled back")

        failed = sim.spawn(place, True)
        sim.spawn(place, False)
        await sim.join()
        rows = outbox.backend.entries(None, None, 10)
        sim.check(len(rows) == 1, f"rows: {rows}")  # the failed transaction added none
        sim.check(isinstance(failed.error, jobfence.ConflictError), f"{failed.error!r}")

    report = explore(scenario, schedules=20)
    assert report.ok, report
