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
from jobfence.testing import Report, Simulation, explore, replay
from tests.servers import POSTGRES_URL, mysql_params

#: real seconds a statement may wait (for a lock a parked task holds) before others go on
BLOCK = 0.3


# -- the databases ----------------------------------------------------------------------
class Flavour:
    """One driver: how to connect, run a statement, begin and commit, in its own style."""

    name = ""
    dialect = ""
    is_async = False
    mark = "%s"
    #: the naive job runs in a transaction (SQLite: each statement commits on its own)
    naive_tx = True

    def __init__(self, where: dict[str, Any]) -> None:
        self.where = where
        self.charges = where["charges"]
        self.accounts = where["accounts"]
        self.inbox = where["inbox"]
        self.fences = where["fences"]

    def sql(self, text: str) -> str:
        return text.format(p=self.mark, charges=self.charges, accounts=self.accounts)

    # blocking flavours
    def connect(self) -> Any:
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

    async def aconnect(self) -> Any:
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

    def connect(self) -> Any:
        return psycopg.connect(self.where["dsn"])

    def begin(self, conn: Any) -> None:
        pass  # psycopg begins at the first statement

    def run(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = conn.execute(self.sql(text), params)
        return cur.fetchall() if cur.description else []


class PsycopgAsync(AsyncFlavour):
    name, dialect = "psycopg-async", "postgresql"

    async def aconnect(self) -> Any:
        return await psycopg.AsyncConnection.connect(self.where["dsn"])

    async def abegin(self, conn: Any) -> None:
        pass

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = await conn.execute(self.sql(text), params)
        return await cur.fetchall() if cur.description else []


class PyMySQL(Flavour):
    name, dialect = "pymysql", "mysql"

    def connect(self) -> Any:
        return pymysql.connect(**mysql_params(), autocommit=False)


class AioMySQL(AsyncFlavour):
    name, dialect = "aiomysql", "mysql"

    async def aconnect(self) -> Any:
        import aiomysql

        params = mysql_params()
        params["db"] = params.pop("database")
        return await aiomysql.connect(**params, autocommit=False)

    async def aclose(self, conn: Any) -> None:
        conn.close()


class SQLite3(Flavour):
    name, dialect, mark, naive_tx = "sqlite3", "sqlite", "?", False

    def connect(self) -> Any:
        # no busy wait: a write the other connection's lock stops fails at once (a
        # blocked thread would hold up every other task)
        return sqlite3.connect(
            self.where["path"], timeout=0, isolation_level=None, check_same_thread=False
        )

    def begin(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")


class AioSQLite(AsyncFlavour):
    name, dialect, mark, naive_tx = "aiosqlite", "sqlite", "?", False

    async def aconnect(self) -> Any:  # not opened yet: attach it, then await it
        import aiosqlite

        return aiosqlite.connect(self.where["path"], isolation_level=None)

    async def abegin(self, conn: Any) -> None:
        # deferred: the first write takes the lock (a concurrent one waits for it)
        await conn.execute("BEGIN")

    async def arun(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return list(await conn.execute_fetchall(self.sql(text), params))


FLAVOURS = [Psycopg, PsycopgAsync, PyMySQL, AioMySQL, SQLite3, AioSQLite]


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
    """Add 10 to the balance (read, then write back; or versioned_update)."""
    tx = flavour.naive_tx
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
    tx = flavour.naive_tx
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


Scenario = Callable[[Simulation], Any]


def scenario_of(flavour: Flavour, job: str, safe: bool, picks: list[Any]) -> Scenario:
    """Two tasks run ``job`` ("charge" or "deposit") on connections of their own; the
    scenario checks the effect applied once / no deposit lost."""
    where = flavour.where

    async def scenario(sim: Simulation) -> None:
        sim.block_timeout = BLOCK
        _reset(where)
        tasks = []
        if isinstance(flavour, AsyncFlavour):
            conns = [await _attach_async(sim, flavour) for _ in range(2)]
            ainbox = jobfence.AsyncInbox("memory://attach", table=flavour.inbox)
            for conn in conns:
                if job == "charge":
                    tasks.append(sim.spawn(charge_async, flavour, conn, ainbox, safe))
                else:
                    tasks.append(sim.spawn(deposit_async, flavour, conn, safe))
            await sim.join()
            for conn in conns:
                await flavour.aclose(conn)
            await ainbox.close()
        else:
            conns = [sim.attach(flavour.connect()) for _ in range(2)]
            inbox = jobfence.Inbox("memory://attach", table=flavour.inbox)
            for conn in conns:
                if job == "charge":
                    tasks.append(sim.spawn(charge_sync, flavour, conn, inbox, safe))
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
        else:
            ((balance,),) = _outside(where, f"SELECT balance FROM {flavour.accounts}")
            done = sum(1 for t in tasks if t.error is None)
            sim.check(balance == 10 * done, f"{done} deposits of 10 committed, balance {balance}")

    return scenario


async def _attach_async(sim: Simulation, flavour: AsyncFlavour) -> Any:
    made = await flavour.aconnect()
    if flavour.name == "aiosqlite":  # aiosqlite answers from a thread: attach, then open
        return await sim.attach(made)
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
    expected = "applied 2 times" if job == "charge" else "balance 10"
    assert expected in failure.message
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
