"""Concurrency limits (counting semaphores) made of locks: the names, tokens and checks.

``locks.acquire(name, limit=N)`` grants at most ``N`` leases on ``name`` at once. It is
composed of the backend's lock verbs, so every lock backend has it:

* slot ``k`` (0 to ``N - 1``) is the plain lock ``<name>\\x1f<k>``; a lease of the limit is
  a lease of one free slot;
* a waiter first takes the gate, the plain lock ``<name>\\x1fgate`` (renewed like any lease),
  so waiters are served in their order on the gate (FIFO where the backend's queue is); the
  gate's holder queues on every slot, is handed the first slot released, gives back any
  second one it was handed, and releases the gate;
* the lease's fencing token is ``slot_token * 1000 + k``: unique across the limit's slots
  and increasing per slot (``token % 1000`` is the slot).

``\\x1f`` (the ASCII unit separator) is refused in lock names, so no name of a user's can be a
slot or a gate of another's. ``limit=1`` is the plain lock on ``name`` itself (same key, same
tokens). The limit of a name must be the same in every process: a process that acquires
``name`` with ``limit=3`` and another with ``limit=5`` share slots 0 to 2 only, so up to 5 run.
A client refuses a second limit for a name it used with another one (``ConfigurationError``).
"""

from __future__ import annotations

from ._core.validate import MAX_NAME_BYTES, check_name
from .backends.base import LockHolder
from .errors import ConfigurationError

__all__ = [
    "MAX_LIMIT",
    "SEPARATOR",
    "TOKEN_STRIDE",
    "check_limit",
    "check_lock_name",
    "gate_name",
    "slot_name",
    "slot_token",
    "split_listing",
]

#: joins a limit's name and its slot number (or ``gate``) into the name of a plain lock
SEPARATOR = "\x1f"
#: the largest ``limit`` accepted
MAX_LIMIT = 1000
#: a limit's token is the slot's token times this, plus the slot number
TOKEN_STRIDE = 1000
#: the longest suffix a limit adds to its name (``\x1fgate``), in bytes
_SUFFIX_BYTES = len(SEPARATOR + "gate")


def check_limit(limit: object, *, argument: str = "limit") -> int:
    """A concurrency limit: an ``int`` from 1 to :data:`MAX_LIMIT` (not a bool)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(
            f"{argument} must be an int from 1 to {MAX_LIMIT} (how many leases on the name may "
            f"be held at once), got {limit!r}",
            argument=argument,
        )
    return limit


def check_lock_name(name: object, *, argument: str = "name", limit: int = 1) -> str:
    """A lock name (a non-empty str of at most 1024 bytes in UTF-8) without the separator of a
    limit's slots; with a ``limit`` > 1, short enough for its slots' names."""
    name = check_name(name, argument=argument)
    if SEPARATOR in name:
        raise ConfigurationError(
            f"{argument} must not contain the character U+001F (it names the slots of "
            "concurrency limits)",
            argument=argument,
        )
    if limit > 1 and len(name.encode("utf-8")) > MAX_NAME_BYTES - _SUFFIX_BYTES:
        raise ConfigurationError(
            f"{argument} of a limit > 1 must be at most {MAX_NAME_BYTES - _SUFFIX_BYTES} bytes "
            "in UTF-8 (its slots' names add a suffix)",
            argument=argument,
        )
    return name


def slot_name(name: str, slot: int) -> str:
    """The plain lock that is slot ``slot`` of the limit on ``name``."""
    return f"{name}{SEPARATOR}{slot}"


def gate_name(name: str) -> str:
    """The plain lock the waiters of the limit on ``name`` queue on."""
    return f"{name}{SEPARATOR}gate"


def slot_token(token: int, slot: int) -> int:
    """The fencing token of a limit's lease: the slot's token times :data:`TOKEN_STRIDE`,
    plus the slot."""
    return token * TOKEN_STRIDE + slot


def split_listing(name: str, holder: LockHolder) -> tuple[str, LockHolder] | None:
    """One ``holders()`` row as users see it: a slot's lease under the limit's name, with
    the limit's token; ``None`` for a gate (a waiter, not a holder); other rows unchanged."""
    if SEPARATOR not in name:
        return name, holder
    base, _, part = name.rpartition(SEPARATOR)
    if not part.isdigit():
        return None
    token = None if holder.token is None else slot_token(holder.token, int(part))
    return base, LockHolder(holder.owner, token, holder.expires_in)
