"""redis-py's asyncio ``Lock``, backed by jobfence: a drop-in for
``redis.asyncio.lock.Lock``.

    from jobfence.compat.redis_py.asyncio import Lock

    async with redis_client.lock("reports", timeout=60, lock_class=Lock) as lock:
        ...  # lock.fencing_token: strictly increasing per name

Everything :mod:`jobfence.compat.redis_py` says holds here, with coroutine methods; a
``release()`` cancelled while its command is in flight keeps the token (the release goes on,
and calling ``release()`` again takes its answer), as redis-py's does.
"""

from __future__ import annotations

from ._shared import DEFAULT_LEASE_TTL
from .lock_async import Lock, LockError, LockNotOwnedError, close_locks

__all__ = ["DEFAULT_LEASE_TTL", "Lock", "LockError", "LockNotOwnedError", "close_locks"]
