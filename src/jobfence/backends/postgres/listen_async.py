"""The LISTEN connection of a PostgreSQL client: ``AsyncListener`` in ``listen_async.py`` (a
task) and ``Listener`` in ``listen.py`` (a thread; generated from it). The lock backend uses it
to wake its waiters when a lease is released, the queue backend to wake its waiting receives
when a message is published.

One dedicated connection per client runs ``LISTEN``; every notification's payload goes to the
client's ``_wake(payload)``. If the connection cannot be opened, or is lost, the client is told
(``_wake(None)``: look again now) and its waiters poll; the listener is tried again after
``LISTEN_RETRY`` seconds.

A host class provides ``_connect()``, ``_execute(conn, sql)``, ``_drop(conn)``, optionally
``_source`` (a caller's pool the connection came from: it goes back there after
``UNLISTEN *`` instead of being closed; a pool of one connection gets no listener, since
it would keep the connection every statement needs),
``_wake(payload)``, ``_closed``, ``_listen_sql`` (its ``LISTEN`` statement) and
``_listener_label`` (for the logs and the task or thread name), and calls
:meth:`_reset_listener` in its constructor and after a fork.
"""

from __future__ import annotations

import logging
from typing import Any

from ..._core import acompat
from ..._core.clock import get_clock

__all__ = ["LISTEN_RETRY", "LISTEN_TICK", "AsyncListener"]

log = logging.getLogger("jobfence.backends.postgres")

#: the listener wakes this often to notice that its client was closed
LISTEN_TICK = 0.5
#: after the listener failed to start, waiters poll for this long before it is tried again
LISTEN_RETRY = 5.0


class AsyncListener:
    """The LISTEN connection of a client (a mixin; see the module)."""

    _closed: bool

    @property
    def _listen_sql(self) -> str:
        """The host's ``LISTEN`` statement."""
        raise NotImplementedError

    #: what the logs call the client and its fallback ("postgres LISTEN", "waiters poll")
    _listener_label: tuple[str, str] = ("postgres", "waiters poll")

    def _reset_listener(self) -> None:
        """No listener (in the constructor; in a child process after a fork)."""
        self._listener_mutex = acompat.Lock()
        self._listener: Any = None
        self._listener_conn: Any = None
        self._listener_up = False
        self._listener_retry_at = 0.0

    def _listening(self) -> bool:
        """Is the LISTEN connection up (and its task/thread alive, e.g. not on a closed loop)?"""
        return self._listener_up and acompat.worker_alive(self._listener)

    async def _ensure_listener(self) -> None:
        """Start the LISTEN connection unless it runs; on failure, waiters poll for a while."""
        if self._listening():
            return
        clock = get_clock()
        if self._closed or clock.monotonic() < self._listener_retry_at:
            return
        source = getattr(self, "_source", None)
        limit = source.limit if source is not None and source.pooled else None
        if limit is not None and limit < 2:
            return  # the caller's pool lends one connection: LISTEN would keep it; waiters poll
        who, fallback = self._listener_label
        async with self._listener_mutex:
            if self._listening():
                return
            try:
                conn = await self._connect()  # type: ignore[attr-defined]
            except Exception as exc:
                self._listener_retry_at = clock.monotonic() + LISTEN_RETRY
                log.warning("%s LISTEN connection failed (%s): %s", who, fallback, exc)
                return
            try:
                await self._execute(conn, self._listen_sql)  # type: ignore[attr-defined]
            except Exception as exc:
                await self._drop(conn)  # type: ignore[attr-defined]
                self._listener_retry_at = clock.monotonic() + LISTEN_RETRY
                log.warning("%s LISTEN failed (%s): %s", who, fallback, exc)
                return
            self._listener_conn = conn
            self._listener_up = True
            name = "jobfence-" + who.replace(" ", "-") + "-listener"
            self._listener = acompat.spawn(lambda: self._listen(conn), name)

    async def _listen(self, conn: Any) -> None:
        who, fallback = self._listener_label
        try:
            while not self._closed:
                async for note in conn.notifies(timeout=LISTEN_TICK):
                    self._wake(note.payload)  # type: ignore[attr-defined]
        except Exception as exc:
            if not self._closed:
                log.warning("%s LISTEN connection lost (%s): %s", who, fallback, exc)
        finally:
            self._listener_up = False
            self._wake(None)  # type: ignore[attr-defined]  # every waiter looks again now
            await self._release_listener(conn)

    async def _release_listener(self, conn: Any) -> None:
        """Close the LISTEN connection; one of a caller's pool goes back to it without the
        LISTEN (closed, to be replaced, if that fails)."""
        source = getattr(self, "_source", None)
        if source is not None and source.pooled and not conn.closed:
            try:
                await conn.execute("UNLISTEN *")
            except Exception:
                pass
            else:
                await source.put(conn)
                return
        await self._drop(conn)  # type: ignore[attr-defined]
