"""``postgresql://`` -- the PostgreSQL lock backend.

Built on psycopg 3: its asyncio connection class in ``locks_async.py``, the blocking one in
``locks.py`` (generated from it).
The SQL lives in ``sql/locks.sql``. Two modes, chosen by the URL option ``?mode=``, each a
class (``AsyncPostgresLockBackend`` / ``AsyncPostgresSessionLockBackend``, sharing
``AsyncPostgresLockCommon``: options, connections, tables); ``AsyncPostgresLockBackend(url)``
makes the session class when the URL or a keyword says ``mode=session``:

``mode=lease`` (default)
    A lease is a row in ``{namespace}_locks`` with an expiry measured by the server's
    ``clock_timestamp()``; ``ttl`` is honoured (a paused holder loses its lease). Every
    operation is ONE autocommit statement -- acquire (token bump + conditional upsert, one
    CTE), release, extend, and the batched renewal of every due lease -- so this mode also
    works behind PgBouncer in transaction pooling mode. Fair FIFO hand-off: a waiting acquire
    joins a queue table (``{namespace}_lock_queue``; its entry lives while the waiter comes
    back every poll interval); a free lease goes to the head of the live queue, never to a
    newcomer; release gives the lease straight to the head (new token, its own ttl) in the
    same statement and notifies only that waiter, with its token, so it owns the lease when it
    wakes. Waiters sleep on LISTEN/NOTIFY (one dedicated listener connection per client),
    never longer than the core's poll interval or the holder's remaining lifetime. Behind
    PgBouncer transaction pooling LISTEN does not work: set ``?notify=false`` and waiters
    poll without queueing (no FIFO: a queue served by polling would hand the lease over
    only as often as its head polls); they still never take a lease from the head of a
    queue that notified clients of the same namespace keep.

``mode=session``
    Session advisory locks. Each held lock sits on its own dedicated connection (taken from a
    small idle pool; never multiplexed, because advisory locks are re-entrant per session, so
    two owners sharing a session would both "get" the lock). ``try_acquire`` is
    ``pg_try_advisory_lock``; a waiting ``acquire`` is a blocking ``pg_advisory_lock`` with
    ``lock_timeout`` set to the wait, so waiters queue IN THE SERVER in arrival order and a
    release hands the lock straight to the next waiter (fifo and hand-off). The lock is held
    as long as its connection lives: ``ttl`` is NOT honoured (a paused holder keeps it);
    renewal is a liveness check of each holding connection (it still holds the lock in
    ``pg_locks``), so a dropped or terminated connection becomes a lost lease within one
    renewal interval. Needs session pooling or direct connections (not PgBouncer
    transaction pooling).

Keys: a lock name maps to the signed 64-bit advisory key :func:`advisory_key` (the first 8
bytes of BLAKE2b over the namespace and the full name) -- no 32-bit space, no truncation of
the name. Fencing tokens (both modes) come from a per-name counter row in
``{namespace}_lock_tokens``, bumped in the statement that grants the lock; a missing counter
is seeded from the server time in microseconds, so tokens never go backwards.

URL / keyword options (keywords win; everything else in the URL goes to libpq unchanged):
``mode`` (``lease`` | ``session``), ``notify`` (``true`` | ``false``, lease mode),
``pool_size`` (idle connections kept for reuse, default 4; ``max_idle`` is a deprecated name
for it), ``prepare_threshold`` (psycopg's;
``none`` disables server-side prepared statements, e.g. for PgBouncer < 1.21),
``connect_timeout`` and ``timeout`` (seconds, default 5 each).

Deadlines: opening a connection waits at most ``connect_timeout`` (libpq's parameter: whole
seconds, at least 2); every statement waits at most ``timeout`` for its reply (a session-mode
``pg_advisory_lock`` its wait on top), after which its connection is broken off, closed and
never reused (``common.execute_bounded``); idle connections have TCP keepalives and
``tcp_user_timeout`` (``common.connect_kwargs``). :meth:`prepare` opens a connection, creates
the tables and starts the LISTEN connection before ``Locks`` starts a lease's clock, so a
grant costs one round trip even on a cold client.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from ..._core import acompat, forks
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.options import (
    TIMEOUT_OPTIONS,
    Timeouts,
    option_bool,
    option_int,
    option_pool_size,
    option_timeouts,
)
from ..._core.pool_async import AsyncConnPool
from ..._core.source_async import AsyncSource, open_source
from ..._core.sqlfiles import load_sql
from ..._core.url import BackendURL
from ..._core.validate import check_namespace as _check_namespace
from ..._core.validate import check_schema_version
from ...errors import ConfigurationError
from ..base import AsyncLockBackend, LockCapabilities, LockHolder, RenewItem
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
from .dialect import DIALECT, NAMESPACE_LIMIT
from .listen_async import AsyncListener

if ASYNC:
    import asyncio

__all__ = [
    "LEASE_CAPABILITIES",
    "MODES",
    "POLLING_CAPABILITIES",
    "SCHEMA_VERSION",
    "SESSION_CAPABILITIES",
    "AsyncPostgresLockBackend",
    "AsyncPostgresLockCommon",
    "AsyncPostgresSessionLockBackend",
    "advisory_key",
    "load_queries",
    "requested_mode",
    "stored_name",
]

log = logging.getLogger("jobfence.backends.postgres")

SCHEMA_VERSION = 1
MODES = ("lease", "session")
OPTIONS = ("mode", "notify", "pool_size", "prepare_threshold", *TIMEOUT_OPTIONS)
#: deprecated names of options (accepted, with a DeprecationWarning)
_ALIASES = ("max_idle",)
DEFAULT_POOL_SIZE = 4

LEASE_CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=True, handoff=True, tokens_survive_data_loss=True
)
#: lease mode with ``notify=false``: waiters poll and do not queue (a FIFO queue served by
#: polling would hand the lease over only as fast as the head polls: about once a second)
POLLING_CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=False, handoff=False, tokens_survive_data_loss=True
)
#: seconds added to a lease-mode waiter's queue deadline beyond the wait it asked for
WAITER_SLACK = 1.0
SESSION_CAPABILITIES = LockCapabilities(
    cross_process=True,
    ttl_expiry=False,
    fifo=True,
    handoff=True,
    tokens_survive_data_loss=True,
    queue_follows_connection=True,
)

Conn = AsyncConnection[tuple[Any, ...]]


def advisory_key(namespace: str, name: str) -> int:
    """The session advisory-lock key of ``name``: a signed 64-bit integer (PostgreSQL bigint).

    The first 8 bytes (big-endian, two's complement) of BLAKE2b, personalised with
    ``b"jobfence.lock"``, over ``namespace + "\\0" + name`` in UTF-8. Stable across processes,
    machines and versions (it is part of the on-server format); it uses the full 64 bits, so
    two names collide with probability about 2**-64, not 2**-32 as with a 32-bit hash.
    """
    data = namespace.encode("utf-8") + b"\0" + name.encode("utf-8")
    digest = hashlib.blake2b(data, digest_size=8, person=b"jobfence.lock").digest()
    return int.from_bytes(digest, "big", signed=True)


stored_name = pg_text


def _schema_key(namespace: str) -> int:
    digest = hashlib.blake2b(
        namespace.encode("utf-8"), digest_size=8, person=b"jobfence.schema"
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def _halves(key: int) -> dict[str, int]:
    """The key as pg_locks shows it: classid (high 32 bits) and objid (low 32 bits)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}


def check_namespace(namespace: object) -> str:
    """The namespace prefixes table names: an SQL identifier short enough for every table
    (``NAMESPACE_LIMIT`` characters, see ``dialect.py``)."""
    return _check_namespace(namespace, limit=NAMESPACE_LIMIT, backend="postgres")


def load_queries(namespace: str) -> dict[str, str]:
    """The sections of ``sql/locks.sql`` for ``namespace`` (already validated), with psycopg
    placeholders: ``schema`` is one script, every other section one statement."""
    return dict(
        load_sql(
            DIALECT.package,
            "locks.sql",
            names={"namespace": namespace},
            quote=DIALECT.quote,
            values={"schema_key": _schema_key(namespace)},
            style="psycopg",
        )
    )


_option_bool = option_bool
_option_int = option_int


@dataclass(frozen=True)
class PostgresOptions:
    mode: str
    notify: bool
    pool_size: int
    prepare_threshold: int | None
    timeouts: Timeouts

    @classmethod
    def parse(cls, url: BackendURL, options: dict[str, Any]) -> PostgresOptions:
        unknown = sorted(set(options) - set(OPTIONS) - set(_ALIASES))
        if unknown:
            raise ConfigurationError(
                f"unknown postgres option {unknown[0]!r}; allowed: " + ", ".join(OPTIONS),
                argument=unknown[0],
            )
        merged: dict[str, Any] = {
            **{k: v for k, v in url.options.items() if k in OPTIONS or k in _ALIASES},
            **options,
        }
        mode = str(merged.get("mode", "lease")).strip().lower()
        if mode not in MODES:
            raise ConfigurationError(
                f"mode must be one of {', '.join(MODES)} (lease honours ttl and works behind "
                f"PgBouncer transaction pooling; session uses session advisory locks), "
                f"got {merged.get('mode')!r}",
                argument="mode",
            )
        threshold_raw = merged.get("prepare_threshold", 5)
        threshold = (
            None
            if threshold_raw is None or str(threshold_raw).strip().lower() in ("none", "off")
            else _option_int(threshold_raw, "prepare_threshold", 0, 1_000_000)
        )
        return cls(
            mode=mode,
            notify=_option_bool(merged.get("notify", True), "notify"),
            pool_size=option_pool_size(options, url.options, DEFAULT_POOL_SIZE),
            prepare_threshold=threshold,
            timeouts=option_timeouts(options, url.options),
        )


class _Waiter:
    """A lease-mode waiter of this process: woken by a NOTIFY for its name."""

    __slots__ = ("attempts", "event", "left", "notified", "requeued", "token")

    def __init__(self) -> None:
        self.event = acompat.Event()
        self.notified = False
        self.left: float | None = None  # the holder's remaining lifetime at the last attempt
        self.token: int | None = None  # handed to us by a release (from its NOTIFY)
        self.attempts = 0
        self.requeued = False  # a later attempt made a NEW queue entry (see the SQL)


@dataclass
class _Held:
    """A session-mode lock: the connection that holds it, its key and its token."""

    conn: Conn
    key: int
    token: int


def requested_mode(url: BackendURL, options: dict[str, Any]) -> str:
    """The ``mode`` asked for by the keywords or else the URL (``lease`` when neither says)."""
    return str(options.get("mode", url.options.get("mode", "lease"))).strip().lower()


class AsyncPostgresLockCommon(AsyncLockBackend):
    """What both modes share: the options, the connections (opened lazily -- the constructor
    needs no event loop --, with autocommit, kept in a small idle pool), the statements of
    ``sql/locks.sql`` and the tables (created on first use, or by :meth:`install`)."""

    kind = "postgres"
    #: ``lease`` or ``session`` (the class decides; see the module)
    mode: str

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        **options: Any,
    ) -> None:
        self.namespace = check_namespace(namespace)
        #: the caller's pool, engine or connection factory, if one was passed in
        self._source: AsyncSource | None = None
        if client is not None:
            refuse_connect_options(options, "postgres lock backend")
            self._source = open_source(client, DIALECT, "postgres lock backend")
        self.url = url
        self.options = PostgresOptions.parse(url, options)
        self.queries = load_queries(namespace)
        self._conninfo = libpq_uri(url, *OPTIONS, *_ALIASES)
        self.timeouts = self.options.timeouts
        self._connect_kwargs = connect_kwargs(url.options, self.timeouts)
        #: idle connections; a session-mode lock keeps its connection out of it while held
        source = self._source
        self._pool = AsyncConnPool(
            self._connect,
            self._drop,
            pool_size=self.options.pool_size,
            reusable=reusable,
            put=source.put if source is not None and source.pooled else None,
        )
        self._mutex = threading.Lock()  # guards the mode's bookkeeping (never across I/O)
        self._schema_mutex = acompat.Lock()
        self._installed = False
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.url.masked} mode={self.mode} "
            f"namespace={self.namespace!r}>"
        )

    # -- connections ---------------------------------------------------------------------
    async def _connect(self) -> Conn:
        if self._closed:
            raise ConfigurationError("this postgres lock backend is closed", argument="self")
        conn: Conn = await connect(
            self.url,
            self._conninfo,
            self._connect_kwargs,
            prepare_threshold=self.options.prepare_threshold,
            source=self._source,
        )
        return conn

    async def _take(self) -> Conn:
        """A connection of the pool (open, idle), or a new one."""
        conn: Conn = await self._pool.take()
        return conn

    async def _give(self, conn: Conn) -> None:
        """Return a healthy idle connection to the pool (or close it)."""
        await self._pool.give(conn)

    async def _drop(self, conn: Conn) -> None:
        """Close a connection (which also frees every session lock it holds); one of the
        caller's goes back to its pool closed, to be replaced."""
        if self._source is not None:
            await self._source.discard(conn)
            return
        try:
            await conn.close()
        except Exception:  # already broken: nothing left to close
            pass

    async def _execute(
        self, conn: Conn, query: str, params: dict[str, Any] | None = None, *, wait: float = 0.0
    ) -> tuple[list[tuple[Any, ...]], int]:
        """Run one statement on ``conn`` within the ``timeout`` (plus ``wait``, for one that
        waits in the server on purpose): (rows, rowcount). Past it the connection is closed
        and ``TimeoutError`` raised."""
        return await execute_bounded_async(conn, query, params, limit=self.timeouts.request + wait)

    async def _run(
        self, query: str, params: dict[str, Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """Run one autocommit statement on a pooled connection: (rows, rowcount)."""
        await self._ready()
        conn = await self._take()
        try:
            rows, rowcount = await self._execute(conn, query, params)
        except BaseException:
            await self._give(conn)  # kept only if it is idle and healthy
            raise
        await self._give(conn)
        return rows, rowcount

    # -- schema --------------------------------------------------------------------------
    async def _ready(self) -> None:
        if not self._installed:
            await self.install()

    async def install(self) -> None:
        """Create the tables now, idempotently (they are also created on first use)."""
        async with self._schema_mutex:
            if self._installed:
                return
            conn = await self._take()
            try:
                try:
                    await self._execute(conn, self.queries["schema"])
                except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                    # another component created a shared table at the same instant without
                    # our advisory lock: it exists now, so the second run only finds it
                    await self._execute(conn, self.queries["schema"])
                rows, _ = await self._execute(conn, self.queries["schema_version"])
                row = rows[0] if rows else None
            except BaseException:
                await self._give(conn)
                raise
            await self._give(conn)
            check_schema_version(
                row, SCHEMA_VERSION, backend=self.kind, tables=f"lock tables {self.namespace}_*"
            )
            self._installed = True

    # -- the verbs -----------------------------------------------------------------------
    async def prepare(self, *, waiting: bool = False) -> None:
        """Create the tables and open a pooled connection -- each once -- so that the grant
        request that follows is one round trip."""
        await self._ready()
        if not self._pool.ready():
            await self._give(await self._take())

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections
        inherited from the parent without closing them (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
        self._mutex = threading.Lock()
        self._schema_mutex = acompat.Lock()


class AsyncPostgresLockBackend(AsyncListener, AsyncPostgresLockCommon):
    """Leases in PostgreSQL (``mode=lease``, the default). See the module docstring and
    ``docs/how-to/backends/postgres.md``. Made with ``mode=session`` (in the URL or as a
    keyword), it makes an :class:`AsyncPostgresSessionLockBackend` instead: the one place
    where the mode picks the class, so ``Locks(url)`` and this constructor agree."""

    mode = "lease"

    def __new__(cls, url: BackendURL | None = None, *args: Any, **options: Any) -> Any:
        if (
            cls is AsyncPostgresLockBackend
            and url is not None
            and requested_mode(url, options) == "session"
        ):
            return AsyncPostgresSessionLockBackend(url, *args, **options)
        return super().__new__(cls)

    @property
    def _listen_sql(self) -> str:
        return str(self.queries["listen"])

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(url, namespace=namespace, client=client, **options)
        self.capabilities = LEASE_CAPABILITIES if self.options.notify else POLLING_CAPABILITIES
        self._waiters: dict[str, dict[str, _Waiter]] = {}
        self._reset_listener()

    async def prepare(self, *, waiting: bool = False) -> None:
        """Create the tables, open a pooled connection and, for a waiter with ``notify``, the
        LISTEN connection -- each once -- so that the grant request that
        follows is one round trip."""
        await self._ready()
        if waiting and self.options.notify:
            await self._ensure_listener()
        if not self._pool.ready():
            await self._give(await self._take())

    async def holder(self, name: str) -> LockHolder | None:
        """The live lease's owner, token and seconds left."""
        rows, _ = await self._run(self.queries["holder"], {"name": stored_name(name)})
        if not rows:
            return None
        owner, token, left = rows[0]
        return LockHolder(str(owner), int(token), max(0.0, float(left)))

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """The live leases whose names start with ``prefix``."""
        rows, _ = await self._run(
            self.queries["holders"],
            {
                # a prefix that text cannot hold (or that starts with the escape mark) can
                # only begin escaped names: then both conditions look for those
                "prefix": prefix if pg_text(prefix) == prefix else pg_text_prefix(prefix),
                "escaped": pg_text_prefix(prefix),
                "mark": pg_text_prefix(""),
                "limit": limit,
            },
        )
        return [
            (pg_untext(str(name)), LockHolder(str(owner), int(token), max(0.0, float(left))))
            for name, owner, token, left in rows
        ]

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        name = stored_name(name)
        if wait is not None:
            if self.options.notify:
                await self._ensure_listener()  # LISTEN before looking: no release goes unseen
            self._register(name, owner)
        queue_for = wait if self.options.notify else None  # polling waiters do not queue
        rows, _ = await self._run(
            self.queries["acquire"],
            {"name": name, "owner": owner, "ttl": ttl, "wait": queue_for, "slack": WAITER_SLACK},
        )
        token = left = None
        queued = False
        for row_token, row_left, row_queued in rows:
            if row_queued:
                queued = True
            elif row_token is not None:
                token = int(row_token)
            elif row_left is not None:
                left = float(row_left)
        if token is not None:
            if wait is not None:
                self._unregister(name, owner)
            return token
        if wait is not None:
            with self._mutex:
                waiter = self._waiters.get(name, {}).get(owner)
                if waiter is not None:
                    waiter.left = left
                    waiter.attempts += 1
                    if queued and waiter.attempts > 1:
                        waiter.requeued = True
        return None

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Sleep until a NOTIFY for ``name``, the holder's expiry or ``timeout``."""
        name = stored_name(name)
        with self._mutex:
            waiter = self._waiters.get(name, {}).get(owner)
        limit = max(0.0, timeout)
        if waiter is not None and waiter.left is not None:
            limit = min(limit, max(0.0, waiter.left) + 0.001)
        if waiter is not None and self._listening():
            if not waiter.notified:
                await get_clock().wait_async(waiter.event, limit)
        else:
            await get_clock().asleep(limit)
        if waiter is None or waiter.token is None:
            return None
        if waiter.requeued:  # a stale queue entry of ours: remove it (rare; see the SQL)
            return await self._leave_queue(name, owner)
        self._unregister(name, owner)
        return waiter.token

    async def cancel_wait(self, name: str, owner: str) -> int | None:
        """Leave the queue; the token if the lease was handed to us meanwhile."""
        return await self._leave_queue(stored_name(name), owner)

    async def _leave_queue(self, name: str, owner: str) -> int | None:
        """``cancel_wait`` for a stored name: two statements, so that the second one sees a
        release that was handing us the lease while the first one ran."""
        self._unregister(name, owner)
        params = {"name": name, "owner": owner}
        await self._run(self.queries["cancel_wait"], params)
        rows, _ = await self._run(self.queries["handed"], params)
        return int(rows[0][0]) if rows else None

    async def release(self, name: str, owner: str) -> bool:
        rows, _ = await self._run(
            self.queries["release"], {"name": stored_name(name), "owner": owner}
        )
        return bool(rows[0][0])

    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        _, rowcount = await self._run(
            self.queries["extend"], {"name": stored_name(name), "owner": owner, "ttl": ttl}
        )
        return rowcount == 1

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """ONE statement for every item."""
        if not items:
            return []
        rows, _ = await self._run(
            self.queries["renew"],
            {
                "names": [stored_name(item[0]) for item in items],
                "owners": [item[1] for item in items],
                "ttls": [float(item[2]) for item in items],
            },
        )
        return [bool(row[1]) for row in rows]

    async def force_release(self, name: str) -> bool:
        """Drop the lease on ``name`` whoever holds it (tests, operator tools): delete its
        row."""
        rows, _ = await self._run(self.queries["force_release"], {"name": stored_name(name)})
        return bool(rows[0][0])

    async def close(self) -> None:
        """Close every connection; idempotent. Waiters of this client leave the queue first
        (a release must not hand the lease to an owner nobody waits for), and a lease already
        handed to one of them is given back; held leases are the core's to release."""
        if self._closed:
            return
        with self._mutex:
            waiting = [(name, owner) for name, per in self._waiters.items() for owner in per]
        for name, owner in waiting:
            try:
                if await self._leave_queue(name, owner) is not None:
                    await self._run(self.queries["release"], {"name": name, "owner": owner})
            except Exception as exc:  # best effort: the entry drops out after its deadline
                log.warning("leaving the wait queue of %r on close failed: %r", name, exc)
        self._closed = True
        if ASYNC:
            task = self._listener
            if isinstance(task, asyncio.Task) and acompat.worker_alive(task):
                task.cancel()
                try:
                    await task
                except BaseException:  # cancelled, or it already failed: it is finished now
                    pass
        await self._pool.close()

    def _register(self, name: str, owner: str) -> None:
        with self._mutex:
            per_name = self._waiters.setdefault(name, {})
            waiter = per_name.get(owner)
            if waiter is None:
                waiter = per_name[owner] = _Waiter()
            waiter.notified = False
            waiter.left = None
            waiter.token = None
            waiter.event.clear()

    def _unregister(self, name: str, owner: str) -> None:
        with self._mutex:
            per_name = self._waiters.get(name)
            if per_name is not None:
                per_name.pop(owner, None)
                if not per_name:
                    del self._waiters[name]

    def _wake(self, payload: str | None) -> None:
        """A NOTIFY arrived: ``h\\n<owner>\\n<token>\\n<name>`` (the lease was handed to that
        waiter) or ``w\\n<name>`` (every waiter of that name looks again; a payload of another
        form is taken as a bare name). ``None``: the listener stopped; wake everyone."""
        with self._mutex:
            if payload is None:
                waiters = [w for per_name in self._waiters.values() for w in per_name.values()]
            elif payload.startswith("h\n") and payload.count("\n") >= 3:
                _, owner, token, name = payload.split("\n", 3)
                waiter = self._waiters.get(name, {}).get(owner)
                if waiter is None or not token.isdigit():
                    return  # another client's waiter
                waiter.token = int(token)
                waiters = [waiter]
            else:
                name = payload[2:] if payload.startswith("w\n") else payload
                waiters = list(self._waiters.get(name, {}).values())
            for waiter in waiters:
                waiter.notified = True
                waiter.event.set()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: also forget the listener and this
        process's waiters (none are here)."""
        super().after_fork()
        forks.keep(self._listener, self._listener_conn)
        self._waiters = {}
        self._reset_listener()


class AsyncPostgresSessionLockBackend(AsyncPostgresLockCommon):
    """Session advisory locks in PostgreSQL (``mode=session``): each held lock sits on its
    own connection. See the module docstring and ``docs/how-to/backends/postgres.md``."""

    mode = "session"

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(url, namespace=namespace, client=client, **options)
        self.capabilities = SESSION_CAPABILITIES
        self._held: dict[tuple[str, str], _Held] = {}
        #: connections blocked in pg_advisory_lock right now (close cancels them)
        self._blocked: set[Conn] = set()

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        """``pg_try_advisory_lock`` (no ``wait``), or a blocking ``pg_advisory_lock`` with
        ``lock_timeout`` set to the wait: waiters queue in the server. ``ttl`` is not
        honoured (the lock lasts as long as its connection)."""
        with self._mutex:
            mine = self._held.get((name, owner))
        if mine is not None:
            return mine.token
        await self._ready()
        key = advisory_key(self.namespace, name)
        params = {"key": key, "name": stored_name(name)}
        conn = await self._take()
        try:
            if wait is None or wait <= 0:
                rows, _ = await self._execute(conn, self.queries["session_try"], params)
                row = rows[0] if rows else None
            else:
                limit_ms = max(1, math.ceil(wait * 1000))
                self._blocked.add(conn)
                try:
                    rows, _ = await self._execute(
                        conn,
                        self.queries["session_lock"],
                        {**params, "lock_timeout": f"{limit_ms}ms"},
                        wait=limit_ms / 1000,
                    )
                    row = rows[0] if rows else None
                except psycopg.errors.LockNotAvailable:
                    # the lock may have been granted in the instant the timeout fired:
                    # look on this very connection, and keep it if we got it
                    row = None
                    held, _ = await self._execute(conn, self.queries["session_held"], _halves(key))
                    if held and held[0][0]:
                        rows, _ = await self._execute(conn, self.queries["session_bump"], params)
                        row = rows[0] if rows else None
        except BaseException:
            self._blocked.discard(conn)
            await self._drop(conn)  # closing the session frees anything it may hold
            raise
        self._blocked.discard(conn)
        if self._closed:  # granted as the client closed: nobody will use it
            await self._drop(conn)
            raise ConfigurationError("this postgres lock backend is closed", argument="self")
        if row is None:
            await self._give(conn)
            return None
        token = int(row[0])
        with self._mutex:
            self._held[(name, owner)] = _Held(conn, key, token)
        return token

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Waiting happens in the server inside :meth:`acquire`, so this returns at once."""
        return None

    async def cancel_wait(self, name: str, owner: str) -> int | None:
        return None

    async def release(self, name: str, owner: str) -> bool:
        with self._mutex:
            held = self._held.pop((name, owner), None)
        if held is None:
            return False
        try:
            rows, _ = await self._execute(
                held.conn, self.queries["session_unlock"], {"key": held.key}
            )
            row = rows[0] if rows else None
        except BaseException:
            broken = held.conn.broken or held.conn.closed
            await self._drop(held.conn)  # closing the session frees the lock in any case
            if broken:
                return False  # the session was gone, and its lock with it
            raise
        unlocked = bool(row is not None and row[0])
        if unlocked:
            await self._give(held.conn)
        else:
            log.warning("pg_advisory_unlock of %r found it not held by its session", name)
            await self._drop(held.conn)
        return unlocked

    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        """Whether the connection holding ``name`` still holds it (``ttl`` is not honoured)."""
        return await self._alive(name, owner)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """A liveness check of each holding connection (one round trip per held lock, on its
        own connection)."""
        return [await self._alive(name, owner) for name, owner, _ttl in items]

    async def _alive(self, name: str, owner: str) -> bool:
        """Does the connection holding ``name`` for ``owner`` still hold the lock?"""
        with self._mutex:
            held = self._held.get((name, owner))
        if held is None:
            return False
        try:
            rows, _ = await self._execute(
                held.conn, self.queries["session_held"], _halves(held.key)
            )
            row = rows[0] if rows else None
        except (psycopg.Error, TimeoutError):  # a timeout closed the connection
            if not (held.conn.broken or held.conn.closed):
                raise
            with self._mutex:
                if self._held.get((name, owner)) is held:
                    del self._held[(name, owner)]
            await self._drop(held.conn)
            return False
        return bool(row is not None and row[0])

    async def holder(self, name: str) -> LockHolder | None:
        """The token of the session holding the advisory lock (its owner id and ttl are not
        recorded on the server)."""
        params = {**_halves(advisory_key(self.namespace, name)), "name": stored_name(name)}
        rows, _ = await self._run(self.queries["session_holder"], params)
        if not rows:
            return None
        return LockHolder(None, None if rows[0][0] is None else int(rows[0][0]), None)

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """Session mode keeps no list of names held (an advisory lock's key is a hash of its
        name), so it refuses."""
        raise ConfigurationError(
            "a postgres lock backend in session mode cannot list the locks held (the "
            "server knows only the hashed advisory-lock keys); ask for one name with "
            "holder(name), or list a lease-mode namespace",
            argument="mode",
        )

    async def force_release(self, name: str) -> bool:
        """Drop the lock on ``name`` whoever holds it (tests, operator tools): terminate the
        holding backend (needs the ``pg_signal_backend`` role, superuser, or the same role as
        the holder)."""
        params = _halves(advisory_key(self.namespace, name))
        rows, _ = await self._run(self.queries["session_force_release"], params)
        terminated = any(bool(row[0]) for row in rows)
        if terminated:  # the lock is free only once the backend has exited
            clock = get_clock()
            deadline = clock.monotonic() + self.timeouts.request
            while clock.monotonic() < deadline:
                held, _ = await self._run(self.queries["session_holders"], params)
                if not held[0][0]:
                    break
                await clock.asleep(0.005)
        return terminated

    async def close(self) -> None:
        """Close every connection; idempotent. Closing a connection frees its lock at once."""
        if self._closed:
            return
        self._closed = True
        for blocked in list(self._blocked):  # waiters: out of the server's queue
            try:
                await blocked.cancel_safe(timeout=self.timeouts.connect)
            except Exception:  # it finished meanwhile, or the server is gone
                pass
        with self._mutex:
            conns = [held.conn for held in self._held.values()]
            self._held.clear()
        await self._pool.close()
        for conn in conns:
            await self._drop(conn)

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: also forget the locks inherited from
        the parent (they live on the parent's connections and stay the parent's)."""
        super().after_fork()
        forks.keep(self._held, self._blocked)
        self._held = {}
        self._blocked = set()
