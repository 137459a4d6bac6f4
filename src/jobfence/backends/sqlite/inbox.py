# Generated from backends/sqlite/inbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``sqlite:///path`` inbox backend: on aiosqlite in ``inbox_async.py``, on sqlite3 in
``inbox.py`` (generated from it).

Every verb is one statement from ``sql/inbox.sql`` in autocommit mode on a WAL file;
SQLite runs writers one at a time, so the claim's single upsert is atomic across threads and
processes on this host. Time is SQLite's clock (the host's), in epoch seconds. Each verb runs
whole through ``run_on`` (``connect_async.py``): in ``AsyncInbox``, one hop to aiosqlite's
thread per verb.

URL / keyword options: ``table`` (default ``jobfence_inbox``), ``busy_timeout`` seconds (default
30), ``pool_size`` (idle connections kept for reuse, default 4; ``max_idle`` is a deprecated
name for it).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..._core.inbox_support import DEFAULT_TABLE, inbox_table, utc_from_epoch
from ..._core.options import option_seconds, reject_unknown
from ..._core.pool import ConnPool
from ..._core.sqlconn import is_old_schema
from ..._core.url import BackendURL
from .._sql.inbox import SQLInboxBackend
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
from .common import sqlite_path
from .connect import (
    count_rows,
    fetch_all,
    open_wal,
    run_in_transaction,
    run_on,
    write_gate,
)
from .dialect import DIALECT, TABLE_LIMIT

__all__ = ["SQLiteInboxBackend"]

DEFAULT_POOL_SIZE = 4
T = TypeVar("T")


def _record(row: Sequence[Any]) -> ClaimRecord:
    return record_from_row(row, utc_from_epoch)


#: the sections of inbox.sql whose statement returns rows (the others: a row count)
_ROW_SECTIONS = frozenset({"claim", "peek", "claims", "claim_info"})


class SQLiteInboxBackend(SQLInboxBackend):
    kind = "sqlite"
    capabilities = InboxCapabilities(cross_process=True, transactional=True)

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        pooling = ("pool_size", "max_idle")
        reject_unknown(url.options, ("table", "busy_timeout", *pooling), "sqlite inbox URL")
        self.table = inbox_table(
            url, table, options, backend="sqlite", limit=TABLE_LIMIT, extra=("busy_timeout",)
        )
        self.path = sqlite_path(url)
        #: the real path of the file: the key of its write gate
        self._real_path = os.path.realpath(self.path)
        self.busy_timeout = option_seconds(
            options.get("busy_timeout", url.options.get("busy_timeout", 30.0)),
            "busy_timeout",
            0.0,
            3600.0,
        )
        self._sql = DIALECT.inbox_queries(self.table)
        self._installed = False
        self._pool = ConnPool.configured(
            self._connect, self._close, options, url.options, DEFAULT_POOL_SIZE
        )

    def _connect(self) -> Any:
        return open_wal(self.path, self.busy_timeout)

    @staticmethod
    def _close(conn: Any) -> None:
        conn.close()

    _record = staticmethod(_record)

    def _info(self, key: str, row: Sequence[Any]) -> ClaimInfo:
        return info_from_row(key, row, utc_from_epoch)

    def _run(self, name: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use.

        A statement that returns rows is run and read (its row count is not needed and
        reported as -1); the others are run and their cursor closed, for the row count. Either
        is one call (async: one hop to aiosqlite's thread)."""
        sql = self._sql[name]
        for _ in range(2):
            try:
                with write_gate(self._real_path), self._pool.connection() as conn:
                    if name in _ROW_SECTIONS:
                        return run_on(conn, fetch_all, sql, params), -1
                    return [], run_on(conn, count_rows, sql, params)
            except sqlite3.OperationalError as exc:
                if self._installed or not is_old_schema(exc):
                    raise
                self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    def _batch(self, fn: Callable[..., list[T]], *args: Any) -> list[T]:
        """``fn(raw, *args)`` in ONE transaction (one durable commit for a whole batch);
        create the table on first use."""
        for _ in range(2):
            try:
                with write_gate(self._real_path), self._pool.connection() as conn:
                    # a failure rolls back, and closes the connection (the pool discards it)
                    return run_in_transaction(conn, fn, *args)
            except sqlite3.OperationalError as exc:
                if self._installed or not is_old_schema(exc):
                    raise
                self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    batches = True

    def claim_many(self, items: Sequence[ClaimItem]) -> list[ClaimRecord]:
        """Claim a batch in ONE transaction (the ``claim`` statement per key, and ``peek``
        for a key it did not take): one commit for the batch."""
        return self._batch(self._claim_many_in, items) if items else []

    def _claim_many_in(
        self, raw: sqlite3.Connection, items: Sequence[ClaimItem]
    ) -> list[ClaimRecord]:
        claim, peek = self._sql["claim"], self._sql["peek"]
        records = []
        for key, owner, fingerprint, ttl in items:
            params = {"key": key, "owner": owner, "fingerprint": fingerprint, "ttl": ttl}
            rows = fetch_all(raw, claim, params) or fetch_all(raw, peek, {"key": key})
            records.append(_record(rows[0]))  # in one transaction the blocking row is there
        return records

    def complete_many(self, items: Sequence[CompleteItem], retention: float) -> list[bool]:
        """Complete a batch in ONE transaction: one commit for the batch."""
        return self._batch(self._complete_many_in, items, retention) if items else []

    def _complete_many_in(
        self, raw: sqlite3.Connection, items: Sequence[CompleteItem], retention: float
    ) -> list[bool]:
        sql = self._sql["complete"]
        return [
            count_rows(
                raw, sql, {"result": data, "retention": retention, "key": key, "owner": owner}
            )
            == 1
            for key, owner, data in items
        ]

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every claim of ``items`` in ONE transaction (one ``extend`` statement per
        claim); one bool per item."""
        return self._batch(self._renew_in, items) if items else []

    def _renew_in(self, raw: sqlite3.Connection, items: Sequence[RenewItem]) -> list[bool]:
        sql = self._sql["extend"]
        return [
            count_rows(raw, sql, {"key": key, "owner": owner, "ttl": ttl}) == 1
            for key, owner, ttl in items
        ]

    def install(self) -> None:
        with write_gate(self._real_path), self._pool.connection() as conn:
            run_in_transaction(conn, self._install_in)
        self._installed = True

    def _install_in(self, raw: sqlite3.Connection) -> None:
        for statement in self._sql.statements("schema"):
            raw.execute(statement)
        row = fetch_all(raw, self._sql["upgrade_needed"], {})
        if row and row[0][0]:  # a version-1 table: add claimed_at
            raw.execute(self._sql["upgrade"])

    def drop(self) -> None:
        """Drop the table and its schema row (tests, uninstall)."""
        with write_gate(self._real_path), self._pool.connection() as conn:
            run_on(conn, self._drop_in)
        self._installed = False

    def _drop_in(self, raw: sqlite3.Connection) -> None:
        for statement in self._sql.statements("drop"):
            try:
                raw.execute(statement)
            except sqlite3.OperationalError:
                pass

    def close(self) -> None:
        self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections
        inherited from the parent (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
