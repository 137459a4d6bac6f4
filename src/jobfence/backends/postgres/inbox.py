# Generated from backends/postgres/inbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
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
from ..._core.pool import ConnPool
from ..._core.sqlconn import is_undefined_table
from ..._core.sqlqueries import load_queries, to_format
from ..._core.url import BackendURL
from ..base import ClaimRecord, InboxCapabilities, SQLInboxBackend, record_from_row
from .common import pg_text

__all__ = ["PostgresInboxBackend"]

_OPTIONS = ("table", "max_idle")


def _record(row: Sequence[Any]) -> ClaimRecord:
    return record_from_row(row, as_utc)


class PostgresInboxBackend(SQLInboxBackend):
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
        self._pool = ConnPool(
            self._connect,
            self._close,
            max_idle=option_int(
                options.get("max_idle", url.options.get("max_idle", 8)), "max_idle", 0, 1000
            ),
        )

    def _connect(self) -> Any:
        return psycopg.Connection.connect(self._conninfo, autocommit=True)

    @staticmethod
    def _close(conn: Any) -> None:
        conn.close()

    def _run(self, name: str, params: Sequence[Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""
        (sql,) = self._sql[name]
        for _ in range(2):
            try:
                with self._pool.connection() as conn:
                    cur = conn.execute(sql, params)
                    rows = cur.fetchall() if cur.description else []
                    return rows, cur.rowcount
            except psycopg.Error as exc:
                if self._installed or not is_undefined_table(exc):
                    raise
                self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    def install(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            for statement in self._sql["schema"]:
                conn.execute(statement)
        self._installed = True

    def _db_key(self, key: str) -> str:
        return pg_text(key)  # text cannot hold NUL

    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        key = self._db_key(key)
        while True:
            rows, _ = self._run("claim", (key, owner, fingerprint, ttl))
            if not rows:  # a duplicate: read the record that stopped us
                rows, _ = self._run("peek", (key,))
            if rows:
                return _record(rows[0])
            # purged between the two statements: claim again

    def drop(self) -> None:
        """Drop the table and its schema row (tests, uninstall)."""
        with self._pool.connection() as conn:
            for statement in self._sql["drop"]:
                try:
                    conn.execute(statement)
                except psycopg.errors.UndefinedTable:
                    pass
        self._installed = False

    def close(self) -> None:
        self._pool.close()
