"""``Inbox.claim_in`` / ``AsyncInbox.claim_in`` on every dialect and every supported driver.

The processed-marker is written inside the caller's transaction: it commits or rolls back with
the business write, a concurrent duplicate waits on the unique key and then sees False, a
missing table is a SchemaMissing naming install(). Real PostgreSQL, MariaDB, SQLite files.
"""

from __future__ import annotations

import asyncio
import sqlite3
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import ClaimState, FingerprintMismatch, SchemaMissing
from tests.servers import MYSQL_URL, POSTGRES_URL

from ._sqldrivers import FLAVOUR_IDS, FLAVOURS, Aiomysql, Flavour, admin, query, unique


@pytest.fixture(params=FLAVOURS, ids=FLAVOUR_IDS)
def flavour(request: pytest.FixtureRequest, tmp_path: Path) -> Flavour:
    cls: type[Flavour] = request.param
    return cls(tmp_path / "app.db")


def inbox_url(flavour: Flavour) -> str:
    return {
        "postgresql": POSTGRES_URL,
        "mysql": MYSQL_URL,
        "sqlite": f"sqlite:///{flavour.sqlite_path}",
    }[flavour.dialect]


@pytest.fixture
def table(flavour: Flavour) -> Iterator[str]:
    """A fresh inbox table (installed through the inbox's own connection) and an accounts
    table for the effect; both dropped afterwards."""
    name = unique("jf_inbox")
    inbox = jobfence.Inbox(inbox_url(flavour), table=name)
    inbox.install()
    inbox.install()  # idempotent
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"CREATE TABLE {name}_acc (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
        query(a, f"INSERT INTO {name}_acc (id, balance) VALUES (1, 0)")
    yield name
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"DROP TABLE IF EXISTS {name}_acc")
    inbox.drop()
    inbox.close()


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


async def claim_in(flavour: Flavour, table: str, conn: Any, key: str, **kw: Any) -> bool:
    url = inbox_url(flavour)
    if flavour.is_async:
        ainbox = jobfence.AsyncInbox(url, table=table)
        try:
            return await ainbox.claim_in(conn, key, **kw)
        finally:
            await ainbox.close()
    inbox = jobfence.Inbox(url, table=table)
    try:
        return inbox.claim_in(conn, key, **kw)
    finally:
        inbox.close()


async def apply(flavour: Flavour, table: str, conn: Any, key: str, amount: int) -> bool:
    """The exactly-once unit: marker + effect in the caller's transaction (not committed)."""
    if await claim_in(flavour, table, conn, key):
        await flavour.execute(
            conn, f"UPDATE {table}_acc SET balance = balance + ? WHERE id = 1", (amount,)
        )
        return True
    return False


def balance(flavour: Flavour, table: str) -> int:
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        return int(query(a, f"SELECT balance FROM {table}_acc WHERE id = 1")[0][0])


async def test_marker_and_effect_commit_together(flavour: Flavour, table: str, conn: Any) -> None:
    assert await apply(flavour, table, conn, "order:1", 10) is True
    await flavour.commit(conn)
    assert balance(flavour, table) == 10
    assert await apply(flavour, table, conn, "order:1", 10) is False  # redelivery
    await flavour.commit(conn)
    assert balance(flavour, table) == 10
    assert await apply(flavour, table, conn, "order:2", 5) is True
    await flavour.commit(conn)
    assert balance(flavour, table) == 15


async def test_rollback_takes_the_marker_with_it(flavour: Flavour, table: str, conn: Any) -> None:
    assert await apply(flavour, table, conn, "order:9", 7) is True
    await flavour.rollback(conn)  # the work failed: neither the effect nor the marker stays
    assert balance(flavour, table) == 0
    assert await apply(flavour, table, conn, "order:9", 7) is True  # the retry applies it
    await flavour.commit(conn)
    assert balance(flavour, table) == 7


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_concurrent_duplicate_waits_on_the_key(
    flavour: Flavour, table: str, conn: Any, outcome: str
) -> None:
    other = await flavour.connect()
    try:
        assert await apply(flavour, table, conn, "dup", 1) is True  # holds the key, uncommitted
        duplicate = asyncio.ensure_future(
            apply(flavour, table, other, "dup", 1)
            if flavour.is_async
            else asyncio.to_thread(asyncio.run, apply(flavour, table, other, "dup", 1))
        )
        await asyncio.sleep(0.3)
        assert not duplicate.done(), "the duplicate must wait for the first transaction"
        if outcome == "commit":
            await flavour.commit(conn)
            assert await asyncio.wait_for(duplicate, 15) is False
        else:
            await flavour.rollback(conn)
            assert await asyncio.wait_for(duplicate, 15) is True  # the key is free again
        await flavour.commit(other)
        assert balance(flavour, table) == 1
    finally:
        await flavour.rollback(other)
        await flavour.close(other)


async def test_missing_table_is_schema_missing_naming_install(flavour: Flavour, conn: Any) -> None:
    with pytest.raises(SchemaMissing) as info:
        await claim_in(flavour, unique("jf_absent"), conn, "k")
    assert "install()" in str(info.value)
    assert info.value.__cause__ is not None


async def test_fingerprint_mismatch(flavour: Flavour, table: str, conn: Any) -> None:
    assert await claim_in(flavour, table, conn, "pay", fingerprint="A") is True
    await flavour.commit(conn)
    assert await claim_in(flavour, table, conn, "pay", fingerprint="A") is False
    with pytest.raises(FingerprintMismatch):
        await claim_in(flavour, table, conn, "pay", fingerprint="B")


async def test_claim_then_claim_in_applies_once(flavour: Flavour, table: str, conn: Any) -> None:
    """A worker that holds claim() on the key still applies its effect with claim_in, once."""
    inbox = jobfence.Inbox(inbox_url(flavour), table=table)
    try:
        claim = inbox.claim("job", ttl=60)
        assert claim.state is ClaimState.NEW
        assert await apply(flavour, table, conn, "job", 3) is True
        await flavour.commit(conn)
        assert await apply(flavour, table, conn, "job", 3) is False
        await flavour.commit(conn)
        claim.complete("ok")
        assert inbox.claim("job").result == "ok"
        assert balance(flavour, table) == 3
    finally:
        inbox.close()


def test_claim_in_is_one_statement_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    inbox = jobfence.Inbox(f"sqlite:///{path}", table="one")
    inbox.install()
    conn = sqlite3.connect(path)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    assert inbox.claim_in(conn, "k") is True
    assert inbox.claim_in(conn, "k") is False
    conn.commit()
    conn.set_trace_callback(None)
    sent = [s for s in statements if not s.startswith(("BEGIN", "COMMIT"))]
    assert len(sent) == 2 and all(s.startswith("INSERT") for s in sent), sent
    conn.close()
    inbox.close()


def test_claim_in_is_one_statement_on_mysql() -> None:
    import pymysql

    name = unique("jf_inbox")
    inbox = jobfence.Inbox(MYSQL_URL, table=name)
    inbox.install()
    with admin("mysql") as a:
        conn = pymysql.connect(host=a.host, port=a.port, user=a.user, database="test")
    try:

        def questions() -> int:
            with conn.cursor() as cur:
                cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
                return int(cur.fetchone()[1])

        before = questions()
        assert inbox.claim_in(conn, "k") is True
        after = questions()
        assert after - before == 2  # the claim_in INSERT and the SHOW itself
        conn.commit()
    finally:
        conn.close()
        inbox.drop()
        inbox.close()


async def test_a_duplicate_claim_in_raises_no_driver_warning(
    flavour: Flavour, table: str, conn: Any
) -> None:
    """A duplicate is claim_in's everyday answer: the caller sees no warning for it."""
    assert await claim_in(flavour, table, conn, "dup-quiet")
    await flavour.commit(conn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not await claim_in(flavour, table, conn, "dup-quiet")


async def _show_warnings_sent(conn: Any) -> int:
    cur = await conn.cursor()
    await cur.execute("SHOW SESSION STATUS LIKE 'Com_show_warnings'")
    row = await cur.fetchone()
    await cur.close()
    return int(row["Value"] if isinstance(row, dict) else row[1])


async def test_a_duplicate_claim_in_on_aiomysql_sends_no_show_warnings(tmp_path: Path) -> None:
    """aiomysql answers a statement's server warning with ``SHOW WARNINGS``, one more round
    trip inside the caller's transaction: claim_in's ``INSERT IGNORE`` of a key already
    applied gets one ("Duplicate entry"), and jobfence does not fetch it."""
    flavour = Aiomysql(tmp_path / "unused.db")
    name = unique("jf_inbox")
    inbox = jobfence.AsyncInbox(MYSQL_URL, table=name)
    await inbox.install()
    conn = await flavour.connect()
    try:
        assert await inbox.claim_in(conn, "k")
        await flavour.commit(conn)
        before = await _show_warnings_sent(conn)
        assert not await inbox.claim_in(conn, "k")
        assert await _show_warnings_sent(conn) == before
    finally:
        await flavour.rollback(conn)
        await flavour.close(conn)
        await inbox.drop()
        await inbox.close()


async def test_concurrent_claim_ins_leave_the_warning_filters_as_they_were(tmp_path: Path) -> None:
    """Two claim_in of one key at once, one waiting for the other's commit. A
    ``warnings.catch_warnings`` around each statement would let them restore the process's
    warning filters out of order, leaving the first one's filter installed for good. On
    aiomysql, whose cursor would also raise the duplicate's server warning."""
    flavour = Aiomysql(tmp_path / "unused.db")
    table = unique("jf_inbox")
    setup = jobfence.Inbox(inbox_url(flavour), table=table)
    setup.install()
    first, second = await flavour.connect(), await flavour.connect()
    before = list(warnings.filters)

    async def take_and_commit(conn: Any) -> bool:
        # each commits: whichever takes the key first lets the other one go on
        taken = await claim_in(flavour, table, conn, "both")
        await flavour.commit(conn)
        return taken

    try:
        results = await asyncio.gather(take_and_commit(first), take_and_commit(second))
        assert sorted(results) == [False, True]
        assert warnings.filters == before
    finally:
        warnings.filters[:] = before
        for c in (first, second):
            await flavour.rollback(c)
            await flavour.close(c)
        setup.drop()
        setup.close()
