# Generated from _core/pool_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""A minimal connection pool for the inbox's own connections (async source of ``_pool.py``).

Idle connections sit in a list (``append``/``pop`` are atomic, so threads and tasks can share
it); a connection that saw an exception is closed instead of reused, since its state is
unknown. There is no upper bound on connections in use, only on idle ones kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ConnPool"]


class ConnPool:
    def __init__(
        self,
        connect: Callable[[], Any],
        close: Callable[[Any], None],
        *,
        max_idle: int = 8,
    ) -> None:
        self._connect = connect
        self._close = close
        self._idle: list[Any] = []
        self._max_idle = max_idle
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[Any]:
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            self._discard(conn)
            raise
        if self._closed or len(self._idle) >= self._max_idle:
            self._discard(conn)
        else:
            self._idle.append(conn)

    def _discard(self, conn: Any) -> None:
        try:
            self._close(conn)
        except Exception:
            pass

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._discard(self._idle.pop())
