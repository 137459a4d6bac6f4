"""Deadlines for requests on a driver that has none of its own (psycopg's ``execute``).

A :class:`SocketGuard` watches one request on one connection. If the request is still running
when its deadline passes, the guard shuts the connection's socket down (both directions; the
file descriptor stays open, owned by the driver): the blocked call wakes at once and fails
with the driver's "connection lost" error, whatever the link does -- a stalled proxy, a dead
peer, a server that never answers -- and the connection is broken for good, so its owner closes
it instead of returning it to a pool in an unknown state.

Hand-written for both flavours: :func:`guard_async` arms the guard on the running event loop
(``loop.call_later``); :func:`guard` on one process-wide watchdog thread, for blocking calls.
Deadlines run on the real monotonic clock, not jobfence's clock: they bound real network waits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any

__all__ = ["SocketGuard", "guard", "guard_async"]

_ARMED, _FIRED, _DONE = 0, 1, 2


def _shutdown(fd: int) -> None:
    """Shut the socket ``fd`` down in both directions without closing ``fd`` (its owner will)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:  # already closed
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected any more
        pass
    finally:
        sock.close()  # closes our duplicate only


class SocketGuard:
    """Shuts ``fd`` down once ``seconds`` pass, unless :meth:`done` came first."""

    __slots__ = ("_handle", "_mutex", "_state", "fd", "seconds")

    def __init__(self, fd: int, seconds: float) -> None:
        self.fd = fd
        self.seconds = seconds
        self._mutex = threading.Lock()  # the watchdog thread fires while the caller may finish
        self._state = _ARMED
        self._handle: Any = None

    def fire(self) -> None:
        """The deadline passed: shut the socket down if the request is still running."""
        with self._mutex:
            if self._state != _ARMED:
                return
            self._state = _FIRED
            _shutdown(self.fd)

    def done(self) -> bool:
        """The request finished (or failed): disarm. Returns whether the guard had fired (then
        the connection is broken, even if the request's reply arrived). After this returns,
        the guard never touches the socket again."""
        with self._mutex:
            fired = self._state == _FIRED
            self._state = _DONE
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        return fired

    @property
    def fired(self) -> bool:
        return self._state == _FIRED


def guard_async(fd: int, seconds: float) -> SocketGuard:
    """A guard on the running event loop (for a request awaited on that loop)."""
    guard_ = SocketGuard(fd, seconds)
    guard_._handle = asyncio.get_running_loop().call_later(seconds, guard_.fire)
    return guard_


def guard(fd: int, seconds: float) -> SocketGuard:
    """A guard on the watchdog thread (for a blocking request)."""
    guard_ = SocketGuard(fd, seconds)
    _WATCHDOG.arm(guard_, time.monotonic() + seconds)
    return guard_


class _Watchdog:
    """One daemon thread firing the guards of blocking requests when their deadlines pass.

    Guards that were disarmed stay in the heap until their deadline and are then dropped.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, SocketGuard]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, guard_: SocketGuard, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), guard_))
            if self._thread is None or not self._thread.is_alive():  # also after a fork
                self._thread = threading.Thread(
                    target=self._run, name="jobfence-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is guard_:
                self._cond.notify()  # the earliest deadline now: wake up sooner

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, first = self._heap[0]
                    if first._state != _ARMED:
                        heapq.heappop(self._heap)
                        continue
                    wait = due - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    heapq.heappop(self._heap)
                    break
            first.fire()


_WATCHDOG = _Watchdog()
