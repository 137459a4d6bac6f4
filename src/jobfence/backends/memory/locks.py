"""``memory://`` -- an in-process lock backend for tests and the testing toolkit.

It passes the same conformance suite as the server backends: fair FIFO hand-off, TTL expiry
measured by jobfence's clock (so a virtual clock drives it), strictly increasing tokens, each
floored at the clock's ``time()`` in microseconds as on the servers. Sync and async clients of
the same URL and namespace in one process share one store. ``memory://name`` selects a
separate store, and so does another ``namespace``; stores live as long as the process. Unknown
options are refused, as on every backend.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..._core.clock import get_clock
from ..._core.options import reject_unknown
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ..base import AsyncLockBackend, LockBackend, LockCapabilities, LockHolder
from . import NAMESPACE_LIMIT

__all__ = ["AsyncMemoryLockBackend", "MemoryLockBackend", "MemoryStore", "get_store"]

_WAITER_SLACK = 1.0

_F = TypeVar("_F", bound=Callable[..., Any])


def _at_once(method: _F) -> _F:
    """Mark an async method that answers without ever waiting (``answers_at_once``): no
    cancellation can cut it off halfway, so its caller needs no task of its own to shield it.
    A subclass that overrides the method (and may wait) does not inherit the mark."""
    method.answers_at_once = True  # type: ignore[attr-defined]
    return method


@dataclass
class _Lease:
    owner: str
    token: int
    expires: float


@dataclass
class _Waiter:
    owner: str
    ttl: float
    deadline: float
    granted: int | None = None
    wakers: list[Callable[[], None]] = field(default_factory=list)


class MemoryStore:
    """The shared state of one ``memory://`` URL. Every method is atomic under one lock."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.leases: dict[str, _Lease] = {}
        self.tokens: dict[str, int] = {}
        self.queues: dict[str, OrderedDict[str, _Waiter]] = {}

    # -- helpers, called with the mutex held -------------------------------------------
    def _live(self, name: str, now: float) -> _Lease | None:
        lease = self.leases.get(name)
        if lease is not None and lease.expires <= now:
            del self.leases[name]
            return None
        return lease

    def _grant(self, name: str, owner: str, ttl: float, now: float) -> int:
        # floored at the clock in microseconds, like every backend: above every token handed
        # out before, even one from a store that was replaced or cleared
        token = max(self.tokens.get(name, 0) + 1, int(get_clock().time() * 1_000_000))
        self.tokens[name] = token
        self.leases[name] = _Lease(owner, token, now + ttl)
        return token

    def _head(self, name: str, now: float) -> _Waiter | None:
        queue = self.queues.get(name)
        while queue:
            owner, waiter = next(iter(queue.items()))
            if waiter.deadline > now:
                return waiter
            del queue[owner]
        if queue is not None and not queue:
            del self.queues[name]
        return None

    def _waiter(self, name: str, owner: str) -> _Waiter | None:
        queue = self.queues.get(name)
        return None if queue is None else queue.get(owner)

    def _hand_off(self, name: str, now: float) -> bool:
        head = self._head(name, now)
        if head is None:
            return False
        del self.queues[name][head.owner]
        head.granted = self._grant(name, head.owner, head.ttl, now)
        for wake in head.wakers:
            wake()
        head.wakers.clear()
        return True

    # -- operations --------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float, wait: float | None) -> int | None:
        now = get_clock().monotonic()
        with self.mutex:
            lease = self._live(name, now)
            if lease is not None and lease.owner == owner:
                return lease.token
            if lease is None:
                head = self._head(name, now)
                if head is None or head.owner == owner:
                    if head is not None:
                        del self.queues[name][owner]
                    return self._grant(name, owner, ttl, now)
                self._hand_off(name, now)  # an expired lease: the queue's head goes first
            if wait is not None:
                queue = self.queues.setdefault(name, OrderedDict())
                waiter = queue.get(owner)
                deadline = now + wait + _WAITER_SLACK
                if waiter is None:
                    queue[owner] = _Waiter(owner, ttl, deadline)
                else:
                    waiter.deadline = deadline
            return None

    def prepare_wait(
        self, name: str, owner: str, timeout: float, wake: Callable[[], None]
    ) -> tuple[int | None, float]:
        """Register ``wake``; return (token if already granted, how long to wait at most).

        The wait ends at a hand-off, a release, a :meth:`cancel_wait` (each calls ``wake``) or
        the holder's expiry, whichever comes first, and never past ``timeout``: nothing else
        can change for the waiter, so a long ``timeout`` loses no wake-up (and a virtual clock
        jumps straight to the expiry). The waiter's place in the queue lasts as long as the
        wait. A waiter not in the queue (it lapsed) waits not at all: it queues again first.
        """
        now = get_clock().monotonic()
        with self.mutex:
            lease = self._live(name, now)
            if lease is not None and lease.owner == owner:
                return lease.token, 0.0
            if lease is None:
                return None, 0.0
            waiter = self._waiter(name, owner)
            if waiter is None:
                return None, 0.0
            waiter.wakers.append(wake)
            limit = max(0.0, min(timeout, lease.expires - now))
            waiter.deadline = max(waiter.deadline, now + limit + _WAITER_SLACK)
            return None, limit

    def finish_wait(self, name: str, owner: str, wake: Callable[[], None]) -> int | None:
        now = get_clock().monotonic()
        with self.mutex:
            waiter = self._waiter(name, owner)
            if waiter is not None and wake in waiter.wakers:
                waiter.wakers.remove(wake)
            lease = self._live(name, now)
            if lease is not None and lease.owner == owner:
                return lease.token
            return None

    def cancel_wait(self, name: str, owner: str) -> int | None:
        now = get_clock().monotonic()
        with self.mutex:
            queue = self.queues.get(name)
            if queue is not None:
                waiter = queue.pop(owner, None)
                if not queue:
                    del self.queues[name]
                if waiter is not None:  # a wait of this owner still going on ends now
                    for wake in waiter.wakers:
                        wake()
                    waiter.wakers.clear()
            lease = self._live(name, now)
            return lease.token if lease is not None and lease.owner == owner else None

    def release(self, name: str, owner: str) -> bool:
        now = get_clock().monotonic()
        with self.mutex:
            lease = self._live(name, now)
            if lease is None or lease.owner != owner:
                return False
            del self.leases[name]
            self._hand_off(name, now)
            return True

    def extend(self, name: str, owner: str, ttl: float) -> bool:
        now = get_clock().monotonic()
        with self.mutex:
            lease = self._live(name, now)
            if lease is None or lease.owner != owner:
                return False
            lease.expires = now + ttl
            return True

    def holder(self, name: str) -> LockHolder | None:
        """Who holds ``name`` now: (owner, token, seconds left by jobfence's clock)."""
        now = get_clock().monotonic()
        with self.mutex:
            lease = self._live(name, now)
            if lease is None:
                return None
            return LockHolder(lease.owner, lease.token, lease.expires - now)

    def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """The live leases whose names start with ``prefix``, by name, at most ``limit``."""
        now = get_clock().monotonic()
        with self.mutex:
            found = []
            for name in sorted(n for n in self.leases if n.startswith(prefix)):
                lease = self._live(name, now)
                if lease is not None:
                    found.append((name, LockHolder(lease.owner, lease.token, lease.expires - now)))
                    if len(found) >= limit:
                        break
            return found

    def force_release(self, name: str) -> bool:
        """Drop a lease behind its holder's back (admin; tests of lost-lease detection)."""
        now = get_clock().monotonic()
        with self.mutex:
            if self._live(name, now) is None:
                return False
            del self.leases[name]
            self._hand_off(name, now)
            return True


_stores: dict[str, MemoryStore] = {}
_stores_mutex = threading.Lock()


def get_store(key: str = "") -> MemoryStore:
    with _stores_mutex:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = MemoryStore()
        return store


def _store_key(url: BackendURL) -> str:
    return (url.host or "") + url.path


def _open_store(url: BackendURL, options: dict[str, Any]) -> MemoryStore:
    """The store of the URL and namespace. Like every backend, it refuses an option it does
    not know (keyword or URL query); the namespace is checked like Redis's (a key prefix)
    and separates the locks of one URL as it does on the servers."""
    reject_unknown(url.options, (), "memory lock URL")
    reject_unknown(options, ("namespace",), "memory lock")
    namespace = check_namespace(
        options.get("namespace", "jobfence"),
        limit=NAMESPACE_LIMIT,
        backend="memory",
        identifier=False,
    )
    return get_store(f"{_store_key(url)}\x00{namespace}")


_CAPS = LockCapabilities(
    cross_process=False,
    ttl_expiry=True,
    fifo=True,
    handoff=True,
    tokens_survive_data_loss=True,
    wait_ends_on_change=True,
)


class MemoryLockBackend(LockBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, **options: Any) -> None:
        self.store = _open_store(url, options)

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        return self.store.acquire(name, owner, ttl, wait)

    def wait(self, name: str, owner: str, timeout: float) -> int | None:
        event = threading.Event()
        token, limit = self.store.prepare_wait(name, owner, timeout, event.set)
        if token is not None or limit <= 0:
            return token
        get_clock().wait(event, limit)
        return self.store.finish_wait(name, owner, event.set)

    def cancel_wait(self, name: str, owner: str) -> int | None:
        return self.store.cancel_wait(name, owner)

    def release(self, name: str, owner: str) -> bool:
        return self.store.release(name, owner)

    def extend(self, name: str, owner: str, ttl: float) -> bool:
        return self.store.extend(name, owner, ttl)

    def force_release(self, name: str) -> bool:
        return self.store.force_release(name)

    def holder(self, name: str) -> LockHolder | None:
        return self.store.holder(name)

    def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        return self.store.holders(prefix, limit)

    def close(self) -> None:
        pass


class AsyncMemoryLockBackend(AsyncLockBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, **options: Any) -> None:
        self.store = _open_store(url, options)

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        return self.store.acquire(name, owner, ttl, wait)

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(event.set)

        token, limit = self.store.prepare_wait(name, owner, timeout, wake)
        if token is not None or limit <= 0:
            return token
        await get_clock().wait_async(event, limit)
        return self.store.finish_wait(name, owner, wake)

    async def cancel_wait(self, name: str, owner: str) -> int | None:
        return self.store.cancel_wait(name, owner)

    @_at_once
    async def release(self, name: str, owner: str) -> bool:
        return self.store.release(name, owner)

    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        return self.store.extend(name, owner, ttl)

    async def force_release(self, name: str) -> bool:
        return self.store.force_release(name)

    async def holder(self, name: str) -> LockHolder | None:
        return self.store.holder(name)

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        return self.store.holders(prefix, limit)

    async def close(self) -> None:
        pass
