"""The body of :func:`jobfence.guarded`: ``run_guarded_async`` for a coroutine function
(``_guard_run_async.py``), ``run_guarded`` for a plain one (``_guard_run.py``, generated).

lock -> claim -> run (with retries) -> complete -> release, with the failure rules:

* a duplicate (claim COMPLETED) returns the stored result without running (inside a worker's
  handler, the worker counts it as a suppressed duplicate);
* a claim owned by another live worker raises :class:`ClaimInProgress`, a lease held by
  another worker :class:`LockTimeout`: "not now" refusals (:class:`~jobfence.errors.NotNow`)
  whose ``retry_after`` is the holder's known expiry; a worker defers them uncounted;
* an exception in the function releases the claim (a redelivery may retry) and re-raises;
* once the function has returned, its claim is never released for a failure to store the
  result: a transient failure is retried, and if the result still cannot be stored the claim
  is kept (completed by an attempt whose answer was lost, or in progress until its ttl), so a
  redelivery does not run the function a second time;
* the claim is renewed while the function runs; a claim found lost cancels an async
  function (raising :class:`ClaimLost`), and its result is stored only by an owner-checked
  ``complete``;
* a lost lease releases the claim -- never completes it -- and raises :class:`LockLost`.
  With both a lock and an inbox, the lease is confirmed on the backend right before the
  claim is completed -- an owner-checked ``extend``, one round trip; or, when both are on the
  same Redis, in the completion's own script, which stores nothing unless the lease is still
  this holder's -- so a lease that is gone on the server but not yet noticed locally cannot
  let a result be stored; a release that then finds the lease gone (it expired during the
  completion itself) is logged, not raised: the result is stored and is what a redelivery
  replays.

Round trips with a lock and an inbox, where they are not on one Redis database: acquire,
claim, the confirming ``extend``, complete, release (batched on the inbox's side where its
backend batches). On the same database of one Redis, two: one script takes the lease and,
only if it was free, claims the key; one script stores the result, only while the lease is
still this holder's, and releases the lease (hand-off to a waiter included). A duplicate or
a claim in progress elsewhere keeps the lease the first script took, and the block gives it
back as for any other outcome (so its release, and a loss it reports, are those of every
other call). A lease not free on the first try with ``timeout`` > 0 is waited for as before,
and the key then claimed on its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from . import telemetry
from ._core.clock import get_clock
from ._guard_spec import GuardSpec, current_claim_var, current_lease_var, is_duplicate
from .acquire_async import new_owner
from .conflicts import is_transient
from .errors import (
    BackendError,
    ClaimLost,
    JobfenceError,
    LimitReached,
    LockLost,
    LockTimeout,
)
from .limited_async import holder_limited

__all__ = ["run_guarded_async"]

log = logging.getLogger("jobfence.guard")

_SKIPPED = object()
#: how many times a transiently failing ``complete`` is tried, and the pause between tries
#: (seconds, times the attempt number)
COMPLETE_ATTEMPTS = 3
COMPLETE_PAUSE = 0.05


async def _release_claim(claim: Any) -> None:
    try:
        await claim.release()
    except JobfenceError as err:  # the claim will expire after its ttl
        log.warning("releasing the claim on %r failed: %s", claim.key, err)


async def _complete(
    claim: Any, result: Any, held: tuple[str, str] | None = None, release: Any = None
) -> bool:
    """Store the result (``held``: only while that lease is held, checked in the same
    script; False if it was not, and then nothing was stored and the claim is still ours;
    ``release``: that lease, released by the same script unless it was not held).
    The function has run, so a failure here must not let a redelivery run it again: a
    transient failure (the backend did not answer) is retried, up to
    ``COMPLETE_ATTEMPTS`` times while the claim is held; if the result still cannot be
    stored, or a retry finds the claim no longer in progress (the first attempt may have
    stored it before its answer was lost), the claim is kept, not released: a redelivery
    finds it completed, or in progress until its ttl passes. Only an error that says
    nothing was stored (a result the serializer rejects) gives the key back."""
    attempt = 0
    while True:
        attempt += 1
        try:
            if held is None:
                await claim.complete(result)
                return True
            return bool(await claim._complete_if_held(result, *held, release=release))
        except ClaimLost:
            raise  # taken over, or stored by an attempt whose answer was lost: keep it
        except BackendError as err:
            if not is_transient(err) and attempt == 1:
                await _release_claim(claim)
                raise
            if attempt >= COMPLETE_ATTEMPTS or claim.lost:
                claim._stop_renewal()  # expires after its ttl; never released
                raise
            log.warning(
                "storing the result of %r failed (%s); trying again (%d of %d)",
                claim.key,
                err,
                attempt + 1,
                COMPLETE_ATTEMPTS,
            )
            await get_clock().asleep(COMPLETE_PAUSE * attempt)
        except BaseException:  # e.g. a result the serializer rejects: let a redelivery in
            await _release_claim(claim)
            raise


async def _confirm(lease: Any) -> None:
    """Is the lease still ours on the server? An owner-checked ``extend``: ``LockLost`` if
    not. If the lock backend does not answer, the lease is still within its local deadline
    (``check()``), so go on."""
    try:
        await lease.extend()
    except LockLost:
        raise
    except JobfenceError as err:
        log.warning("could not confirm the lease on %r before completing: %s", lease.name, err)
        lease.check()


def _lease_gone(spec: GuardSpec, lease: Any) -> None:
    """The completion's own lease check found the lease gone or another holder's: marked
    lost here, as a refused ``extend`` marks it (no longer renewed, ``on_lost`` run)."""
    spec.locks.stop_renewing(lease)
    lease.mark_lost("the lease was found gone or held by another owner before completing")


async def _lease_and_claim(
    spec: GuardSpec, name: str, key: str, fingerprint: str | None
) -> tuple[Any, Callable[[], Awaitable[Any]] | None]:
    """The lease and the claim in ONE script, the lock and the inbox being on one Redis
    database (``RedisInboxBackend.claim_leased``): the lease taken as ``try_acquire`` takes
    it, then, only if it was, the key claimed as ``claim`` claims it. The call passes the I/O
    hook points ``lock.acquire`` then ``inbox.claim``. Returns the lease (``None``: it was not
    free, and nothing was claimed) and what makes the claim of the record the script returned
    -- awaited first thing in the lease's block, so that a fingerprint mismatch, a duplicate
    or a claim in progress elsewhere gives the lease back as the block gives it back.

    Interrupted, or its reply lost, the call gives back the lease and the claim (both
    owner-checked); a grant too late to be of use gives back both too."""
    locks, inbox = spec.locks, spec.inbox
    locks._check_open()
    name, _ = locks._checked(name, 1)
    key, fingerprint, ttl, owner = inbox._new_claim(key, fingerprint, spec.claim_ttl)
    if inbox._orphans:
        await inbox._orphans_go(key)
    lease_owner = new_owner()
    lease_key = locks.backend.lock_key(name)
    backend = inbox.backend
    sent: list[Any] = []  # when the script was sent, then the claim's record

    async def claim_leased() -> tuple[int, Any]:
        return await backend.claim_leased(  # type: ignore[no-any-return]
            key, owner, fingerprint, ttl, lease_key, lease_owner, spec.ttl
        )

    async def grant() -> int | None:
        sent.append(get_clock().monotonic())
        token, record = await inbox.call_hooked("inbox.claim", key, claim_leased)
        if record is None:
            return None
        sent.append(record)
        return int(token)

    try:
        lease = await locks._try_acquire(name, lease_owner, spec.ttl, True, grant)
    except BaseException:
        # the reply may have been lost with the key claimed: give it back (the lease is
        # given back by the acquire itself)
        await inbox._abandon_quietly(key, owner)
        raise
    if len(sent) < 2:
        return lease, None  # the lease was not free: nothing was claimed
    started, record = sent
    if lease is None:  # granted too late to be of use: the lease was given back
        if record.mine:
            await inbox._abandon_quietly(key, owner)
        return None, None
    return lease, partial(inbox._claimed, key, owner, fingerprint, ttl, started, True, record)


async def run_guarded_async(
    spec: GuardSpec, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run one guarded call inside a ``jobfence.guarded`` span (see :mod:`jobfence.telemetry`):
    its attributes name the function, and the lock, token and key once they are known (no
    span at all while no tracer would record it)."""
    if not telemetry.spans():
        return await _run_guarded_async(spec, fn, args, kwargs, telemetry.NO_SPAN)
    function = getattr(fn, "__qualname__", None) or repr(fn)
    with telemetry.span("jobfence.guarded", {"jobfence.function": function}) as span:
        return await _run_guarded_async(spec, fn, args, kwargs, span)


async def _run_guarded_async(
    spec: GuardSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    span: Any,
) -> Any:
    arguments = spec.arguments(args, kwargs)
    if spec.limit is None:
        return await _run_locked_async(spec, fn, args, kwargs, span, arguments)
    slot = await _take_limit(spec, arguments, span)
    try:
        return await _run_locked_async(spec, fn, args, kwargs, span, arguments)
    finally:
        await _give_back_limit(slot)


async def _take_limit(spec: GuardSpec, arguments: dict[str, Any], span: Any) -> Any:
    """One of the ``n`` leases of the call's concurrency limit, or :class:`LimitReached`
    (a "not now" refusal; its ``retry_after`` is when the first held lease ends)."""
    name, n = spec.limit_name(arguments)
    span.set_attribute("jobfence.limit.name", name)
    span.set_attribute("jobfence.limit", n)
    lease = await spec.locks.try_acquire(name, ttl=spec.ttl, limit=n)
    if lease is not None:
        return lease
    holder = await _first_holder(spec.locks, name, n)
    left = None if holder is None else holder.expires_in
    ends = "" if left is None else f"; the first ends within {left:.1f} s"
    raise LimitReached(
        f"{name!r} has its limit of {n} concurrent runs reached{ends}",
        name=name,
        limit=n,
        owner=None if holder is None else holder.owner,
        token=None if holder is None else holder.token,
        expires_in=None if holder is None else holder.expires_in,
    )


async def _first_holder(locks: Any, name: str, n: int) -> Any:
    """The holder whose lease on the limit ``name`` ends first (``None``: unknown)."""
    if n > 1:
        return await holder_limited(locks, name, n, quiet=True)
    return await locks._holder(name)


async def _give_back_limit(lease: Any) -> None:
    """Release the call's lease of its concurrency limit. A limit bounds load, not
    correctness: a lease found lost meanwhile is logged, never raised over the call's own
    outcome."""
    try:
        await lease.release()  # a lease found lost is logged by the lease itself
    except JobfenceError as err:
        log.warning("releasing %s failed (it will expire): %s", lease.label, err)


async def _run_locked_async(
    spec: GuardSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    span: Any,
    arguments: dict[str, Any],
) -> Any:
    lease = None
    key: str | None = None
    #: the claim taken with the lease by one script (lock and inbox on one Redis)
    claimed: Callable[[], Awaitable[Any]] | None = None
    one_redis = False
    if spec.locks is not None and spec.lock is not None:
        name = spec.lock_name(arguments)
        span.set_attribute("jobfence.lock.name", name)
        one_redis = spec.inbox is not None and spec.one_redis()
        if one_redis:  # the first try also claims the key: one round trip for both
            key = spec.key_name(arguments)
            span.set_attribute("jobfence.key", key)
            fingerprint = spec.fingerprint_of(arguments)
            lease, claimed = await _lease_and_claim(spec, name, key, fingerprint)
        if lease is not None:
            pass
        elif spec.timeout == 0:
            if not one_redis:
                lease = await spec.locks.try_acquire(name, ttl=spec.ttl)
            if lease is None and spec.if_locked == "raise":
                # who holds it, and for how long (the refusal's retry_after), where the
                # backend can tell; one more round trip, only on this path
                holder = await spec.locks._holder(name)
                raise LockTimeout(
                    f"{name!r} is held by another worker"
                    + ("" if holder is None else f" ({holder.owner}, {holder.expires_in} s left)"),
                    name=name,
                    owner=None if holder is None else holder.owner,
                    token=None if holder is None else holder.token,
                    expires_in=None if holder is None else holder.expires_in,
                )
        else:
            try:
                lease = await spec.locks.acquire(name, ttl=spec.ttl, timeout=spec.timeout)
            except LockTimeout:
                if spec.if_locked == "raise":
                    raise
        if lease is None:
            return spec.skipped_result
        span.set_attribute("jobfence.lock.token", lease.token)
    completed = False
    try:
        async with lease if lease is not None else contextlib.nullcontext():
            claim = None
            if spec.inbox is not None:
                if key is None:
                    key = spec.key_name(arguments)
                    span.set_attribute("jobfence.key", key)
                if claimed is not None:
                    claim = await claimed()
                else:
                    claim = await spec.inbox.claim(
                        key,
                        fingerprint=spec.fingerprint_of(arguments),
                        ttl=spec.claim_ttl,
                        renew=True,
                    )
                if is_duplicate(claim, key):
                    return claim.result
            token = current_lease_var.set(lease)
            claim_token = current_claim_var.set(claim)
            try:
                if claim is None:
                    result = await fn(*args, **kwargs)
                else:  # async: cancelled if the claim is found lost meanwhile (ClaimLost)
                    result = await claim._run_work(fn, *args, **kwargs)
            except BaseException:
                if claim is not None:
                    await _release_claim(claim)
                raise
            finally:
                current_claim_var.reset(claim_token)
                current_lease_var.reset(token)
            held = None
            if lease is not None and (lease.lost or claim is not None):
                try:
                    lease.check()  # raises LockLost
                    if claim is not None:
                        held = spec.held_check(lease)
                        if held is None:
                            await _confirm(lease)
                except BaseException:  # LockLost, a cancellation: let a redelivery in
                    if claim is not None:
                        await _release_claim(claim)
                    raise
            if claim is not None:
                # on one Redis, the script that stores the result also releases the lease
                release = lease if one_redis and held is not None else None
                if not await _complete(claim, result, held, release) and lease is not None:
                    # the lease was gone on the server: nothing stored, let a redelivery in
                    _lease_gone(spec, lease)
                    await _release_claim(claim)
                    lease.check()  # raises LockLost
                completed = True
            return result
    except LockLost as lost:
        if not completed:
            raise
        log.warning("the result was stored, but releasing the lease failed: %s", lost)
        return result
