"""Connections from a caller's own pool, engine or factory, for the SQL backends
(``source_async.py``; ``source.py`` is generated from it).

A backend given ``client=`` (a ``psycopg_pool`` pool, a SQLAlchemy ``Engine`` /
``AsyncEngine``, or a callable returning a psycopg connection) gets its connections from a
:class:`AsyncSource` instead of opening them:

* :meth:`AsyncSource.get` checks one out and puts it in the state the backend needs
  (autocommit: every statement of jobfence commits on its own or opens its own transaction);
* :meth:`AsyncSource.put` gives a healthy one back as it was (its autocommit setting
  restored), to be reused by the caller's code;
* :meth:`AsyncSource.discard` closes one whose state is unknown (a statement cut off, a
  session lock it may hold) and hands it back so the caller's pool replaces it.

Connections of a pool or an engine are the caller's: jobfence holds one only while it uses
it (a session-mode lock and the PostgreSQL LISTEN connection hold theirs while they last) and
never closes the pool or the engine. Connections a factory makes are jobfence's: the backend
keeps them in its own idle pool and closes them on ``close()`` (``pooled`` is False).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from ..errors import ConfigurationError
from .clients import recognise
from .flavour import ASYNC
from .sqlconn import SQLDialect

__all__ = ["AsyncSource", "open_source"]


def _is_driver(conn: object, dialect: SQLDialect) -> bool:
    wanted = dialect.drivers[_FLAVOUR]
    return any(
        cls.__module__.startswith(module) and cls.__name__ == name
        for cls in type(conn).__mro__
        for module, name in wanted
    )


class AsyncSource:
    """Where a backend's connections come from when the caller passed a client (see the
    module). ``dialect``: the backend's :class:`~.sqlconn.SQLDialect` (its drivers, how they
    switch autocommit); ``what`` names the backend in messages."""

    #: the caller's pool holds the connections (False: a factory's are the backend's)
    pooled = True

    @property
    def limit(self) -> int | None:
        """The most connections the caller's pool lends at once (``None``: no bound known).
        A pool of one has none to spare for a connection jobfence keeps (the LISTEN one)."""
        return None

    def __init__(self, client: Any, dialect: SQLDialect, what: str) -> None:
        self.client = client
        self.dialect = dialect
        self.what = what
        self._mutex = threading.Lock()
        #: id(connection) -> (its autocommit before, the handle to give it back with)
        self._out: dict[int, tuple[bool, Any]] = {}

    async def get(self) -> Any:
        """A connection of the caller's, in autocommit mode."""
        conn, handle = await self._checkout()
        if not _is_driver(conn, self.dialect):
            await self._give_back(conn, handle, broken=False)
            raise ConfigurationError(
                f"the {self.what} needs {self.dialect.driver_names[_FLAVOUR]} connections; "
                f"{self.client!r} gave a {type(conn).__module__}.{type(conn).__qualname__}",
                argument="url",
            )
        try:
            before = await self._set_autocommit(conn, True)
        except BaseException:
            await self._give_back(conn, handle, broken=True)
            raise
        with self._mutex:
            self._out[id(conn)] = (before, handle)
        return conn

    async def put(self, conn: Any) -> None:
        """Give a healthy connection back, its autocommit setting as it was."""
        with self._mutex:
            before, handle = self._out.pop(id(conn), (False, None))
        try:
            if not before:
                await self._set_autocommit(conn, False)
        except Exception:
            if handle is None:
                await self._close_quietly(conn)
            await self._give_back(conn, handle, broken=True)
            return
        await self._give_back(conn, handle, broken=False)

    async def discard(self, conn: Any) -> None:
        """Close a connection whose state is unknown and hand it back to be replaced."""
        with self._mutex:
            _before, handle = self._out.pop(id(conn), (False, None))
        if handle is None:  # an engine closes the connection it invalidates itself
            await self._close_quietly(conn)
        await self._give_back(conn, handle, broken=True)

    # -- per kind ---------------------------------------------------------------------------
    async def _checkout(self) -> tuple[Any, Any]:
        raise NotImplementedError

    async def _give_back(self, conn: Any, handle: Any, *, broken: bool) -> None:
        raise NotImplementedError

    async def _set_autocommit(self, conn: Any, on: bool) -> bool:
        """Set autocommit; return the setting before."""
        before = self.dialect.autocommit(conn)
        if before != on:
            await self.dialect.set_autocommit(conn, on)
        return before

    @staticmethod
    async def _close_quietly(conn: Any) -> None:
        try:
            if type(conn).__module__.startswith("aiomysql"):
                conn.close()  # aiomysql: close() is immediate, ensure_closed() a round trip
            else:
                await conn.close()
        except Exception:
            pass


class _PsycopgPool(AsyncSource):
    """A ``psycopg_pool.ConnectionPool`` / ``AsyncConnectionPool`` (opened by the caller)."""

    async def _checkout(self) -> tuple[Any, Any]:
        return await self.client.getconn(), None

    async def _give_back(self, conn: Any, handle: Any, *, broken: bool) -> None:
        await self.client.putconn(conn)  # the pool replaces a closed one

    @property
    def limit(self) -> int | None:
        return int(self.client.max_size)


class _Engine(AsyncSource):
    """A SQLAlchemy ``Engine`` / ``AsyncEngine``: the driver connections of its pool."""

    async def _checkout(self) -> tuple[Any, Any]:
        handle = await self.client.connect()
        try:
            if ASYNC:
                fairy = await handle.get_raw_connection()
            else:
                fairy = handle.connection
            return fairy.driver_connection, handle
        except BaseException:
            await handle.close()
            raise

    async def _give_back(self, conn: Any, handle: Any, *, broken: bool) -> None:
        if handle is None:
            return
        if broken:
            await handle.invalidate()  # the pool drops it and opens another later
        await handle.close()

    @property
    def limit(self) -> int | None:
        pool = self.client.pool
        size, overflow = getattr(pool, "size", None), getattr(pool, "_max_overflow", None)
        if not callable(size) or not isinstance(overflow, int) or overflow < 0:
            return None  # no queue pool (e.g. NullPool), or an unbounded overflow
        return int(size()) + overflow


class _Factory(AsyncSource):
    """A callable returning a new psycopg connection: the connections are the backend's."""

    pooled = False

    async def _checkout(self) -> tuple[Any, Any]:
        conn = self.client()
        if inspect.isawaitable(conn):
            if not ASYNC:
                getattr(conn, "close", lambda: None)()  # a coroutine nobody will await
                raise ConfigurationError(
                    "the connection factory of a blocking client must return a psycopg "
                    "Connection, not an awaitable: pass it to the Async class instead",
                    argument="url",
                )
            conn = await conn
        return conn, None

    async def _give_back(self, conn: Any, handle: Any, *, broken: bool) -> None:
        if broken:
            return  # closed already
        await self._close_quietly(conn)  # a factory's connection is ours to close


#: whether this module hands out asyncio connections (the generated twin: blocking ones)
_FLAVOUR = inspect.iscoroutinefunction(AsyncSource.get)


def open_source(client: Any, dialect: SQLDialect, what: str) -> AsyncSource:
    """The :class:`AsyncSource` for a caller's ``client`` (kinds as
    :func:`~jobfence._core.clients.recognise` tells them)."""
    kind = recognise(client)
    if kind is not None and kind.kind == "psycopg_pool":
        return _PsycopgPool(client, dialect, what)
    if kind is not None and kind.kind == "sqlalchemy":
        return _Engine(client, dialect, what)
    if kind is not None and kind.kind == "factory":
        return _Factory(client, dialect, what)
    raise ConfigurationError(
        f"the {what} cannot use {client!r}: pass a psycopg_pool pool, a SQLAlchemy engine "
        "or a callable returning a psycopg connection",
        argument="url",
    )
