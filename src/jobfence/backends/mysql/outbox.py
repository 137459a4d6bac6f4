# Generated from backends/mysql/outbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``mysql://`` / ``mariadb://`` outbox backend: on aiomysql in ``outbox_async.py``, on
PyMySQL in ``outbox.py`` (generated from it).

The relay's side of the outbox table (rows are added by ``Outbox.add`` on the caller's own
connection, inside the caller's transaction). Every verb is one statement of
``sql/outbox.sql`` on an autocommit connection, except the claim. MySQL has no ``UPDATE ...
RETURNING``, so a claim runs on one connection: ``GET_LOCK`` on a name made from the
database and the table (claims of one table run one at a time), a plain read of the rows to
claim (under autocommit each statement sees every claim committed before it), the ``UPDATE``
that holds them (each only while still claimable), a read of the rows held only when the
``UPDATE`` held fewer than it was given, and ``RELEASE_LOCK``. A connection that fails
mid-way is closed, which releases the lock. Time is the server's clock
(``UTC_TIMESTAMP(6)``). The table is created on first use or by ``install()``.

MySQL has no wake-up for the relay: :meth:`wait` is the interface's sleep, and the relay
polls.

URL / keyword options: ``table`` (default ``jobfence_outbox``), ``pool_size`` (idle
connections kept for reuse, default 4), ``connect_timeout`` and ``timeout`` (seconds, default
5 each: opening a connection, and one request's reply; a connection whose request timed out
is closed, never reused).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from pymysql.constants import CLIENT

from ..._core.options import TIMEOUT_OPTIONS, option_timeouts, request_timed_out
from ..._core.pool import ConnPool
from ..._core.source import Source, open_source
from ..._core.sqlconn import is_undefined_table
from ..._core.url import BackendURL
from ..._core.validate import check_schema_version
from ...errors import ConfigurationError
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
from .common import STYLE, is_disconnect, is_timeout, own_cursor
from .connect import connect
from .dialect import DIALECT

__all__ = ["MySQLOutboxBackend"]

T = TypeVar("T")

OPTIONS = ("table", "pool_size", *TIMEOUT_OPTIONS)
DEFAULT_POOL_SIZE = 4
#: the server's times leave it as microseconds since the epoch
_MICRO = 1_000_000.0
#: the client flags every outbox connection needs: rowcount = matched rows
_NEEDED_FLAGS = CLIENT.FOUND_ROWS


def _micros(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))


def _entry_order(row: Sequence[Any]) -> Sequence[Any]:
    """The ``entries`` row (times first, then claimed_by) in the order of the other servers."""
    (seq, id_, queue, key, state, attempts, created, available, until, published, by) = row[:11]
    return (
        seq,
        id_,
        queue,
        key,
        state,
        attempts,
        created,
        available,
        by,
        until,
        published,
        *row[11:],
    )


class MySQLOutboxBackend(OutboxBackend):
    """One outbox table on MySQL or MariaDB. See the module docstring."""

    kind = "mysql"
    capabilities = OutboxCapabilities(server_wakeup=False)

    def __init__(
        self,
        url: BackendURL,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        client: Any = None,
        **options: Any,
    ) -> None:
        #: a caller's SQLAlchemy engine, whose pool lends the connections
        self._source: Source | None = None
        if client is not None:
            if "connect_timeout" in options:
                raise ConfigurationError(
                    "option 'connect_timeout' configures the connections the mysql outbox "
                    "opens; with a client passed in, configure its connections instead",
                    argument="connect_timeout",
                )
            self._source = open_source(client, DIALECT, "mysql outbox")
        self.table = outbox_table(
            url,
            table,
            options,
            backend="mysql",
            limit=DIALECT.outbox_table_limit,
            allowed=OPTIONS,
        )
        self.url = url
        self.timeouts = option_timeouts(options, url.options)
        self._params: dict[str, Any] = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "root",
            "password": url.password or "",
            "charset": "utf8mb4",
            "autocommit": True,
            "client_flag": CLIENT.FOUND_ROWS,
            "connect_timeout": self.timeouts.connect,
        }
        self._database = url.path.lstrip("/") or None
        self._sql = DIALECT.outbox_queries(self.table, style=STYLE)
        self._installed = False
        source = self._source
        self._pool = ConnPool.configured(
            self._connect,
            self._close,
            options,
            url.options,
            DEFAULT_POOL_SIZE,
            put=source.put if source is not None else None,
            loop_bound=True,  # an aiomysql connection works on the loop that opened it only
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url.masked} table={self.table!r}>"

    # -- connections and statements ------------------------------------------------------
    def _connect(self) -> Any:
        if self._source is not None:
            conn = self._source.get()
            flags: int = getattr(conn, "client_flag", 0) or getattr(conn, "_client_flag", 0)
            if flags & _NEEDED_FLAGS != _NEEDED_FLAGS:
                self._source.put(conn)
                raise ConfigurationError(
                    "the mysql outbox counts matched rows: create the engine with "
                    "connect_args={'client_flag': CLIENT.FOUND_ROWS} "
                    "(from pymysql.constants import CLIENT)",
                    argument="url",
                )
            return conn
        return connect(
            self._params,
            self._database,
            connect_timeout=self.timeouts.connect,
            timeout=self.timeouts.request,
        )

    def _close(self, conn: Any) -> None:
        if self._source is not None:  # one of the caller's: back to its pool, to be replaced
            self._source.discard(conn)
            return
        conn.close()

    def _statement(self, section: str, seqs: Sequence[int] = ()) -> str:
        """The statement of ``section``, its ``{seqs}`` slot filled with ``seqs`` (ints)."""
        sql = self._sql[section]
        if "{seqs}" in sql:
            sql = sql.replace("{seqs}", ", ".join(str(int(seq)) for seq in seqs))
        return sql

    def _bounded(self, request: Callable[[], T]) -> T:
        """One request within the ``timeout`` (PyMySQL: its read and write timeouts; aiomysql:
        a deadline around it). A timed-out request raises ``TimeoutError``; its connection is
        closed by the pool (it closes a connection that saw an error)."""
        try:
            return request()
        except Exception as exc:
            if is_timeout(exc):
                raise request_timed_out(self.timeouts.request) from exc
            raise

    @staticmethod
    def _request(cur: Any, sql: str, params: Mapping[str, Any] | None) -> tuple[list[Any], int]:
        cur.execute(sql, params)
        count = cur.rowcount
        rows = list(cur.fetchall()) if cur.description else []
        return rows, count

    def _on(
        self, cur: Any, sql: str, params: Mapping[str, Any] | None = None
    ) -> tuple[list[Any], int]:
        return self._bounded(partial(self._request, cur, sql, params))

    def _run(
        self, section: str, params: Mapping[str, Any], seqs: Sequence[int] = ()
    ) -> tuple[list[Any], int]:
        """The statement of ``section`` on a pooled connection: (rows, rowcount). A missing
        table (first use, or dropped meanwhile) is created and the statement run again. A
        connection found gone by the statement (an idle pooled one the server closed: a
        restart, a failover, its wait_timeout) is dropped and the statement run once more
        on a new one: else the first ``published`` after a restart would fail, and its rows
        be sent again after their lease. Every verb run here may run twice (each is guarded
        by the row's state and holder)."""
        sql = self._statement(section, seqs)
        installed = reconnected = False
        while True:
            try:
                with self._pool.connection() as conn, conn.cursor() as cur:
                    return self._on(cur, sql, params)
            except Exception as exc:
                if is_undefined_table(exc) and not installed:
                    installed = True
                    self.install()
                elif is_disconnect(exc) and not reconnected:
                    reconnected = True
                else:
                    raise

    # -- schema --------------------------------------------------------------------------
    def install(self) -> None:
        """Create the table and its schema row (idempotent; also done on first use), then
        check the schema version."""
        # own_cursor: no SHOW WARNINGS for the server's "table already exists" notes
        with self._pool.connection() as conn, own_cursor(conn) as cur:
            for statement in self._sql.statements("schema"):
                self._on(cur, statement)
            rows, _ = self._on(cur, self._sql["schema_version"])
        check_schema_version(
            rows[0] if rows else None,
            OUTBOX_SCHEMA_VERSION,
            backend=self.kind,
            tables=f"outbox table {self.table}",
        )
        self._installed = True

    def drop(self) -> None:
        """Drop the table and its schema row (tests, uninstall)."""
        with self._pool.connection() as conn, own_cursor(conn) as cur:
            for statement in self._sql.statements("drop"):
                try:
                    self._on(cur, statement)
                except Exception as exc:
                    if not is_undefined_table(exc):
                        raise
        self._installed = False

    # -- the relay's verbs ---------------------------------------------------------------
    def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        """Under the table's ``GET_LOCK``: read the rows to claim, hold them, read back which
        were held (only when some were not), release the lock."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        pick = {
            "limit": int(limit),
            "every": queues is None,
            "queues": json.dumps([] if queues is None else list(queues)),
        }
        for attempt in range(2):
            try:
                with self._pool.connection() as conn, conn.cursor() as cur:
                    return self._claim_on(cur, relay, lease, pick)
            except Exception as exc:
                if attempt or not is_undefined_table(exc):
                    raise
            self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim_on(
        self, cur: Any, relay: str, lease: float, pick: dict[str, Any]
    ) -> list[OutboxRow]:
        wait = max(0.0, self.timeouts.request / 2)
        idle = max(1, math.ceil(self.timeouts.request))
        self._on(cur, self._sql["claim_session"], {"idle": idle})
        try:
            rows, _ = self._on(cur, self._sql["claim_lock"], {"wait": wait})
            if not rows or rows[0][0] != 1:
                raise TimeoutError(
                    f"the claim lock of the outbox table {self.table!r} was held by another "
                    f"relay's claim for {wait:g} s"
                )
            picked, _ = self._on(cur, self._sql["claim_pick"], pick)
            if not picked:
                return []
            seqs = [int(row[0]) for row in picked]
            params = {"relay": relay, "lease_us": _micros(lease)}
            _, held = self._on(cur, self._statement("claim_hold", seqs), params)
            if held != len(seqs):  # some were published meanwhile by a relay past its hold
                read, _ = self._on(cur, self._statement("claim_read", seqs), {"relay": relay})
                kept = {int(row[0]) for row in read}
                picked = [row for row in picked if int(row[0]) in kept]
        finally:
            self._on(cur, self._sql["claim_unlock"])
        return [row_from_db(row, _MICRO) for row in picked]

    def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        section = "published_delete" if retention <= 0 else "published"
        _, count = self._run(section, {"relay": relay}, numbers)
        return max(count, 0)

    def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        params = {
            "relay": relay,
            "seq": int(seq),
            "error": str(error).encode("utf-8", "backslashreplace").decode("utf-8"),
            "dead": retry_in is None,
            "retry_us": 0 if retry_in is None else _micros(retry_in),
        }
        _, count = self._run("failed", params)
        return count == 1

    def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        params = {"relay": relay, "retry_us": _micros(retry_in)}
        _, count = self._run("release", params, numbers)
        return max(count, 0)

    def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        _, count = self._run("extend", {"relay": relay, "lease_us": _micros(lease)}, numbers)
        return max(count, 0)

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
        rows, _ = self._run("entries", params)
        return [entry_from_row(row, _MICRO, order=_entry_order) for row in rows]

    def stats(self) -> OutboxStats:
        rows, _ = self._run("stats", {})
        return stats_from_row(rows[0], _MICRO)

    def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        if ids is not None and not ids:
            return 0
        params = {"every": ids is None, "ids": json.dumps([] if ids is None else list(ids))}
        _, count = self._run("retry_dead", params)
        return max(count, 0)

    def purge(self, retention: float) -> int:
        _, count = self._run("purge", {"retention_us": _micros(retention)})
        return max(count, 0)

    # -- life ----------------------------------------------------------------------------
    def close(self) -> None:
        self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections
        inherited from the parent (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
