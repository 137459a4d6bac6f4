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
    "Shared",
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


class Shared:
    """The jobfence ``Locks`` (``AsyncLocks``) the ``Lock`` objects over one redis-py client
    share: each ``Lock`` holds it, the registry below only a weak reference. Once the last
    ``Lock`` over the client lets go of it, the jobfence client is closed (its renewer
    stops), so that neither it nor the redis-py client is kept for the life of the process
    (an application may make a redis-py client per request)."""

    __slots__ = ("__weakref__", "locks")

    def __init__(self, locks: Any) -> None:
        self.locks = locks


# redis-py client -> {poll interval: the Shared jobfence Locks / AsyncLocks over it}; only
# weak references, so nothing here keeps a client or its Lock objects' jobfence client
_CLIENTS: weakref.WeakKeyDictionary[Any, dict[float, weakref.ref[Shared]]] = (
    weakref.WeakKeyDictionary()
)
_CLIENTS_MUTEX = threading.Lock()
#: closes of AsyncLocks under way (a task must be referenced until it is done)
_CLOSING: set[Any] = set()


def client_for(redis: Any, poll_interval: float, *, asynchronous: bool) -> Shared:
    """The jobfence ``Locks`` (``AsyncLocks``) over the caller's redis-py client, one per
    client and poll interval, its lease keys named like redis-py's (the lock's name as it
    is), held by the returned :class:`Shared`. The client stays the caller's: jobfence never
    closes it."""
    interval = max(MIN_POLL_INTERVAL, float(poll_interval))
    with _CLIENTS_MUTEX:
        by_interval = _CLIENTS.setdefault(redis, {})
        ref = by_interval.get(interval)
        shared = ref() if ref is not None else None
        if shared is None or shared.locks.closed:
            from ...backends import open_lock_backend

            backend = open_lock_backend(redis, asynchronous=asynchronous, bare_keys=True)
            if asynchronous:
                from ...locks_async import AsyncLocks

                locks: Any = AsyncLocks(backend, poll_interval=interval)
            else:
                from ...locks import Locks

                locks = Locks(backend, poll_interval=interval)
            shared = Shared(locks)
            # not at interpreter exit: the renewer, a daemon thread or a task, ends with it
            finalizer = weakref.finalize(shared, _retire, locks, asynchronous)
            finalizer.atexit = False  # type: ignore[misc]  # a property typeshed omits
            by_interval[interval] = weakref.ref(shared)
        return shared


def _retire(locks: Any, asynchronous: bool) -> None:
    """Close the jobfence client no ``Lock`` holds any more, in the background: this runs
    where the last ``Lock`` was let go of, possibly inside the garbage collector."""
    if locks.closed:
        return
    try:
        if not asynchronous:
            threading.Thread(target=locks.close, name="jobfence-compat-close", daemon=True).start()
            return
        import asyncio

        worker = getattr(locks._renewer, "_worker", None)  # its loop, if it ever ran one
        if worker is not None:
            loop = worker.get_loop()
        else:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # never used on a loop: nothing runs
        if not loop.is_closed():
            loop.call_soon_threadsafe(_close_on_loop, locks)
    except RuntimeError:  # the interpreter or the loop is shutting down: it stops with them
        pass


def _close_on_loop(locks: Any) -> None:
    import asyncio

    task = asyncio.get_running_loop().create_task(locks.close())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


def take_clients(redis: Any) -> list[Any]:
    """Forget the jobfence clients kept for ``redis`` and return them (to be closed)."""
    with _CLIENTS_MUTEX:
        refs = list(_CLIENTS.pop(redis, {}).values())
    shared = [ref() for ref in refs]
    return [entry.locks for entry in shared if entry is not None]


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
