"""``postgresql://`` inbox backend on psycopg 3 (async source of ``postgres.py``).

Every verb is one statement from ``sql/postgres_inbox.sql`` on an autocommit connection: the
claim is a single ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE expired RETURNING``: one
round trip decides it and, when the key was taken, reports it; a duplicate reads the blocking
record with a second statement (``peek``; duplicates are the rare path). The
table is created on first use (or by ``install()``) by one ``DO`` block that takes an advisory
lock first, so that many processes starting at once do not race on ``CREATE TABLE``.

URL options: ``table`` (default ``jobfence_inbox``), ``max_idle`` (pooled idle connections).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ..._core.inbox_support import DEFAULT_TABLE, as_utc, check_table
from ..._core.options import option_int, reject_unknown
from ..._core.pool_async import AsyncConnPool
from ..._core.sqlconn import is_undefined_table
from ..._core.sqlqueries import load_queries, to_format
from ..._core.url import BackendURL
from ..base import AsyncSQLInboxBackend, ClaimRecord, InboxCapabilities, record_from_row
from .common import pg_text

__all__ = ["AsyncPostgresInboxBackend"]

_OPTIONS = ("table", "max_idle")


def _record(row: Sequence[Any]) -> ClaimRecord:
    return record_from_row(row, as_utc)


class AsyncPostgresInboxBackend(AsyncSQLInboxBackend):
    kind = "postgres"
    capabilities = InboxCapabilities(cross_process=True, transactional=True)

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        reject_unknown(options, ("retention", "max_idle"), "postgresql inbox")
        self.table = check_table(url.options.get("table", table))
        self._conninfo = url.without_options(*_OPTIONS)
        if self._conninfo.startswith("postgres://"):
            self._conninfo = "postgresql://" + self._conninfo[len("postgres://") :]
        self._sql = {
            name: tuple(to_format(s) for s in stmts)
            for name, stmts in load_queries("postgresql", self.table).items()
        }
        self._installed = False
        self._pool = AsyncConnPool(
            self._connect,
            self._close,
            max_idle=option_int(
                options.get("max_idle", url.options.get("max_idle", 8)), "max_idle", 0, 1000
            ),
        )

    async def _connect(self) -> Any:
        return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)

    @staticmethod
    async def _close(conn: Any) -> None:
        await conn.close()

    async def _run(self, name: str, params: Sequence[Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""
        (sql,) = self._sql[name]
        for _ in range(2):
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(sql, params)
                    rows = await cur.fetchall() if cur.description else []
                    return rows, cur.rowcount
            except psycopg.Error as exc:
                if self._installed or not is_undefined_table(exc):
                    raise
                await self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    async def install(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            for statement in self._sql["schema"]:
                await conn.execute(statement)
        self._installed = True

    def _db_key(self, key: str) -> str:
        return pg_text(key)  # text cannot hold NUL

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        key = self._db_key(key)
        while True:
            rows, _ = await self._run("claim", (key, owner, fingerprint, ttl))
            if not rows:  # a duplicate: read the record that stopped us
                rows, _ = await self._run("peek", (key,))
            if rows:
                return _record(rows[0])
            # purged between the two statements: claim again

    async def drop(self) -> None:
        """Drop the table and its schema row (tests, uninstall)."""
        async with self._pool.connection() as conn:
            for statement in self._sql["drop"]:
                try:
                    await conn.execute(statement)
                except psycopg.errors.UndefinedTable:
                    pass
        self._installed = False

    async def close(self) -> None:
        await self._pool.close()
