"""``postgresql://`` queue backend on psycopg 3: its asyncio connection in ``queue_async.py``,
the blocking one in ``queue.py`` (generated from it).

One table (option ``table``, default ``jobfence_queue``) holds the messages of every queue,
one row per message; the SQL and the table's layout are in ``sql/queue.sql``. Every verb is
ONE statement on an autocommit connection of the client's pool:

* ``publish`` inserts the whole batch from arrays (``unnest``) and notifies the queue's
  channel (:func:`notify_channel`), in the same statement;
* ``receive`` takes the next deliverable rows with ``FOR UPDATE SKIP LOCKED`` and gives each
  a new delivery (delivery + 1, a new random receipt, hidden until now + visibility); a
  delivered row stays ``ready`` with its ``visible_at`` in the future, so that once the
  visibility passes without an ack or a renewal it is delivered again -- also when its
  consumer died. When it finds nothing it reports, in the same round trip, how long until
  the queue's next row becomes deliverable;
* ``ack`` / ``nack`` / ``dead_letter`` / ``renew`` are owner-checked by the delivery's receipt
  and consumer (``renew`` of many receipts is one statement over arrays).

A receipt handed out is ``"<seq>.<token>"``: the row's key and the delivery's random token.

Waiting: a ``receive`` with ``wait > 0`` LISTENs on a dedicated connection of the client
(one per client, opened on the first waiting receive; its task or thread wakes every
waiting receive of the client when a notification for its queue arrives) and sleeps until
such a notification, or until the next row becomes deliverable (a delayed message, a
delivery whose visibility ends), or until its wait is over: an idle consumer sends one
statement per wait, not one per poll interval. Without notifications (``notify=false``, for
PgBouncer in transaction pooling mode, or while the LISTEN connection is down) it looks
again every ``POLL_INTERVAL`` seconds.

The table is created on first use (or by ``install()``) by one ``DO`` block under an advisory
lock, with a schema-version row in ``jobfence_queue_schema``.

URL / keyword options (keywords win): ``table`` (default ``jobfence_queue``; an SQL identifier
of at most 58 characters, lower-cased), ``notify`` (``true`` | ``false``, default true),
``pool_size`` (idle connections kept for reuse, default 16), ``prepare_threshold`` (psycopg's;
``none`` disables server-side prepared statements, e.g. for PgBouncer < 1.21),
``connect_timeout`` and
``timeout`` (seconds, default 5 each: opening a connection, and one statement's reply; a
statement past its deadline has its connection closed, never reused; see ``common.py``).
Every other URL option goes to libpq unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection

from ..._core import acompat, forks
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.options import (
    TIMEOUT_OPTIONS,
    option_bool,
    option_int,
    option_timeouts,
    reject_unknown,
)
from ..._core.pool_async import AsyncConnPool
from ..._core.source_async import AsyncSource, open_source
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
from .common import (
    connect_kwargs,
    execute_bounded_async,
    libpq_uri,
    pg_text,
    refuse_connect_options,
    reusable,
)
from .connect_async import connect
from .dialect import DIALECT, IDENTIFIER_LIMIT, QUEUE_TABLE_LIMIT
from .listen_async import LISTEN_TICK, AsyncListener

if ASYNC:
    import asyncio

__all__ = [
    "CAPABILITIES",
    "DEFAULT_TABLE",
    "POLLING_CAPABILITIES",
    "SCHEMA_VERSION",
    "AsyncPostgresQueueBackend",
    "load_queue_queries",
    "notify_channel",
]

log = logging.getLogger("jobfence.backends.postgres")

#: version of the queue table's layout, stored in ``jobfence_queue_schema``
SCHEMA_VERSION = 1
DEFAULT_TABLE = "jobfence_queue"
OPTIONS = ("table", "notify", "pool_size", "prepare_threshold", *TIMEOUT_OPTIONS)
#: a worker runs up to ``concurrency`` acks at once beside its receive and renewals: keep
#: enough idle connections that a busy worker never opens one per statement
DEFAULT_POOL_SIZE = 16
#: seconds between two looks of a waiting receive that gets no notifications
POLL_INTERVAL = 1.0
#: the shortest pause of a waiting receive between two looks: when the next message is due
#: at once but was not taken (another receive held its row at that instant)
MIN_PAUSE = 0.01
#: a waiting receive sleeps this much past the instant the next message becomes deliverable,
#: so that it does not look a hair too early
DUE_SLACK = 0.001

CAPABILITIES = QueueCapabilities(cross_process=True, visibility_timeout=True, server_wakeup=True)
#: with ``notify=false``: waiting receives poll
POLLING_CAPABILITIES = QueueCapabilities(
    cross_process=True, visibility_timeout=True, server_wakeup=False
)

Conn = AsyncConnection[tuple[Any, ...]]

_ESCAPE = "\ufffe"
_MAX_SEQ = 2**63 - 1


def notify_channel(table: str, queue: str) -> str:
    """The LISTEN/NOTIFY channel of ``queue`` in ``table``: ``"<table>.<queue>"``, or, when
    that is longer than PostgreSQL's 63-byte names, ``"<table>.#<BLAKE2b hex of queue>"`` cut
    to 63 characters (two queues sharing a cut channel only wake each other's consumers in
    vain: the payload, the queue name, tells them apart)."""
    channel = f"{table}.{queue}"
    if len(channel) <= IDENTIFIER_LIMIT:
        return channel
    digest = hashlib.blake2b(queue.encode("utf-8"), digest_size=32).hexdigest()
    return f"{table}.#{digest}"[:IDENTIFIER_LIMIT]


def _quote(name: str) -> str:
    """A double-quoted identifier, as it is (a channel holds dots that are not qualifiers;
    validated table names and channels hold no double quote)."""
    return '"' + name + '"'


def load_queue_queries(table: str, channel: str) -> Queries:
    """The sections of ``sql/queue.sql`` for ``table`` (validated and lower-cased) and the
    queue's ``channel`` (see :func:`notify_channel`), with psycopg placeholders."""
    return load_sql(
        DIALECT.package,
        "queue.sql",
        names={"table": table, "channel": channel},
        quote=_quote,
        style="psycopg",
    )


def _text_out(value: str | None) -> str | None:
    """The inverse of :func:`~jobfence.backends.postgres.common.pg_text`."""
    if value is not None and value.startswith(_ESCAPE):
        return bytes.fromhex(value[len(_ESCAPE) :]).decode("utf-8")
    return value


def _error_text(error: str | None) -> str | None:
    """An error message as ``text`` can store it (a lone surrogate is written as its
    escape; a NUL as :func:`pg_text` does)."""
    if error is None:
        return None
    try:
        error.encode("utf-8")
    except UnicodeEncodeError:
        error = error.encode("utf-8", "backslashreplace").decode("utf-8")
    return pg_text(error)


def _headers_in(headers: dict[str, str]) -> str | None:
    """Headers as the JSON text the table stores (``None``: none)."""
    if not headers:
        return None
    text = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: only their \\u escapes can be stored
        text = json.dumps(headers, separators=(",", ":"))
    return text


def _headers_out(text: str | None) -> dict[str, str]:
    return {} if text is None else dict(json.loads(text))


def _receipt(seq: int, token: uuid.UUID) -> str:
    return f"{seq}.{token.hex}"


def _parse_receipt(receipt: str) -> tuple[int, uuid.UUID] | None:
    """``(seq, token)`` of a receipt this backend handed out; ``None`` for anything else (no
    delivery has it, so the verb returns False without asking the server)."""
    if not isinstance(receipt, str):
        return None
    seq, dot, token = receipt.partition(".")
    if not dot or not (seq.isascii() and seq.isdigit()) or len(seq) > 19 or len(token) != 32:
        return None
    try:
        number, parsed = int(seq), uuid.UUID(hex=token)
    except ValueError:
        return None
    return (number, parsed) if number <= _MAX_SEQ else None


def _message(row: Sequence[Any]) -> QueuedMessage:
    seq, id_, body, headers, delivery, token, published_at, last_error = row[:8]
    return QueuedMessage(
        id=str(_text_out(id_)),
        body=bytes(body),
        headers=_headers_out(headers),
        delivery=int(delivery),
        receipt=_receipt(int(seq), token),
        published_at=None if published_at is None else float(published_at),
        last_error=_text_out(last_error),
    )


class AsyncPostgresQueueBackend(AsyncListener, AsyncQueueBackend):
    """One queue (``name``) in a PostgreSQL table shared by every queue. See the module
    docstring and ``docs/how-to/queues/postgres.md``.

    Connections are opened lazily (the constructor needs no event loop), with autocommit,
    and kept in the client's pool; the LISTEN connection is opened by the first waiting
    ``receive``.
    """

    kind = "postgres"
    capabilities = CAPABILITIES

    _listener_label = ("postgres queue", "waiting receives poll")

    @property
    def _listen_sql(self) -> str:
        return str(self._sql["listen"])

    def __init__(self, url: BackendURL, *, name: str, client: Any = None, **options: Any) -> None:
        self.name = check_queue_name(name)
        #: the caller's pool, engine or connection factory, if one was passed in
        self._source: AsyncSource | None = None
        if client is not None:
            refuse_connect_options(options, "postgres queue backend")
            self._source = open_source(client, DIALECT, "postgres queue backend")
        reject_unknown(options, OPTIONS, "postgres queue")
        merged = {**{k: v for k, v in url.options.items() if k in OPTIONS}, **options}
        self.table = check_namespace(
            merged.get("table", DEFAULT_TABLE),
            limit=QUEUE_TABLE_LIMIT,
            backend="postgres",
            argument="table",
        ).lower()  # one spelling: the table PostgreSQL would make of the unquoted name
        self.notify = option_bool(merged.get("notify", True), "notify")
        threshold = merged.get("prepare_threshold", 5)
        self.prepare_threshold = (
            None
            if threshold is None or str(threshold).strip().lower() in ("none", "off")
            else option_int(threshold, "prepare_threshold", 0, 1_000_000)
        )
        if not self.notify:
            self.capabilities = POLLING_CAPABILITIES
        self.url = url
        self.timeouts = option_timeouts(options, url.options)
        self._connect_kwargs = connect_kwargs(url.options, self.timeouts)
        self._conninfo = libpq_uri(url, *OPTIONS)
        self.channel = notify_channel(self.table, self.name)
        self._sql = load_queue_queries(self.table, self.channel)
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
        #: the events of this client's waiting receives; the listener sets them
        self._waiters: set[acompat.Event] = set()
        self._mutex = threading.Lock()  # guards _waiters (never held across I/O)
        self._closed = False
        self._reset_listener()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url.masked} table={self.table!r} name={self.name!r}>"

    # -- connections and statements ------------------------------------------------------
    async def _connect(self) -> Conn:
        if self._closed:
            raise ConfigurationError("this postgres queue backend is closed", argument="self")
        conn: Conn = await connect(
            self.url,
            self._conninfo,
            self._connect_kwargs,
            prepare_threshold=self.prepare_threshold,
            source=self._source,
        )
        return conn

    async def _drop(self, conn: Conn) -> None:
        if self._source is not None:  # one of the caller's: back to its pool, to be replaced
            await self._source.discard(conn)
            return
        try:
            await conn.close()
        except Exception:  # already broken: nothing left to close
            pass

    async def _execute(
        self, conn: Conn, sql: str, params: dict[str, Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One statement within the ``timeout``; past it the connection is closed and
        ``TimeoutError`` raised (every statement of this client goes through here)."""
        return await execute_bounded_async(conn, sql, params, limit=self.timeouts.request)

    async def _run(
        self, section: str, params: dict[str, Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """Run the statement of ``section`` on a pooled connection: (rows, rowcount). A
        missing table (first use, or dropped meanwhile) is created and the statement run
        again."""
        sql = self._sql[section]
        for attempt in range(2):
            try:
                async with self._pool.connection() as conn:
                    return await self._execute(conn, sql, params)
            except psycopg.errors.UndefinedTable:
                if attempt:
                    raise
            await self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- schema --------------------------------------------------------------------------
    async def install(self) -> None:
        """Create the table, its index and its schema row now (idempotent; also done on
        first use), then check the schema version."""
        async with self._pool.connection() as conn:
            try:
                await self._execute(conn, self._sql["schema"])
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                # another component created a shared table at the same instant without the
                # advisory lock: it exists now, so the second run only finds it
                await self._execute(conn, self._sql["schema"])
            rows, _ = await self._execute(conn, self._sql["schema_version"])
        check_schema_version(
            rows[0] if rows else None,
            SCHEMA_VERSION,
            backend=self.kind,
            tables=f"queue table {self.table}",
        )

    async def drop(self) -> None:
        """Delete the queue's messages; drop the table (and its schema row) too if no other
        queue has messages in it."""
        async with self._pool.connection() as conn:
            try:
                await self._execute(conn, self._sql["purge"], {"queue": self.name})
            except psycopg.errors.UndefinedTable:
                return
            await self._execute(conn, self._sql["drop_table"])

    # -- the verbs -----------------------------------------------------------------------
    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        """Insert the batch with ONE statement, which also wakes the queue's waiting
        consumers."""
        if not messages:
            return
        await self._run(
            "publish",
            {
                "queue": self.name,
                "channel": self.channel,
                "ids": [pg_text(id_) for id_, _, _ in messages],
                "bodies": [bytes(body) for _, body, _ in messages],
                "headers": [_headers_in(headers) for _, _, headers in messages],
                "delay": max(0.0, float(delay)),
            },
        )

    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        """One ``receive`` statement; when it finds nothing and ``wait > 0``, sleep until a
        notification for this queue, the instant the next message becomes deliverable, or
        the end of the wait, then look again."""
        if max_messages <= 0:
            return []
        params = {
            "queue": self.name,
            "n": int(max_messages),
            "visibility": float(visibility),
            "consumer": consumer,
        }
        clock = get_clock()
        deadline = clock.monotonic() + max(0.0, wait)
        event: acompat.Event | None = None
        if wait > 0 and self.notify:
            await self._ensure_listener()  # LISTEN before looking: no publish goes unseen
            event = self._register()
        last = False  # polling: the wait is over, this is the last look
        try:
            while True:
                if event is not None:
                    event.clear()
                rows, _ = await self._run("receive", params)
                messages = [_message(row) for row in rows if row[0] is not None]
                if messages or wait <= 0 or last:
                    return messages
                left = deadline - clock.monotonic()
                if left <= 0:
                    return []
                next_in = rows[0][8] if rows else None
                due = None if next_in is None else max(float(next_in) + DUE_SLACK, MIN_PAUSE)
                # final: this pause runs to the end of the wait (nothing is due before it)
                pause, final = (due, False) if due is not None and due < left else (left, True)
                if event is not None and self._listening():
                    # a timer may fire a hair before the deadline: a final pause that saw no
                    # notification ends the wait without another look
                    if not await clock.wait_async(event, pause) and final:
                        return []
                else:
                    nap = min(pause, POLL_INTERVAL)
                    await clock.asleep(nap)
                    last = final and nap >= pause
                    if event is not None:  # the listener was down: try it again (throttled)
                        await self._ensure_listener()
                if self._closed:
                    return []
        finally:
            if event is not None:
                self._unregister(event)

    async def ack(self, receipt: str, consumer: str) -> bool:
        """Delete the message if ``receipt`` is still its current delivery and
        ``consumer``'s (also after the visibility passed, as long as nobody received the
        message again)."""
        handle = _parse_receipt(receipt)
        if handle is None:
            return False
        _, count = await self._run(
            "ack",
            {"queue": self.name, "seq": handle[0], "receipt": handle[1], "consumer": consumer},
        )
        return count == 1

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """Ack every delivery of ``items`` with ONE statement; one bool per item. A receipt
        this backend did not hand out (or named twice: acked once) is False."""
        slots: list[int] = []  # each item's position in the arrays, -1: not acked by it
        seen: set[tuple[int, uuid.UUID, str]] = set()
        seqs: list[int] = []
        tokens: list[uuid.UUID] = []
        consumers: list[str] = []
        for receipt, consumer in items:
            handle = _parse_receipt(receipt)
            key = None if handle is None else (handle[0], handle[1], consumer)
            if handle is None or key in seen:
                slots.append(-1)
                continue
            seen.add(key)  # type: ignore[arg-type]
            slots.append(len(seqs))
            seqs.append(handle[0])
            tokens.append(handle[1])
            consumers.append(consumer)
        acked: list[bool] = []
        if seqs:
            params = {"queue": self.name, "seqs": seqs, "receipts": tokens, "consumers": consumers}
            rows, _ = await self._run("ack_many", params)
            acked = [bool(row[1]) for row in rows]
        return [slot >= 0 and acked[slot] for slot in slots]

    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        return await self._give_back("nack", receipt, consumer, delay, error=_error_text(error))

    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """As :meth:`nack`, without counting this delivery and keeping ``last_error``."""
        return await self._give_back("defer", receipt, consumer, delay)

    async def _give_back(
        self, statement: str, receipt: str, consumer: str, delay: float, **extra: Any
    ) -> bool:
        """Run ``statement`` (``nack`` or ``defer``) on this consumer's delivery ``receipt``."""
        handle = _parse_receipt(receipt)
        if handle is None:
            return False
        params = {
            "queue": self.name,
            "channel": self.channel,
            "seq": handle[0],
            "receipt": handle[1],
            "consumer": consumer,
            "delay": max(0.0, float(delay)),
            **extra,
        }
        rows, _ = await self._run(statement, params)
        return bool(rows)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every delivery of ``items`` with ONE statement (one round trip). An item
        named twice is renewed once, with the longer visibility; a receipt this backend did
        not hand out is False without asking the server."""
        slots: list[int] = []  # each item's position in the arrays, -1: not a receipt
        index: dict[tuple[int, uuid.UUID, str], int] = {}
        seqs: list[int] = []
        tokens: list[uuid.UUID] = []
        consumers: list[str] = []
        visibilities: list[float] = []
        for receipt, consumer, visibility in items:
            handle = _parse_receipt(receipt)
            if handle is None:
                slots.append(-1)
                continue
            key = (handle[0], handle[1], consumer)
            position = index.get(key)
            if position is None:
                position = index[key] = len(seqs)
                seqs.append(handle[0])
                tokens.append(handle[1])
                consumers.append(consumer)
                visibilities.append(float(visibility))
            else:
                visibilities[position] = max(visibilities[position], float(visibility))
            slots.append(position)
        if not seqs:
            return [False] * len(items)
        rows, _ = await self._run(
            "renew",
            {
                "queue": self.name,
                "seqs": seqs,
                "receipts": tokens,
                "consumers": consumers,
                "visibilities": visibilities,
            },
        )
        renewed = [bool(row[1]) for row in rows]
        return [position >= 0 and renewed[position] for position in slots]

    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        handle = _parse_receipt(receipt)
        if handle is None:
            return False
        _, count = await self._run(
            "dead_letter",
            {
                "queue": self.name,
                "seq": handle[0],
                "receipt": handle[1],
                "consumer": consumer,
                "error": _error_text(error),
            },
        )
        return count == 1

    async def stats(self) -> QueueStats:
        rows, _ = await self._run("stats", {"queue": self.name})
        ready, delayed, in_flight, dead = (int(n) for n in rows[0])
        return QueueStats(ready=ready, delayed=delayed, in_flight=in_flight, dead=dead)

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        rows, _ = await self._run("dead_letters", {"queue": self.name, "limit": int(limit)})
        return [
            DeadLetter(
                id=str(_text_out(id_)),
                body=bytes(body),
                headers=_headers_out(headers),
                deliveries=int(delivery),
                error=_text_out(error),
                dead_at=None if dead_at is None else float(dead_at),
            )
            for id_, body, headers, delivery, error, dead_at in rows
        ]

    async def names(self, limit: int) -> list[str]:
        rows, _ = await self._run("names", {"limit": int(limit)})
        return [str(_text_out(row[0])) for row in rows]

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        if ids is not None and not ids:
            return 0
        rows, _ = await self._run(
            "requeue_dead",
            {
                "queue": self.name,
                "channel": self.channel,
                "every": ids is None,
                "ids": [] if ids is None else [pg_text(id_) for id_ in ids],
            },
        )
        return int(rows[0][0])

    async def purge(self) -> int:
        _, count = await self._run("purge", {"queue": self.name})
        return int(count)

    async def close(self) -> None:
        """Close every connection (the LISTEN one too); idempotent. A receive waiting in
        this client returns ``[]``."""
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
            # the listener thread sees the flag within LISTEN_TICK and closes its connection
            acompat.join(self._listener, LISTEN_TICK + self.timeouts.request)
        await self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections and
        the listener inherited from the parent, without closing anything (see
        ``jobfence/_core/forks.py``); the child opens its own on first use."""
        self._pool.after_fork()
        forks.keep(self._listener, self._listener_conn)
        self._waiters = set()
        self._mutex = threading.Lock()
        self._reset_listener()

    # -- waiting -------------------------------------------------------------------------
    def _register(self) -> acompat.Event:
        event = acompat.Event()
        with self._mutex:
            self._waiters.add(event)
        return event

    def _unregister(self, event: acompat.Event) -> None:
        with self._mutex:
            self._waiters.discard(event)

    def _wake(self, payload: str | None) -> None:
        """A notification arrived with a queue name as ``payload``: wake this client's
        waiting receives if it is this queue's. ``None`` (the listener stopped, or the
        client closes): wake them all, to look again (or return)."""
        if payload is not None and payload != self.name:
            return  # another queue whose channel name was cut to the same one
        with self._mutex:
            events = list(self._waiters)
        for event in events:
            event.set()
