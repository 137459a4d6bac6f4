"""The lock backend interface (async source of ``base.py``).

A backend is a small plugin chosen by URL scheme. Every method is one atomic operation on
the server (a Lua script, one SQL statement or transaction) with the owner check done there.
Names arrive validated (non-empty, <= 1024 bytes of UTF-8); ``ttl`` is in seconds, > 0.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ._types import LockCapabilities, RenewItem

__all__ = ["AsyncLockBackend"]


class AsyncLockBackend(abc.ABC):
    """Four verbs (acquire, release, extend, renew) plus waiting, and a close."""

    #: short backend name used in errors and metrics ("redis", "sqlite", ...)
    kind: str = "?"
    capabilities: LockCapabilities

    @abc.abstractmethod
    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        """One attempt to take ``name`` for ``owner``; return the fencing token or ``None``.

        ``wait`` is ``None`` for a plain try. Otherwise the caller is about to wait up to
        ``wait`` seconds: a backend with a waiter queue records ``owner`` in it (or refreshes
        its entry), so that :meth:`release` can hand the lease over.
        """

    @abc.abstractmethod
    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Block until ``name`` may be free, at most ``timeout`` seconds.

        Return a fencing token if the lease was handed to ``owner`` while it waited, else
        ``None`` (the caller then tries :meth:`acquire` again). May return early; must not
        block past ``timeout``.
        """

    @abc.abstractmethod
    async def cancel_wait(self, name: str, owner: str) -> int | None:
        """``owner`` stops waiting. Return its token if the lease was handed to it meanwhile."""

    @abc.abstractmethod
    async def release(self, name: str, owner: str) -> bool:
        """Free ``name`` if ``owner`` holds it; return whether it did."""

    @abc.abstractmethod
    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        """Set the remaining lifetime to ``ttl`` if ``owner`` holds ``name``."""

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend many leases in one round trip where the backend can; one bool per item."""
        return [await self.extend(name, owner, ttl) for name, owner, ttl in items]

    async def install(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Create the backend's tables now (idempotent). Backends without a schema do nothing;
        SQL backends also create them on first use of their own connection."""

    async def force_release(self, name: str) -> bool:
        """Administrative: drop the lease on ``name`` whoever holds it (the holder will find
        it lost at its next renewal). Used by ``jobfence locks release`` and by tests of
        lost-lease detection. Returns whether a lease was dropped."""
        raise NotImplementedError(f"{type(self).__name__} must implement force_release()")

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Leases still held are left to expire."""
