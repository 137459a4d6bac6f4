"""The caller-connection adapter (``jobfence._core.sqlconn``): identifiers, placeholders, drivers.

Driver round trips use real servers (tests/servers.py) and SQLite files.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jobfence._core.sqlconn import (
    Result,
    _to_dollar,
    _to_format,
    _to_named,
    adapt,
    adapt_async,
    check_ident,
    is_undefined_table,
)
from jobfence.backends import sql_dialect
from jobfence.errors import ConfigurationError
from tests.servers import MYSQL_URL, POSTGRES_URL

# -- identifiers ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["t", "_t1", "Inventory", "public.inventory", "a" * 63])
def test_valid_identifiers(name: str) -> None:
    assert check_ident(name, "table") == name


@pytest.mark.parametrize(
    "name",
    ["", "1t", "a-b", "a b", 't"; DROP TABLE x; --', "t`", "a" * 64, "a.b.c", ".a", "a.", "é", 5],
)
def test_invalid_identifiers_name_the_argument(name: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_ident(name, "table")
    assert info.value.argument == "table"


def test_unqualified_identifiers_reject_dots() -> None:
    with pytest.raises(ConfigurationError):
        check_ident("a.b", "key", qualified=False)


def test_quote_per_dialect() -> None:
    assert sql_dialect("postgresql").quote("s.t") == '"s"."t"'
    assert sql_dialect("sqlite").quote("t") == '"t"'
    assert sql_dialect("mysql").quote("s.t") == "`s`.`t`"


# -- placeholders ---------------------------------------------------------------------------


def test_placeholder_conversion() -> None:
    sql = "SELECT ? , '100%' WHERE a = ? AND b = ?"
    assert _to_format(sql) == "SELECT %s , '100%%' WHERE a = %s AND b = %s"
    assert _to_dollar(sql) == "SELECT $1 , '100%' WHERE a = $2 AND b = $3"
    assert _to_named(sql, (1, 2, 3)) == (
        "SELECT :p0 , '100%' WHERE a = :p1 AND b = :p2",
        {"p0": 1, "p1": 2, "p2": 3},
    )


# -- detection ------------------------------------------------------------------------------


def test_unsupported_type_lists_supported_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        adapt(object())
    assert info.value.argument == "conn"
    for name in ("psycopg", "pymysql", "sqlite3", "sqlalchemy"):
        assert name in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        adapt_async("not a connection")
    for name in ("asyncpg", "aiomysql", "aiosqlite", "AsyncSession"):
        assert name in str(info.value)


async def test_sync_and_async_mismatch_is_explained(tmp_path: Path) -> None:
    import aiosqlite

    conn = sqlite3.connect(tmp_path / "a.db")
    with pytest.raises(ConfigurationError, match="blocking connection"):
        adapt_async(conn)
    conn.close()
    async with aiosqlite.connect(tmp_path / "a.db") as aconn:
        with pytest.raises(ConfigurationError, match="asyncio connection"):
            adapt(aconn)


def test_subclasses_are_recognised(tmp_path: Path) -> None:
    class MyConn(sqlite3.Connection):
        pass

    conn = sqlite3.connect(tmp_path / "a.db", factory=MyConn)
    assert adapt(conn).dialect == "sqlite"
    conn.close()


def test_sqlalchemy_dialect_and_driver(tmp_path: Path) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.connect() as conn:
        sc = adapt(conn)
        assert (sc.dialect, sc.driver) == ("sqlite", "sqlalchemy+pysqlite")
    with Session(engine) as session:
        assert adapt(session).dialect == "sqlite"
    engine.dispose()
    mariadb = sa.create_engine(MYSQL_URL.replace("mysql://", "mariadb+pymysql://"))
    with mariadb.connect() as conn:
        assert adapt(conn).dialect == "mysql"  # MariaDB counts as mysql
    mariadb.dispose()


# -- execute: in the caller's transaction, rows as tuples -----------------------------------


def test_sqlite3_execute_stays_in_the_callers_transaction(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "a.db")
    conn.row_factory = sqlite3.Row
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.commit()
    sc = adapt(conn)
    res = sc.execute("INSERT INTO t (a) VALUES (?), (?)", (1, 2))
    assert res.rowcount == 2
    res = sc.execute("SELECT a, '50%' FROM t ORDER BY a")
    assert res == Result([(1, "50%"), (2, "50%")], 2, res.lastrowid, ["a", "'50%'"])
    assert all(type(r) is tuple for r in res.rows)
    conn.rollback()  # nothing was committed by the adapter
    assert sc.execute("SELECT count(*) FROM t").rows == [(0,)]
    conn.close()


def test_psycopg_dict_rows_and_rollback() -> None:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(POSTGRES_URL, row_factory=dict_row) as conn:
        sc = adapt(conn)
        sc.execute("CREATE TEMP TABLE t (a int)")
        assert sc.execute("INSERT INTO t VALUES (?), (?)", (1, 2)).rowcount == 2
        res = sc.execute("SELECT a FROM t WHERE a > ? ORDER BY a", (0,))
        assert (res.rows, res.columns) == ([(1,), (2,)], ["a"])
        assert conn.info.transaction_status.name == "INTRANS"  # still the caller's transaction
        conn.rollback()


def test_pymysql_dict_cursor_rows_are_tuples() -> None:
    from urllib.parse import urlsplit

    import pymysql

    u = urlsplit(MYSQL_URL)
    conn = pymysql.connect(
        host=u.hostname,
        port=u.port or 3306,
        user=u.username,
        database=u.path.lstrip("/"),
        cursorclass=pymysql.cursors.DictCursor,
    )
    try:
        res = adapt(conn).execute("SELECT ? + 1, '100%'", (1,))
        assert res.rows == [(2, "100%")]
        assert conn.get_autocommit() is False  # untouched
    finally:
        conn.close()


async def test_asyncpg_rowcount_rows_and_pool_connections() -> None:
    import asyncpg

    pool = await asyncpg.create_pool(POSTGRES_URL, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn, conn.transaction():
            sc = adapt_async(conn)
            assert (sc.dialect, sc.driver) == ("postgresql", "asyncpg")
            await sc.execute("CREATE TEMP TABLE t (a int)")
            assert (await sc.execute("INSERT INTO t VALUES (?), (?)", (1, 2))).rowcount == 2
            assert (await sc.execute("UPDATE t SET a = a + 1 WHERE a > ?", (0,))).rowcount == 2
            res = await sc.execute("DELETE FROM t WHERE a = ? RETURNING a", (3,))
            assert (res.rows, res.rowcount) == ([(3,)], 1)
    finally:
        await pool.close()


# -- undefined-table errors from every driver ----------------------------------------------


async def test_is_undefined_table_recognises_every_driver(tmp_path: Path) -> None:
    import aiomysql
    import asyncpg
    import psycopg
    import pymysql
    import sqlalchemy as sa

    errors: list[BaseException] = []
    missing = "SELECT * FROM jf_no_such_table_xyz"
    with psycopg.connect(POSTGRES_URL) as c:
        try:
            c.execute(missing)
        except Exception as exc:
            errors.append(exc)
    ac = await asyncpg.connect(POSTGRES_URL)
    try:
        await ac.fetch(missing)
    except Exception as exc:
        errors.append(exc)
    finally:
        await ac.close()
    engine = sa.create_engine(MYSQL_URL.replace("mysql://", "mysql+pymysql://"))
    with engine.connect() as c:
        try:
            c.execute(sa.text(missing))
        except Exception as exc:
            errors.append(exc)  # sqlalchemy.exc.ProgrammingError wrapping pymysql 1146
    engine.dispose()
    from urllib.parse import urlsplit

    u = urlsplit(MYSQL_URL)
    am = await aiomysql.connect(host=u.hostname, port=u.port or 3306, user=u.username, db="test")
    try:
        async with am.cursor() as cur:
            await cur.execute(missing)
    except Exception as exc:
        errors.append(exc)
    finally:
        am.close()
    try:
        sqlite3.connect(tmp_path / "a.db").execute(missing)
    except Exception as exc:
        errors.append(exc)
    assert len(errors) == 5
    assert all(is_undefined_table(e) for e in errors), errors
    # other errors are not mistaken for it
    assert not is_undefined_table(sqlite3.OperationalError("database is locked"))
    assert not is_undefined_table(pymysql.err.OperationalError(1213, "Deadlock found"))
    assert not is_undefined_table(ValueError("no such table"))


# -- named parameters (the convention of the shipped SQL files) ----------------------------

NAMED = "SELECT :a::int + 1, '100%', ':no', :b, :a"


def test_named_parameters_on_every_sync_driver(tmp_path: Path) -> None:
    import psycopg
    import pymysql
    import sqlalchemy as sa

    from tests.servers import mysql_params

    with psycopg.connect(POSTGRES_URL) as conn:
        assert adapt(conn).execute(NAMED, {"a": 1, "b": "x", "z": 0}).rows == [
            (2, "100%", ":no", "x", 1)
        ]
        assert adapt(conn).execute("SELECT '50%'", {}).rows == [("50%",)]
    engine = sa.create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        assert adapt(conn).execute(NAMED, {"a": 1, "b": "x"}).rows == [(2, "100%", ":no", "x", 1)]
    engine.dispose()
    mysql_sql = "SELECT :a + 1, '100%', ':no', :b, :a"
    my = pymysql.connect(**mysql_params())
    try:
        assert adapt(my).execute(mysql_sql, {"a": 1, "b": "x"}).rows == [(2, "100%", ":no", "x", 1)]
    finally:
        my.close()
    lite = sqlite3.connect(tmp_path / "n.db")
    assert adapt(lite).execute(mysql_sql, {"a": 1, "b": "x"}).rows == [(2, "100%", ":no", "x", 1)]
    lite.close()


async def test_named_parameters_on_asyncpg() -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        res = await adapt_async(conn).execute(NAMED, {"a": 1, "b": "x"})
        assert res.rows == [(2, "100%", ":no", "x", 1)]
    finally:
        await conn.close()
