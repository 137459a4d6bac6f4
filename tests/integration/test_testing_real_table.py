"""``sim.table(..., url=...)``: the simulated table with its rows in real PostgreSQL / SQLite.

The same scenarios as in memory, with the same points, faults, history and checks: the
article's naive job fails the same way, the versioned fix passes, a seed replays the same
tape, ``get()`` shows what the database committed, and every schedule leaves nothing behind.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import jobfence
from jobfence import ConfigurationError, StaleToken
from jobfence.testing import Simulation, explore, faults, no_lost_update, point
from jobfence.testing.table_real import RealTable
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL

from ._sqldrivers import admin, query

Scenario = Callable[[Simulation], Any]


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return POSTGRES_URL
    return f"sqlite:///{tmp_path / 'sim.db'}"


def dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def sqlite_file(url: str) -> Path | None:
    return Path(url[len("sqlite:///") :]) if url.startswith("sqlite") else None


def outside(url: str, table: RealTable, key: Any) -> dict[str, Any] | None:
    """The row ``key`` read by a connection of the test's own (committed data only)."""
    with admin(dialect(url), sqlite_file(url)) as conn:
        found = query(
            conn, f"SELECT version, data FROM {table.sql_name} WHERE id = ?", (json.dumps(key),)
        )
    if not found:
        return None
    version, data = found[0]
    return {**json.loads(data), "version": version}


def aiosqlite_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]


# -- the article's jobs ------------------------------------------------------------------


async def naive_job(sim: Simulation, db: Any, qty: int) -> None:
    """Read, compute, write; a failed write is sent again as it was: with the stale value."""
    row = await db.read(1)
    stock = row["stock"] - qty
    for _attempt in range(3):
        try:
            await db.write(1, stock=stock)
            return
        except ConnectionError:
            await sim.sleep(0.1)


def naive(url: str | None) -> Scenario:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {1: {"stock": 10}}, url=url)
        sim.spawn(naive_job(sim, db, 5))
        sim.spawn(naive_job(sim, db, 3))
        await sim.join()
        stock = db.get(1)["stock"]
        sim.check(stock == 2, f"stock {stock}, expected 2")

    return scenario


async def fixed_job(db: Any, qty: int, trace: list[Any] | None = None) -> None:
    @jobfence.retry_unit(attempts=10)
    async def unit() -> None:
        row = await db.read("stock")
        version = await jobfence.versioned_update_async(
            db, "inventory", {"id": "stock"}, row["version"], {"stock": row["stock"] - qty}
        )
        if trace is not None:
            trace.append((qty, row["stock"], version))

    await unit()


def fixed(url: str | None, tasks: tuple[int, ...] = (5, 3)) -> Scenario:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"stock": 10}}, url=url)
        for qty in tasks:
            sim.spawn(fixed_job(db, qty))
        await sim.join()
        stock = db.get("stock")["stock"]
        sim.check(stock == 10 - sum(tasks), f"stock {stock}, expected {10 - sum(tasks)}")

    return scenario


def test_the_naive_job_fails_as_in_memory(db_url: str) -> None:
    in_memory = explore(naive(None), schedules=300, faults="auto", checks=[no_lost_update()])
    real = explore(naive(db_url), schedules=300, faults="auto", checks=[no_lost_update()])
    assert not in_memory.ok and not real.ok
    want, got = in_memory.failures[0], real.failures[0]
    assert (got.check, got.message, str(got.tape)) == (want.check, want.message, str(want.tape))
    assert got.message == "stock 7, expected 2"
    # without faults, the interleavings alone lose an update: the checker sees it in the
    # history of the real table too
    racy = explore(naive(db_url), schedules=50, checks=[no_lost_update()])
    assert not racy.ok
    assert racy.failures[0].check == "no_lost_update"


def test_the_versioned_job_passes_200_schedules_with_transient_faults(db_url: str) -> None:
    report = explore(
        fixed(db_url),
        schedules=200,
        faults=faults.auto(kinds=["transient"]),
        checks=[no_lost_update()],
    )
    report.assert_ok()
    assert report.schedules == 200


def recorder(url: str | None) -> Scenario:
    """Three versioned jobs; the schedule always fails at the end, with everything it saw
    (the jobs' reads and versions, the rows, the history) as its message."""

    async def scenario(sim: Simulation) -> None:
        trace: list[Any] = []
        db = sim.table("inventory", {"stock": {"stock": 10}}, url=url)
        for qty in (1, 2, 3):
            sim.spawn(fixed_job(db, qty, trace))
        await sim.join()
        history = [(w.task, w.values, w.base, w.over, w.version) for w in db.history]
        sim.check(False, repr((trace, db.rows(), history)))

    return scenario


def record(url: str | None, schedules: int, fault_spec: Any) -> list[tuple[int, str, str]]:
    """Every schedule's index, tape and what it saw."""
    report = explore(
        recorder(url),
        schedules=schedules,
        seed=11,
        faults=fault_spec,
        stop_on_failure=False,
        shrink=False,
    )
    return [(f.index, str(f.tape), f.message) for f in report.failures]


def test_a_seed_gives_the_same_tape_every_time_and_the_same_as_in_memory(db_url: str) -> None:
    first = record(db_url, 5, None)  # FIFO, then four random schedules
    assert [index for index, _tape, _message in first] == [0, 1, 2, 3, 4]
    assert len({tape for _index, tape, _message in first}) == 5
    for _ in range(19):
        assert record(db_url, 5, None) == first
    assert record(None, 5, None) == first
    # with every fault "auto" tries first (transient, commit_unknown), as in memory too
    assert record(db_url, 12, "auto") == record(None, 12, "auto")


def test_get_shows_the_committed_row_as_the_database_holds_it(db_url: str) -> None:
    seen: list[Any] = []

    async def job(sim: Simulation, db: RealTable) -> None:
        async with db.transaction() as tx:
            await tx.write(1, stock=7, note="tx")
            assert await tx.read(1) == {"stock": 7, "note": "tx", "version": 2}
            seen.append(("in tx", db.get(1), outside(db_url, db, 1)))
        seen.append(("committed", db.get(1), outside(db_url, db, 1)))
        try:
            await db.write("two", stock=[1, {"a": None}])  # applied, then reported failed
        except ConnectionError:
            seen.append(("unknown", db.get("two"), outside(db_url, db, "two")))
        seen.append(("rows", db.rows()))

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {1: {"stock": 10}}, url=db_url)
        sim.spawn(job(sim, db))
        await sim.join()

    # db.write #1 is the transaction's write, #2 the one after it
    report = explore(scenario, schedules=1, faults=[faults.commit_unknown("db.write", nth=2)])
    report.assert_ok()
    before = {"stock": 10, "version": 1}
    after = {"stock": 7, "note": "tx", "version": 2}
    two = {"stock": [1, {"a": None}], "version": 1}
    assert seen == [
        ("in tx", before, before),
        ("committed", after, after),
        ("unknown", two, two),
        ("rows", {1: after, "two": two}),
    ]


def test_nothing_is_left_behind(db_url: str) -> None:
    tables: list[RealTable] = []

    async def holder(sim: Simulation, db: RealTable) -> None:
        async with db.transaction() as tx:
            await tx.write("held", by="holder")
            await point("inside")  # crashes here with its transaction open
            await sim.sleep(5)  # or is still inside when the schedule fails

    async def stopper(sim: Simulation) -> None:
        await sim.sleep(1)
        sim.check(False, "the schedule ends here")

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"stock": 10}}, url=db_url)
        tables.append(db)
        sim.spawn(holder(sim, db))
        sim.spawn(fixed_job(db, 5))
        await sim.join()
        sim.check(db.get("held") is None, "a crashed transaction was committed")

    async def stopped(sim: Simulation) -> None:
        sim.spawn(stopper(sim))
        await scenario(sim)

    before = aiosqlite_threads()
    report = explore(scenario, schedules=6, faults=[faults.crash("inside")])
    report.assert_ok()
    report = explore(stopped, schedules=1, shrink=False)
    assert report.failures[0].message == "the schedule ends here"
    assert len(tables) == 7
    names = [t.sql_name for t in tables]
    with admin(dialect(db_url), sqlite_file(db_url)) as conn:
        if dialect(db_url) == "postgresql":
            left = query(
                conn,
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name IN ("
                + ", ".join("?" for _ in names)
                + ")",
                tuple(name.split(".")[0].strip('"') for name in names),
            )
        else:
            left = query(conn, "SELECT name FROM sqlite_master WHERE name LIKE '%jfsim%'")
    assert left == []
    assert aiosqlite_threads() == before
    file = sqlite_file(db_url)
    if file is not None:  # the last connection gone, SQLite removes the write-ahead log
        assert not Path(f"{file}-wal").exists()


def test_bad_url_name_or_key_is_a_configuration_error(tmp_path: Path) -> None:
    def build(url: Any, name: str = "inventory", key: Any = 1) -> ConfigurationError:
        async def scenario(sim: Simulation) -> None:
            db = sim.table(name, {key: {"stock": 1}}, url=url)
            sim.spawn(db.read(key))

        (failure,) = explore(scenario, schedules=1).failures  # the scenario's error
        assert isinstance(failure.error, ConfigurationError), failure
        return failure.error

    bad = [
        "mysql://root:s3cret-pw@127.0.0.1:3306/test",
        "redis://127.0.0.1:6379/0",
        "memory://",
        "sqlite://",
        "sqlite:///:memory:",
        f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}",
        "postgresql://postgres@127.0.0.1:99999/test",
        "",
        42,
    ]
    for url in bad:
        error = build(url)
        assert error.argument == "url", (url, error)
        assert "s3cret-pw" not in str(error)
    sqlite = f"sqlite:///{tmp_path / 'ok.db'}"
    assert build(sqlite, name="no spaces").argument == "name"
    assert build(sqlite, key=(1, 2)).argument == "key"


def test_a_statement_waiting_for_a_lock_gives_way_and_completes(db_url: str) -> None:
    """The one case where the database, not the scheduler, makes a task wait: the statement
    stalls, the simulation lets the lock holder go on, and both writes land in order."""
    out: dict[str, Any] = {}

    async def holder(sim: Simulation, db: RealTable) -> None:
        async with db.transaction() as tx:
            await tx.write(1, by="holder")
            await sim.sleep(5)  # holds the row (or SQLite's write lock) meanwhile

    async def writer(sim: Simulation, db: RealTable) -> None:
        await sim.sleep(1)
        await db.write(1, by="writer")  # waits for the holder's lock
        out["at"] = sim.now()

    async def scenario(sim: Simulation) -> None:
        sim.block_timeout = 0.2
        db = sim.table("t", {1: {"by": None}}, url=db_url)
        sim.spawn(holder(sim, db))
        sim.spawn(writer(sim, db))
        await sim.join()
        out["row"] = db.get(1)
        out["history"] = [(w.task, w.over, w.version) for w in db.history]

    explore(scenario, schedules=1).assert_ok()
    assert out["at"] >= 5.0  # when the holder committed (then real timing decides)
    assert out["row"] == {"by": "writer", "version": 3}
    assert out["history"] == [("t1", 1, 2), ("t2", 2, 3)]


def test_a_crashed_process_connection_is_closed_and_its_transaction_rolled_back(
    db_url: str,
) -> None:
    out: dict[str, Any] = {}

    async def crasher(db: RealTable) -> None:
        async with db.transaction() as tx:
            await tx.write(1, by="crasher")
            await point("work")  # dies here, its transaction open

    async def writer(sim: Simulation, db: RealTable) -> None:
        await sim.sleep(1)
        await db.write(1, by="writer")  # no wait: the crasher's lock went with it

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {1: {"by": None}}, url=db_url)
        sim.spawn(crasher(db))
        sim.spawn(writer(sim, db))
        await sim.join()
        out["row"] = db.get(1)
        out["history"] = [(w.task, w.over, w.version) for w in db.history]

    explore(scenario, schedules=1, faults=[faults.crash("work")]).assert_ok()
    assert out == {"row": {"by": "writer", "version": 2}, "history": [("t2", 1, 2)]}


def test_transactions_fences_and_history_as_in_memory(db_url: str) -> None:
    """The exactly-once unit (a transaction with an order row, so it is protected: a re-run
    after a commit reported failed finds the row) survives every fault, and a fenced table
    refuses a stale token, with the same history as in memory."""
    seen: dict[str | None, Any] = {}

    async def once_job(db: Any, order: int, qty: int) -> None:
        @jobfence.retry_unit(attempts=10, protected=True)
        async def unit() -> None:
            async with db.transaction() as tx:
                if await tx.read(f"order:{order}"):
                    return  # applied already: only its commit was reported failed
                row = await tx.read("stock")
                await jobfence.versioned_update_async(
                    tx, "inventory", {"id": "stock"}, row["version"], {"stock": row["stock"] - qty}
                )
                await tx.write(f"order:{order}", done=True)

        await unit()

    async def fenced_job(db: Any, token: int) -> None:
        try:
            await db.write("job", token=token, by=token)
        except StaleToken as exc:
            seen.setdefault("refused", []).append((exc.token, exc.newest))

    def scenario(url: str | None) -> Scenario:
        async def run(sim: Simulation) -> None:
            sim.block_timeout = 0.1
            db = sim.table("inventory", {"stock": {"stock": 10}}, url=url)
            fenced = sim.table("fenced", url=url, fenced=True)
            sim.spawn(once_job(db, 1, 5))
            sim.spawn(once_job(db, 2, 3))
            sim.spawn(fenced_job(fenced, 7))
            await sim.join()
            sim.spawn(fenced_job(fenced, 6))
            await sim.join()
            sim.check(db.get("stock")["stock"] == 2, f"stock {db.get('stock')}")
            seen[url] = [(w.task, w.key, w.token, w.version) for w in fenced.history]

        return run

    for url in (None, db_url):
        explore(scenario(url), schedules=30, faults="auto", checks=[no_lost_update()]).assert_ok()
    assert seen[db_url] == seen[None] == [("t3", "job", 7, 1)]
    assert set(seen["refused"]) == {(6, 7)}


def test_psycopg_connects_on_the_virtual_clock_and_its_timeouts_are_real() -> None:
    """psycopg bounds a connect by the real clock (the loop's only paces its polling): a
    connect slower than ``block_timeout`` still succeeds while virtual time runs ahead, and a
    server that never answers still times out."""
    port = urlsplit(POSTGRES_URL).port or 5432
    with FaultProxy(port) as proxy:
        url = proxy.url_for(POSTGRES_URL, port) + "?connect_timeout=2"
        out: dict[str, Any] = {}

        async def reader(sim: Simulation, db: RealTable) -> None:
            proxy.latency(0.15)  # each round trip takes 0.3 s, more than block_timeout
            out["row"] = await db.read(1)
            out["read at"] = sim.now()
            proxy.latency(0)

        async def sleeper(sim: Simulation) -> None:
            await sim.sleep(0.5)
            out["slept"] = True

        async def scenario(sim: Simulation) -> None:
            sim.block_timeout = 0.05
            db = sim.table("t", {1: {"x": 1}}, url=url)
            sim.spawn(reader(sim, db))
            sim.spawn(sleeper(sim))
            await sim.join()

        explore(scenario, schedules=1).assert_ok()
        assert out["row"] == {"x": 1, "version": 1}
        # the statement stalled, so the sleeper went on and virtual time ran past the
        # connect_timeout meanwhile: psycopg's deadline is on the real clock
        assert out["slept"] and out["read at"] > 2

        async def unanswered(sim: Simulation) -> None:
            with sim.real_io():
                proxy.stall()
                try:
                    await psycopg.AsyncConnection.connect(url)
                except psycopg.errors.ConnectionTimeout:
                    out["timed out"] = True
                finally:
                    proxy.resume()

        async def scenario2(sim: Simulation) -> None:
            sim.block_timeout = 0.05
            sim.spawn(unanswered(sim))

        explore(scenario2, schedules=1).assert_ok()
        assert out["timed out"]


def test_a_transaction_is_its_tasks_own(db_url: str) -> None:
    """A task's transaction runs on a connection of its own: nobody else (not even the same
    task outside it) sees its writes before it commits."""
    seen: list[Any] = []

    async def writer(sim: Simulation, db: RealTable) -> None:
        async with db.transaction() as tx:
            await tx.write(1, x=2)
            seen.append(("writer in tx", await tx.read(1)))
            seen.append(("writer outside", await db.read(1)))
            await sim.sleep(2)

    async def reader(sim: Simulation, db: RealTable) -> None:
        await sim.sleep(1)
        seen.append(("reader before", await db.read(1)))
        await sim.sleep(2)
        seen.append(("reader after", await db.read(1)))

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {1: {"x": 1}}, url=db_url)
        sim.spawn(writer(sim, db))
        sim.spawn(reader(sim, db))
        await sim.join()

    explore(scenario, schedules=1).assert_ok()
    old, new = {"x": 1, "version": 1}, {"x": 2, "version": 2}
    assert seen == [
        ("writer in tx", new),
        ("writer outside", old),
        ("reader before", old),
        ("reader after", new),
    ]
    file = sqlite_file(db_url)
    if file is not None:
        with sqlite3.connect(file) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_postgres_scheme_is_accepted_too() -> None:
    url = POSTGRES_URL.replace("postgresql://", "postgres://", 1)
    assert url.startswith("postgres://")
    explore(fixed(url), schedules=3, faults=faults.auto(kinds=["transient"])).assert_ok()


def test_claim_in_fence_and_versioned_update_in_the_database(db_url: str) -> None:
    """On the table and its transactions as on a connection of that database: a marker and
    a fence commit or roll back with their transaction, a stale token is refused, a stale
    version raises StaleVersion; fences and markers are no rows of ``rows()``."""
    seen: list[Any] = []

    async def job(db: RealTable, inbox: Any) -> None:
        try:
            async with db.transaction() as tx:
                seen.append(await inbox.claim_in(tx, "order:1"))
                await jobfence.fence_async(tx, "stock", 9)
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        async with db.transaction() as tx:
            seen.append(await inbox.claim_in(tx, "order:1", fingerprint="f"))
            await jobfence.fence_async(tx, "stock", 5)  # 9 was rolled back
            row = await tx.read("stock")
            assert row is not None
            seen.append(
                await jobfence.versioned_update_async(
                    tx, "inventory", {"id": "stock"}, row["version"], {"stock": 5}
                )
            )
        async with db.transaction() as tx:
            seen.append(await inbox.claim_in(tx, "order:1", fingerprint="f"))
        with pytest.raises(jobfence.FingerprintMismatch):
            await inbox.claim_in(db, "order:1", fingerprint="g")
        with pytest.raises(StaleToken) as stale:
            await jobfence.fence_async(db, "stock", 4)
        seen.append((stale.value.token, stale.value.newest))
        with pytest.raises(jobfence.StaleVersion) as old:
            await jobfence.versioned_update_async(db, "inventory", {"id": "stock"}, 1, {"stock": 0})
        seen.append((old.value.expected, old.value.current))

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"stock": 10}}, url=db_url)
        sim.spawn(job, db, sim.inbox())
        await sim.join()
        seen.append(db.rows())

    explore(scenario, schedules=1).assert_ok()
    rows = {"stock": {"stock": 5, "version": 2}}
    assert seen == [True, True, 2, False, (4, 5), (1, rows["stock"]), rows]


def test_claim_in_protects_a_retried_unit_under_every_fault_in_the_database(db_url: str) -> None:
    """Two orders on one stock, each a unit under retry_unit delivered again when it fails
    for good: with claim_in in the unit's transaction, no double deduction under the faults
    the first schedules try (an unknown commit among them); without it, one."""

    def orders(claim: bool) -> Scenario:
        async def order(db: RealTable, inbox: Any, number: int, qty: int) -> None:
            @jobfence.retry_unit(attempts=10)
            async def unit() -> None:
                async with db.transaction() as tx:
                    if claim and not await inbox.claim_in(tx, f"order:{number}"):
                        return
                    row = await tx.read("stock")
                    assert row is not None
                    new = {"stock": row["stock"] - qty}
                    await jobfence.versioned_update_async(
                        tx, "inventory", {"id": "stock"}, row["version"], new
                    )

            for _delivery in range(5):
                try:
                    await unit()
                    return
                except Exception:
                    continue

        async def scenario(sim: Simulation) -> None:
            sim.block_timeout = 0.1
            db = sim.table("inventory", {"stock": {"stock": 10}}, url=db_url)
            inbox = sim.inbox()
            sim.spawn(order, db, inbox, 1, 5)
            sim.spawn(order, db, inbox, 2, 3)
            await sim.join()
            stock = db.get("stock")["stock"]  # type: ignore[index]
            sim.check(stock == 2, f"stock {stock}, not 2")

        return scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jobfence.UnprotectedRetryWarning)
        plain = explore(orders(claim=False), schedules=30, faults="auto")
    assert [f.kind for f in plain.failures[0].tape.faults] == ["commit_unknown"]
    explore(orders(claim=True), schedules=30, faults="auto").assert_ok()
