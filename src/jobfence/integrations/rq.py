"""RQ: guard a job function with a lease, an idempotency claim, or both, and let RQ retry it.

```python
from rq import Queue, Retry
from jobfence.integrations.rq import guarded

@guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}", retry_delay=5)
def place_order(order_id: int, product_id: int, qty: int) -> dict:
    ...

Queue("orders", connection=redis).enqueue(place_order, 7, 1, 5, retry=Retry(max=3))
```

:func:`guarded` takes :func:`jobfence.guarded`'s arguments plus ``retry_delay`` and
``max_retries``. In an RQ job:

* without ``key=``, the idempotency key is ``"rq:<job id>"``: RQ keeps a job's id on every
  retry and requeue, so running the same job again is a duplicate and returns the stored
  result without running the function;
* a lost lease or claim, a claim another worker holds (or a killed worker's, not expired
  yet), a lock not obtained in time and a transient backend error make the job *return*
  ``rq.Retry(max=max_retries, interval=...)``: RQ's own return-based retry, which
  schedules the same job again (a delay > 0 needs a scheduler: ``rq worker --with-scheduler``).
  A "not now" refusal (:class:`jobfence.NotNow`: the lease, the claim) runs again after the
  holder's known expiry plus jitter (``retry_delay`` when unknown) and is NOT counted against
  ``max_retries``; a transient backend error runs again after ``retry_delay``, counted;
* ``FingerprintMismatch`` and ``ConfigurationError`` fail the job for good: the job's
  remaining exception retries (``enqueue(..., retry=Retry(...))``) are cleared first, since
  the same job would fail the same way each time;
* every other exception, the function's own included, is left to RQ as it is.

Outside an RQ job (a plain call, a test) the function behaves like a ``guarded`` one: it needs
``key=``, and the "try again later" outcomes are raised as they are.

RQ imports this module's caller's functions by name, so decorate module-level functions.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from rq import Retry, get_current_job

from ..errors import ConfigurationError, NotNow
from ._task import DEFAULT_RETRY_DELAY, guard_task

__all__ = ["DEFAULT_MAX_RETRIES", "guarded", "guarded_job"]

log = logging.getLogger("jobfence.integrations.rq")

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_MAX_RETRIES = 20
"""How many times one RQ job may be sent back to RQ's retry by jobfence before RQ fails it."""


class _RetryLater(Exception):
    """A jobfence outcome that asks RQ to run the job again after ``delay`` seconds."""

    def __init__(self, cause: BaseException, delay: float) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}; retry in {delay} s")
        self.cause = cause
        self.delay = delay


def _job_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    job = get_current_job()
    return None if job is None else str(job.id)


def _final(exc: BaseException) -> BaseException:
    """Clear the running job's exception retries: a fingerprint mismatch or a configuration
    error would fail the same way on every retry. RQ's failure handling reads ``retries_left``
    from this very job object."""
    job = get_current_job()
    if job is not None and job.retries_left:
        log.warning(
            "job %s: %s: %s; not retried (%s exception retries dropped)",
            job.id,
            type(exc).__name__,
            exc,
            job.retries_left,
        )
        job.retries_left = 0
    return exc


def _check_max_retries(max_retries: Any) -> int:
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1:
        raise ConfigurationError(
            f"max_retries must be an int >= 1 (how many times RQ may retry one job for "
            f"jobfence), got {max_retries!r}",
            argument="max_retries",
        )
    return int(max_retries)


def _retry(request: _RetryLater, max_retries: int) -> Retry:
    """What the job returns to ask RQ for a retry, or the jobfence exception itself when
    there is no RQ job to retry."""
    job = get_current_job()
    if job is None:
        raise request.cause
    # rq.Retry takes whole seconds; round up so the job never runs again sooner than asked
    interval = math.ceil(request.delay)
    if isinstance(request.cause, NotNow):
        # "not now" (another worker holds the claim or lease): RQ counts every returned Retry
        # in number_of_retries (+ 1 as it schedules the job); one less here leaves the count
        # as it was, so refusals never use up max_retries
        job.number_of_retries = (job.number_of_retries or 0) - 1
        log.info(
            "job %s: %s: %s; RQ runs it again in %d s (not counted as a retry)",
            job.id,
            type(request.cause).__name__,
            request.cause,
            interval,
        )
        return Retry(max=max_retries, interval=interval)
    done = job.number_of_retries or 0
    if done >= max_retries:
        log.warning(
            "job %s: %s: %s; not retried again: max_retries=%d reached, RQ fails the job",
            job.id,
            type(request.cause).__name__,
            request.cause,
            max_retries,
        )
    else:
        log.warning(
            "job %s: %s: %s; RQ retries it in %d s (retry %d of at most %d)",
            job.id,
            type(request.cause).__name__,
            request.cause,
            interval,
            done + 1,
            max_retries,
        )
    return Retry(max=max_retries, interval=interval)


def guarded(
    *,
    retry_delay: float = DEFAULT_RETRY_DELAY,
    max_retries: int = DEFAULT_MAX_RETRIES,
    **guard_options: Any,
) -> Callable[[F], F]:
    """Guard an RQ job function like :func:`jobfence.guarded` (``guard_options`` are its
    arguments: ``locks``, ``inbox``, ``lock``, ``key``, ``ttl``, ``timeout``, ``claim_ttl``,
    ``fingerprint``, ``attempts``/``retry``, ``if_locked``, ``skipped_result``, ``limit``),
    with RQ's job id as the default key and RQ's own retry for jobfence's "try again later"
    outcomes.

    ``lock``/``key`` templates see the job's own arguments (RQ passes them as enqueued).
    Without ``key``, the key is ``"rq:<job id>"``, the same on every retry and requeue of the
    job, so a second run of a completed job returns the stored result without running.

    ``retry_delay`` (seconds, default 5, rounded up to whole seconds as ``rq.Retry`` wants):
    a lost lease or claim, a claim in progress, a lock timeout or a transient backend error
    makes the job return ``rq.Retry(max=max_retries, interval=...)``; RQ schedules it
    again (a delay > 0 needs ``rq worker --with-scheduler``). A "not now" refusal (the lease
    or claim: :class:`jobfence.NotNow`) waits for the holder's known expiry plus jitter
    (``retry_delay`` when unknown) and is not counted. ``max_retries`` (default 20) bounds the
    counted retries (transient backend errors) per job; past it RQ fails the job. A fingerprint
    mismatch or a
    configuration error fails the job without retry, even if it was enqueued with
    ``retry=Retry(...)``. Works for ``def`` and ``async def`` job functions (RQ runs the
    latter with ``asyncio.run``; pass ``AsyncLocks``/``AsyncInbox`` then).
    """
    retries = _check_max_retries(max_retries)
    # guarded's retry=RetryPolicy(...) (in-process re-runs) is guard_task's retry_policy:
    # guard_task's own retry is how a job goes back to RQ
    options = dict(guard_options)
    if "retry" in options:
        options["retry_policy"] = options.pop("retry")

    def decorate(fn: F) -> F:
        task = guard_task(
            fn,
            framework="rq",
            job_id=_job_id,
            retry=_RetryLater,
            defer=_RetryLater,
            retry_delay=retry_delay,
            final=_final,
            **options,
        )

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_job(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await task(*args, **kwargs)
                except _RetryLater as exc:
                    request = exc
                # outside the except block: a re-raised cause gets no added context
                return _retry(request, retries)

            return async_job  # type: ignore[return-value]

        @functools.wraps(fn)
        def job(*args: Any, **kwargs: Any) -> Any:
            try:
                return task(*args, **kwargs)
            except _RetryLater as exc:
                request = exc
            return _retry(request, retries)

        return job  # type: ignore[return-value]

    return decorate


#: the same as :func:`guarded` (its first name)
guarded_job = guarded
