"""What the blocking and the asyncio redis-py ``Lock`` replacements share: the jobfence
client of each redis-py client, owner ids, names and redis-py's messages."""

from __future__ import annotations

import threading
import uuid
import weakref
from types import SimpleNamespace
from typing import Any

from ...errors import ConfigurationError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "MIN_POLL_INTERVAL",
    "as_bytes",
    "client_for",
    "lock_name",
    "locks_timeout",
    "locks_ttl",
    "new_local",
    "owner_id",
    "stored_value",
    "take_clients",
]

#: the ttl of a lock made without ``timeout`` (redis-py's never-expiring lock): jobfence
#: renews it while its process lives, and a crashed holder frees it within this many seconds
DEFAULT_LEASE_TTL = 30.0
#: the shortest interval at which a waiter looks again when no hand-off wakes it
MIN_POLL_INTERVAL = 0.01

# redis-py client -> {poll interval: the jobfence Locks / AsyncLocks over it}
_CLIENTS: weakref.WeakKeyDictionary[Any, dict[float, Any]] = weakref.WeakKeyDictionary()
_CLIENTS_MUTEX = threading.Lock()


def client_for(redis: Any, poll_interval: float, *, asynchronous: bool) -> Any:
    """The jobfence ``Locks`` (``AsyncLocks``) over the caller's redis-py client, one per
    client and poll interval, its lease keys named like redis-py's (the lock's name as it
    is). The client stays the caller's: jobfence never closes it."""
    interval = max(MIN_POLL_INTERVAL, float(poll_interval))
    with _CLIENTS_MUTEX:
        by_interval = _CLIENTS.setdefault(redis, {})
        locks = by_interval.get(interval)
        if locks is None or locks.closed:
            from ...backends import open_lock_backend

            backend = open_lock_backend(redis, asynchronous=asynchronous, bare_keys=True)
            if asynchronous:
                from ...locks_async import AsyncLocks

                locks = AsyncLocks(backend, poll_interval=interval)
            else:
                from ...locks import Locks

                locks = Locks(backend, poll_interval=interval)
            by_interval[interval] = locks
        return locks


def take_clients(redis: Any) -> list[Any]:
    """Forget the jobfence clients kept for ``redis`` and return them (to be closed)."""
    with _CLIENTS_MUTEX:
        return list(_CLIENTS.pop(redis, {}).values())


def lock_name(name: object) -> str:
    """A redis-py lock name (``str``, ``bytes`` or ``memoryview``) as a ``str``."""
    if isinstance(name, memoryview):
        name = name.tobytes()
    if isinstance(name, bytes):
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigurationError(
                f"name must be UTF-8 text, got {name!r}", argument="name"
            ) from None
    if isinstance(name, str) and name:
        return name
    raise ConfigurationError(
        f"name must be a non-empty str (or UTF-8 bytes), got {name!r}", argument="name"
    )


def owner_id(token: object) -> str:
    """The owner id of one acquire: the caller's ``token``, or a fresh random one (as
    redis-py's ``uuid1().hex``)."""
    if token is None:
        return uuid.uuid1().hex
    if isinstance(token, bytes):
        token = token.decode("utf-8")
    if not isinstance(token, str) or not token:
        raise ConfigurationError(
            f"token must be a non-empty str or bytes, got {token!r}", argument="token"
        )
    return token


def stored_value(fencing_token: int, owner: str) -> bytes:
    """What the lock's key holds while ``owner`` has it: ``b"<fencing token>:<owner>"``."""
    return f"{fencing_token}:{owner}".encode()


class _ThreadLocal(threading.local):
    token: bytes | None = None  # every thread starts without a token
    lease: Any = None


def new_local(thread_local: bool) -> Any:
    """Where a lock keeps its token (and its jobfence lease): per thread (redis-py's
    default) or shared by every thread."""
    if thread_local:
        return _ThreadLocal()
    return SimpleNamespace(token=None, lease=None)


def as_bytes(value: Any) -> Any:
    """A reply of a client that may decode replies, as bytes."""
    return value.encode() if isinstance(value, str) else value


def locks_ttl(seconds: float) -> float:
    """A lifetime for jobfence: at least a millisecond, as Redis counts them."""
    return max(0.001, seconds)


def locks_timeout(seconds: float | None) -> float | None:
    """A wait for jobfence: ``None`` (for ever) or at least zero."""
    return None if seconds is None else max(0.0, float(seconds))
