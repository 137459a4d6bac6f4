# Generated from backends/sqlite/outbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``sqlite:///path`` outbox backend: on aiosqlite in ``outbox_async.py``, on sqlite3 in
``outbox.py`` (generated from it).

The relay's side of the outbox table (rows are added by ``Outbox.add`` on the caller's own
connection, inside the caller's transaction). Every verb is one statement of
``sql/outbox.sql`` in autocommit mode on a WAL file; the claim is one ``UPDATE ...
RETURNING`` inside ``BEGIN IMMEDIATE``: SQLite runs writers one at a time, so every claim
sees the claims committed before it, across threads and processes on this host. Time is
SQLite's clock (the host's), in seconds since the epoch. Each verb runs whole through
``run_on`` (``connect_async.py``): in ``AsyncOutbox``, one hop to aiosqlite's thread.

Waking: :meth:`wait` reads ``PRAGMA data_version`` on a connection of its own every
``WAIT_TICK`` seconds; the number changes when another connection commits a change to the
file -- an ``Outbox.add`` of any process, once its transaction commits (not when it rolls
back).

URL / keyword options: ``table`` (default ``jobfence_outbox``), ``busy_timeout`` seconds
(default 30), ``pool_size`` (idle connections kept for reuse, default 2).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..._core import forks
from ..._core.clock import get_clock
from ..._core.options import option_seconds
from ..._core.pool import ConnPool
from ..._core.sqlconn import is_undefined_table
from ..._core.url import BackendURL
from ..._core.validate import check_schema_version
from .._sql.outbox_rows import (
    DEFAULT_OUTBOX_TABLE,
    OUTBOX_SCHEMA_VERSION,
    entry_from_row,
    outbox_table,
    row_from_db,
    seq_list,
    stats_from_row,
)
from ..base import OutboxBackend, OutboxCapabilities, OutboxEntry, OutboxRow, OutboxStats
from .common import sqlite_path
from .connect import (
    count_rows,
    fetch_all,
    open_wal,
    run_in_transaction,
    run_on,
    write_gate,
)
from .dialect import DIALECT

__all__ = ["WAIT_TICK", "SQLiteOutboxBackend"]

OPTIONS = ("table", "busy_timeout", "pool_size")
DEFAULT_POOL_SIZE = 2
DEFAULT_BUSY_TIMEOUT = 30.0
#: how often a waiting :meth:`AsyncSQLiteOutboxBackend.wait` reads ``PRAGMA data_version``
#: (seconds): one cheap pragma on an open connection; an idle relay measured 1.6 % of a core
#: at 5 ms (0.26 % at 50 ms), and a row committed waits at most this long for the relay
WAIT_TICK = 0.005


def _data_version(raw: sqlite3.Connection) -> int:
    return int(raw.execute("PRAGMA data_version").fetchone()[0])


def _claim_in(raw: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[Any]:
    return fetch_all(raw, sql, params)


class SQLiteOutboxBackend(OutboxBackend):
    """One outbox table in a SQLite file. See the module docstring."""

    kind = "sqlite"
    capabilities = OutboxCapabilities(server_wakeup=True)

    def __init__(
        self, url: BackendURL, *, table: str = DEFAULT_OUTBOX_TABLE, **options: Any
    ) -> None:
        merged = {**url.options, **options}
        self.table = outbox_table(
            url,
            table,
            merged,
            backend="sqlite",
            limit=DIALECT.outbox_table_limit,
            allowed=OPTIONS,
        )
        self.path = sqlite_path(url)
        #: the real path of the file: the key of its write gate
        self._real_path = os.path.realpath(self.path)
        self.busy_timeout = option_seconds(
            merged.get("busy_timeout", DEFAULT_BUSY_TIMEOUT), "busy_timeout", 0.0, 3600.0
        )
        self._sql = DIALECT.outbox_queries(self.table)
        self._installed = False
        self._pool = ConnPool.configured(
            self._connect, self._close, options, url.options, DEFAULT_POOL_SIZE
        )
        self._closed = False
        self._reset_waiting()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r} table={self.table!r}>"

    def _reset_waiting(self) -> None:
        #: the connection :meth:`wait` reads ``data_version`` on, and the last number read
        self._watch: sqlite3.Connection | None = None
        self._version: int | None = None

    def _connect(self) -> sqlite3.Connection:
        return open_wal(self.path, self.busy_timeout)

    @staticmethod
    def _close(conn: sqlite3.Connection) -> None:
        conn.close()

    def _rows(self, section: str, params: dict[str, Any]) -> list[Any]:
        """Run the statement of ``section`` and read its rows; create the table on first
        use."""
        rows: list[Any] = self._call(fetch_all, self._sql[section], params)
        return rows

    def _count(self, section: str, params: dict[str, Any]) -> int:
        """Run the statement of ``section``; the number of rows it changed."""
        return max(int(self._call(count_rows, self._sql[section], params)), 0)

    def _call(self, fn: Any, *args: Any, transaction: bool = False) -> Any:
        for attempt in range(2):
            try:
                with write_gate(self._real_path), self._pool.connection() as conn:
                    if transaction:
                        return run_in_transaction(conn, fn, *args)
                    return run_on(conn, fn, *args)
            except sqlite3.OperationalError as exc:
                if attempt or not is_undefined_table(exc):
                    raise
            self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- schema --------------------------------------------------------------------------
    def install(self) -> None:
        """Create the table, its indexes and its schema row (idempotent; also done on first
        use), then check the schema version."""
        with write_gate(self._real_path), self._pool.connection() as conn:
            rows = run_in_transaction(conn, self._install_in)
        check_schema_version(
            rows[0] if rows else None,
            OUTBOX_SCHEMA_VERSION,
            backend=self.kind,
            tables=f"outbox table {self.table} in {self.path!r}",
        )
        self._installed = True

    def _install_in(self, raw: sqlite3.Connection) -> list[Any]:
        for statement in self._sql.statements("schema"):
            raw.execute(statement)
        return fetch_all(raw, self._sql["schema_version"], {})

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

    # -- the relay's verbs ---------------------------------------------------------------
    def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        """ONE ``UPDATE ... RETURNING`` in a ``BEGIN IMMEDIATE`` transaction."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        if self._version is None:
            # note the file's version before the first look, so that the relay's first
            # wait() also sees the rows committed after this claim
            self._note_version()
        params = {
            "relay": relay,
            "limit": int(limit),
            "lease": float(lease),
            "every": queues is None,
            "queues": json.dumps([] if queues is None else list(queues)),
        }
        rows = self._call(_claim_in, self._sql["claim"], params, transaction=True)
        return sorted((row_from_db(row) for row in rows), key=lambda row: row.seq)

    def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        section = "published_delete" if retention <= 0 else "published"
        return self._count(section, {"relay": relay, "seqs": json.dumps(numbers)})

    def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        params = {
            "relay": relay,
            "seq": int(seq),
            "error": str(error).encode("utf-8", "backslashreplace").decode("utf-8"),
            "retry_in": None if retry_in is None else max(0.0, float(retry_in)),
        }
        return self._count("failed", params) == 1

    def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        params = {
            "relay": relay,
            "seqs": json.dumps(numbers),
            "retry_in": max(0.0, float(retry_in)),
        }
        return self._count("release", params)

    def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        params = {"relay": relay, "seqs": json.dumps(numbers), "lease": float(lease)}
        return self._count("extend", params)

    # -- waiting -------------------------------------------------------------------------
    def wait(self, timeout: float) -> bool:
        """Until another connection commits a change to the file -- True -- or ``timeout``
        seconds pass -- False: ``PRAGMA data_version`` read every ``WAIT_TICK`` seconds on a
        connection of its own. A change committed since the previous call (or since the
        first claim) returns at once."""
        clock = get_clock()
        deadline = clock.monotonic() + max(0.0, timeout)
        while not self._closed:
            seen = self._version
            version = self._note_version()
            if seen is not None and version != seen:
                return True
            left = deadline - clock.monotonic()
            if left <= 0:
                return False
            clock.sleep(min(WAIT_TICK, left))
        return False

    def _note_version(self) -> int:
        """Read ``PRAGMA data_version`` on the waiting connection (opened on first use) and
        keep it as the last number seen."""
        if self._watch is None:
            self._watch = self._connect()
        self._version = version = run_on(self._watch, _data_version)
        return version

    # -- admin views ---------------------------------------------------------------------
    def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]:
        params = {
            "state": state,
            "queue": queue,
            "after": 0 if after is None else int(after),
            "limit": int(limit),
        }
        rows = self._rows("entries", params)
        return [entry_from_row(row, order=tuple) for row in rows]

    def stats(self) -> OutboxStats:
        rows = self._rows("stats", {})
        return stats_from_row(rows[0])

    def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        if ids is not None and not ids:
            return 0
        params = {"every": ids is None, "ids": json.dumps([] if ids is None else list(ids))}
        return self._count("retry_dead", params)

    def purge(self, retention: float) -> int:
        return self._count("purge", {"retention": max(0.0, float(retention))})

    # -- life ----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections and the
        waiting connection inherited from the parent (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
        forks.keep(self._watch)
        self._reset_waiting()
