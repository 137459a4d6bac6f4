"""In-process wake-ups for backends that poll across processes (SQLite, MySQL/MariaDB).

Shared by a backend's sync and async twins and by every instance on the same store, so a
release anywhere in this process wakes a waiter at once: a thread's ``threading.Event.set`` or
a task's thread-safe ``loop.call_soon_threadsafe(event.set)``. Waiters in other processes are
not reachable: they poll.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from . import forks

__all__ = ["LocalWaiters"]


class LocalWaiters:
    """Waiters per key, woken one at a time in registration order."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queues: dict[Hashable, OrderedDict[int, tuple[str, Callable[[], None]]]] = {}
        forks.register(self)

    def _after_fork(self) -> None:
        """In a child process right after ``fork()``: the parent's waiters are not here."""
        self._mutex = threading.Lock()
        self._queues = {}

    def add(self, key: Hashable, wake: Callable[[], None], owner: str = "") -> int:
        """Register ``wake`` (called at most once); returns a ticket for :meth:`remove`."""
        with self._mutex:
            ticket = id(wake)
            self._queues.setdefault(key, OrderedDict())[ticket] = (owner, wake)
            return ticket

    def remove(self, key: Hashable, ticket: int) -> None:
        with self._mutex:
            queue = self._queues.get(key)
            if queue is not None:
                queue.pop(ticket, None)
                if not queue:
                    del self._queues[key]

    def notify(self, key: Hashable, prefer: Callable[[str], bool] | None = None) -> None:
        """Wake one waiter on ``key``: the first whose owner ``prefer`` accepts, else the
        longest-registered one."""
        with self._mutex:
            queue = self._queues.get(key)
            if not queue:
                return
            ticket = None
            if prefer is not None:
                ticket = next((t for t, (owner, _w) in queue.items() if prefer(owner)), None)
            if ticket is None:
                ticket = next(iter(queue))
            _owner, wake = queue.pop(ticket)
            if not queue:
                del self._queues[key]
        try:
            wake()
        except RuntimeError:  # its event loop is closed: nobody is waiting there any more
            pass

    def count(self, key: Hashable) -> int:
        with self._mutex:
            return len(self._queues.get(key, ()))
