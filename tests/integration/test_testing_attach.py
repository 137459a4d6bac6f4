"""``sim.attach(conn)``: the scenario's own database connections, scheduled at every
statement, on real PostgreSQL, MariaDB and SQLite, from async tasks and thread tasks.

For each driver: the naive version of a job (check-then-act; read-modify-write) is found
failing (the effect applied twice; an update lost) and jobfence's call (``claim_in``;
``versioned_update``; ``fence``) passes; three identical ``explore`` runs give identical
reports and schedules; the failing tape replays the same 20 times out of 20. Then the
points' semantics: transient and commit_unknown faults, a crashed process's connection
closed so the server rolls back, the scenario's own statements inert, the connection
restored when the schedule ends.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence import ConflictError
from jobfence.testing import InjectedFault, Report, Simulation, explore, faults, replay
from jobfence.testing.connections import statement_point, table_named
from tests.servers import POSTGRES_URL, mysql_params

#: real seconds a statement may wait (for a lock a parked task holds) before others go on:
#: short where jobfence's call makes the second task wait for the first (the fixed jobs),
#: the default for the naive jobs, whose reports are compared run to run, so that a
#: statement slowed down by a loaded machine is still waited for
BLOCK = 0.3
NAIVE_BLOCK = 1.0


# -- the databases ----------------------------------------------------------------------
class Flavour:
    """One driver: how to connect, run a statement, begin and commit, in its own style."""

    name = ""
    dialect = ""
    is_async = False
    mark = "%s"
    #: the naive jobs run without a transaction, on a connection in autocommit mode: no
    #: statement of theirs waits for a lock, so no real timing enters their schedules
    naive_tx = False

    def __init__(self, where: dict[str, Any]) -> None:
        self.where = where
        self.charges = where["charges"]
        self.accounts = where["accounts"]
        self.inbox = where["inbox"]
        self.fences = where["fences"]

    def sql(self, text: str) -> str:
        return text.format(p=self.mark, charges=self.charges, accounts=self.accounts)

    # blocking flavours
    def connect(self, autocommit: bool) -> Any:
        raise NotImplementedError

    def run(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = conn.cursor()
        try:
            cur.execute(self.sql(text), params)
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    def begin(self, conn: Any) -> None:
        conn.begin()

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def close(self, conn: Any) -> None:
        conn.close()


class AsyncFlavour(Flavour):
    is_async = True

    async def aconnect(self, autocommit: bool) -> Any:
        raise NotImplementedError

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = await conn.cursor()
        try:
            await cur.execute(self.sql(text), params)
            return list(await cur.fetchall()) if cur.description else []
        finally:
            await cur.close()

    async def abegin(self, conn: Any) -> None:
        await conn.begin()

    async def acommit(self, conn: Any) -> None:
        await conn.commit()

    async def arollback(self, conn: Any) -> None:
        await conn.rollback()

    async def aclose(self, conn: Any) -> None:
        await conn.close()


class Psycopg(Flavour):
    name, dialect = "psycopg", "postgresql"

    def connect(self, autocommit: bool) -> Any:
        return psycopg.connect(self.where["dsn"], autocommit=autocommit)

    def begin(self, conn: Any) -> None:
        pass  # psycopg begins at the first statement

    def run(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = conn.execute(self.sql(text), params)
        return cur.fetchall() if cur.description else []


class PsycopgAsync(AsyncFlavour):
    name, dialect = "psycopg-async", "postgresql"

    async def aconnect(self, autocommit: bool) -> Any:
        return await psycopg.AsyncConnection.connect(self.where["dsn"], autocommit=autocommit)

    async def abegin(self, conn: Any) -> None:
        pass

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = await conn.execute(self.sql(text), params)
        return await cur.fetchall() if cur.description else []


class PyMySQL(Flavour):
    name, dialect = "pymysql", "mysql"

    def connect(self, autocommit: bool) -> Any:
        return pymysql.connect(**mysql_params(), autocommit=autocommit)


class AioMySQL(AsyncFlavour):
    name, dialect = "aiomysql", "mysql"

    async def aconnect(self, autocommit: bool) -> Any:
        import aiomysql

        params = mysql_params()
        params["db"] = params.pop("database")
        return await aiomysql.connect(**params, autocommit=autocommit)

    async def aclose(self, conn: Any) -> None:
        conn.close()


class SQLite3(Flavour):
    name, dialect, mark = "sqlite3", "sqlite", "?"

    def connect(self, autocommit: bool) -> Any:
        # no busy wait: a write the other connection's lock stops fails at once (a
        # blocked thread would hold up every other task)
        return sqlite3.connect(
            self.where["path"], timeout=0, isolation_level=None, check_same_thread=False
        )

    def begin(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")


class AioSQLite(AsyncFlavour):
    name, dialect, mark = "aiosqlite", "sqlite", "?"

    async def aconnect(self, autocommit: bool) -> Any:  # not opened: attach, then await it
        import aiosqlite

        return aiosqlite.connect(self.where["path"], isolation_level=None)

    async def abegin(self, conn: Any) -> None:
        # deferred: the first write takes the lock (a concurrent one waits for it)
        await conn.execute("BEGIN")

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return list(await conn.execute_fetchall(self.sql(text), params))


def _named(text: str, params: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    """``%s`` placeholders as SQLAlchemy's ``:p0, :p1...``."""
    parts = text.split("%s")
    out = parts[0] + "".join(f":p{i}{part}" for i, part in enumerate(parts[1:]))
    return out, {f"p{i}": v for i, v in enumerate(params)}


class SAEngine(Flavour):
    """A SQLAlchemy Connection of a psycopg engine (no pool: one connection per task)."""

    name, dialect = "sqlalchemy", "postgresql"

    def connect(self, autocommit: bool) -> Any:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        url = self.where["dsn"].replace("postgresql://", "postgresql+psycopg://")
        level = "AUTOCOMMIT" if autocommit else "READ COMMITTED"
        return create_engine(url, poolclass=NullPool, isolation_level=level).connect()

    def begin(self, conn: Any) -> None:
        pass  # autobegin

    def run(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        from sqlalchemy import text as sql_text

        sql, named = _named(self.sql(text), params)
        result = conn.execute(sql_text(sql), named)
        return [tuple(r) for r in result] if result.returns_rows else []


class SAAsyncEngine(AsyncFlavour):
    """A SQLAlchemy AsyncConnection of a psycopg (async) engine, the engine attached."""

    name, dialect = "sqlalchemy-async", "postgresql"

    async def aconnect(self, autocommit: bool) -> Any:
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        url = self.where["dsn"].replace("postgresql://", "postgresql+psycopg://")
        level = "AUTOCOMMIT" if autocommit else "READ COMMITTED"
        # attached, then connected
        return create_async_engine(url, poolclass=NullPool, isolation_level=level)

    async def abegin(self, conn: Any) -> None:
        pass  # autobegin

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        from sqlalchemy import text as sql_text

        sql, named = _named(self.sql(text), params)
        result = await conn.execute(sql_text(sql), named)
        return [tuple(r) for r in result] if result.returns_rows else []


FLAVOURS = [Psycopg, PsycopgAsync, PyMySQL, AioMySQL, SQLite3, AioSQLite, SAEngine, SAAsyncEngine]


@pytest.fixture
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Tables of the test's own in the flavour's database: charges (one row per effect),
    accounts (a versioned balance), an inbox table and a fence table."""
    dialect = request.param
    uid = uuid.uuid4().hex[:10]
    if dialect == "postgresql":
        schema = f"jfattach_{uid}"
        dsn = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
        with psycopg.connect(POSTGRES_URL, autocommit=True) as a:
            a.execute(f"CREATE SCHEMA {schema}")
        names = {"charges": "charges", "accounts": "accounts", "inbox": "inbox"}
        where: dict[str, Any] = {"dsn": dsn, "fences": "fences", **names}
        admin: Callable[[], Any] = lambda: psycopg.connect(dsn, autocommit=True)  # noqa: E731
        text = "text"
    elif dialect == "mysql":
        where = {
            "charges": f"charges_{uid}",
            "accounts": f"accounts_{uid}",
            "inbox": f"inbox_{uid}",
            "fences": f"fences_{uid}",
        }
        admin = lambda: pymysql.connect(**mysql_params(), autocommit=True)  # noqa: E731
        text = "VARCHAR(64)"
    else:
        path = str(tmp_path / "app.db")
        where = {"path": path, "charges": "charges", "accounts": "accounts"}
        where.update({"inbox": "inbox", "fences": "fences"})
        admin = lambda: sqlite3.connect(path, isolation_level=None)  # noqa: E731
        with admin() as a:
            a.execute("PRAGMA journal_mode=WAL")
        text = "TEXT"
    conn = admin()
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {where['charges']} (msg {text} NOT NULL)")
        cur.execute(
            f"CREATE TABLE {where['accounts']} (id INTEGER PRIMARY KEY, "
            "balance INTEGER NOT NULL, version INTEGER NOT NULL)"
        )
        jobfence.Inbox("memory://attach", table=where["inbox"]).install(conn)
        jobfence.fencing.install(conn, table=where["fences"])
    finally:
        conn.close()
    where["admin"] = admin
    where["dialect"] = dialect
    yield where
    conn = admin()
    try:
        cur = conn.cursor()
        if dialect == "postgresql":
            cur.execute(f"DROP SCHEMA {schema} CASCADE")
        elif dialect == "mysql":
            for key in ("charges", "accounts", "inbox", "fences"):
                cur.execute(f"DROP TABLE IF EXISTS {where[key]}")
    finally:
        conn.close()


def flavours() -> Any:
    """Parametrize ``flavour`` (the driver) with ``where`` (its database)."""
    return pytest.mark.parametrize(
        ("flavour_cls", "where"),
        [pytest.param(cls, cls.dialect, id=cls.name) for cls in FLAVOURS],
        indirect=["where"],
    )


def _reset(where: dict[str, Any]) -> None:
    conn = where["admin"]()
    try:
        cur = conn.cursor()
        cur.execute(f"DELETE FROM {where['charges']}")
        cur.execute(f"DELETE FROM {where['accounts']}")
        cur.execute(f"DELETE FROM {where['inbox']}")
        cur.execute(f"DELETE FROM {where['fences']}")
        mark = "?" if where["dialect"] == "sqlite" else "%s"
        cur.execute(
            f"INSERT INTO {where['accounts']} (id, balance, version) VALUES ({mark}, 0, 1)",
            (1,),
        )
        if where["dialect"] == "sqlite":
            conn.commit()
    finally:
        conn.close()


def _outside(where: dict[str, Any], sql: str) -> list[Any]:
    conn = where["admin"]()
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return list(cur.fetchall())
    finally:
        conn.close()


# -- the jobs ----------------------------------------------------------------------------
def _conflict(flavour: Flavour, exc: Exception) -> Exception:
    """SQLite without a busy wait: a write another connection's lock stops is a conflict."""
    if flavour.dialect == "sqlite" and "locked" in str(exc):
        return ConflictError(f"database is locked: {exc}")
    return exc


def charge_sync(flavour: Flavour, conn: Any, inbox: jobfence.Inbox, safe: bool) -> None:
    """Apply the effect of message m1 once (check-then-act, or claim_in)."""
    tx = safe or flavour.naive_tx
    try:
        if tx:
            flavour.begin(conn)
        if safe:
            first = inbox.claim_in(conn, "m1")
        else:
            first = not flavour.run(conn, "SELECT msg FROM {charges} WHERE msg = {p}", ("m1",))
        if first:
            flavour.run(conn, "INSERT INTO {charges} (msg) VALUES ({p})", ("m1",))
        if tx:
            flavour.commit(conn)
    except Exception as exc:
        if tx:
            flavour.rollback(conn)
        error = _conflict(flavour, exc)
        if error is exc:
            raise
        raise error from exc


async def charge_async(
    flavour: AsyncFlavour, conn: Any, inbox: jobfence.AsyncInbox, safe: bool
) -> None:
    tx = safe or flavour.naive_tx
    try:
        if tx:
            await flavour.abegin(conn)
        if safe:
            first = await inbox.claim_in(conn, "m1")
        else:
            found = await flavour.arun(conn, "SELECT msg FROM {charges} WHERE msg = {p}", ("m1",))
            first = not found
        if first:
            await flavour.arun(conn, "INSERT INTO {charges} (msg) VALUES ({p})", ("m1",))
        if tx:
            await flavour.acommit(conn)
    except Exception:
        if tx:
            await flavour.arollback(conn)
        raise


def deposit_sync(flavour: Flavour, conn: Any, safe: bool) -> None:
    """Add 10 to the balance (read, then write back; or versioned_update, in a transaction
    but on SQLite, where a read then a write in one transaction fails when another wrote
    meanwhile: "database is locked")."""
    tx = safe and flavour.dialect != "sqlite"
    try:
        if tx:
            flavour.begin(conn)
        ((balance, version),) = flavour.run(
            conn, "SELECT balance, version FROM {accounts} WHERE id = {p}", (1,)
        )
        if safe:
            jobfence.versioned_update(
                conn, flavour.accounts, {"id": 1}, version, {"balance": balance + 10}
            )
        else:
            flavour.run(conn, "UPDATE {accounts} SET balance = {p} WHERE id = 1", (balance + 10,))
        if tx:
            flavour.commit(conn)
    except Exception:
        if tx:
            flavour.rollback(conn)
        raise


async def deposit_async(flavour: AsyncFlavour, conn: Any, safe: bool) -> None:
    tx = safe and flavour.dialect != "sqlite"
    try:
        if tx:
            await flavour.abegin(conn)
        ((balance, version),) = await flavour.arun(
            conn, "SELECT balance, version FROM {accounts} WHERE id = {p}", (1,)
        )
        if safe:
            await jobfence.versioned_update_async(
                conn, flavour.accounts, {"id": 1}, version, {"balance": balance + 10}
            )
        else:
            await flavour.arun(
                conn, "UPDATE {accounts} SET balance = {p} WHERE id = 1", (balance + 10,)
            )
        if tx:
            await flavour.acommit(conn)
    except Exception:
        if tx:
            await flavour.arollback(conn)
        raise


def set_owner_sync(flavour: Flavour, conn: Any, token: int, safe: bool) -> None:
    """The holder of lease ``token`` writes the account (fenced, or not)."""
    tx = safe or flavour.naive_tx
    try:
        if tx:
            flavour.begin(conn)
        if safe:
            jobfence.fence(conn, "account:1", token, table=flavour.fences)
        flavour.run(conn, "UPDATE {accounts} SET balance = {p} WHERE id = 1", (token,))
        if tx:
            flavour.commit(conn)
    except Exception as exc:
        if tx:
            flavour.rollback(conn)
        error = _conflict(flavour, exc)
        if error is exc:
            raise
        raise error from exc


async def set_owner_async(flavour: AsyncFlavour, conn: Any, token: int, safe: bool) -> None:
    tx = safe or flavour.naive_tx
    try:
        if tx:
            await flavour.abegin(conn)
        if safe:
            await jobfence.fence_async(conn, "account:1", token, table=flavour.fences)
        await flavour.arun(conn, "UPDATE {accounts} SET balance = {p} WHERE id = 1", (token,))
        if tx:
            await flavour.acommit(conn)
    except Exception:
        if tx:
            await flavour.arollback(conn)
        raise


Scenario = Callable[[Simulation], Any]


def scenario_of(flavour: Flavour, job: str, safe: bool, picks: list[Any]) -> Scenario:
    """Two tasks run ``job`` ("charge" or "deposit") on connections of their own; the
    scenario checks the effect applied once / no deposit lost."""
    where = flavour.where

    async def scenario(sim: Simulation) -> None:
        sim.block_timeout = BLOCK if safe else NAIVE_BLOCK
        _reset(where)
        tasks = []
        if isinstance(flavour, AsyncFlavour):
            conns = [await _attach_async(sim, flavour, not safe) for _ in range(2)]
            ainbox = jobfence.AsyncInbox("memory://attach", table=flavour.inbox)
            for token, conn in enumerate(conns, 1):
                if job == "charge":
                    tasks.append(sim.spawn(charge_async, flavour, conn, ainbox, safe))
                elif job == "fence":
                    tasks.append(sim.spawn(set_owner_async, flavour, conn, token, safe))
                else:
                    tasks.append(sim.spawn(deposit_async, flavour, conn, safe))
            await sim.join()
            for conn in conns:
                await flavour.aclose(conn)
            await ainbox.close()
        else:
            conns = [sim.attach(flavour.connect(not safe)) for _ in range(2)]
            inbox = jobfence.Inbox("memory://attach", table=flavour.inbox)
            for token, conn in enumerate(conns, 1):
                if job == "charge":
                    tasks.append(sim.spawn(charge_sync, flavour, conn, inbox, safe))
                elif job == "fence":
                    tasks.append(sim.spawn(set_owner_sync, flavour, conn, token, safe))
                else:
                    tasks.append(sim.spawn(deposit_sync, flavour, conn, safe))
            await sim.join()
            for conn in conns:
                flavour.close(conn)
            inbox.close()
        picks.append(tuple(sim.picks))
        if job == "charge":
            n = len(_outside(where, f"SELECT msg FROM {flavour.charges}"))
            sim.check(n == 1, f"the effect was applied {n} times")
        elif job == "fence":
            ((owner,),) = _outside(where, f"SELECT balance FROM {flavour.accounts}")
            newest = max(token for token, t in enumerate(tasks, 1) if t.error is None)
            sim.check(owner == newest, f"token {owner} wrote after token {newest}")
        else:
            ((balance,),) = _outside(where, f"SELECT balance FROM {flavour.accounts}")
            done = sum(1 for t in tasks if t.error is None)
            sim.check(balance == 10 * done, f"{done} deposits of 10 committed, balance {balance}")

    return scenario


async def _attach_async(sim: Simulation, flavour: AsyncFlavour, autocommit: bool) -> Any:
    made = await flavour.aconnect(autocommit)
    if flavour.name == "aiosqlite":  # aiosqlite answers from a thread: attach, then open
        return await sim.attach(made)
    if flavour.name == "sqlalchemy-async":  # the engine attached: its connections too
        return await sim.attach(made).connect()
    return sim.attach(made)


def _summary(report: Report) -> list[Any]:
    return [
        report.schedules,
        [(f.check, f.message, str(f.tape), str(f.original), f.seed) for f in report.failures],
    ]


def _prove(flavour: Flavour, job: str, schedules: int) -> None:
    naive_picks: list[list[Any]] = [[], [], []]
    reports = [
        explore(scenario_of(flavour, job, False, naive_picks[i]), schedules=schedules, seed=1)
        for i in range(3)
    ]
    first = reports[0]
    assert not first.ok, f"{flavour.name}: the naive {job} passed {first.schedules} schedules"
    failure = first.failures[0]
    expected = {"charge": "applied 2 times", "deposit": "balance 10", "fence": "after token 2"}
    assert expected[job] in failure.message
    # three identical runs: identical reports and identical schedules
    assert _summary(reports[1]) == _summary(first) == _summary(reports[2])
    assert naive_picks[1] == naive_picks[0] == naive_picks[2]
    # the failing tape replays the same, 20 times out of 20
    replays = []
    for _ in range(20):
        again = replay(scenario_of(flavour, job, False, []), failure.tape)
        replays.append([(f.check, f.message) for f in again.failures])
    assert replays == [[(failure.check, failure.message)]] * 20
    safe_picks: list[list[Any]] = [[], []]
    fixed = [
        explore(scenario_of(flavour, job, True, safe_picks[i]), schedules=schedules, seed=1)
        for i in range(2)
    ]
    assert fixed[0].ok, fixed[0]
    assert fixed[0].schedules == schedules
    if flavour.dialect != "sqlite" or flavour.is_async:
        # (SQLite without a busy wait: a conflict fails at once, no real timing involved)
        assert _summary(fixed[1]) == _summary(fixed[0])
    assert len(set(safe_picks[0])) > 1  # the decisions went more than one way


@flavours()
def test_claim_in_on_an_attached_connection_applies_the_effect_once(
    flavour_cls: type[Flavour], where: dict[str, Any]
) -> None:
    _prove(flavour_cls(where), "charge", 12)


@flavours()
def test_versioned_update_on_an_attached_connection_loses_no_update(
    flavour_cls: type[Flavour], where: dict[str, Any]
) -> None:
    _prove(flavour_cls(where), "deposit", 12)


@flavours()
def test_fence_on_an_attached_connection_keeps_an_older_holder_out(
    flavour_cls: type[Flavour], where: dict[str, Any]
) -> None:
    _prove(flavour_cls(where), "fence", 12)


# -- the points' semantics ----------------------------------------------------------------
pg_only = pytest.mark.parametrize("where", ["postgresql"], indirect=True)


@pg_only
def test_a_transient_fault_raises_before_the_statement(where: dict[str, Any]) -> None:
    async def scenario(sim: Simulation) -> None:
        _reset(where)
        aconn = sim.attach(await psycopg.AsyncConnection.connect(where["dsn"]))
        conn = sim.attach(psycopg.connect(where["dsn"]))

        async def in_async() -> None:
            await aconn.execute("INSERT INTO charges (msg) VALUES ('async')")
            await aconn.commit()

        def in_thread() -> None:
            conn.execute("INSERT INTO charges (msg) VALUES ('thread')")
            conn.commit()

        first = sim.spawn(in_async)
        second = sim.spawn(in_thread)
        await sim.join()
        await aconn.close()
        conn.close()
        sim.check(isinstance(first.error, InjectedFault), f"async: {first.error!r}")
        sim.check(isinstance(second.error, InjectedFault), f"thread: {second.error!r}")
        sim.check(not _outside(where, "SELECT msg FROM charges"), "a statement ran")

    report = explore(
        scenario,
        schedules=1,
        strategy="fifo",
        faults=[faults.transient("db.write", nth=1), faults.transient("db.write", nth=2)],
    )
    assert report.ok, report


@pg_only
def test_commit_unknown_commits_then_raises(where: dict[str, Any]) -> None:
    async def scenario(sim: Simulation) -> None:
        _reset(where)
        aconn = sim.attach(await psycopg.AsyncConnection.connect(where["dsn"]))
        conn = sim.attach(psycopg.connect(where["dsn"]))

        async def in_async() -> None:
            async with aconn.transaction():
                await aconn.execute("INSERT INTO charges (msg) VALUES ('async')")

        def in_thread() -> None:
            conn.execute("INSERT INTO charges (msg) VALUES ('thread')")
            conn.commit()

        first = sim.spawn(in_async)
        second = sim.spawn(in_thread)
        await sim.join()
        await aconn.close()
        conn.close()
        sim.check(isinstance(first.error, InjectedFault), f"async: {first.error!r}")
        sim.check(isinstance(second.error, InjectedFault), f"thread: {second.error!r}")
        rows = sorted(r[0] for r in _outside(where, "SELECT msg FROM charges"))
        sim.check(rows == ["async", "thread"], f"committed: {rows}")

    report = explore(
        scenario,
        schedules=1,
        strategy="fifo",
        faults=[
            faults.commit_unknown("db.commit", nth=1),
            faults.commit_unknown("db.commit", nth=2),
        ],
    )
    assert report.ok, report


@pg_only
@pytest.mark.parametrize("kind", ["async", "thread"])
def test_a_crashed_process_connection_is_closed_and_the_server_rolls_back(
    where: dict[str, Any], kind: str
) -> None:
    closed: list[bool] = []

    async def scenario(sim: Simulation) -> None:
        _reset(where)
        if kind == "async":
            dead = sim.attach(await psycopg.AsyncConnection.connect(where["dsn"]))
            alive = sim.attach(await psycopg.AsyncConnection.connect(where["dsn"]))

            async def holder() -> None:  # crashes at its commit, the row locked
                await dead.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
                await dead.commit()

            async def other() -> None:
                await sim.sleep(1)
                await alive.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                await alive.commit()

            sim.spawn(holder)
            task = sim.spawn(other)
        else:
            dead = sim.attach(psycopg.connect(where["dsn"]))
            alive = sim.attach(psycopg.connect(where["dsn"]))

            def holder_sync() -> None:
                dead.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
                dead.commit()

            def other_sync() -> None:
                jobfence.testing.get_clock().sleep(1)
                alive.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                alive.commit()

            sim.spawn(holder_sync)
            task = sim.spawn(other_sync)
        await sim.join()
        closed.append(dead.closed)
        sim.check(task.error is None, f"{task.error!r}")
        ((balance,),) = _outside(where, "SELECT balance FROM accounts")
        sim.check(balance == 1, f"balance {balance}: the crashed write was not rolled back")
        if kind == "async":
            await alive.close()
        else:
            alive.close()

    report = explore(scenario, schedules=1, faults=[faults.crash("db.commit", nth=1)])
    assert report.ok, report
    assert closed == [True]


@pg_only
def test_the_scenarios_own_statements_are_inert_and_the_connection_is_restored(
    where: dict[str, Any],
) -> None:
    kept: list[Any] = []
    points: list[Any] = []

    async def scenario(sim: Simulation) -> None:
        _reset(where)
        conn = psycopg.connect(where["dsn"])
        kept.append(conn)
        assert sim.attach(conn) is conn
        assert sim.attach(conn) is conn  # again: nothing changes
        conn.execute("INSERT INTO charges (msg) VALUES ('setup')")  # the scenario's own
        conn.commit()
        points.append(dict(sim.hits))

        def job() -> None:
            conn.execute("SELECT msg FROM charges")
            conn.commit()

        sim.spawn(job)
        await sim.join()
        points.append(dict(sim.hits))

    report = explore(scenario, schedules=2)
    assert report.ok, report
    assert points[0] == {} and points[1] == {"db.read": 1, "db.commit": 1}
    for conn in kept:  # as it was: usable, no points, its own classes
        assert type(conn) is psycopg.Connection
        assert conn.cursor_factory is psycopg.Cursor
        assert conn.execute("SELECT count(*) FROM charges").fetchone() == (1,)
        conn.close()


@pg_only
def test_a_blocking_connection_in_an_async_task_is_refused(where: dict[str, Any]) -> None:
    async def scenario(sim: Simulation) -> None:
        conn = sim.attach(psycopg.connect(where["dsn"]))

        async def job() -> None:
            conn.execute("SELECT 1")

        sim.spawn(job)
        await sim.join()
        conn.close()

    report = explore(scenario, schedules=1)
    assert [f.check for f in report.failures] == ["exception"]
    assert "for thread tasks" in report.failures[0].message


def test_attach_refuses_what_it_cannot_instrument() -> None:
    async def scenario(sim: Simulation) -> None:
        with pytest.raises(jobfence.ConfigurationError, match="supported: psycopg"):
            sim.attach(object())

    assert explore(scenario, schedules=1).ok


@pytest.mark.parametrize(
    ("sql", "point", "table"),
    [
        ("SELECT a FROM public.orders o JOIN items i ON 1=1", "db.read", "orders"),
        ('  -- note\n  select * from "Orders" for update', "db.read", "Orders"),
        (
            "INSERT INTO jobfence_inbox (key) VALUES (%s) ON CONFLICT DO NOTHING",
            "db.write",
            "jobfence_inbox",
        ),
        ("UPDATE `acc` SET v = v + 1", "db.write", "acc"),
        ("DELETE FROM t WHERE id = 1", "db.write", "t"),
        ("WITH x AS (SELECT 1) UPDATE t SET a = 1", "db.write", "t"),
        ("WITH x AS (SELECT 1 FROM s) SELECT * FROM x", "db.read", "s"),
        ("COMMIT", "db.commit", None),
        ("BEGIN IMMEDIATE", None, None),
        ("ROLLBACK", None, None),
        ("SAVEPOINT a", None, None),
        ("CREATE TABLE IF NOT EXISTS n (id int)", "db.write", "n"),
        ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", None, None),
        (b"SELECT 1", "db.read", None),
    ],
)
def test_statement_points_and_tables(sql: Any, point: str | None, table: str | None) -> None:
    assert statement_point(sql) == point
    assert table_named(sql) == table


DJANGO_SCRIPT = r"""
import json, sys
import django
from django.conf import settings

schema = sys.argv[1]
settings.configure(
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "test", "USER": "postgres",
        "HOST": "127.0.0.1", "PORT": "5432",
        "OPTIONS": {"options": f"-c search_path={schema}"},
    }},
    USE_TZ=True,
)
django.setup()
from django.db import connection, transaction

import psycopg

import jobfence
from jobfence.testing import Simulation, explore, replay

inbox = jobfence.Inbox("memory://django", table="inbox")


def handle(sim, safe):
    conn = sim.attach(connection)  # this thread's connection
    try:
        with transaction.atomic():
            with conn.cursor() as cur:
                if safe:
                    first = inbox.claim_in(conn, "m1")
                else:
                    cur.execute("SELECT msg FROM charges WHERE msg = 'm1'")
                    first = not cur.fetchall()
                if first:
                    cur.execute("INSERT INTO charges (msg) VALUES ('m1')")
    finally:
        conn.close()


def make(safe):
    async def scenario(sim: Simulation) -> None:
        sim.block_timeout = 0.3
        # the scenario is async: its own look goes through psycopg
        dsn = f"postgresql://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DELETE FROM charges")
            admin.execute("DELETE FROM inbox")
        sim.spawn(handle, sim, safe)
        sim.spawn(handle, sim, safe)
        await sim.join()
        with psycopg.connect(dsn, autocommit=True) as admin:
            (n,) = admin.execute("SELECT count(*) FROM charges").fetchone()
        sim.check(n == 1, f"the effect was applied {n} times")
    return scenario


naive = explore(make(False), schedules=12, seed=1)
again = replay(make(False), naive.failures[0].tape) if naive.failures else None
safe = explore(make(True), schedules=12, seed=1)
print(json.dumps({
    "naive": [f.message for f in naive.failures],
    "replayed": [f.message for f in again.failures] if again else None,
    "safe": [f.message for f in safe.failures],
    "safe_schedules": safe.schedules,
}))
"""


@pg_only
def test_a_django_connection_attached_in_each_thread(where: dict[str, Any]) -> None:
    import json
    import subprocess
    import sys

    schema = where["dsn"].rsplit("%3D", 1)[1]
    done = subprocess.run(
        [sys.executable, "-c", DJANGO_SCRIPT, schema],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["naive"] == ["the effect was applied 2 times"]
    assert out["replayed"] == out["naive"]
    assert out["safe"] == [] and out["safe_schedules"] == 12


@pg_only
@pytest.mark.parametrize("kind", ["async", "thread"])
def test_a_fault_aimed_at_a_table_hits_its_statements_only(
    where: dict[str, Any], kind: str
) -> None:
    async def scenario(sim: Simulation) -> None:
        _reset(where)
        if kind == "async":
            conn = sim.attach(await psycopg.AsyncConnection.connect(where["dsn"], autocommit=True))

            async def job() -> None:
                await conn.execute("INSERT INTO charges (msg) VALUES ('kept')")
                await conn.execute("UPDATE accounts SET balance = 7 WHERE id = 1")

            task = sim.spawn(job)
        else:
            conn = sim.attach(psycopg.connect(where["dsn"], autocommit=True))

            def job_sync() -> None:
                conn.execute("INSERT INTO charges (msg) VALUES ('kept')")
                conn.execute("UPDATE accounts SET balance = 7 WHERE id = 1")

            task = sim.spawn(job_sync)
        await sim.join()
        sim.check(isinstance(task.error, InjectedFault), f"{task.error!r}")
        sim.check(_outside(where, "SELECT msg FROM charges") == [("kept",)], "charges")
        sim.check(_outside(where, "SELECT balance FROM accounts") == [(0,)], "accounts")

    report = explore(
        scenario, schedules=1, faults=[faults.transient("db.write", target="accounts")]
    )
    assert report.ok, report
