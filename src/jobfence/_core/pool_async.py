"""A minimal connection pool for the inbox's own connections (async source of ``_pool.py``).

Idle connections sit in a list (``append``/``pop`` are atomic, so threads and tasks can share
it); a connection that saw an exception is closed instead of reused, since its state is
unknown. There is no upper bound on connections in use, only on idle ones kept.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["AsyncConnPool"]


class AsyncConnPool:
    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        close: Callable[[Any], Awaitable[None]],
        *,
        max_idle: int = 8,
    ) -> None:
        self._connect = connect
        self._close = close
        self._idle: list[Any] = []
        self._max_idle = max_idle
        self._closed = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = await self._connect()
        try:
            yield conn
        except BaseException:
            await self._discard(conn)
            raise
        if self._closed or len(self._idle) >= self._max_idle:
            await self._discard(conn)
        else:
            self._idle.append(conn)

    async def _discard(self, conn: Any) -> None:
        try:
            await self._close(conn)
        except Exception:
            pass

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await self._discard(self._idle.pop())
