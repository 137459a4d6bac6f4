# Generated from _core/pool_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The idle-connection pool of one client (``pool_async.py``; ``pool.py`` is
generated from it).

Every part of a server that opens its own connections -- the PostgreSQL locks and inbox, the
MySQL/MariaDB and SQLite inboxes -- keeps them in one of these, one pool per client instance
(two clients never share connections). Idle connections sit in a list guarded by a lock that
is never held across I/O, so threads and tasks can share a pool; ``pool_size`` bounds the idle
ones kept, not the ones in use.

A connection goes back to the idle list only if it is usable: ``reusable(conn)`` (when given)
says so, e.g. "open, and not inside a transaction" for psycopg. Without ``reusable``, a
connection that saw an exception is closed instead of reused, since its state is unknown. A
pool given ``put`` hands usable connections to it instead (the caller's own pool, see
``source_async.py``). A caller that must keep a connection to itself (a PostgreSQL session
advisory lock lives on its connection) takes it with :meth:`take` and gives it back, if
ever, with :meth:`give`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import forks
from .options import option_pool_size

__all__ = ["DEFAULT_POOL_SIZE", "ConnPool"]

DEFAULT_POOL_SIZE = 8


class ConnPool:
    def __init__(
        self,
        connect: Callable[[], Any],
        close: Callable[[Any], None],
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        reusable: Callable[[Any], bool] | None = None,
        put: Callable[[Any], None] | None = None,
        loop_bound: bool = False,
    ) -> None:
        self._connect = connect
        #: where a usable connection goes back to instead of the idle list: the caller's own
        #: pool, when the connections come from it (nothing is kept idle here then)
        self._put = put
        self._close = close
        self._reusable = reusable
        self._idle: list[Any] = []
        self._mutex = threading.Lock()  # guards _idle (never held across I/O)
        self.pool_size = pool_size
        self.closed = False

    @classmethod
    def configured(
        cls,
        connect: Callable[[], Any],
        close: Callable[[Any], None],
        options: Mapping[str, Any],
        url_options: Mapping[str, Any],
        default: int,
        reusable: Callable[[Any], bool] | None = None,
        put: Callable[[Any], None] | None = None,
        loop_bound: bool = False,
    ) -> ConnPool:
        """A pool whose size is the ``pool_size`` option (keywords, then the URL), else
        ``default``."""
        return cls(
            connect,
            close,
            pool_size=option_pool_size(options, url_options, default),
            reusable=reusable,
            put=put,
            loop_bound=loop_bound,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} idle={len(self._idle)} pool_size={self.pool_size}>"

    def _usable(self, conn: Any) -> bool:
        return self._reusable is None or self._reusable(conn)

    def ready(self) -> bool:
        """Whether an idle usable connection is at hand: the next :meth:`take` needs no
        connect (unless another caller takes it first)."""
        with self._mutex:
            conn = self._idle[-1] if self._idle else None
        return conn is not None and self._usable(conn)

    def take(self) -> Any:
        """An idle usable connection, or a new one."""
        while True:
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if self._usable(conn):
                return conn
            self.discard(conn)

    def give(self, conn: Any) -> None:
        """Return ``conn`` to the idle list if it is usable and there is room, else close it."""
        if self._put is not None and self._usable(conn):
            self._put(conn)
            return
        if not self.closed and self._usable(conn):
            with self._mutex:
                if len(self._idle) < self.pool_size:
                    self._idle.append(conn)
                    return
        self.discard(conn)

    def discard(self, conn: Any) -> None:
        """Close ``conn`` (it may be broken already)."""
        try:
            self._close(conn)
        except Exception:  # already broken: nothing left to close
            pass

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for the block, returned to the pool afterwards."""
        conn = self.take()
        try:
            yield conn
        except BaseException:
            if self._reusable is None:
                self.discard(conn)
            else:
                self.give(conn)  # kept only if it is still usable
            raise
        self.give(conn)

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the idle connections inherited
        from the parent, without closing them (:func:`jobfence._core.forks.keep`), so the
        child opens its own. Connections the parent had in use never come back here."""
        forks.keep(self._idle)
        self._idle = []
        self._mutex = threading.Lock()

    def close(self) -> None:
        """Close the idle connections; connections in use are closed when given back."""
        self.closed = True
        with self._mutex:
            idle, self._idle = self._idle, []
        for conn in idle:
            self.discard(conn)
