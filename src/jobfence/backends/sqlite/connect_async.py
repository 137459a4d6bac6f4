"""Opening a SQLite connection the way every SQLite backend needs it: ``open_wal`` in
``connect_async.py`` (aiosqlite), and its blocking twin in ``connect.py`` (sqlite3,
generated from it).

The connection is in autocommit mode (``isolation_level=None``: the backends issue their own
``BEGIN IMMEDIATE``), in WAL mode with the backend's ``synchronous`` level, with a busy
timeout, and its schema is created by the backend's ``create(conn)``. Switching to WAL and WAL
recovery can report ``database is locked`` at once, without waiting for the busy timeout, when
several processes open a new file together: the setup is retried (with a backoff) until the
busy timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiosqlite

from ..._core.clock import get_clock
from ..._core.flavour import ASYNC

if ASYNC:
    import threading

__all__ = ["connect", "open_wal", "rollback_quietly"]


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
