"""redis-py's ``Lock`` over a jobfence lease: :class:`Lock` here is the one of
:mod:`jobfence.compat.redis_py.asyncio` (for ``redis.asyncio.Redis``); ``lock.py``, generated
from this module by ``tools/async_to_sync.py``, holds the one of :mod:`jobfence.compat.redis_py`
(for ``redis.Redis``). What the lock does and how it differs from redis-py's is described
there.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from redis.exceptions import LockError, LockNotOwnedError

from ..._core.flavour import ASYNC
from ...errors import LockLost, LockTimeout
from ._shared import (
    DEFAULT_LEASE_TTL,
    as_bytes,
    client_for,
    lock_name,
    locks_timeout,
    locks_ttl,
    new_local,
    owner_id,
    stored_value,
    take_clients,
)

__all__ = ["DEFAULT_LEASE_TTL", "Lock", "LockError", "LockNotOwnedError", "close_locks"]

log = logging.getLogger("jobfence.compat.redis_py")


class Lock:
    """redis-py's ``Lock`` over a jobfence lease, for a ``redis.Redis`` (the sync class) or a
    ``redis.asyncio.Redis`` (the asyncio one), also ``RedisCluster``: give names a hash tag, as
    in ``"{orders}:lock"``.

    ``timeout``: the lock's lifetime in seconds (it expires unless extended), or ``None``
    for a lock held until released (a lease renewed by jobfence while the process lives).
    ``sleep``: the longest a waiter goes without looking again when no hand-off wakes it.
    ``blocking`` / ``blocking_timeout``: whether, and how long, :meth:`acquire` waits by
    default. ``thread_local``: the token is kept per thread (redis-py's default).
    ``raise_on_release_error``: leaving a ``with`` block raises if the lock was no longer
    held. ``lease_ttl``: the renewed lease of a lock without ``timeout``.
    """

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        self.redis = redis
        self.name = name
        self._key = lock_name(name)
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.lease_ttl = lease_ttl
        self.local = new_local(self.thread_local)
        #: the jobfence client shared by the Lock objects over ``redis`` (closed once none
        #: holds it any more)
        self._shared = client_for(redis, sleep, asynchronous=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._key!r} token={self.fencing_token}>"

    @property
    def _locks(self) -> Any:
        return self._shared.locks

    # -- jobfence's view -------------------------------------------------------------------
    @property
    def lease(self) -> Any:
        """The jobfence :class:`~jobfence.Lease` held by this thread (``None`` if none)."""
        return self.local.lease

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the lease held by this thread: strictly increasing per
        name, for :func:`jobfence.fence` (``None`` if not held)."""
        lease = self.local.lease
        return None if lease is None else int(lease.token)

    # -- redis-py's interface --------------------------------------------------------------
    async def __aenter__(self) -> Lock:
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            log.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Take the lock; ``True`` once held, ``False`` if not within the wait.

        ``blocking=False`` tries once. Otherwise the call waits in the name's FIFO queue, at
        most ``blocking_timeout`` seconds (``None``: for ever). ``token``: the owner id of
        this hold (unique per hold; default a random one). ``sleep`` is accepted for
        redis-py's signature: waiting is by hand-off, with the lock's ``sleep`` as the
        longest pause between looks.
        """
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        owner = owner_id(token)
        ttl, renew = (float(self.timeout), False) if self.timeout else (float(self.lease_ttl), True)
        locks = self._locks
        if not blocking:
            lease = await locks._try_acquire(self._key, owner, locks_ttl(ttl), renew)
            if lease is None:
                return False
        else:
            try:
                lease = await locks._acquire(
                    self._key, locks_ttl(ttl), locks_timeout(blocking_timeout), renew, owner
                )
            except LockTimeout:
                return False
        self.local.lease = lease
        self.local.token = stored_value(lease.token, owner)
        return True

    async def locked(self) -> bool:
        """Whether anyone holds the lock (its key exists)."""
        return await self.redis.get(self._key) is not None

    async def owned(self) -> bool:
        """Whether this thread's token is the one the key holds."""
        token = self.local.token
        return token is not None and as_bytes(await self.redis.get(self._key)) == token

    async def release(self) -> None:
        """Release the lock: :class:`LockError` if this thread does not hold it,
        :class:`LockNotOwnedError` if it expired or was taken meanwhile."""
        lease = self.local.lease
        if self.local.token is None or lease is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        if ASYNC:
            # the token goes only once the release is answered: a cancelled release keeps it,
            # and release() may be called again (it takes the answer of the one in flight)
            released = await lease.release()
            self.local.token = None
            self.local.lease = None
        else:  # as redis-py's: the token goes first
            self.local.token = None
            self.local.lease = None
            released = lease.release()
        if not released:
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self.name
            )

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lock's remaining lifetime (or set it to
        that with ``replace_ttl``). Only for a lock with a ``timeout``."""
        lease = self.local.lease
        if self.local.token is None or lease is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        ttl = float(additional_time)
        if not replace_ttl:
            left = int(await self.redis.pttl(self._key))
            ttl += max(0, left) / 1000
        await self._extend(lease, ttl, "extend")
        return True

    async def reacquire(self) -> bool:
        """Reset the lock's remaining lifetime to its ``timeout``."""
        lease = self.local.lease
        if self.local.token is None or lease is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)
        await self._extend(lease, float(self.timeout), "reacquire")
        return True

    async def _extend(self, lease: Any, ttl: float, verb: str) -> None:
        try:
            await lease.extend(locks_ttl(ttl))
        except LockLost:
            raise LockNotOwnedError(
                f"Cannot {verb} a lock that's no longer owned", lock_name=self.name
            ) from None


async def close_locks(redis: Any) -> None:
    """Close the jobfence client this module keeps for the redis-py client ``redis`` (one
    is made on the first ``Lock`` over it): its renewer stops and the leases still held are
    given back. The redis-py client stays open (it is yours). A later ``Lock`` over
    ``redis`` makes a new one. Call it when shutting down, before closing ``redis``."""
    for locks in take_clients(redis):
        await locks.close()
