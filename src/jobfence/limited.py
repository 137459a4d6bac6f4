# Generated from limited_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Acquiring a lease under a concurrency limit: ``locks.acquire(name, limit=N)`` and
``locks.try_acquire(name, limit=N)`` for ``N`` > 1 (``limited_async.py``; ``limited.py`` is
generated from it by ``tools/async_to_sync.py``).

The limit is made of plain locks (see :mod:`jobfence.limits` for the names and tokens):

* the fast path tries the slots in order, 0 first (one round trip while slot 0 is free);
* a waiter takes the gate (a plain, renewed lease: waiters are served in their order on it),
  then queues on every slot with the backend's own waiting verbs (``acquire(..., wait=)``,
  ``wait``, ``cancel_wait``): a slot released meanwhile is handed to it, not to a newcomer.
  It waits on one slot at a time for ``poll_interval / N`` seconds and looks at every slot
  between two waits, so a slot handed to it while it waited on another one is picked up
  within that time. It keeps the first slot it gets, gives back any other it was handed,
  and releases the gate;
* a backend whose waiters wait in the server (PostgreSQL session mode) is asked for one slot
  at a time, ``poll_interval / N`` seconds each.

Safety never rests on the gate: each slot is a lock, so at most ``N`` leases are held even if
a gate is lost or two waiters hold it one after the other.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from . import telemetry
from ._core import compat
from ._core.clock import get_clock
from .acquire import WaitRetry, new_owner, timed_out, usable, wait_length, warn_late_grant
from .backends.base import LockHolder
from .conflicts import is_transient
from .errors import BackendError, LockTimeout
from .lease import Lease
from .limits import gate_name, slot_name, slot_token

__all__ = ["acquire_limited", "holder_limited", "try_acquire_limited"]

log = logging.getLogger("jobfence.locks")

_NEVER = float("inf")


def try_acquire_limited(locks: Any, name: str, limit: int, ttl: float, renew: bool) -> Lease | None:
    """``locks.try_acquire(name, limit=limit)``: a free slot's lease, or ``None``."""
    began = get_clock().monotonic()
    lease = _try_slots(locks, name, limit, new_owner(), ttl, renew)
    telemetry.lock_wait(locks.backend.kind, began, lease is not None, limit=limit)
    return lease


def _try_slots(
    locks: Any, name: str, limit: int, owner: str, ttl: float, renew: bool
) -> Lease | None:
    """One try of every slot, 0 first; the first granted one's lease."""
    backend = locks.backend
    locks._prepare(name, waiting=False)
    clock = get_clock()
    for slot in range(limit):
        key = slot_name(name, slot)
        started = clock.monotonic()
        try:
            token = locks.call_backend(
                "lock.acquire", key, partial(backend.acquire, key, owner, ttl, wait=None)
            )
        except BaseException:  # the grant may have happened with its reply lost
            locks._abandon_quietly(key, owner, queued=False)
            raise
        if token is None:
            continue
        if locks.closed:
            locks._refuse_closed(key, owner)
        if not usable(started, ttl):
            warn_late_grant(key, token, started, ttl)
            locks._abandon_quietly(key, owner, queued=False)
            continue
        return _lease(locks, name, slot, owner, token, ttl, started, renew)
    return None


def _lease(
    locks: Any,
    name: str,
    slot: int,
    owner: str,
    token: int,
    ttl: float,
    started: float,
    renew: bool,
) -> Lease:
    lease: Lease = locks._lease(
        name,
        owner,
        slot_token(token, slot),
        ttl,
        started,
        renew,
        backend_name=slot_name(name, slot),
        slot=slot,
    )
    return lease


def acquire_limited(
    locks: Any, name: str, limit: int, ttl: float, timeout: float | None, renew: bool
) -> Lease:
    """``locks.acquire(name, limit=limit, ...)``: a slot's lease, waiting in turn for one at
    most ``timeout`` seconds (``None``: forever); :class:`LockTimeout` when it passes."""
    clock = get_clock()
    kind = locks.backend.kind
    began = clock.monotonic()
    deadline = None if timeout is None else began + timeout
    owner = new_owner()
    lease = _try_slots(locks, name, limit, owner, ttl, renew)
    if lease is None and (deadline is None or clock.monotonic() < deadline):
        gate = _take_gate(locks, name, ttl, timeout, deadline)
        if gate is not None:
            try:
                lease = _wait_for_slot(locks, name, limit, owner, ttl, renew, timeout, deadline)
            finally:
                _give_back_gate(gate)
    if lease is None:
        telemetry.lock_wait(kind, began, False, limit=limit)
        raise timed_out(name, timeout, holder_limited(locks, name, limit, quiet=True))
    telemetry.lock_wait(kind, began, True, limit=limit)
    return lease


def _take_gate(
    locks: Any, name: str, ttl: float, timeout: float | None, deadline: float | None
) -> Lease | None:
    """The gate's lease (``None``: the timeout passed first)."""
    key = gate_name(name)
    owner = new_owner()
    now = get_clock().monotonic()
    left = None if deadline is None else max(0.0, deadline - now)
    locks._waiting[(key, owner)] = None  # close() takes it out of the gate's queue
    try:
        lease: Lease = locks._acquire_as(key, owner, ttl, left, True, now)
        return lease
    except LockTimeout:
        return None
    finally:
        locks._waiting.pop((key, owner), None)


def _give_back_gate(gate: Lease | None) -> None:
    if gate is None:
        return
    try:
        gate.release()
    except Exception as exc:  # the next waiter takes the gate when it expires
        log.warning("releasing the gate %r failed (it will expire): %r", gate.name, exc)


def _wait_for_slot(
    locks: Any,
    name: str,
    limit: int,
    owner: str,
    ttl: float,
    renew: bool,
    timeout: float | None,
    deadline: float | None,
) -> Lease | None:
    """Queue on every slot until one is ours (``None``: the deadline passed first); called
    holding the gate."""
    clock = get_clock()
    backend = locks.backend
    long_waits = backend.capabilities.queue_follows_connection
    keys = [slot_name(name, slot) for slot in range(limit)]
    retry = WaitRetry(name, timeout, deadline)
    share = locks.poll_interval / limit  # one wait on one slot
    turn = 0
    for key in keys:
        locks._waiting[(key, owner)] = None  # close() takes us out of every slot's queue
    try:
        try:
            while True:
                compat.raise_if_cancelling()
                locks._check_open()
                now = clock.monotonic()
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    break
                piece = share if remaining is None else min(share, remaining)
                if long_waits:  # the server queues us on one slot for ``piece`` seconds
                    slot = turn % limit
                    turn += 1
                    token = locks._call_waiting(
                        retry, now, partial(locks._acquire_once, keys[slot], owner, ttl, piece)
                    )
                    lease = _taken(locks, retry, name, slot, owner, token, ttl, now, renew)
                    if lease is not None:
                        return lease
                    continue
                queue_for = wait_length(False, locks.poll_interval, remaining)
                for slot, key in enumerate(keys):  # join (or stay in) every slot's queue
                    started = clock.monotonic()
                    token = locks._call_waiting(
                        retry, started, partial(locks._acquire_once, key, owner, ttl, queue_for)
                    )
                    lease = _taken(locks, retry, name, slot, owner, token, ttl, started, renew)
                    if lease is not None:
                        _leave(locks, keys, slot, owner)
                        return lease
                if not retry.failing:
                    retry.since = _NEVER
                slot = turn % limit
                turn += 1
                started = clock.monotonic()
                token = locks._call_waiting(
                    retry, started, partial(locks._wait_once, keys[slot], owner, piece)
                )
                lease = _taken(locks, retry, name, slot, owner, token, ttl, started, renew)
                if lease is not None:
                    _leave(locks, keys, slot, owner)
                    return lease
        except BaseException:
            for key in keys:  # leave every queue; give back what was handed to us meanwhile
                locks._abandon_quietly(key, owner)
            raise
        return _last_look(locks, retry, name, keys, owner, ttl, renew)
    finally:
        for key in keys:
            locks._waiting.pop((key, owner), None)


def _taken(
    locks: Any,
    retry: WaitRetry,
    name: str,
    slot: int,
    owner: str,
    token: int | None,
    ttl: float,
    started: float,
    renew: bool,
) -> Lease | None:
    """The lease for a grant of ``slot`` (``None``: no grant, or one that came too late to
    be of use and was given back)."""
    if token is None:
        return None
    key = slot_name(name, slot)
    started = min(started, retry.since)  # the grant may be an earlier call's
    if locks.closed:
        locks._refuse_closed(key, owner)
    if usable(started, ttl):
        return _lease(locks, name, slot, owner, token, ttl, started, renew)
    warn_late_grant(key, token, started, ttl)
    try:
        locks.call_backend("lock.release", key, partial(locks.backend.release, key, owner))
    except BackendError as err:
        if not is_transient(err):
            raise
        retry.error = err
    return None


def _leave(locks: Any, keys: list[str], kept: int, owner: str) -> None:
    """We hold slot ``kept``: leave the other slots' queues, and give back any slot handed to
    us meanwhile (owner-checked), for the next waiter."""
    backend = locks.backend
    for slot, key in enumerate(keys):
        if slot == kept:
            continue
        try:
            token = locks.call_backend(
                "lock.cancel_wait", key, partial(backend.cancel_wait, key, owner)
            )
            if token is not None:
                locks.call_backend("lock.release", key, partial(backend.release, key, owner))
        except BackendError as err:  # our queue entry expires soon; a slot within its ttl
            log.warning("leaving the queue of %r failed (it will expire): %s", key, err)
            locks._abandon_quietly(key, owner)


def _last_look(
    locks: Any,
    retry: WaitRetry,
    name: str,
    keys: list[str],
    owner: str,
    ttl: float,
    renew: bool,
) -> Lease | None:
    """The deadline passed: leave every queue, keeping a slot handed to us just now."""
    backend = locks.backend
    now = get_clock().monotonic()
    kept: Lease | None = None
    for slot, key in enumerate(keys):
        try:
            token = locks.call_backend(
                "lock.cancel_wait", key, partial(backend.cancel_wait, key, owner)
            )
        except BackendError as err:
            locks._abandon_quietly(key, owner)
            if not is_transient(err):
                raise
            continue
        if token is None:
            continue
        if kept is None:
            kept = _taken(locks, retry, name, slot, owner, token, ttl, now, renew)
            if kept is not None:
                continue
        locks._abandon_quietly(key, owner, queued=False)
    return kept


def holder_limited(locks: Any, name: str, limit: int, *, quiet: bool = False) -> LockHolder | None:
    """The holder of a slot of the limit on ``name`` whose lease ends first (with the
    limit's token), ``None`` if no slot is held. ``quiet``: a failing question answers
    ``None`` (for a :class:`LockTimeout`'s text)."""
    first: LockHolder | None = None
    for slot in range(limit):
        key = slot_name(name, slot)
        if quiet:
            found = locks._holder(key)
        else:
            found = locks.call_backend("lock.holder", key, partial(locks.backend.holder, key))
        if found is None:
            continue
        found = LockHolder(
            found.owner,
            None if found.token is None else slot_token(found.token, slot),
            found.expires_in,
        )
        if first is None or _ends(found) < _ends(first):
            first = found
    return first


def _ends(holder: LockHolder) -> float:
    return _NEVER if holder.expires_in is None else holder.expires_in
