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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from ..._core import acompat
from ..._core.clock import get_clock
from ..._core.flavour import ASYNC

if ASYNC:
    import asyncio
    import weakref

__all__ = ["connect", "open_wal", "rollback_quietly", "write_gate"]

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


async def open_wal(
    path: str,
    busy_timeout: float,
    synchronous: str,
    create: Callable[[aiosqlite.Connection], Awaitable[None]],
) -> aiosqlite.Connection:
    """A new connection to ``path``, set up and with its schema (closed again on failure)."""
    conn = await connect(path, busy_timeout)
    try:
        clock = get_clock()
        deadline = clock.monotonic() + busy_timeout
        delay = 0.005
        while True:
            try:
                await _setup(conn, synchronous, create)
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


async def _setup(
    conn: aiosqlite.Connection,
    synchronous: str,
    create: Callable[[aiosqlite.Connection], Awaitable[None]],
) -> None:
    cursor = await conn.execute("PRAGMA journal_mode")
    row = await cursor.fetchone()
    await cursor.close()
    if row is None or str(row[0]).lower() != "wal":
        await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute(f"PRAGMA synchronous={synchronous}")
    await create(conn)


async def rollback_quietly(conn: aiosqlite.Connection) -> None:
    """``ROLLBACK``, ignoring the error when no transaction is open (it failed to start, or
    already ended)."""
    try:
        await conn.execute("ROLLBACK")
    except Exception:
        pass
