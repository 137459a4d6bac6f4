# Generated from acquire_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Acquiring a lease: ``AsyncAcquireContext`` (what ``AsyncLocks.acquire`` returns) and the
bookkeeping of a waiting acquire (``acquire_async.py``; ``acquire.py`` is generated from it by
``tools/async_to_sync.py``).

The client (``AsyncLocks`` / ``Locks``) makes the backend calls; this module holds what
decides about them without I/O: a new owner id per attempt, how long one wait in the
backend's queue lasts, whether a grant came too late to be of use, the pauses after transient
errors (:class:`WaitRetry`) and the text of a :class:`~jobfence.errors.LockTimeout`.
"""

from __future__ import annotations

import logging
import os
import socket

from ._core.clock import get_clock
from .backends.base import LockHolder
from .errors import LockTimeout

__all__ = [
    "GRANT_MIN_LEFT",
    "SERVER_WAIT",
    "WAIT_RETRY_PAUSE",
    "WAIT_RETRY_PAUSE_MAX",
    "WaitRetry",
    "new_owner",
    "timed_out",
    "usable",
    "wait_length",
    "warn_late_grant",
]

log = logging.getLogger("jobfence.locks")

#: one wait in a server-side queue when the caller waits forever (then it queues again)
SERVER_WAIT = 3600.0
#: a grant that arrives with less than this fraction of its ttl left is given back: the reply
#: took most of the ttl, and too little is left to renew it (the wait goes on)
GRANT_MIN_LEFT = 1 / 3
#: first pause after a transient backend error while waiting; it doubles up to the next one
WAIT_RETRY_PAUSE = 0.05
WAIT_RETRY_PAUSE_MAX = 1.0

_HOST = socket.gethostname()[:64]
_NEVER = float("inf")


def new_owner() -> str:
    """A new owner id (``host:pid:uuid``, the last part 128 random bits in hex), unique to one
    acquire attempt."""
    return f"{_HOST}:{os.getpid()}:{os.urandom(16).hex()}"


def wait_length(long_waits: bool, poll_interval: float, remaining: float | None) -> float:
    """How long one acquire with ``wait`` asks the backend to keep us in its queue:
    ``remaining`` seconds (``None``: forever) are left before the timeout."""
    if long_waits:  # the server queues us as long as our connection lives
        return SERVER_WAIT if remaining is None else max(0.0, remaining)
    # how long the backend keeps our place in its queue without hearing from us: we come
    # back every poll_interval, so a dead waiter drops out soon
    wait = poll_interval * 3
    if remaining is not None:
        wait = min(wait, max(0.0, remaining))
    return wait


def usable(started: float, ttl: float) -> bool:
    """Whether a grant for a request sent at ``started`` is worth keeping now: enough of its
    ttl is left to use and renew it."""
    return started + ttl - get_clock().monotonic() >= ttl * GRANT_MIN_LEFT


def warn_late_grant(name: str, token: int, started: float, ttl: float) -> None:
    """Log a grant that came too late to be of use (it is given back)."""
    left = started + ttl - get_clock().monotonic()
    log.warning(
        "the lease on %r (token %s) was granted with %.2f s of its %g s ttl left (the "
        "reply took %.2f s): given back",
        name,
        token,
        max(0.0, left),
        ttl,
        ttl - left,
    )


def timed_out(name: str, timeout: float | None, holder: LockHolder | None) -> LockTimeout:
    """The :class:`LockTimeout` of an acquire of ``name`` that waited ``timeout`` s in vain,
    saying who holds the lease (as far as the backend tells)."""
    return LockTimeout(
        f"could not acquire {name!r} within {timeout} s{_held_by(holder)}",
        name=name,
        owner=None if holder is None else holder.owner,
        token=None if holder is None else holder.token,
        expires_in=None if holder is None else holder.expires_in,
    )


def _held_by(holder: LockHolder | None) -> str:
    """The end of a LockTimeout message: who holds the lease, as far as the backend tells."""
    if holder is None:
        return ""
    text = f"; held by {holder.owner or 'another session'}"
    if holder.token is not None:
        text += f" (token {holder.token})"
    if holder.expires_in is not None:
        text += f", {holder.expires_in:.1f} s left on its lease"
    return text


class WaitRetry:
    """One waiting acquire's transient errors: the last one, the pause before the next try,
    and since when a grant may have been made whose answer never reached us."""

    def __init__(self, name: str, timeout: float | None, deadline: float | None) -> None:
        self.name = name
        self.timeout = timeout
        self.deadline = deadline
        self.error: BaseException | None = None
        self.failing = False
        self.since = _NEVER
        self._pause = WAIT_RETRY_PAUSE

    def answered(self) -> None:
        self.failing = False
        self._pause = WAIT_RETRY_PAUSE

    def failed(self, error: BaseException, now: float) -> float | None:
        """Record ``error``; return the pause before the next try, ``None`` if the deadline
        passed."""
        if not self.failing:
            log.warning("waiting for %r: the backend failed, trying again: %s", self.name, error)
        self.error = error
        self.failing = True
        pause = self._pause
        self._pause = min(WAIT_RETRY_PAUSE_MAX, pause * 2)
        if self.deadline is None:
            return pause
        left = self.deadline - now
        return None if left <= 0 else min(pause, left)
