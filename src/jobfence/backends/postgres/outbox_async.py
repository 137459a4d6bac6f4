"""``postgresql://`` outbox backend on psycopg 3: its asyncio connection in
``outbox_async.py``, the blocking one in ``outbox.py`` (generated from it).

The relay's side of the outbox table (rows are added by ``Outbox.add`` on the caller's own
connection, inside the caller's transaction). Every verb is one statement of
``sql/outbox.sql`` on an autocommit connection of the backend's pool, except the claim: one
short transaction that takes the table's advisory lock (``pg_advisory_xact_lock`` of a 64-bit
hash of the table's name) and then runs the claiming ``UPDATE ... RETURNING`` as a fresh
statement, so that it sees every claim committed before it: two relays never hold one row,
and never split one key's run.

Waking: ``Outbox.add`` notifies the channel named like the table in its own statement
(delivered when the caller's transaction commits); :meth:`wait` LISTENs on it through a
dedicated connection (opened by the first ``wait``), the queue's listener.

The table is created on first use (or by ``install()``) by one ``DO`` block under an advisory
lock, with a schema-version row in ``jobfence_outbox_schema``.

URL / keyword options: ``table`` (default ``jobfence_outbox``; an SQL identifier of at most 53
characters, lower-cased), ``pool_size`` (idle connections kept for reuse, default 4),
``connect_timeout`` and ``timeout`` (seconds, default 5 each: opening a connection, and one
statement's reply; a statement past its deadline has its connection closed, never reused).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from ..._core import acompat, forks
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.options import TIMEOUT_OPTIONS, option_timeouts
from ..._core.pool_async import AsyncConnPool
from ..._core.source_async import AsyncSource, open_source
from ..._core.url import BackendURL
from ..._core.validate import check_schema_version
from .._sql.outbox_rows import (
    DEFAULT_OUTBOX_TABLE,
    OUTBOX_SCHEMA_VERSION,
    entry_from_row,
    lock_key,
    outbox_table,
    row_from_db,
    seq_list,
    stats_from_row,
)
from ..base import AsyncOutboxBackend, OutboxCapabilities, OutboxEntry, OutboxRow, OutboxStats
from .common import (
    connect_kwargs,
    execute_bounded_async,
    libpq_uri,
    refuse_connect_options,
    reusable,
)
from .connect_async import connect
from .dialect import DIALECT
from .listen_async import AsyncListener

if ASYNC:
    import asyncio

__all__ = ["AsyncPostgresOutboxBackend"]

OPTIONS = ("table", "pool_size", *TIMEOUT_OPTIONS)
DEFAULT_POOL_SIZE = 4


def _error_text(error: str) -> str:
    """An error message as ``text`` can store it (no NUL, no lone surrogate)."""
    return error.replace("\0", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


class AsyncPostgresOutboxBackend(AsyncListener, AsyncOutboxBackend):
    """One outbox table on PostgreSQL. See the module docstring."""

    kind = "postgres"
    capabilities = OutboxCapabilities(server_wakeup=True)

    _listener_label = ("postgres outbox", "relays poll")

    def __init__(
        self,
        url: BackendURL,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        client: Any = None,
        **options: Any,
    ) -> None:
        #: the caller's pool, engine or connection factory, if one was passed in
        self._source: AsyncSource | None = None
        if client is not None:
            refuse_connect_options(options, "postgres outbox")
            self._source = open_source(client, DIALECT, "postgres outbox")
        self.table = DIALECT.outbox_table(
            outbox_table(
                url,
                table,
                options,
                backend="postgres",
                limit=DIALECT.outbox_table_limit,
                allowed=OPTIONS,
            )
        )
        self.url = url
        self.timeouts = option_timeouts(options, url.options)
        self._connect_kwargs = connect_kwargs(url.options, self.timeouts)
        self._conninfo = libpq_uri(url, *OPTIONS)
        self._sql = DIALECT.outbox_queries(self.table, style="psycopg")
        self._lock = lock_key(self.table)
        self._installed = False
        source = self._source
        self._pool = AsyncConnPool.configured(
            self._connect,
            self._drop,
            options,
            url.options,
            DEFAULT_POOL_SIZE,
            reusable,
            put=source.put if source is not None and source.pooled else None,
        )
        self._closed = False
        self._reset_waiting()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url.masked} table={self.table!r}>"

    def _reset_waiting(self) -> None:
        """No listener, no waiter (in the constructor; in a child process after a fork)."""
        self._waiters: set[acompat.Event] = set()
        self._mutex = threading.Lock()  # guards _waiters and _noted (never held across I/O)
        #: a notification arrived since the last wait() returned
        self._noted = False
        #: the LISTEN connection was lost: rows committed until it is back are announced to
        #: nobody, so the wait() that opens it again returns True (look at the table now)
        self._relisten = False
        self._reset_listener()

    @property
    def _listen_sql(self) -> str:
        return str(self._sql["listen"])

    # -- connections and statements ------------------------------------------------------
    async def _connect(self) -> Any:
        return await connect(self.url, self._conninfo, self._connect_kwargs, source=self._source)

    async def _drop(self, conn: Any) -> None:
        if self._source is not None:  # one of the caller's: back to its pool, to be replaced
            await self._source.discard(conn)
            return
        try:
            await conn.close()
        except Exception:  # already broken: nothing left to close
            pass

    async def _execute(
        self, conn: Any, sql: str, params: dict[str, Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One statement within the ``timeout``; past it the connection is closed."""
        return await execute_bounded_async(conn, sql, params, limit=self.timeouts.request)

    async def _run(
        self, section: str, params: dict[str, Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """The statement of ``section`` on a pooled connection: (rows, rowcount). A missing
        table (first use, or dropped meanwhile) is created and the statement run again. A
        connection found broken by the statement (an idle pooled one the server closed: a
        restart, a failover) is replaced and the statement run once more on a new one: else
        the first ``published`` after a restart would fail, and its rows be sent again
        after their lease. Every verb run here may run twice (each is guarded by the row's
        state and holder)."""
        sql = self._sql[section]
        installed = reconnected = False
        while True:
            conn = None
            try:
                async with self._pool.connection() as conn:
                    return await self._execute(conn, sql, params)
            except psycopg.errors.UndefinedTable:
                if installed:
                    raise
                installed = True
                await self.install()
            except psycopg.OperationalError:
                if reconnected or conn is None or not conn.broken:
                    raise
                reconnected = True

    # -- schema --------------------------------------------------------------------------
    async def install(self) -> None:
        """Create the table, its indexes and its schema row (idempotent; also done on first
        use), then check the schema version."""
        async with self._pool.connection() as conn:
            try:
                await self._execute(conn, self._sql["schema"])
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                # created at the same instant by a component without the advisory lock
                await self._execute(conn, self._sql["schema"])
            rows, _ = await self._execute(conn, self._sql["schema_version"])
        check_schema_version(
            rows[0] if rows else None,
            OUTBOX_SCHEMA_VERSION,
            backend=self.kind,
            tables=f"outbox table {self.table}",
        )
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

    # -- the relay's verbs ---------------------------------------------------------------
    async def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        """The advisory lock of the table, then the claiming statement, in ONE transaction.
        The first claim also starts the LISTEN connection of :meth:`wait`."""
        if limit <= 0 or (queues is not None and not queues):
            return []
        if not self._listening():
            # LISTEN before the first look, so that the relay's first wait() also hears of
            # the rows committed after this claim
            await self._ensure_listener()
            if self._listening():
                self._relisten = False  # this claim looks after the LISTEN
        params = {
            "lock": self._lock,
            "idle_ms": str(max(1, int(self.timeouts.request * 1000))),
            "relay": relay,
            "limit": int(limit),
            "lease": float(lease),
            "every": queues is None,
            "queues": [] if queues is None else list(queues),
        }
        for attempt in range(2):
            try:
                # BEGIN and COMMIT are statements of their own under the timeout too (not
                # psycopg's transaction block, whose BEGIN/COMMIT wait for as long as a
                # stalled link hangs); a claim that fails leaves its connection inside the
                # transaction: the pool closes it, which rolls the claim back
                async with self._pool.connection() as conn:
                    await self._execute(conn, "BEGIN")
                    await self._execute(conn, self._sql["claim_lock"], params)
                    rows, _ = await self._execute(conn, self._sql["claim"], params)
                    await self._execute(conn, "COMMIT")
                break
            except psycopg.errors.UndefinedTable:
                if attempt:
                    raise
            await self.install()
        return sorted((row_from_db(row) for row in rows), key=lambda row: row.seq)

    async def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        section = "published_delete" if retention <= 0 else "published"
        _, count = await self._run(section, {"relay": relay, "seqs": numbers})
        return max(count, 0)

    async def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        params = {
            "relay": relay,
            "seq": int(seq),
            "error": _error_text(str(error)),
            "retry_in": None if retry_in is None else max(0.0, float(retry_in)),
        }
        _, count = await self._run("failed", params)
        return count == 1

    async def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        params = {"relay": relay, "seqs": numbers, "retry_in": max(0.0, float(retry_in))}
        _, count = await self._run("release", params)
        return max(count, 0)

    async def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        numbers = seq_list(seqs)
        if not numbers:
            return 0
        _, count = await self._run(
            "extend", {"relay": relay, "seqs": numbers, "lease": float(lease)}
        )
        return max(count, 0)

    # -- waiting -------------------------------------------------------------------------
    async def wait(self, timeout: float) -> bool:
        """Until a transaction that added rows (or revived dead ones) commits -- True -- or
        ``timeout`` seconds pass -- False. The LISTEN connection is opened by the first call;
        a notification that arrived since the previous call returns at once. While the
        listener is down, this sleeps ``timeout`` (the relay polls); the call that opens it
        again after it was lost returns True at once, since the rows committed meanwhile
        were announced to nobody."""
        await self._ensure_listener()
        event = acompat.Event()
        with self._mutex:
            if self._relisten and self._listening():
                self._relisten = False  # kept until the LISTEN connection is back
                self._noted = False
                return True
            if self._noted:
                self._noted = False
                return True
            self._waiters.add(event)
        woken = False
        try:
            clock = get_clock()
            if self._listening():
                woken = await clock.wait_async(event, max(0.0, timeout))
            else:
                await clock.asleep(max(0.0, timeout))
                woken = False
        finally:
            with self._mutex:
                self._waiters.discard(event)
                if woken:
                    self._noted = False
        return bool(woken) and not self._closed

    def _wake(self, payload: str | None) -> None:
        """A notification arrived (``None``: the listener stopped or the backend closes): wake
        every waiting :meth:`wait`, or the next one."""
        with self._mutex:
            self._noted = True
            if payload is None:  # the listener stopped: see _relisten
                self._relisten = True
            events = list(self._waiters)
        for event in events:
            event.set()

    # -- admin views ---------------------------------------------------------------------
    async def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]:
        params = {
            "state": state,
            "queue": queue,
            "after": 0 if after is None else int(after),
            "limit": int(limit),
        }
        rows, _ = await self._run("entries", params)
        return [entry_from_row(row, order=tuple) for row in rows]

    async def stats(self) -> OutboxStats:
        rows, _ = await self._run("stats")
        return stats_from_row(rows[0])

    async def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        if ids is not None and not ids:
            return 0
        params = {"every": ids is None, "ids": [] if ids is None else list(ids)}
        rows, _ = await self._run("retry_dead", params)
        return int(rows[0][0])

    async def purge(self, retention: float) -> int:
        _, count = await self._run("purge", {"retention": max(0.0, float(retention))})
        return max(count, 0)

    # -- life ----------------------------------------------------------------------------
    async def close(self) -> None:
        """Close every connection (the LISTEN one too); idempotent. A waiting :meth:`wait`
        returns False."""
        if self._closed:
            return
        self._closed = True
        self._wake(None)
        if ASYNC:
            task = self._listener
            if isinstance(task, asyncio.Task) and acompat.worker_alive(task):
                task.cancel()
                try:
                    await task
                except BaseException:  # cancelled, or it already failed: it is finished now
                    pass
        else:
            acompat.join(self._listener, 0.5 + self.timeouts.request)
        await self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections and the
        listener inherited from the parent, without closing anything (see
        ``jobfence/_core/forks.py``); the child opens its own on first use."""
        self._pool.after_fork()
        forks.keep(self._listener, self._listener_conn)
        self._reset_waiting()
