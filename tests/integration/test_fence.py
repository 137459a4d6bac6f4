"""``jobfence.fence`` / ``fence_async`` on every dialect and every supported driver.

Real PostgreSQL and MariaDB (tests/servers.py) and SQLite files; each test uses its own
fence table, dropped afterwards.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, SchemaMissing, StaleToken
from jobfence.fencing import install
from jobfence.testing import set_hook

from ._sqldrivers import FLAVOUR_IDS, FLAVOURS, PG_DSN, Flavour, admin, query, unique


@pytest.fixture(params=FLAVOURS, ids=FLAVOUR_IDS)
def flavour(request: pytest.FixtureRequest, tmp_path: Path) -> Flavour:
    cls: type[Flavour] = request.param
    return cls(tmp_path / "app.db")


@pytest.fixture
def fence_table(flavour: Flavour) -> Iterator[str]:
    """A fresh, installed fence table for this test (dropped afterwards)."""
    table = unique("jf_fence")
    with admin(flavour.dialect, flavour.sqlite_path) as conn:
        install(conn, table=table)
        install(conn, table=table)  # idempotent
    yield table
    with admin(flavour.dialect, flavour.sqlite_path) as conn:
        query(conn, f"DROP TABLE IF EXISTS {table}")


@pytest.fixture
async def conn(flavour: Flavour) -> AsyncIterator[Any]:
    c = await flavour.connect()
    try:
        yield c
    finally:
        try:
            await flavour.rollback(c)
        finally:
            await flavour.close(c)


def stored_token(flavour: Flavour, table: str, resource: str) -> int | None:
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        if flavour.dialect == "mysql":
            key = hashlib.sha256(resource.encode()).hexdigest()
            rows = query(
                a, f"SELECT token, resource FROM {table} WHERE resource_hash = UNHEX(?)", (key,)
            )
            if rows:
                assert bytes(rows[0][1]).decode() == resource  # the name is kept beside the hash
        else:
            rows = query(a, f"SELECT token FROM {table} WHERE resource = ?", (resource,))
    return int(rows[0][0]) if rows else None


async def test_newer_and_equal_tokens_pass_older_raises(
    flavour: Flavour, fence_table: str, conn: Any
) -> None:
    res = "inventory:42 ünïcode"
    await flavour.fence(conn, res, 5, table=fence_table)  # first fence creates the record
    await flavour.commit(conn)
    assert stored_token(flavour, fence_table, res) == 5

    await flavour.fence(conn, res, 6, table=fence_table)  # newer
    await flavour.fence(conn, res, 6, table=fence_table)  # same holder again: allowed
    await flavour.commit(conn)
    assert stored_token(flavour, fence_table, res) == 6

    with pytest.raises(StaleToken) as info:
        await flavour.fence(conn, res, 5, table=fence_table)
    assert (info.value.resource, info.value.token, info.value.newest) == (res, 5, 6)
    assert "offered 5" in str(info.value) and "token 6" in str(info.value)
    await flavour.rollback(conn)
    assert stored_token(flavour, fence_table, res) == 6

    # resources are independent
    await flavour.fence(conn, "inventory:43", 1, table=fence_table)
    await flavour.commit(conn)
    assert stored_token(flavour, fence_table, "inventory:43") == 1


async def test_rollback_undoes_the_fence_record(
    flavour: Flavour, fence_table: str, conn: Any
) -> None:
    await flavour.fence(conn, "r", 3, table=fence_table)
    await flavour.commit(conn)
    await flavour.fence(conn, "r", 9, table=fence_table)
    await flavour.rollback(conn)  # the fence is part of the caller's transaction
    assert stored_token(flavour, fence_table, "r") == 3
    await flavour.fence(conn, "r", 4, table=fence_table)  # 9 never happened
    await flavour.commit(conn)
    assert stored_token(flavour, fence_table, "r") == 4


async def test_fence_commits_together_with_the_business_write(
    flavour: Flavour, fence_table: str, conn: Any
) -> None:
    data = unique("jf_data")
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"CREATE TABLE {data} (id INTEGER PRIMARY KEY, val VARCHAR(20))")
    try:
        await flavour.fence(conn, "row:1", 10, table=fence_table)
        await flavour.execute(conn, f"INSERT INTO {data} (id, val) VALUES (?, ?)", (1, "new"))
        await flavour.commit(conn)
        with pytest.raises(StaleToken):
            await flavour.fence(conn, "row:1", 9, table=fence_table)
        await flavour.rollback(conn)  # what a caller does on StaleToken
        with admin(flavour.dialect, flavour.sqlite_path) as a:
            assert query(a, f"SELECT id, val FROM {data}") == [(1, "new")]
    finally:
        await flavour.rollback(conn)
        with admin(flavour.dialect, flavour.sqlite_path) as a:
            query(a, f"DROP TABLE IF EXISTS {data}")


async def test_missing_table_raises_schema_missing(flavour: Flavour, conn: Any) -> None:
    table = unique("jf_absent")
    with pytest.raises(SchemaMissing) as info:
        await flavour.fence(conn, "r", 1, table=table)
    msg = str(info.value)
    assert "install" in msg and table in msg
    assert info.value.__cause__ is not None
    if flavour.dialect == "postgresql":
        assert "aborted" in msg
    await flavour.rollback(conn)


async def test_fence_check_hook_runs_before_the_statement(
    flavour: Flavour, fence_table: str, conn: Any
) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def hook(point: str, **info: Any) -> None:
        seen.append((point, info))
        if info.get("token") == 666:
            raise RuntimeError("injected")

    old = set_hook(hook)
    try:
        await flavour.fence(conn, "r", 1, table=fence_table)
        with pytest.raises(RuntimeError, match="injected"):
            await flavour.fence(conn, "r", 666, table=fence_table)
    finally:
        set_hook(old)
    await flavour.commit(conn)
    assert ("fence.check", {"resource": "r", "token": 1}) in seen
    assert stored_token(flavour, fence_table, "r") == 1  # the injected failure wrote nothing


@pytest.mark.parametrize(
    "table",
    ['jobfence_fences"; DROP TABLE x; --', "a b", "1abc", "x" * 64, "a.b.c", "", "t`", 'q"'],
)
async def test_injection_in_table_name_is_rejected(table: str, tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(ConfigurationError) as info:
        jobfence.fence(conn, "r", 1, table=table)
    assert info.value.argument == "table"
    with pytest.raises(ConfigurationError) as info:
        install(conn, table=table)
    assert info.value.argument == "table"
    conn.close()


@pytest.mark.parametrize(
    ("resource", "token", "argument"),
    [
        ("", 1, "resource"),
        (b"r", 1, "resource"),
        ("x" * 1025, 1, "resource"),
        ("r", -1, "token"),
        ("r", True, "token"),
        ("r", "5", "token"),
        ("r", 2**63, "token"),
    ],
)
async def test_bad_arguments(resource: Any, token: Any, argument: str, tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(ConfigurationError) as info:
        jobfence.fence(conn, resource, token)
    assert info.value.argument == argument
    conn.close()


async def test_unsupported_connection_names_conn() -> None:
    with pytest.raises(ConfigurationError) as info:
        jobfence.fence(object(), "r", 1)
    assert info.value.argument == "conn" and "psycopg" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        await jobfence.fence_async(object(), "r", 1)
    assert info.value.argument == "conn" and "asyncpg" in str(info.value)


async def test_schema_qualified_table(tmp_path: Path) -> None:
    """``schema.table`` works (PostgreSQL schema ``public``)."""
    import psycopg

    table = unique("jf_fence")
    with admin("postgresql") as a:
        install(a, table=f"public.{table}")
    try:
        with psycopg.connect(PG_DSN) as conn:
            jobfence.fence(conn, "r", 2, table=f"public.{table}")
            with pytest.raises(StaleToken):
                jobfence.fence(conn, "r", 1, table=f"public.{table}")
    finally:
        with admin("postgresql") as a:
            query(a, f"DROP TABLE IF EXISTS {table}")


# -- concurrency: the row lock makes concurrent fenced transactions take turns ---------------

SYNC_NATIVE = {"postgresql": "psycopg", "mysql": "pymysql", "sqlite": "sqlite3"}


def _waiting_on_lock(dialect: str, session_id: int | None) -> bool:
    """Whether the server shows ``session_id`` blocked on a row lock."""
    with admin(dialect) as a:
        if dialect == "postgresql":
            rows = query(
                a, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", (session_id,)
            )
            return bool(rows) and rows[0][0] == "Lock"
        rows = query(
            a,
            "SELECT trx_state FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?",
            (session_id,),
        )
        return bool(rows) and rows[0][0] == "LOCK WAIT"


def _session_id(dialect: str, conn: Any) -> int | None:
    if dialect == "postgresql":
        return int(conn.info.backend_pid)
    if dialect == "mysql":
        return int(conn.thread_id())
    return None


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
@pytest.mark.parametrize("first", [6, 5], ids=["newer-first", "older-first"])
async def test_concurrent_fences_take_turns(dialect: str, first: int, tmp_path: Path) -> None:
    """Tokens 5 and 6 fence one resource in two open transactions at once.

    The first fence holds the row lock; the second blocks until the first commits, then sees
    its token. newer-first: the older (5), committing later, is rejected. older-first: 5
    commits, then 6 passes. The final record is 6 either way.
    """
    cls = next(f for f in FLAVOURS if f.id == SYNC_NATIVE[dialect])
    fl = cls(tmp_path / "app.db")
    table = unique("jf_fence")
    with admin(dialect, fl.sqlite_path) as a:
        install(a, table=table)
    second = 5 if first == 6 else 6
    c1, c2 = await fl.connect(), await fl.connect()
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def run_second() -> None:
        started.set()
        try:
            jobfence.fence(c2, "res", second, table=table)
            outcome["ok"] = True
        except BaseException as exc:  # reported to the main thread
            outcome["error"] = exc

    try:
        jobfence.fence(c1, "res", first, table=table)  # holds the row lock now
        sid = _session_id(dialect, c2)
        thread = threading.Thread(target=run_second)
        thread.start()
        assert started.wait(10)
        if sid is not None:  # wait until the server shows it blocked on our row lock
            deadline = time.monotonic() + 10
            while not _waiting_on_lock(dialect, sid):
                assert time.monotonic() < deadline, "second fence never blocked on the row lock"
                assert thread.is_alive(), f"second fence did not wait: {outcome}"
                time.sleep(0.005)
        assert thread.is_alive(), outcome  # still blocked
        c1.commit()
        thread.join(10)
        assert not thread.is_alive()
        if first == 6:
            err = outcome.get("error")
            assert isinstance(err, StaleToken), outcome
            assert (err.token, err.newest) == (5, 6)
            c2.rollback()
        else:
            assert outcome == {"ok": True}
            c2.commit()
        assert stored_token(fl, table, "res") == 6
    finally:
        for c in (c1, c2):
            c.rollback()
            c.close()
        with admin(dialect, fl.sqlite_path) as a:
            query(a, f"DROP TABLE IF EXISTS {table}")
