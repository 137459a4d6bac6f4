"""``postgresql://`` inbox backend on psycopg 3: its asyncio connection in ``inbox_async.py``,
the blocking one in ``inbox.py`` (generated from it).

Every verb is one statement from ``sql/inbox.sql`` on an autocommit connection: the claim is a
single ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE expired RETURNING``: one round trip
decides it and, when the key was taken, reports it; a duplicate reads the blocking record with
a second statement (``peek``; duplicates are the rare path). The table is created on first use
(or by ``install()``) by one ``DO`` block that takes an advisory lock first, so that many
processes starting at once do not race on ``CREATE TABLE``.

URL / keyword options: ``table`` (default ``jobfence_inbox``), ``pool_size`` (idle connections
kept for reuse, default 8; ``max_idle`` is its deprecated former name), ``connect_timeout`` and
``timeout`` (seconds, default 5 each: opening a connection, and one statement's reply; a
statement past its deadline has its connection closed, never reused; see ``common.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from ..._core.inbox_support import DEFAULT_TABLE, as_utc, inbox_table
from ..._core.options import TIMEOUT_OPTIONS, option_timeouts
from ..._core.pool_async import AsyncConnPool
from ..._core.source_async import AsyncSource, open_source
from ..._core.sqlconn import is_old_schema
from ..._core.url import BackendURL
from .._sql.inbox_async import AsyncSQLInboxBackend
from ..base import (
    ClaimInfo,
    ClaimItem,
    ClaimRecord,
    CompleteItem,
    InboxCapabilities,
    RenewItem,
    info_from_row,
    record_from_row,
)
from .common import (
    connect_kwargs,
    execute_bounded_async,
    libpq_uri,
    pg_text,
    pg_text_prefix,
    pg_untext,
    refuse_connect_options,
    reusable,
)
from .connect_async import connect
from .dialect import DIALECT, TABLE_LIMIT

__all__ = ["AsyncPostgresInboxBackend"]

_OPTIONS = ("table", "pool_size", "max_idle", *TIMEOUT_OPTIONS)
DEFAULT_POOL_SIZE = 8
#: a batch statement that another transaction's locks made fail as a whole
_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def _record(row: Sequence[Any]) -> ClaimRecord:
    return record_from_row(row, as_utc)


class AsyncPostgresInboxBackend(AsyncSQLInboxBackend):
    kind = "postgres"
    capabilities = InboxCapabilities(cross_process=True, transactional=True)

    def __init__(
        self, url: BackendURL, *, table: str = DEFAULT_TABLE, client: Any = None, **options: Any
    ) -> None:
        #: the caller's pool, engine or connection factory, if one was passed in
        self._source: AsyncSource | None = None
        if client is not None:
            refuse_connect_options(options, "postgres inbox")
            self._source = open_source(client, DIALECT, "postgres inbox")
        self.table = inbox_table(
            url, table, options, backend="postgres", limit=TABLE_LIMIT, extra=TIMEOUT_OPTIONS
        )
        self.timeouts = option_timeouts(options, url.options)
        self._connect_kwargs = connect_kwargs(url.options, self.timeouts)
        self.url = url
        self._conninfo = libpq_uri(url, *_OPTIONS)
        self._sql = DIALECT.inbox_queries(self.table, style="psycopg")
        self._installed = False
        source = self._source
        self._pool = AsyncConnPool.configured(
            self._connect,
            self._close,
            options,
            url.options,
            DEFAULT_POOL_SIZE,
            reusable,
            put=source.put if source is not None and source.pooled else None,
        )

    async def _connect(self) -> Any:
        return await connect(self.url, self._conninfo, self._connect_kwargs, source=self._source)

    async def _execute(self, conn: Any, sql: str, params: Any = None) -> tuple[list[Any], int]:
        """One statement within the ``timeout``; past it the connection is closed."""
        return await execute_bounded_async(conn, sql, params, limit=self.timeouts.request)

    async def _close(self, conn: Any) -> None:
        if self._source is not None:  # one of the caller's: back to its pool, to be replaced
            await self._source.discard(conn)
            return
        await conn.close()

    _record = staticmethod(_record)

    def _db_key(self, key: str) -> str:
        return DIALECT.db_key(key)

    def _key_from_db(self, stored: Any) -> str:
        return pg_untext(str(stored))

    def _prefix_params(self, prefix: str) -> dict[str, Any]:
        return {
            # a prefix that text cannot hold (or that starts with the escape mark) can only
            # begin escaped keys: then both conditions look for those
            "prefix": prefix if pg_text(prefix) == prefix else pg_text_prefix(prefix),
            "escaped": pg_text_prefix(prefix),
            "mark": pg_text_prefix(""),
        }

    def _info(self, key: str, row: Sequence[Any]) -> ClaimInfo:
        return info_from_row(key, row, as_utc)

    async def _run(self, name: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""
        sql = self._sql[name]
        for _ in range(2):
            try:
                async with self._pool.connection() as conn:
                    return await self._execute(conn, sql, params)
            except psycopg.Error as exc:
                if self._installed or not is_old_schema(exc):
                    raise
                await self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    batches = True

    async def claim_many(self, items: Sequence[ClaimItem]) -> list[ClaimRecord]:
        """Claim a batch with ONE statement (``claim_many``), plus one ``peek_many`` for the
        keys it did not take (duplicates). A batch that deadlocks with another transaction
        (a caller's ``claim_in`` holding one of its keys while it waits for another) is
        claimed key by key instead."""
        if not items:
            return []
        keys = [self._db_key(key) for key, _, _, _ in items]
        params = {
            "keys": keys,
            "owners": [owner for _, owner, _, _ in items],
            "fingerprints": [fp for _, _, fp, _ in items],
            "ttls": [float(ttl) for _, _, _, ttl in items],
        }
        try:
            rows, _ = await self._run("claim_many", params)
        except _CONFLICTS:
            return [await self.claim(*item) for item in items]
        found = {row[0]: _record(row[1:]) for row in rows}
        blocked = [key for key in keys if key not in found]
        if blocked:
            rows, _ = await self._run("peek_many", {"keys": blocked})
            found.update((row[0], _record(row[1:])) for row in rows)
        records = []
        for key, item in zip(keys, items, strict=True):
            record = found.get(key)
            # purged between the two statements: claim it again
            records.append(record if record is not None else await self.claim(*item))
        return records

    async def complete_many(self, items: Sequence[CompleteItem], retention: float) -> list[bool]:
        """Complete a batch with ONE statement (``complete_many``), owner-checked per key."""
        if not items:
            return []
        keys = [self._db_key(key) for key, _, _ in items]
        params = {
            "keys": keys,
            "owners": [owner for _, owner, _ in items],
            "results": [data for _, _, data in items],
            "retention": retention,
        }
        try:
            rows, _ = await self._run("complete_many", params)
        except _CONFLICTS:
            return [await self.complete(key, owner, data, retention) for key, owner, data in items]
        stored = {row[0] for row in rows}
        return [key in stored for key in keys]

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every claim of ``items`` with ONE statement (one round trip)."""
        if not items:
            return []
        params = {
            "keys": [self._db_key(key) for key, _, _ in items],
            "owners": [owner for _, owner, _ in items],
            "ttls": [float(ttl) for _, _, ttl in items],
        }
        rows, _ = await self._run("renew", params)
        return [bool(row[1]) for row in rows]

    async def install(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            for statement in self._sql.statements("schema"):
                await self._execute(conn, statement)
        self._installed = True

    async def drop(self) -> None:
        """Drop the table and its schema row (tests, uninstall)."""
        async with self._pool.connection() as conn:
            for statement in self._sql.statements("drop"):
                try:
                    await self._execute(conn, statement)
                except psycopg.errors.UndefinedTable:
                    pass
        self._installed = False

    async def close(self) -> None:
        await self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections
        inherited from the parent (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
