"""claim_in and friends at their edges (found in review; each test fails without its fix)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence.testing import set_hook
from tests.servers import MYSQL_URL, POSTGRES_URL


def _table() -> str:
    return "edge_" + uuid.uuid4().hex[:10]


def _mysql() -> Any:
    return pymysql.connect(host="127.0.0.1", port=3306, user="root", database="test")


@pytest.fixture(params=["postgresql", "mysql", "sqlite"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[jobfence.Inbox, Any]]:
    table = _table()
    if request.param == "postgresql":
        inbox = jobfence.Inbox(POSTGRES_URL, table=table)
        conn: Any = psycopg.connect(POSTGRES_URL)
    elif request.param == "mysql":
        inbox = jobfence.Inbox(MYSQL_URL, table=table)
        conn = _mysql()
    else:
        path = tmp_path / "e.db"
        inbox = jobfence.Inbox(f"sqlite:///{path}", table=table)
        conn = sqlite3.connect(path)
    inbox.install()
    try:
        yield inbox, conn
    finally:
        conn.close()
        inbox.backend.drop()
        inbox.close()


def test_claim_in_sees_a_key_completed_through_claim_as_applied(
    setup: tuple[jobfence.Inbox, Any],
) -> None:
    inbox, conn = setup
    claim = inbox.claim("order:1", ttl=60)
    claim.complete({"charged": True})
    assert inbox.claim_in(conn, "order:1") is False  # already done: do not run the effect
    conn.commit()


def test_claim_in_marks_a_key_held_by_claim(setup: tuple[jobfence.Inbox, Any]) -> None:
    inbox, conn = setup
    claim = inbox.claim("order:2", ttl=60)
    assert inbox.claim_in(conn, "order:2") is True  # the holder applies the effect once
    conn.commit()
    assert inbox.claim_in(conn, "order:2") is False
    conn.commit()
    claim.complete("ok")


def test_mysql_fingerprint_mismatch_is_seen_through_an_older_snapshot() -> None:
    """Under REPEATABLE READ, transaction B's snapshot predates A's marker; B must still see
    the mismatch (a locking read), not report "already applied"."""
    table = _table()
    inbox = jobfence.Inbox(MYSQL_URL, table=table)
    inbox.install()
    a, b = _mysql(), _mysql()
    try:
        with b.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute(f"SELECT COUNT(*) FROM {table}")  # B's snapshot starts here
        assert inbox.claim_in(a, "msg:1", fingerprint="fpA") is True
        a.commit()
        with pytest.raises(jobfence.FingerprintMismatch):
            inbox.claim_in(b, "msg:1", fingerprint="fpB")
        b.rollback()
    finally:
        a.close()
        b.close()
        inbox.backend.drop()
        inbox.close()


def test_a_failed_release_can_be_retried() -> None:
    inbox = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
    claim = inbox.claim("job:1", ttl=60)
    failing = [True]

    def hook(point: str, **info: Any) -> None:
        if point == "inbox.release" and failing:
            failing.clear()
            raise ConnectionError("blip")

    old = set_hook(hook)
    try:
        with pytest.raises(jobfence.BackendError):
            claim.release()
    finally:
        set_hook(old)
    assert claim.release() is True  # still ours: the first release never reached the store
    assert inbox.claim("job:1", ttl=60).state is jobfence.ClaimState.NEW


def test_a_client_side_psycopg_error_is_not_transient() -> None:
    """Too many parameters: OperationalError without SQLSTATE on a healthy connection. A
    retry cannot fix it."""
    with psycopg.connect(POSTGRES_URL) as conn:
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1 WHERE 1 IN (" + ",".join(["%s"] * 70000) + ")", [1] * 70000)
        assert not jobfence.is_transient(info.value)
        assert not jobfence.is_conflict(info.value)
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)


async def test_asyncpg_versioned_update_with_a_column_named_returning() -> None:
    import asyncpg

    table = _table()
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(
            f'CREATE TABLE {table} (id int primary key, "returning" int, version int)'
        )
        await conn.execute(f"INSERT INTO {table} VALUES (1, 5, 1)")
        async with conn.transaction():
            new = await jobfence.versioned_update_async(
                conn, table, {"id": 1}, version=1, values={"returning": 6}
            )
        assert new == 2
        assert await conn.fetchval(f'SELECT "returning" FROM {table}') == 6
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()
