# Generated from backends/sqlite/connect_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
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
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..._core import compat
from ..._core.clock import get_clock

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

#: the gates by the database file's real path
_GATES: Any = {}
_GATES_MUTEX = threading.Lock()


def write_gate(real_path: str) -> compat.Lock:
    """The lock this process's jobfence SQLite clients take around their operations on the
    file at ``real_path`` (``os.path.realpath`` of the database path; async: one per event
    loop, so call it inside the loop)."""
    with _GATES_MUTEX:
        gates = _GATES
        gate: compat.Lock | None = gates.get(real_path)
        if gate is None:
            gate = gates[real_path] = compat.Lock()
        return gate


def _forget_gates() -> None:
    """In a child process right after ``fork()``: a gate held by a parent's thread would
    never be released here; the child starts with none."""
    global _GATES_MUTEX
    _GATES_MUTEX = threading.Lock()
    _GATES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_gates)


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A new autocommit connection to ``path`` that any thread may use."""
    pending = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    return pending


def run_on(
    conn: sqlite3.Connection,
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
    return fn(conn, *args, **kwargs)


def run_in_transaction(
    conn: sqlite3.Connection,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """:func:`run_on` of ``fn`` inside one ``BEGIN IMMEDIATE`` transaction: committed when
    ``fn`` returns, rolled back when anything fails -- and, async, when the caller was
    cancelled before the ``COMMIT``: a cancelled operation takes effect only if its
    cancellation came as it committed."""
    return run_unless(conn, None, fn, *args, **kwargs)


def run_unless(
    conn: sqlite3.Connection,
    first: Callable[[sqlite3.Connection], T | None] | None,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """:func:`run_in_transaction`, after ``first(raw)`` (one autocommit statement: the
    uncontended case of the operation) in the same call: its result when it is not ``None``,
    else that of ``fn`` in its transaction. ``first`` is not run for a caller already gone
    (async: cancelled before the call reached the connection's thread)."""
    return _transaction(conn, [], first, fn, args, kwargs)


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


def open_wal(
    path: str,
    busy_timeout: float,
    synchronous: str | None = None,
    create: Callable[[sqlite3.Connection], None] | None = None,
) -> sqlite3.Connection:
    """A new connection to ``path`` for any part (locks, inbox, queue): the file in WAL
    mode, ``PRAGMA synchronous`` set (unless None) and the part's schema made
    (``create(raw)``, run with :func:`run_on`, unless None); a file busy meanwhile is tried
    again until ``busy_timeout``. Closed again on failure."""
    conn = connect(path, busy_timeout)
    try:
        clock = get_clock()
        deadline = clock.monotonic() + busy_timeout
        delay = 0.005
        while True:
            try:
                run_on(conn, _setup, synchronous, create)
                return conn
            except sqlite3.OperationalError as exc:
                message = str(exc).lower()
                if ("locked" not in message and "busy" not in message) or (
                    clock.monotonic() + delay > deadline
                ):
                    raise
            clock.sleep(delay)
            delay = min(delay * 2, 0.1)
    except BaseException:
        conn.close()
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
