"""``sim.table(..., url=...).sync``: the blocking view of a table in real PostgreSQL / SQLite,
used from thread tasks, with the sync ``versioned_update``, ``fence`` and ``Inbox.claim_in``."""

from __future__ import annotations

from pathlib import Path

import pytest

import jobfence
from jobfence import StaleToken, StaleVersion
from jobfence.testing import InjectedFault, Simulation, explore, faults, replay
from jobfence.testing.table import SyncTable
from tests.servers import POSTGRES_URL


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return POSTGRES_URL
    return f"sqlite:///{tmp_path / 'sim.db'}"


def _naive(db: SyncTable) -> None:
    row = db.read(1)
    assert row is not None
    db.write(1, n=row["n"] + 1)


def _versioned(db: SyncTable) -> None:
    while True:
        row = db.read(1)
        assert row is not None
        try:  # on the view: a transaction of its own, no lock held across a point
            jobfence.versioned_update(db, "counter", {"id": 1}, row["version"], {"n": row["n"] + 1})
            return
        except StaleVersion:
            continue


def _scenario(job: object, url: str) -> object:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}}, url=url)
        sim.spawn(job, db.sync)
        sim.spawn(job, db.sync)
        await sim.join()
        sim.check(db.get(1)["n"] == 2, f"lost update: {db.get(1)}")  # type: ignore[index]

    return scenario


def test_threads_on_a_real_table_lose_an_update_then_keep_it_versioned(db_url: str) -> None:
    naive = _scenario(_naive, db_url)
    report = explore(naive, schedules=30, seed=1)  # type: ignore[arg-type]
    assert not report.ok and "lost update" in report.failures[0].message
    again = replay(naive, report.failures[0].tape)  # type: ignore[arg-type]
    assert [f.message for f in again.failures] == [report.failures[0].message]
    fixed = explore(_scenario(_versioned, db_url), schedules=30, seed=1)  # type: ignore[arg-type]
    assert fixed.ok, fixed


def test_fence_on_a_real_tables_view_refuses_an_older_token(db_url: str) -> None:
    stale: list[bool] = []

    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}}, url=db_url, fenced=True)

        def job(token: int) -> None:
            jobfence.fence(db.sync, "counter:1", token)
            db.sync.write(1, n=token, token=token)

        new = sim.spawn(job, 2)
        old = sim.spawn(job, 1)
        await sim.join()
        stale.append(old.error is not None)
        sim.check(old.error is None or isinstance(old.error, StaleToken), f"{old.error!r}")
        sim.check(new.error is None, f"{new.error!r}")
        sim.check(db.get(1)["n"] == 2, f"the older token won: {db.get(1)}")  # type: ignore[index]

    report = explore(scenario, schedules=20, seed=4)
    assert report.ok, report
    assert set(stale) == {True, False}  # fenced out by fence() or by the table's token check


def test_commit_unknown_on_a_real_tables_view(db_url: str) -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counter", {1: {"n": 0}}, url=db_url)

        def job() -> None:
            with db.sync.transaction() as tx:
                tx.write(1, n=9)

        task = sim.spawn(job)
        await sim.join()
        sim.check(isinstance(task.error, InjectedFault), f"{task.error!r}")
        sim.check(db.get(1) == {"n": 9, "version": 2}, f"{db.get(1)}")

    report = explore(scenario, schedules=1, faults=[faults.commit_unknown("db.commit")])
    assert report.ok, report
