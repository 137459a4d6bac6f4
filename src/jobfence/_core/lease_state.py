"""The local deadlines of one lease and the bookkeeping of its renewals and extends.

No I/O and no asyncio: ``AsyncLease`` and ``Lease`` hold one :class:`LeaseState` each, and
their renewer (a task for ``AsyncLocks``, a thread for ``Locks``) drives it. Every method takes
the state's lock, so the holder's ``extend`` and the renewer may call it from different
threads.

Times are seconds of the clock's ``monotonic`` time. They come in as arguments (``sent``,
``now``) or, where a method needs the current time, from the clock given to the constructor
(default: :func:`jobfence._core.clock.get_clock`, looked up at each call).

The rules:

* Acquired at ``started`` with ``ttl``: the lease expires locally at ``started + ttl`` (counted
  from before the request was sent, so never later than on the server) and is due for
  renewal at ``started + ttl / 3``.
* A renewal or an extend sent at ``sent`` with ``ttl`` that succeeds moves the local expiry to
  ``sent + ttl`` and the next renewal to ``sent + ttl / 3``.
* A renewal that got no answer is tried again after ``RETRY_FRACTION`` of the ttl (at least
  ``RETRY_MIN``, at most ``RETRY_MAX`` seconds), unless the lease expired meanwhile.
* An extend and a renewal in flight at the same time: the server may apply them in either
  order, so neither outcome may move the local expiry past the other's. The shorter deadline
  is kept and a renewal with the new ttl is due at once -- but only once the extend answered:
  while it is still in flight, its own completion schedules that renewal (no busy loop of
  renewals carrying the old ttl).
* A failed extend changes no deadline.
* A renewal or an extend that got no answer (an error, or none in time) may still reach the
  server later -- a request already sent cannot be called back -- and set the remaining
  lifetime to the ttl it carried. The renewal or extend is owner-checked, so it can touch only
  a lease this owner still holds; landing late it can only *shorten* the server's lifetime
  below what a later success told us if it carries a smaller ttl than that success. So from
  then on every deadline is counted with the smallest ttl any unanswered request carried
  (:attr:`LeaseState.effective_ttl`): the local expiry stays no later than the server's,
  whenever the stray request lands.
* ``renews=False``: the lease is never due for renewal; it only expires.

The renewer sleeps until the earliest :attr:`LeaseState.next_check` of its leases. An extend
is the holder's, not the renewer's: when its completion brings the next check forward (a
shorter ttl, or a renewal due at once after a race), :attr:`LeaseState.on_sooner` (set by the
renewer) is called with the new time, so that the renewer wakes for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from .clock import Clock, get_clock

__all__ = ["RETRY_FRACTION", "RETRY_MAX", "RETRY_MIN", "LeaseState", "Look"]

#: after a renewal got no answer, try again after this fraction of the ttl ...
RETRY_FRACTION = 0.1
#: ... but not sooner than this many seconds ...
RETRY_MIN = 0.01
#: ... and not later than this many seconds
RETRY_MAX = 1.0

_NEVER = float("inf")


class Look(NamedTuple):
    """What the renewer needs to know of one lease at one moment (:meth:`LeaseState.look`)."""

    #: the local deadline has passed: the lease is lost
    expired: bool
    #: a renewal is due within the batch window: renew it with a batch that goes out now
    due: bool
    #: a renewal is due now: a batch must go out
    overdue: bool
    #: when the renewer must look again: the next renewal or the expiry
    next_check: float


class LeaseState:
    """Deadlines of one lease: when it expires locally and when it is due for renewal.

    ``ttl`` is the lease's ttl (a successful extend may change it; renewals carry it),
    ``started`` the clock time just before the acquire was sent, ``renews`` whether a renewer
    keeps the lease alive, ``clock`` the clock to read the current time from.
    """

    def __init__(
        self, ttl: float, started: float, *, renews: bool = True, clock: Clock | None = None
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ttl = ttl
        self._renews = renews
        self._expires_at = started + ttl
        self._next_renew = started + ttl / 3 if renews else _NEVER
        # a renewal in flight: when it was sent and with which ttl (None: none in flight)
        self._renew_sent: float | None = None
        self._renew_ttl = ttl
        # an extend overlapped that renewal: the server may apply them in either order, so
        # neither outcome may lengthen the local deadline past the other's
        self._raced = False
        self._extending = False  # an extend is in flight
        self._overlap = False  # a renewal overlapped the extend in flight
        # the smallest ttl an unanswered renewal or extend carried (it may still land)
        self._stray_ttl = _NEVER
        #: called (outside the state's lock) with the new :attr:`next_check` when an extend's
        #: completion brings it forward: the renewer sets it, to wake for that time
        self.on_sooner: Callable[[float], None] | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} ttl={self._ttl} expires_at={self._expires_at} "
            f"next_renew={self._next_renew}>"
        )

    # -- reading -------------------------------------------------------------------------
    def now(self) -> float:
        """The clock's current monotonic time."""
        return (self._clock or get_clock()).monotonic()

    @property
    def ttl(self) -> float:
        """The ttl renewals carry: the acquire's, or that of the last successful extend."""
        return self._ttl

    @property
    def effective_ttl(self) -> float:
        """The ttl local deadlines are counted with: :attr:`ttl`, or less if an unanswered
        renewal or extend carrying a smaller ttl may still reach the server."""
        return min(self._ttl, self._stray_ttl)

    @property
    def renews(self) -> bool:
        """Whether a renewer keeps the lease alive."""
        return self._renews

    @property
    def expires_at(self) -> float:
        """When the lease expires locally unless a renewal or extend gets through."""
        return self._expires_at

    @property
    def next_renew(self) -> float:
        """When the next renewal is due (``inf`` for a lease that is not renewed)."""
        return self._next_renew

    @property
    def next_check(self) -> float:
        """When the renewer must look at the lease next: a renewal or the expiry is due."""
        with self._lock:
            return min(self._next_renew, self._expires_at)

    def look(self, now: float, window: float) -> Look:
        """The lease at ``now``, for the renewer: whether it expired, whether a renewal is
        due within ``window`` (a fraction of the ttl) or now, and when to look next."""
        with self._lock:
            next_renew = self._next_renew
            return Look(
                expired=now >= self._expires_at,
                due=next_renew <= now + window * self._ttl,
                overdue=next_renew <= now,
                next_check=min(next_renew, self._expires_at),
            )

    @property
    def renewal_in_flight(self) -> bool:
        """Whether a renewal was sent and has not finished yet."""
        return self._renew_sent is not None

    @property
    def extending(self) -> bool:
        """Whether an extend was started and has not finished yet."""
        return self._extending

    def expired(self, now: float | None = None) -> bool:
        """Whether the local deadline has passed at ``now`` (default: the clock's time)."""
        if now is None:
            now = self.now()
        return now >= self._expires_at

    def remaining(self, now: float | None = None) -> float:
        """Seconds left at ``now`` (default: the clock's time) before the local expiry."""
        if now is None:
            now = self.now()
        return max(0.0, self._expires_at - now)

    def expiry_reason(self) -> str:
        """Why a lease whose local deadline passed is lost, in words for its holder."""
        if self._renews:
            return "its ttl ran out before a renewal got through"
        return f"its ttl of {self._ttl:g} s ran out (it was taken with renew=False)"

    # -- extend --------------------------------------------------------------------------
    def extend_started(self) -> None:
        """The holder is sending an extend now."""
        with self._lock:
            self._extending = True
            self._overlap = self._renew_sent is not None

    def extend_done(
        self, sent: float | None, ttl: float | None = None, *, answered: bool = True
    ) -> None:
        """The extend started by :meth:`extend_started` finished.

        ``sent``: the time it was sent, if it succeeded; ``None`` if it failed (no deadline
        moves). ``ttl``: the ttl it carried, which later renewals carry too (default: the
        current ttl). ``answered=False``: it failed without an answer (an error), so it may
        still land later with ``ttl``.
        """
        before = self.next_check
        self._extend_done(sent, ttl, answered)
        after = self.next_check
        listener = self.on_sooner
        if after < before and listener is not None:
            listener(after)

    def _extend_done(self, sent: float | None, ttl: float | None, answered: bool) -> None:
        with self._lock:
            overlap = self._overlap or self._renew_sent is not None
            self._extending = self._overlap = False
            if sent is None:
                if not answered:
                    self._stray_ttl = min(self._stray_ttl, self._ttl if ttl is None else ttl)
                return
            if ttl is not None:
                self._ttl = ttl
            ttl = min(self._ttl, self._stray_ttl)
            if not overlap:
                self._expires_at = sent + ttl
                if self._renews:
                    self._next_renew = sent + ttl / 3
                return
            # a renewal carrying the old ttl overlapped: it may have landed after us
            if self._renew_sent is not None:
                self._raced = True
                bound = self._renew_sent + min(self._renew_ttl, self._stray_ttl)
            else:
                bound = self._expires_at
            self._expires_at = min(sent + ttl, bound)
            if self._renews:
                self._next_renew = self.now()  # renew with the new ttl at once

    # -- renewal -------------------------------------------------------------------------
    def renewal_sent(self, now: float) -> float:
        """The renewer is sending a renewal at ``now``; returns the ttl it carries."""
        with self._lock:
            self._renew_sent = now
            self._renew_ttl = self._ttl
            self._raced = self._extending  # an extend in flight may land before or after it
            if self._extending:
                self._overlap = True
            return self._ttl

    def renewal_done(self, ok: bool) -> None:
        """The renewal sent by :meth:`renewal_sent` was answered: ``ok`` if the server
        renewed the lease, false if it found the lease gone (no deadline moves)."""
        with self._lock:
            sent, ttl, raced = self._renew_sent, self._renew_ttl, self._raced
            self._renew_sent = None
            self._raced = False
            if not ok or sent is None:
                return
            ttl = min(ttl, self._stray_ttl)
            if raced:  # server order unknown: keep the shorter deadline, renew again soon
                self._expires_at = min(self._expires_at, sent + ttl)
                # (while the extend is still in flight, its completion schedules that)
                self._next_renew = sent + ttl / 3 if self._extending else self.now()
            else:
                self._expires_at = sent + ttl
                self._next_renew = sent + ttl / 3

    def renewal_failed(self, now: float) -> bool:
        """The renewal sent by :meth:`renewal_sent` got no answer (an error, or none in time):
        it may still land later, with the ttl it carried.

        Returns False if the lease has expired at ``now``; otherwise schedules the next try
        after ``RETRY_FRACTION`` of the ttl (between ``RETRY_MIN`` and ``RETRY_MAX`` s) and
        returns True.
        """
        with self._lock:
            if self._renew_sent is not None:
                self._stray_ttl = min(self._stray_ttl, self._renew_ttl)
            self._renew_sent = None
            self._raced = False
            if now >= self._expires_at:
                return False
            self._next_renew = now + min(
                RETRY_MAX, max(RETRY_MIN, RETRY_FRACTION * min(self._ttl, self._stray_ttl))
            )
            return True
