"""The MySQL/MariaDB inbox and outbox on aiomysql install a table that already exists without
``SHOW WARNINGS``: the server's "already exists" note is neither fetched (one more round trip)
nor raised as a Python ``Warning`` that a process-wide ``warnings.catch_warnings()`` around an
``await`` would have to hide (another task or thread can restore the filters meanwhile)."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.integration._sqldrivers import FLAVOURS, Aiomysql
from tests.servers import MYSQL_URL


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


async def _show_warnings_sent(backend: Any) -> int:
    """``SHOW WARNINGS`` sent so far on the backend's one pooled connection (pool_size=1:
    the connection its statements ran on)."""
    async with backend._pool.connection() as conn:
        cur = await conn.cursor()
        await cur.execute("SHOW SESSION STATUS LIKE 'Com_show_warnings'")
        row = await cur.fetchone()
        await cur.close()
    return int(row[1])


@pytest.mark.parametrize("part", ["inbox", "outbox"])
async def test_installing_an_existing_table_on_aiomysql_sends_no_show_warnings(part: str) -> None:
    table = _name(f"jf_{part}")
    made: Any
    if part == "inbox":
        made = jobfence.AsyncInbox(MYSQL_URL, table=table, pool_size=1)
    else:
        made = jobfence.AsyncOutbox(MYSQL_URL, table=table, pool_size=1)
    try:
        await made.install()  # creates the table
        before = warnings.filters[:]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            await made.install()  # CREATE TABLE IF NOT EXISTS: "already exists" notes
            await made.backend.install()
        assert [str(w.message) for w in seen] == []
        assert warnings.filters == before
        assert await _show_warnings_sent(made.backend) == 0
    finally:
        await made.drop()
        await made.close()


async def test_concurrent_outbox_installs_on_aiomysql_connections_leave_the_filters_alone(
    tmp_path: Path,
) -> None:
    """``outbox.install(conn)`` on a caller's aiomysql connection: no warning comes (its
    statements use a cursor that fetches none), so nothing saves and restores the process's
    warning filters around the awaits, which two interleaved calls would restore out of
    order, leaving one call's filter installed for good."""
    flavour = Aiomysql(tmp_path / "unused.db")
    table = _name("jf_outbox")
    outbox = jobfence.AsyncOutbox(MYSQL_URL, table=table)
    conns = [await flavour.connect(), await flavour.connect()]
    for conn in conns:  # each statement commits: the two calls do not wait for each other
        await conn.autocommit(True)
    before = warnings.filters[:]
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            inside = warnings.filters[:]
            await asyncio.gather(*(outbox.install(conn) for conn in conns))
            await asyncio.gather(*(outbox.install(conn) for conn in conns))  # tables exist
            assert warnings.filters == inside
        assert [str(w.message) for w in seen] == []
        assert warnings.filters == before
    finally:
        for conn in conns:
            await flavour.rollback(conn)
            await flavour.close(conn)
        await outbox.drop()
        await outbox.close()


@pytest.mark.parametrize("fid", ["aiomysql", "sa-aiomysql-conn", "sa-aiomysql-session"])
async def test_outbox_install_on_an_existing_table_raises_no_warning(
    fid: str, tmp_path: Path
) -> None:
    """The second ``install(conn)`` finds the table there: the server's note does not reach
    the caller as a warning, whichever asyncio MySQL connection it is (SQLAlchemy's aiomysql
    adapter raises it; jobfence filters it out for that call)."""
    flavour = next(f for f in FLAVOURS if f.id == fid)(tmp_path / "unused.db")
    outbox = jobfence.AsyncOutbox(MYSQL_URL, table=_name("jf_outbox"))
    conn = await flavour.connect()
    try:
        await outbox.install(conn)
        await flavour.commit(conn)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await outbox.install(conn)
        await flavour.commit(conn)
    finally:
        await flavour.rollback(conn)
        await flavour.close(conn)
        await outbox.drop()
        await outbox.close()
