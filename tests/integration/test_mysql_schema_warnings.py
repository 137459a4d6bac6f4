"""The MySQL/MariaDB inbox and outbox on aiomysql install a table that already exists without
``SHOW WARNINGS``: the server's "already exists" note is neither fetched (one more round trip)
nor raised as a Python ``Warning`` that a process-wide ``warnings.catch_warnings()`` around an
``await`` would have to hide (another task or thread can restore the filters meanwhile)."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest

import jobfence
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
