# Generated from _core/renewer_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Background renewal of leases: ``AsyncRenewer`` (``_core/renewer_async.py``) and ``Renewer``
(``_core/renewer.py``, generated from it).

The renewer renews anything that is :class:`~jobfence._core.renewable.Renewable` -- a lease, a
NEW claim of an inbox, a queue delivery -- and knows nothing else of them: what the backend
call is, how each batch is announced to the I/O hook (at ``lock.renew``, ``inbox.renew`` or
``queue.renew``) and how a lease it gave up on is given back are constructor arguments.

One renewer per client: a task on the event loop for ``AsyncLocks``, one daemon thread for
``Locks`` -- never one per lease. It wakes when the earliest lease is due (about ``ttl / 3``
after its last successful renewal), renews *every* lease that is due or nearly due in one
batched backend call (one round trip per tick), and marks a lease lost when the backend says
it is gone or when its local deadline passes before a renewal got through.

Isolation. The backend call runs through the renewer's own ``BoundedCaller`` (``_core``
``compat`` / ``acompat``): for ``Locks`` a worker thread per client, started on first use (a
call that hangs keeps it, and the next call gets another, up to three); for ``AsyncLocks`` a
task per call. A call that hangs (a stalled connection) is given up when the first lease of its
batch expires, and holds up only this client's renewals: other clients in the process renew on
their own workers.

A renewal given up on may still land. A renewal that was queued behind a hung call and had not
started when it was given up is dropped and never sent. One already sent cannot be called
back (closing its connection does not stop bytes already on the way, e.g. held by a proxy), so
it may reach the server any time later. That is harmless because:

* it is owner-checked on the server: it extends only a lease this owner still holds, never one
  that expired and was taken by someone else, and never a released one;
* when the renewer gives up on a lease it marks it lost and gives it back in the background
  (an owner-checked release): a late renewal that lands after that release finds nothing to
  extend, one that lands before it is undone by it; if the release cannot get through either,
  the late renewal keeps the name blocked for at most one ttl after it lands, while nobody in
  this process uses it;
* leases of the batch that were not lost yet are retried, and their local deadlines are from
  then on counted with the smallest ttl such a stray renewal carried
  (:class:`~jobfence._core.lease_state.LeaseState`), so an ``extend()`` to a longer ttl
  cannot make the holder count on time the stray renewal may take away again.

Never quiet. A renewal that failed but will be retried is logged at WARNING (lease name, time
left; at most once every ``WARN_EVERY`` seconds per lease); a lost lease is logged by the
lease. An unexpected error inside the renewer itself (a bug, a backend answering the wrong
number of results) is logged with its traceback, every lease it tracked is marked lost (their
``on_lost`` callbacks run, ``async with`` bodies are cancelled) and given back, and the
renewer goes on with the leases that come later. ``Locks`` runs the ``on_lost`` callbacks of
losses the renewer finds in a thread of their own, so a slow callback delays no renewal.

Only leases somebody still uses are renewed: the renewer holds weak references. When a lease
taken with ``renew=True`` is garbage-collected without ``release()``, a ``ResourceWarning``
says so, the renewer stops renewing it and gives it back (owner-checked) in the background. A
lease taken with ``renew=False`` ends with its ttl, as documented, whether it is referenced or
not.
"""

from __future__ import annotations

import collections
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .. import telemetry
from . import compat
from .clock import Clock, get_clock
from .lease_state import LeaseState
from .renewable import Renewable

__all__ = ["Renewer"]

log = logging.getLogger("jobfence.locks")

#: the longest a renewer sleeps before looking again, on a real clock (a safety net: every
#: change it must act on wakes it -- a lease added, an extend that brings a renewal forward,
#: a lease collected (``AsyncRenewer``), ``close()``)
IDLE_WAIT = 1.0
#: what :meth:`AsyncRenewer._tick` returns when nothing is due before something wakes the
#: renewer (only on a clock that lets it wait unbounded)
_UNTIL_WOKEN = float("inf")
#: leases due within this fraction of their ttl are renewed in the same batch
BATCH_WINDOW = 0.15
#: a failed renewal that will be retried is logged at most this often per lease (seconds)
WARN_EVERY = 5.0
#: after an unexpected error the renewer pauses this long (an add() wakes it) and goes on
RESTART_PAUSE = 0.1


class _Tracked(weakref.ref):  # type: ignore[type-arg]
    """What the renewer keeps of one lease: a weak reference to it, and what it needs to
    renew the lease or give it back without it."""

    __slots__ = (
        "active",
        "key",
        "label",
        "name",
        "owner",
        "renews",
        "state",
        "token",
        "warned_at",
    )

    name: str
    owner: str
    token: int
    renews: bool
    state: LeaseState
    key: int
    active: bool
    warned_at: float
    label: str

    def __init__(self, lease: Renewable, callback: Callable[[_Tracked], Any]) -> None:
        super().__init__(lease, callback)  # type: ignore[call-arg]  # weakref.ref takes them
        # the name the backend knows it by (a concurrency limit's slot has a name of its own)
        self.name = getattr(lease, "backend_name", lease.name)
        self.owner = lease.owner
        self.token = lease.token
        # what the log calls it: a claim or a queue delivery says so (``label``); a lease's
        # label is empty, and made only when a log line needs it (``describe``)
        self.label = lease.label
        self.renews = lease.renews
        self.state = lease.state
        self.key = id(lease)
        self.active = True  # tracked: neither released, nor lost, nor collected
        self.warned_at = float("-inf")

    def lease(self) -> Renewable | None:
        return self()  # type: ignore[no-any-return]

    def describe(self) -> str:
        """What the renewer's log calls the lease."""
        return self.label or f"the lease on {self.name!r} (token {self.token})"


class Renewer:
    """The renewer of one client.

    ``renew`` is the backend's batched renewal (``[(name, owner, ttl), ...]`` -> one truth
    value each); ``give_back(name, owner)`` starts an owner-checked release in the background
    (for leases the renewer gave up on, and leases collected without a release); ``name``
    names its task or thread; ``counted`` is ``(family, backend kind)`` for the
    ``jobfence.<family>.renewals`` metric. ``announce(names)`` announces each batch (the
    names it renews) to the I/O hook at the client's hook point (``lock.renew``,
    ``inbox.renew``, ``queue.renew``) before the backend call; without it no hook is called.
    """

    def __init__(
        self,
        renew: Callable[[Sequence[tuple[str, str, float]]], Any],
        *,
        give_back: Callable[[str, str], None] | None = None,
        name: str = "jobfence-renewer",
        counted: tuple[str, str] | None = None,
        announce: Callable[[list[str]], None] | None = None,
    ) -> None:
        self._renew = renew
        self._announce = announce
        #: ``(family, backend kind)``: the renewals are counted in the
        #: ``jobfence.<family>.renewals`` metric (family ``lock``, ``inbox`` or ``queue``)
        self._counted = counted
        self._give_back = give_back
        self._name = name
        self._leases: dict[int, _Tracked] = {}
        # leases garbage-collected while tracked (appended by the weak reference's callback,
        # which may run in any thread, at any allocation: it takes no lock)
        self._collected: collections.deque[_Tracked] = collections.deque()
        self._mutex = threading.Lock()
        self._wake = compat.Event()
        self._wake_at = float("inf")
        self._worker: Any = None
        self._caller = compat.BoundedCaller(f"{name}-call")
        self._closed = False
        #: the clock lets the renewer sleep until the next lease is due, without IDLE_WAIT
        #: ticks in between, or until woken when nothing is due (see _run)
        self._unbounded = False
        #: the worker is in its wait between two ticks (nothing in hand)
        self._sleeping = False

    def add(self, lease: Renewable) -> None:
        """Renew ``lease`` from now on (until it is lost, discarded or collected)."""
        entry = _Tracked(lease, self._on_collected)
        state = lease.state
        state.on_sooner = self._sooner
        with self._mutex:
            self._leases[entry.key] = entry
            if compat.worker_alive(self._worker):
                if state.next_check < self._wake_at:
                    self._wake.set()
                return
            self._worker = compat.spawn(self._run, self._name)

    def _sooner(self, next_check: float) -> None:
        """A lease's next check came forward (its holder's extend): wake for it if the
        renewer sleeps past it (or start it then, if it has not started yet)."""
        if next_check < self._wake_at:
            self._wake.set()

    def discard(self, lease: Renewable) -> None:
        """Stop renewing ``lease`` (released, or found lost by its holder)."""
        idle = False
        with self._mutex:
            entry = self._leases.get(id(lease))
            if entry is not None and entry.lease() is lease:
                del self._leases[entry.key]
                entry.active = False
                idle = not self._leases
        if entry is not None and self._unbounded and idle and self._wake_at != _UNTIL_WOKEN:
            # nothing is left to look at: wake the renewer so that it waits until woken,
            # not until this lease would have been due (a timer, and a tick for nothing)
            self._wake.set()

    def _forget(self, entry: _Tracked) -> bool:
        """Stop tracking ``entry``; False if it was not tracked any more."""
        with self._mutex:
            if not entry.active:
                return False
            entry.active = False
            if self._leases.get(entry.key) is entry:
                del self._leases[entry.key]
            return True

    def __len__(self) -> int:
        return len(self._leases)

    @property
    def running(self) -> bool:
        """Whether the renewer's worker (thread or task) is alive."""
        worker = self._worker
        if worker is None:
            return False
        if hasattr(worker, "done"):
            return not worker.done()
        return bool(worker.is_alive())

    def close(self, timeout: float = 5.0) -> list[tuple[str, str]]:
        """Stop renewing and wait (at most ``timeout`` s) for the worker to finish. Leases
        still held are no longer renewed: they are marked lost (their holders are told);
        ``(name, owner)`` of each, and of each renewed lease collected without a release, is
        returned for the client to give back."""
        self._closed = True
        self._wake.set()
        if not (self._unbounded and self._sleeping):
            compat.join(self._worker, timeout)
        # (a worker asleep on the simulator's clock has nothing in hand: woken, it ends at its
        # next step without doing anything, so close need not spend loop rounds waiting)
        self._caller.close()
        # the collected leases first: they are still tracked, and one that is not renewed is
        # left to expire (as the worker does), not given back with the ones still held
        given_back = [(e.name, e.owner) for e in self._take_collected() if e.renews]
        with self._mutex:
            entries = list(self._leases.values())
            self._leases.clear()
            for entry in entries:
                entry.active = False
        for entry in entries:
            given_back.append((entry.name, entry.owner))
            lease = entry.lease()
            if lease is not None:
                lease.mark_lost("its Locks client was closed, so it is no longer renewed")
        return given_back

    # -- the worker ----------------------------------------------------------------------
    def _run(self) -> None:
        clock = get_clock()
        while not self._closed:
            try:
                wake_at = self._tick(clock)
            except Exception as exc:
                # A bug, never a backend failure (those are renewal failures): say so loudly,
                # tell every holder (nothing renews their leases now) and carry on.
                log.exception("the lease renewer %s failed; its leases are marked lost", self._name)
                try:
                    self._fail_all(f"its renewer failed: {exc!r}")
                except Exception:
                    log.exception("the lease renewer %s could not mark its leases lost", self._name)
                wake_at = clock.monotonic() + RESTART_PAUSE  # no busy loop if it fails again
            if wake_at is None:
                continue
            self._wake_at = wake_at
            self._sleeping = True
            clock.wait(self._wake, max(0.0, wake_at - clock.monotonic()))
            self._sleeping = False
            self._wake_at = float("inf")

    def _snapshot(self) -> list[_Tracked]:
        with self._mutex:
            return list(self._leases.values())

    def _tick(self, clock: Clock) -> float | None:
        """One look at the leases: give back collected ones, mark expired ones lost, renew
        the due ones. Returns when to look next (``None``: at once)."""
        self._wake.clear()  # before looking: an add() from now on wakes the next wait
        for entry in self._take_collected():
            if entry.renews and self._give_back is not None:
                self._give_back(entry.name, entry.owner)
        now = clock.monotonic()
        entries = self._snapshot()
        wake_at = _UNTIL_WOKEN if self._unbounded else now + IDLE_WAIT
        due: list[_Tracked] = []
        overdue = False
        for entry in entries:
            look = entry.state.look(now, BATCH_WINDOW)
            if look.expired:
                # a renewed lease may still be on the server (a renewal may land late)
                self._lose(entry, entry.state.expiry_reason(), give_back=entry.renews)
                continue
            # a lease that is not renewed is due only for its expiry (its next_renew is inf)
            wake_at = min(wake_at, look.next_check)
            if look.due:
                due.append(entry)
                overdue = overdue or look.overdue
        if overdue:
            self._renew_batch(due)
            return None
        return wake_at  # _UNTIL_WOKEN (unbounded, nothing tracked): until add() or close()

    def _on_collected(self, entry: _Tracked) -> None:
        """The weak reference's callback: a tracked lease was garbage-collected."""
        if not entry.active:
            return
        self._collected.append(entry)
        if entry.renews:
            try:
                warnings.warn(
                    f"the lease on {entry.name!r} (token {entry.token}) was garbage-collected "
                    "without release(); it is given back now",
                    ResourceWarning,
                    stacklevel=2,
                )
            except Exception:  # e.g. as the interpreter shuts down
                pass

    def _take_collected(self) -> list[_Tracked]:
        """The collected leases that were still tracked, now forgotten."""
        taken = []
        while self._collected:
            entry = self._collected.popleft()
            if self._forget(entry):
                taken.append(entry)
        return taken

    def _lose(self, entry: _Tracked, reason: str, *, give_back: bool) -> None:
        """Stop tracking a lease, tell its holder it is lost and, if asked, give it back."""
        if not self._forget(entry):
            return
        lease = entry.lease()
        if lease is not None:
            lease.mark_lost(reason, background=True)
        if give_back and self._give_back is not None:
            self._give_back(entry.name, entry.owner)

    def _fail_all(self, reason: str) -> None:
        self._take_collected()
        for entry in self._snapshot():
            self._lose(entry, reason, give_back=entry.renews)

    def _hooked_renew(self, items: list[tuple[str, str, float]]) -> Any:
        if self._announce is not None:
            self._announce([item[0] for item in items])
        return self._renew(items)

    def _renew_batch(self, due: list[_Tracked]) -> None:
        clock = get_clock()
        sent = clock.monotonic()
        items = [(entry.name, entry.owner, entry.state.renewal_sent(sent)) for entry in due]
        # A renewal that hangs must not hide a loss: give up when the first lease expires.
        limit = max(0.01, min(entry.state.expires_at for entry in due) - sent)
        try:
            results = list(self._caller.call(partial(self._hooked_renew, items), limit))
        except Exception as exc:
            if self._counted is not None:
                telemetry.renewals(*self._counted, 0, len(due))
            now = clock.monotonic()
            for entry in due:
                if entry.state.renewal_failed(now):  # to be retried
                    self._warn_retry(entry, now, exc)
                else:  # expired: no retry was scheduled
                    self._lose(
                        entry, f"renewal could not reach the backend: {exc!r}", give_back=True
                    )
            return
        if len(results) != len(due):
            for entry in due:
                entry.state.renewal_failed(clock.monotonic())
            raise RuntimeError(
                f"the backend's renew() answered {len(results)} results for {len(due)} leases"
            )
        if self._counted is not None:
            renewed = sum(1 for ok in results if ok)
            telemetry.renewals(*self._counted, renewed, len(results) - renewed)
        for entry, ok in zip(due, results, strict=True):
            entry.state.renewal_done(bool(ok))
            if not ok and not self._released(entry):
                self._lose(
                    entry, "renewal found the lease gone or held by another owner", give_back=False
                )

    @staticmethod
    def _released(entry: _Tracked) -> bool:
        lease = entry.lease()
        return lease is None or lease.released

    def _log_fields(self, entry: _Tracked) -> dict[str, str]:
        """The structured fields of a log record about ``entry`` (see jobfence.telemetry)."""
        assert self._counted is not None
        family, backend = self._counted
        field = {"lock": "jobfence.lock.name", "inbox": "jobfence.key"}.get(family)
        fields = {"jobfence.backend": backend}
        if field is not None:
            fields[field] = entry.name
        return fields

    def _warn_retry(self, entry: _Tracked, now: float, exc: BaseException) -> None:
        if now - entry.warned_at < WARN_EVERY:
            return
        entry.warned_at = now
        log.warning(
            "renewing %s failed, retrying; it is lost in %.2f s unless a renewal gets through: %r",
            entry.describe(),
            entry.state.remaining(now),
            exc,
            extra=None if self._counted is None else self._log_fields(entry),
        )
