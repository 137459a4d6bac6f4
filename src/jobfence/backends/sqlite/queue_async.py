"""``sqlite:///path`` -- the embedded queue backend: on aiosqlite in ``queue_async.py``, on
sqlite3 in ``queue.py`` (generated from it).

Messages are rows of one table (``jobfence_queue`` by default) shared by every queue name in
the file, so every process on this host that opens the file shares the queues. The SQL, and
the life of a row, are in ``sql/queue.sql``.

* Every verb is ONE statement in autocommit mode -- a receive is one ``UPDATE ... RETURNING``
  that picks and delivers the messages, an ack one owner-checked ``DELETE``, a renewal of
  many deliveries one ``UPDATE ... FROM json_each(...)`` -- except a publish, whose inserts run
  in one ``BEGIN IMMEDIATE`` transaction. SQLite runs writers one at a time, so each is atomic
  across threads and processes. The file runs in WAL mode with a busy timeout: concurrent
  processes queue for the write lock instead of failing (``database is locked`` after the
  timeout propagates). Each verb's statements run as one plain function over a sqlite3
  connection, whole, through ``run_on`` (``connect_async.py``): in ``AsyncQueue``, one hop to
  aiosqlite's thread per verb.
* A delivery's handle (its receipt) is ``"<seq>.<token>"``: the row and a random token drawn
  for that delivery, so an old delivery's ack / nack / renewal / dead_letter never touches a
  newer delivery of the same message.
* Time: deadlines (delays, visibility) are measured by one clock only, SQLite's
  ``julianday('now')`` on this host.
* Waiting (``receive(wait > 0)``): SQLite cannot notify other processes. A publish (or a nack
  without delay, or a requeue) in the SAME process wakes a waiting receive at once (a
  process-wide registry per file, table and queue name, shared by the sync and async
  clients). Publishes from other processes are found by polling: a read-only probe of one
  index entry (no write lock), with a backoff from 2 ms doubling up to ``poll_interval``
  (0.1 s by default), never sleeping past the moment the next delayed or in-flight message
  becomes deliverable.

URL / keyword options (keywords win): ``table`` (default ``jobfence_queue``), ``busy_timeout``
(seconds, default 30), ``synchronous`` (``full`` default; ``normal`` trades the durability of
the last transactions on power loss for speed), ``poll_interval`` (seconds, default 0.1: the
longest pause between two polls of an idle waiting receive).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiosqlite

from ..._core import acompat, forks
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.options import option_seconds, reject_unknown
from ..._core.sqlconn import is_undefined_table
from ..._core.sqlfiles import Queries, load_sql
from ..._core.url import BackendURL
from ..._core.validate import check_namespace, check_queue_name, check_schema_version
from ...errors import ConfigurationError
from ..base import (
    AsyncQueueBackend,
    DeadLetter,
    QueueCapabilities,
    QueuedMessage,
    QueueStats,
    RenewItem,
)
from .common import WAITERS, sqlite_path
from .connect_async import (
    count_rows,
    fetch_all,
    open_wal,
    rollback_quietly,
    run_in_transaction,
    run_on,
    write_gate,
)
from .dialect import DIALECT, TABLE_LIMIT

if ASYNC:
    import asyncio
    import sqlite3

__all__ = ["AsyncSQLiteQueueBackend"]

SCHEMA_VERSION = 1
DEFAULT_TABLE = "jobfence_queue"
DEFAULT_BUSY_TIMEOUT = 30.0
DEFAULT_POLL_INTERVAL = 0.1
#: the first pause of a waiting receive that found nothing; it doubles up to poll_interval
POLL_START = 0.002
#: added to a pause that ends when a message becomes due (SQLite's clock has ms resolution)
_DUE_MARGIN = 0.001
OPTIONS = ("table", "busy_timeout", "synchronous", "poll_interval")
_SYNCHRONOUS = ("off", "normal", "full", "extra")

P = ParamSpec("P")
T = TypeVar("T")


def _parse_receipt(receipt: str) -> tuple[int, str] | None:
    """``(seq, token)`` of a receipt ``"<seq>.<token>"``; ``None`` if it is not one."""
    seq, dot, token = receipt.partition(".")
    if not dot or not token or not seq.isascii() or not seq.isdigit():
        return None
    return int(seq), token


def _headers(text: Any) -> dict[str, str]:
    value = json.loads(text)
    return {str(k): str(v) for k, v in value.items()}


class AsyncSQLiteQueueBackend(AsyncQueueBackend):
    """One named queue in a SQLite file, shared by every process on this host that opens it.

    The connection is opened lazily on first use (the constructor needs no event loop) and
    guarded by a lock, so one backend serves a consumer's receive loop, its handlers' acks and
    its renewer; a waiting receive holds the lock only while it polls, never while it sleeps.
    """

    kind = "sqlite"
    capabilities = QueueCapabilities(cross_process=True, visibility_timeout=True)

    def __init__(self, url: BackendURL, *, name: str, **options: Any) -> None:
        self.name = check_queue_name(name)
        self.path = sqlite_path(url)
        merged: dict[str, Any] = {**url.options, **options}
        reject_unknown(merged, OPTIONS, "sqlite queue")
        self.table = check_namespace(
            merged.get("table", DEFAULT_TABLE),
            limit=TABLE_LIMIT,
            backend="sqlite",
            argument="table",
        )
        self.busy_timeout = option_seconds(
            merged.get("busy_timeout", DEFAULT_BUSY_TIMEOUT), "busy_timeout", 0.0, 3600.0
        )
        synchronous = str(merged.get("synchronous", "full")).lower()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}",
                argument="synchronous",
            )
        self.synchronous = synchronous
        self.poll_interval = option_seconds(
            merged.get("poll_interval", DEFAULT_POLL_INTERVAL), "poll_interval", 0.001, 60.0
        )
        self.queries: Queries = load_sql(
            DIALECT.package, "queue.sql", names={"table": self.table}, quote=DIALECT.quote
        )
        #: the in-process wake-up key: the same queue through any client in this process
        self._wake_key = ("queue", os.path.realpath(self.path), self.table, self.name)
        self._conn: aiosqlite.Connection | None = None
        #: the real path of the file: the key of its write gate
        self._real_path = os.path.realpath(self.path)
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r} table={self.table!r} name={self.name!r}>"

    # -- connection ----------------------------------------------------------------------
    async def _connection(self) -> aiosqlite.Connection:
        """The open connection (call with the write gate held); opens it and the schema once."""
        if self._conn is not None:
            if self._conn.in_transaction:  # an interrupted operation left one open
                await run_on(self._conn, rollback_quietly)
            return self._conn
        if self._closed:
            raise ConfigurationError("this sqlite queue backend is closed", argument="self")
        self._conn = await open_wal(self.path, self.busy_timeout, self.synchronous, self._create)
        return self._conn

    def _create(self, raw: sqlite3.Connection) -> None:
        """Create the table (idempotent) and check its schema version."""
        try:
            raw.executescript("BEGIN IMMEDIATE;\n" + self.queries["schema"] + ";\nCOMMIT;")
        except BaseException:
            rollback_quietly(raw)
            raise
        row = raw.execute(self.queries["schema_version"]).fetchall()
        check_schema_version(
            row[0] if row else None,
            SCHEMA_VERSION,
            backend=self.kind,
            tables=f"queue table {self.table} in {self.path!r}",
        )

    async def _run_locked(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(raw, *args, **kwargs)`` through :func:`run_on` on the connection (the write gate
        held). The table is created again if it is gone (``drop()`` drops it once no queue of
        the file has a message left), and ``fn`` run again."""
        conn = await self._connection()
        try:
            return await run_on(conn, fn, *args, **kwargs)
        except aiosqlite.OperationalError as exc:
            if not is_undefined_table(exc):
                raise
        await run_on(conn, self._create)
        return await run_on(conn, fn, *args, **kwargs)

    async def _fetch(self, sql: str, params: dict[str, Any]) -> list[Any]:
        """Run one statement and fetch all its rows (table re-created if gone)."""
        async with write_gate(self._real_path):
            return await self._run_locked(fetch_all, sql, params)

    async def _count(self, sql: str, params: dict[str, Any]) -> int:
        """Run one writing statement; the number of rows it changed (table re-created if
        gone)."""
        async with write_gate(self._real_path):
            return await self._run_locked(count_rows, sql, params)

    async def install(self) -> None:
        """Create the table now (it is also created on first use)."""
        async with write_gate(self._real_path):
            await self._connection()

    # -- in-process wake-ups -------------------------------------------------------------
    def _listen(self) -> tuple[acompat.Event, Callable[[], None], int]:
        """A fresh event, registered to be set by the next publish in this process: the event,
        the callback that sets it and the registry's ticket. Keep the callback referenced
        while the ticket is in use: the ticket is its ``id()``, which a collected callback
        would free for another waiter's."""
        event = acompat.Event()
        if ASYNC:
            loop = asyncio.get_running_loop()

            def wake() -> None:
                loop.call_soon_threadsafe(event.set)

        else:
            wake = event.set
        return event, wake, WAITERS.add(self._wake_key, wake)

    def _wake(self, count: int) -> None:
        """Wake up to ``count`` receives of this queue waiting in this process."""
        for _ in range(min(count, WAITERS.count(self._wake_key))):
            WAITERS.notify(self._wake_key)

    # -- the verbs -----------------------------------------------------------------------
    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        """Insert the messages in ONE transaction, then wake receives waiting in this
        process: one per message (a delayed batch: one, which learns when it is due)."""
        if not messages:
            return
        delay = max(0.0, float(delay))
        rows = [
            {
                "queue": self.name,
                "id": message_id,
                "body": body,
                "headers": json.dumps(headers, separators=(",", ":")) if headers else "{}",
                "delay": delay,
            }
            for message_id, body, headers in messages
        ]
        async with write_gate(self._real_path):
            conn = await self._connection()
            try:
                await run_in_transaction(conn, self._publish_in, rows)
            except aiosqlite.OperationalError as exc:
                if not is_undefined_table(exc):  # else: dropped (see drop()), create it again
                    raise
                await run_on(conn, self._create)
                await run_in_transaction(conn, self._publish_in, rows)
        self._wake(len(rows) if delay <= 0 else 1)

    def _publish_in(self, raw: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
        raw.executemany(self.queries["publish"], rows)

    async def _poll(
        self, consumer: str, max_messages: int, visibility: float
    ) -> tuple[list[QueuedMessage], float | None]:
        """One look: deliver what is deliverable now. Returns the messages, and when there
        were none the seconds until the next one becomes deliverable (``None``: unknown, or
        the queue holds none)."""
        params = {
            "queue": self.name,
            "consumer": consumer,
            "visibility": float(visibility),
            "limit": int(max_messages),
        }
        async with write_gate(self._real_path):
            rows, due_in = await self._run_locked(self._poll_in, params)
        if due_in is not None:
            return [], due_in
        if not rows:  # another consumer took them between the look and the take
            return [], None
        rows.sort(key=lambda row: int(row[0]))  # publish order
        return [
            QueuedMessage(
                id=str(message_id),
                body=bytes(body),
                headers=_headers(headers),
                delivery=int(delivery),
                receipt=f"{int(seq)}.{token}",
                published_at=None if published_at is None else float(published_at),
                last_error=None if last_error is None else str(last_error),
            )
            for seq, message_id, body, headers, delivery, token, published_at, last_error in rows
        ], None

    def _poll_in(
        self, raw: sqlite3.Connection, params: dict[str, Any]
    ) -> tuple[list[Any], float | None]:
        """The statements of :meth:`_poll`, each in autocommit mode: (the rows taken, ``None``)
        when something was due, else (``[]``, seconds until the next one is due or ``None``)."""
        # a read first: an idle poll never takes the write lock
        rows = fetch_all(raw, self.queries["due"], {"queue": params["queue"]})
        due_in = None if not rows or rows[0][0] is None else float(rows[0][0])
        if due_in is None or due_in > 0:
            return [], due_in
        return fetch_all(raw, self.queries["take"], params), None

    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        """Deliver up to ``max_messages`` messages; with ``wait``, poll until one comes
        (woken at once by a publish in this process) or ``wait`` seconds pass."""
        if wait <= 0:
            messages, _ = await self._poll(consumer, max_messages, visibility)
            return messages
        clock = get_clock()
        deadline = clock.monotonic() + wait
        event, _callback, ticket = self._listen()  # before the first look: no publish goes unseen
        try:
            pause = min(POLL_START, self.poll_interval)
            while True:
                messages, due_in = await self._poll(consumer, max_messages, visibility)
                if messages:
                    if event.is_set():  # a wake-up that came while we looked: pass it on
                        self._wake(1)
                    return messages
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    return []
                sleep = min(pause, remaining)
                if due_in is not None:  # never past the moment the next one is due
                    sleep = min(sleep, max(due_in, 0.0) + _DUE_MARGIN)
                if await clock.wait_async(event, sleep):
                    WAITERS.remove(self._wake_key, ticket)  # (the wake-up removed it already)
                    event, _callback, ticket = self._listen()
                    pause = min(POLL_START, self.poll_interval)
                else:
                    pause = min(pause * 2, self.poll_interval)
        finally:
            WAITERS.remove(self._wake_key, ticket)

    def _owned(self, receipt: str, consumer: str) -> dict[str, Any] | None:
        """The owner-check parameters of a delivery; ``None`` for a malformed receipt."""
        parsed = _parse_receipt(receipt)
        if parsed is None:
            return None
        seq, token = parsed
        return {"queue": self.name, "seq": seq, "receipt": token, "consumer": consumer}

    async def ack(self, receipt: str, consumer: str) -> bool:
        """Delete the message if this delivery is still ``consumer``'s current one (also
        after its visibility passed, as long as nobody received it since)."""
        params = self._owned(receipt, consumer)
        if params is None:
            return False
        return await self._count(self.queries["ack"], params) == 1

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """Ack every delivery of ``items`` in ONE statement; one bool per item (an item named
        twice is True once)."""
        parsed = [_parse_receipt(receipt) for receipt, _consumer in items]
        batch = [
            [found[0], found[1], consumer]
            for found, (_receipt, consumer) in zip(parsed, items, strict=True)
            if found is not None
        ]
        acked: set[tuple[int, str, str]] = set()
        if batch:
            rows = await self._fetch(
                self.queries["ack_many"], {"queue": self.name, "items": json.dumps(batch)}
            )
            acked = {(int(seq), str(token), str(consumer)) for seq, token, consumer in rows}
        out: list[bool] = []
        for found, (_receipt, consumer) in zip(parsed, items, strict=True):
            key = None if found is None else (found[0], found[1], consumer)
            out.append(key is not None and key in acked)
            acked.discard(key)  # type: ignore[arg-type]  # an item named twice is acked once
        return out

    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        params = self._owned(receipt, consumer)
        if params is None:
            return False
        delay = max(0.0, float(delay))
        done = await self._count(self.queries["nack"], {**params, "delay": delay, "error": error})
        if done == 1 and delay <= 0:
            self._wake(1)
        return done == 1

    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """As :meth:`nack`, without counting this delivery and keeping ``last_error``."""
        params = self._owned(receipt, consumer)
        if params is None:
            return False
        delay = max(0.0, float(delay))
        done = await self._count(self.queries["defer"], {**params, "delay": delay})
        if done == 1 and delay <= 0:
            self._wake(1)
        return done == 1

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew every delivery of ``items`` in ONE statement; one bool per item."""
        parsed = [_parse_receipt(receipt) for receipt, _consumer, _visibility in items]
        batch = [
            [found[0], found[1], consumer, float(visibility)]
            for found, (_receipt, consumer, visibility) in zip(parsed, items, strict=True)
            if found is not None
        ]
        renewed: set[tuple[int, str, str]] = set()
        if batch:
            rows = await self._fetch(
                self.queries["renew"], {"queue": self.name, "items": json.dumps(batch)}
            )
            renewed = {(int(seq), str(token), str(consumer)) for seq, token, consumer in rows}
        return [
            found is not None and (found[0], found[1], consumer) in renewed
            for found, (_receipt, consumer, _visibility) in zip(parsed, items, strict=True)
        ]

    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        params = self._owned(receipt, consumer)
        if params is None:
            return False
        return await self._count(self.queries["dead_letter"], {**params, "error": error}) == 1

    async def stats(self) -> QueueStats:
        rows = await self._fetch(self.queries["stats"], {"queue": self.name})
        ready, delayed, in_flight, dead = (int(n) for n in rows[0])
        return QueueStats(ready=ready, delayed=delayed, in_flight=in_flight, dead=dead)

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        rows = await self._fetch(
            self.queries["dead_letters"], {"queue": self.name, "limit": int(limit)}
        )
        return [
            DeadLetter(
                id=str(message_id),
                body=bytes(body),
                headers=_headers(headers),
                deliveries=int(delivery),
                error=None if error is None else str(error),
                dead_at=None if dead_at is None else float(dead_at),
            )
            for message_id, body, headers, delivery, error, dead_at in rows
        ]

    async def names(self, limit: int) -> list[str]:
        rows = await self._fetch(self.queries["names"], {"limit": int(limit)})
        return [str(row[0]) for row in rows]

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        """Make dead letters deliverable again (delivery count reset); wakes as many waiting
        receives in this process."""
        if ids is None:
            count = await self._count(self.queries["requeue_dead"], {"queue": self.name})
        else:
            wanted = list(dict.fromkeys(ids))
            if not wanted:
                return 0
            count = await self._count(
                self.queries["requeue_dead_ids"], {"queue": self.name, "ids": json.dumps(wanted)}
            )
        self._wake(count)
        return count

    async def purge(self) -> int:
        return await self._count(self.queries["purge"], {"queue": self.name})

    async def drop(self) -> None:
        """Delete every message of the queue; drop the table too once no queue of the file
        has a message left in it (one transaction: a concurrent publish either lands before,
        and keeps the table, or after, and creates it again)."""
        async with write_gate(self._real_path):
            conn = await self._connection()
            try:
                await run_in_transaction(conn, self._drop_in)
            except BaseException as exc:
                if not is_undefined_table(exc):  # dropped already
                    raise

    def _drop_in(self, raw: sqlite3.Connection) -> None:
        q = self.queries
        count_rows(raw, q["purge"], {"queue": self.name})
        if not fetch_all(raw, q["any_left"], {}):
            for statement in q.statements("drop"):
                raw.execute(statement)

    async def close(self) -> None:
        """Close the connection; idempotent. Deliveries not acked come back after their
        visibility."""
        async with write_gate(self._real_path):
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connection inherited from
        the parent, without closing it (see ``jobfence/_core/forks.py``)."""
        forks.keep(self._conn)
        self._conn = None
