"""redis-py's ``Lock``, backed by jobfence: a drop-in for ``redis.lock.Lock``.

    from jobfence.compat.redis_py import Lock

    with redis_client.lock("reports", timeout=60, lock_class=Lock) as lock:
        ...  # lock.fencing_token: strictly increasing per name

The constructor and the methods are redis-py's (``acquire``, ``release``, ``extend``,
``reacquire``, ``locked``, ``owned``, the context manager), and so are the errors
(``redis.exceptions.LockError`` / ``LockNotOwnedError``). The lock's key is its name, as with
redis-py, so a jobfence lock and a redis-py lock on the same name exclude each other while a
fleet moves from one to the other. Underneath it is a jobfence lease, which adds:

* a fencing token (:attr:`Lock.fencing_token`) that strictly increases per name, for
  :func:`jobfence.fence`;
* fair waiting: a blocking ``acquire`` joins a FIFO queue and a release hands the lock to the
  first waiter, who is woken at once (no polling; ``sleep`` only bounds how long a waiter
  goes without looking, for holders that never hand off: an expiry, a redis-py lock);
* a lock without ``timeout`` is a lease of :data:`DEFAULT_LEASE_TTL` seconds renewed while
  its process lives, instead of a key that never expires: a crashed holder frees it.

What differs from redis-py (docs/how-to/from-redis-py.md): the key holds
``b"<fencing token>:<owner>"`` (``lock.local.token`` is that value), so a caller's ``token``
is the owner part, not the whole value; a lock without ``timeout`` has a ttl on its key; and
waiting is not a loop of ``sleep`` calls. Backend failures raise
:class:`jobfence.BackendError` (from redis-py's error).
"""

from __future__ import annotations

from ._shared import DEFAULT_LEASE_TTL
from .lock import Lock, LockError, LockNotOwnedError, close_locks

__all__ = ["DEFAULT_LEASE_TTL", "Lock", "LockError", "LockNotOwnedError", "close_locks"]
