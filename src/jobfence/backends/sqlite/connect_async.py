"""Opening a SQLite connection the way every SQLite backend needs it: ``open_wal`` in
``connect_async.py`` (aiosqlite), and its blocking twin in ``connect.py`` (sqlite3,
generated from it).

The connection is in autocommit mode (``isolation_level=None``: the backends issue their own
``BEGIN IMMEDIATE``), in WAL mode with the backend's ``synchronous`` level, with a busy
timeout, and its schema is created by the backend's ``create(conn)``. Switching to WAL and WAL
recovery can report ``database is locked`` at once, without waiting for the busy timeout, when
several processes open a new file together: the setup is retried (with a backoff) until the
busy timeout.

``write_gate(path)`` is the lock every jobfence SQLite client of this process takes around its
operations on the database file at ``path`` (in the async flavour: of this event loop).
SQLite admits one writer at a time; the others wait in its busy handler, which sleeps (1, 2,
5, 10 ms and longer) and retries rather than queueing, so writers of one process that collide
lose milliseconds each time. Taking the gate first, they queue in order and are let in as soon
as the previous one is done; the busy handler then only waits for other processes.

``run_on(conn, fn, *args)`` runs ``fn(raw, *args)`` -- ``raw`` the sqlite3 connection itself --
as ONE call: in the async flavour one hop to aiosqlite's thread for the connection and back,
however many statements ``fn`` runs (each aiosqlite call, ``execute``, ``fetchone``,
``close``, is a hop of its own: a queue put, a thread wake-up, a result posted back to the
event loop). So the backends write each operation once, as a plain function over a sqlite3
connection, and both flavours run it whole; ``transaction`` wraps one in ``BEGIN IMMEDIATE``
... ``COMMIT``, rolled back on any failure. aiosqlite has no public way to run a callable on
its thread: ``run_on`` uses ``Connection._execute`` and ``Connection._conn``, the same in every
aiosqlite release ``pyproject.toml`` admits (tests/unit/test_sqlite_run_on.py checks them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiosqlite

from ..._core import acompat
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC

if ASYNC:
    import asyncio
    import sqlite3
    import weakref

__all__ = [
    "connect",
    "count_rows",
    "fetch_all",
    "open_wal",
    "rollback_quietly",
    "run_in_transaction",
    "run_on",
    "run_unless",
    "transaction",
    "wal_mode",
    "write_gate",
]

P = ParamSpec("P")
T = TypeVar("T")

if ASYNC:
    #: the gates by event loop, then by the database file's real path
    _GATES: Any = weakref.WeakKeyDictionary()
else:
    #: the gates by the database file's real path
    _GATES: Any = {}
_GATES_MUTEX = threading.Lock()


def write_gate(real_path: str) -> acompat.Lock:
    """The lock this process's jobfence SQLite clients take around their operations on the
    file at ``real_path`` (``os.path.realpath`` of the database path; async: one per event
    loop, so call it inside the loop)."""
    with _GATES_MUTEX:
        if ASYNC:
            gates = _GATES.get(asyncio.get_running_loop())
            if gates is None:
                gates = _GATES[asyncio.get_running_loop()] = {}
        else:
            gates = _GATES
        gate: acompat.Lock | None = gates.get(real_path)
        if gate is None:
            gate = gates[real_path] = acompat.Lock()
        return gate


def _forget_gates() -> None:
    """In a child process right after ``fork()``: a gate held by a parent's thread would
    never be released here; the child starts with none."""
    global _GATES_MUTEX
    _GATES_MUTEX = threading.Lock()
    _GATES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_gates)


async def connect(path: str, busy_timeout: float) -> aiosqlite.Connection:
    """A new autocommit connection to ``path`` that any thread may use."""
    pending = aiosqlite.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    if ASYNC:
        # aiosqlite runs the connection in a non-daemon thread: an unclosed client must not
        # keep the interpreter from exiting (SQLite is crash-safe either way).
        thread = getattr(pending, "_thread", None)
        if isinstance(thread, threading.Thread) and not thread.is_alive():
            thread.daemon = True
    return await pending


async def run_on(
    conn: aiosqlite.Connection,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``fn(raw, *args, **kwargs)``, ``raw`` being the sqlite3 connection of ``conn``, in one
    call (async: ONE hop to the connection's thread, where ``fn`` runs whole).

    Async: a caller cancelled while ``fn`` runs gets its ``CancelledError`` only once ``fn``
    has finished on the connection's thread (``fn`` itself is never cut off), so a caller
    holding the write gate holds it until the connection is idle again, and never leaves a
    transaction open behind it: every ``fn`` ends the transactions it begins."""
    if ASYNC:
        return await _hop(conn, None, fn, *args, **kwargs)  # type: ignore[no-any-return]
    else:
        return fn(conn, *args, **kwargs)


async def run_in_transaction(
    conn: aiosqlite.Connection,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """:func:`run_on` of ``fn`` inside one ``BEGIN IMMEDIATE`` transaction: committed when
    ``fn`` returns, rolled back when anything fails -- and, async, when the caller was
    cancelled before the ``COMMIT``: a cancelled operation takes effect only if its
    cancellation came as it committed."""
    return await run_unless(conn, None, fn, *args, **kwargs)


async def run_unless(
    conn: aiosqlite.Connection,
    first: Callable[[sqlite3.Connection], T | None] | None,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """:func:`run_in_transaction`, after ``first(raw)`` (one autocommit statement: the
    uncontended case of the operation) in the same call: its result when it is not ``None``,
    else that of ``fn`` in its transaction. ``first`` is not run for a caller already gone
    (async: cancelled before the call reached the connection's thread)."""
    if ASYNC:
        abandoned: list[bool] = []
        return await _hop(conn, abandoned, _transaction, abandoned, first, fn, args, kwargs)  # type: ignore[no-any-return]
    else:
        return _transaction(conn, [], first, fn, args, kwargs)


if ASYNC:

    async def _hop(
        conn: aiosqlite.Connection, abandoned: list[bool] | None, fn: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """``fn(raw, *args, **kwargs)`` on the connection's thread. Cancelled: mark the call
        ``abandoned`` (if given), then wait for it to end before raising."""
        try:
            return await conn._execute(fn, conn._conn, *args, **kwargs)  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            if abandoned is not None:
                abandoned.append(True)  # read by the call on the connection's thread
            # aiosqlite runs its calls one at a time, in order: once a call queued now has
            # run, so has fn
            try:
                await conn._execute(_nothing)  # type: ignore[no-untyped-call]
            except ValueError:  # the connection was closed: nothing runs on it any more
                pass
            raise

    def _nothing() -> None:
        pass


def transaction(
    raw: sqlite3.Connection,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``fn(raw, *args, **kwargs)`` in one ``BEGIN IMMEDIATE`` transaction: committed when it
    returns, rolled back when anything fails."""
    return _transaction(raw, [], None, fn, args, kwargs)


def _transaction(
    raw: sqlite3.Connection,
    abandoned: list[bool],
    first: Callable[[sqlite3.Connection], T | None] | None,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """:func:`transaction`, after ``first`` (see :func:`run_unless`); rolled back instead of
    committed once ``abandoned`` is not empty (its caller is gone)."""
    if first is not None and not abandoned:
        done = first(raw)
        if done is not None:
            return done
    try:
        # inside the try: an interrupted BEGIN (sync: KeyboardInterrupt) may still have run,
        # and the ROLLBACK must end that transaction
        raw.execute("BEGIN IMMEDIATE")
        result = fn(raw, *args, **kwargs)
        raw.execute("ROLLBACK" if abandoned else "COMMIT")
    except BaseException:
        rollback_quietly(raw)
        raise
    return result


def fetch_all(raw: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    """Run one statement and read all its rows: no half-read statement is left open (a read
    would hold an old snapshot, a write its transaction)."""
    return raw.execute(sql, params).fetchall()


def count_rows(raw: sqlite3.Connection, sql: str, params: Any) -> int:
    """Run one statement; the number of rows it changed."""
    cursor = raw.execute(sql, params)
    try:
        return int(cursor.rowcount)
    finally:
        cursor.close()


def rollback_quietly(raw: sqlite3.Connection) -> None:
    """``ROLLBACK``, ignoring the error when no transaction is open (it failed to start, or
    already ended)."""
    try:
        raw.execute("ROLLBACK")
    except Exception:
        pass


def wal_mode(raw: sqlite3.Connection) -> None:
    """Switch the file to WAL mode unless it is in it already (that takes no lock)."""
    row = raw.execute("PRAGMA journal_mode").fetchone()
    if row is None or str(row[0]).lower() != "wal":
        raw.execute("PRAGMA journal_mode=WAL")


async def open_wal(
    path: str,
    busy_timeout: float,
    synchronous: str | None = None,
    create: Callable[[sqlite3.Connection], None] | None = None,
) -> aiosqlite.Connection:
    """A new connection to ``path`` for any part (locks, inbox, queue): the file in WAL
    mode, ``PRAGMA synchronous`` set (unless None) and the part's schema made
    (``create(raw)``, run with :func:`run_on`, unless None); a file busy meanwhile is tried
    again until ``busy_timeout``. Closed again on failure."""
    conn = await connect(path, busy_timeout)
    try:
        clock = get_clock()
        deadline = clock.monotonic() + busy_timeout
        delay = 0.005
        while True:
            try:
                await run_on(conn, _setup, synchronous, create)
                return conn
            except aiosqlite.OperationalError as exc:
                message = str(exc).lower()
                if ("locked" not in message and "busy" not in message) or (
                    clock.monotonic() + delay > deadline
                ):
                    raise
            await clock.asleep(delay)
            delay = min(delay * 2, 0.1)
    except BaseException:
        await conn.close()
        raise


def _setup(
    raw: sqlite3.Connection,
    synchronous: str | None,
    create: Callable[[sqlite3.Connection], None] | None,
) -> None:
    wal_mode(raw)
    if synchronous is not None:
        raw.execute(f"PRAGMA synchronous={synchronous}")
    if create is not None:
        create(raw)
