"""A guarded plain function as a worker's handler: the inbox steps on the worker's event loop,
only the function in a handler thread.

``Worker`` / ``AsyncWorker`` run a plain ``def`` handler in threads. When that handler is a
:func:`jobfence.guarded` function whose only guard is an idempotency inbox opened from a URL
(no ``locks``/``lock``/``limit``, no ``attempts``/``retry``), the worker opens the asyncio
inbox of the same URL and options on its loop (it owns it and closes it at the end of the
run) and runs each message as :func:`run_guarded_in_worker`: claim on the loop (batched with
the other handlers' claims by the asyncio inbox's group commit), the function in a thread,
complete (or release) on the loop. Every other guard keeps the whole guarded call in the
thread. The rules are those of ``run_guarded`` (see :mod:`jobfence._guard_run_async`):

* a duplicate returns the stored result without running the function (the worker counts a
  suppressed duplicate); a claim in progress elsewhere raises :class:`ClaimInProgress`;
* an exception in the function releases the claim and re-raises;
* once the function returned, the claim is never released for a failure to store the result
  (the completion is retried, as ``run_guarded`` retries it);
* the claim is renewed (by the asyncio inbox's renewer) while the function runs. A claim
  found lost cannot stop the thread: the function runs to its end (it may look at
  ``jobfence.current_claim().lost`` or call ``.check()``), and its result is then stored
  only by the owner-checked ``complete``, which raises :class:`ClaimLost` (the worker
  defers the message) when the claim is no longer this call's;
* a message waits for a handler thread with its claim made (the worker starts a plain
  function's messages up to ``prefetch`` beyond ``concurrency``: here their claims go in the
  same batches and their round trips overlap the running functions; the threads still run
  at most ``concurrency`` functions at once). If the worker stops before a thread takes it, the
  function does not run: the claim is released and the message given back uncounted
  (:class:`NotStarted`), as a received message that never started is;
* a handler cut off while the function runs (the worker stopped and its shutdown timeout
  passed) gives its message back, but the claim stays the function's: it is completed (or,
  if the function raised, released) when the function returns, and the worker's run returns
  only after that, so that its inbox keeps renewing the claim until then.

Inside the function, :func:`jobfence.current_message` is the message and
:func:`jobfence.current_claim` the claim (its ``extend``/``complete``/``release`` block the
thread while the loop runs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from . import telemetry
from ._guard_run_async import _complete, _release_claim
from ._guard_spec import GuardSpec, current_claim_var, current_lease_var, is_duplicate
from .errors import JobfenceError

__all__ = ["NotStarted", "WorkerGuard", "run_guarded_in_worker", "worker_guard"]

log = logging.getLogger("jobfence.guard")


class NotStarted(Exception):
    """The function of a claimed message never got a handler thread: the worker stopped while
    the message waited for one. Its claim was released; the worker gives the message back
    without counting the delivery."""


class WorkerGuard:
    """What a worker needs to run a guarded plain function's inbox steps on its loop."""

    def __init__(self, spec: GuardSpec, fn: Callable[..., Any], url: str, options: dict[str, Any]):
        self.spec = spec
        self.fn = fn
        self.url = url
        self.options = options
        #: the span's ``jobfence.function`` attribute
        self.function = getattr(fn, "__qualname__", None) or repr(fn)

    def open_inbox(self) -> Any:
        """The asyncio inbox of the guard's inbox's URL and options (``None``: none here)."""
        from .inbox_async import AsyncInbox

        try:
            return AsyncInbox(self.url, **self.options)
        except (ImportError, JobfenceError, TypeError) as exc:
            log.debug("guarded handler: its inbox steps run in the handler thread (%r)", exc)
            return None


def worker_guard(handler: Any) -> WorkerGuard | None:
    """The :class:`WorkerGuard` of ``handler`` when it is a guarded plain function that can
    run its inbox steps on the worker's loop: an inbox only, opened from a URL of a backend
    other than ``memory://`` (whose store is per client), no lock, limit or retries."""
    guard = getattr(handler, "_jobfence_guard", None)
    if guard is None:
        return None
    spec, body, policy = guard
    if policy is not None or spec.locks is not None or spec.lock is not None:
        return None
    if spec.limit is not None or spec.inbox is None:
        return None
    if type(spec.inbox).__name__ != "Inbox":
        return None
    opened = getattr(spec.inbox, "_opened_from", None)
    if opened is None:
        return None
    url, options = opened
    if urlsplit(url).scheme.lower() == "memory":
        return None
    return WorkerGuard(spec, body, url, options)


class _ThreadClaim:
    """The claim as the function's thread sees it (:func:`jobfence.current_claim`): the asyncio
    claim's attributes, and its coroutines run on the worker's loop, the thread waiting."""

    __slots__ = ("_claim", "_inbox", "_loop")

    def __init__(self, claim: Any, inbox: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_claim", claim)
        #: the guarded function's own (blocking) inbox: a guarded call nested in the function
        #: with the same inbox and key is refused as with the blocking claim
        object.__setattr__(self, "_inbox", inbox)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._claim, name)

    def __setattr__(self, name: str, value: Any) -> None:  # e.g. applied_before
        setattr(self._claim, name, value)

    def __repr__(self) -> str:
        return repr(self._claim)

    def _on_loop(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def extend(self, ttl: float | None = None) -> None:
        self._on_loop(self._claim.extend(ttl))

    def complete(self, result: Any = None) -> None:
        self._on_loop(self._claim.complete(result))

    def release(self) -> bool:
        return bool(self._on_loop(self._claim.release()))


def _call(job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], _ThreadClaim]) -> Any:
    """The function, in the handler thread, in its own copy of the call's context (the
    message, the span): there the claim is :func:`jobfence.current_claim` and no lease is
    current. (Set here rather than around the submission on the loop: two context changes
    fewer per message there.)"""
    fn, args, kwargs, claim = job
    current_lease_var.set(None)
    current_claim_var.set(claim)
    return fn(*args, **kwargs)


#: stands in for the span when no tracer records one (no span object or context manager
#: built per message then)
_UNTRACED = contextlib.nullcontext(telemetry.NO_SPAN)


async def _finish_later(claim: Any, future: asyncio.Future[Any]) -> None:
    """The function of a handler cut off while it ran: complete its claim with the result
    once it returns, or release it if it raised."""
    try:
        result = await future
    except BaseException:
        await _release_claim(claim)
        return
    try:
        await _complete(claim, result)
    except JobfenceError as err:
        log.warning("storing the result of %r after the worker stopped failed: %s", claim.key, err)


async def run_guarded_in_worker(
    guard: WorkerGuard,
    inbox: Any,
    pool: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    finishing: set[asyncio.Task[None]],
    returned: Callable[[], Any] | None = None,
) -> Any:
    """One guarded call of a worker's handler: claim on the loop through ``inbox`` (the
    asyncio twin of the guard's inbox), the function in ``pool`` (the worker's handler
    threads), complete or release on the loop. ``finishing``: where a task that completes
    the claim of a function still running when this call was cancelled is kept (the worker
    awaits them before closing ``inbox``). ``returned``: called once the function has
    returned, before its result is stored (the worker frees the handler's slot then: the
    completion's round trip goes on beside the next handlers, as an ack does)."""
    spec = guard.spec
    traced = (
        telemetry.span("jobfence.guarded", {"jobfence.function": guard.function})
        if telemetry.spans()
        else _UNTRACED
    )
    with traced as span:
        arguments = spec.arguments(args, kwargs)
        key = spec.key_name(arguments)
        span.set_attribute("jobfence.key", key)
        claim = await inbox.claim(
            key, fingerprint=spec.fingerprint_of(arguments), ttl=spec.claim_ttl, renew=True
        )
        if is_duplicate(claim, key):
            return claim.result
        loop = asyncio.get_running_loop()
        # awaited: ``waiter``, which gets the outcome while it waits; if this call is
        # cancelled first, the outcome goes to ``future`` instead (as with a shield of it)
        waiter: asyncio.Future[Any] = loop.create_future()
        job = (guard.fn, args, kwargs, _ThreadClaim(claim, spec.inbox, loop))
        future = pool.run(_call, job, waiter)
        try:
            result = await waiter
        except asyncio.CancelledError:
            if future.cancelled():
                # no thread ever took the call (the worker, stopping, cancelled the calls
                # still waiting for one): the function did not run, its claim goes back
                await _release_claim(claim)
                raise NotStarted(claim.key) from None
            # the worker gave the message back; the function may still run (a thread cannot
            # be stopped): its claim is completed, or released, once it is done (a call no
            # thread took is cancelled at the end of the run, and released then). Cancelled
            # after the outcome reached ``waiter`` (before this call resumed): it is there.
            outcome = waiter if waiter.done() and not waiter.cancelled() else future
            task = loop.create_task(_finish_later(claim, outcome))
            finishing.add(task)
            task.add_done_callback(finishing.discard)
            raise
        except BaseException:
            await _release_claim(claim)
            raise
        if returned is not None:
            returned()
        await _complete(claim, result)
        return result
