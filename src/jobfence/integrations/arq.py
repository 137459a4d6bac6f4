"""arq: guard an ``async def task(ctx, ...)`` with a lease, an idempotency claim, or both.

Put :func:`guarded` on the coroutine you list in ``WorkerSettings.functions``:

```python
from jobfence.integrations import arq as jfarq

@jfarq.guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}", retry_delay=2)
async def apply_order(ctx, order_id: int, product_id: int, qty: int) -> dict: ...

class WorkerSettings:
    functions = [func(apply_order, max_tries=20)]
```

What it adds to :func:`jobfence.guarded`:

* **The templates see the task's own arguments**: ``ctx`` (arq's per-job dict: the Redis
  pool, ``job_id``, ``job_try``, what ``on_startup`` put there) is not one of the arguments
  the ``lock``/``key`` templates and ``fingerprint`` see. The task still receives it.
* **The default key is the arq job id** (``ctx["job_id"]``): ``"arq:<job id>"``. arq runs a
  job again under the same id after its worker died (once the job's in-progress key
  expires), after a cancellation (SIGTERM) and after ``Retry``, and a job enqueued again
  with the same ``_job_id`` keeps it too: a run of a job that completed is a duplicate and
  returns the stored result without running. Give ``key="order:{order_id}"`` when the same
  piece of work may be enqueued as *different* jobs.
* **"Not now" becomes arq's own retry, uncounted**: a lost lease or claim, a claim another
  worker holds (``ClaimInProgress``, also what a killed worker's claim gives until
  ``claim_ttl`` passes) and a lock not obtained within ``timeout`` (:class:`jobfence.NotNow`)
  raise ``arq.Retry(defer=...)`` with the holder's known expiry plus jitter (``retry_delay``
  when unknown): the job stays in the queue, its score moves that far on, and the try it
  used is given back (arq's ``arq:retry:<job id>`` counter, which the next run increments,
  is decremented first), so ``job_try`` stays the same and refusals never use up
  ``max_tries``. A transient backend error raises ``arq.Retry(defer=retry_delay)``, and its
  next run has ``job_try`` one higher, counted against ``max_tries``.
* ``FingerprintMismatch`` and ``ConfigurationError`` are raised as they are: arq retries only
  ``Retry``, cancellations and ``RetryJob``, so the job fails once, for good.

arq has only ``async def`` tasks, so this module guards them with the async clients
(``AsyncLocks``, ``AsyncInbox``); a sync function is refused. Importing this module imports
arq; ``import jobfence`` does not.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import arq
from arq.constants import retry_key_prefix

from ..errors import ConfigurationError
from ..guard import DEFAULT_CLAIM_TTL
from ..retry import RetryPolicy
from ._task import DEFAULT_RETRY_DELAY, check_retry_delay, guard_options, guard_task, without_first

__all__ = ["DEFAULT_RETRY_DELAY", "FRAMEWORK", "guarded", "job_key"]

log = logging.getLogger("jobfence.integrations.arq")

FRAMEWORK = "arq"
"""The prefix of the default idempotency key: ``"arq:<job id>"``."""

F = TypeVar("F", bound=Callable[..., Any])

#: the ``ctx`` of the guarded arq task running in this task (asyncio task)
_job_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("jobfence_arq_ctx", default=None)


def _job_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    ctx = _job_ctx.get()
    ident = ctx.get("job_id") if isinstance(ctx, dict) else None
    return None if ident is None else str(ident)


def job_key() -> str | None:
    """The default idempotency key of the guarded arq task running here, ``"arq:<job id>"``
    (the same on every run of that job); ``None`` outside one, or when its ``ctx`` has no
    ``job_id`` (a direct call with a hand-made ``ctx``)."""
    ident = _job_id((), {})
    return None if ident is None else f"{FRAMEWORK}:{ident}"


def _retry(exc: BaseException, delay: float) -> BaseException:
    """``arq.Retry(defer=delay)``: arq's worker keeps the job in its queue, ``delay`` seconds
    later (with ``retry_jobs=True``, its default), and runs it again with ``job_try + 1``
    until ``max_tries``, after which the job fails with "max retries exceeded"."""
    return arq.Retry(defer=delay)


class _NotNowRetry(arq.Retry):  # type: ignore[misc]
    """A "not now" refusal sent back to arq's retry: its try is given back (see ``task``)."""


def _defer(exc: BaseException, delay: float) -> BaseException:
    """:func:`_retry` for a "not now" refusal, which does not use up a try."""
    return _NotNowRetry(defer=delay)


async def _give_back_try(ctx: Any) -> None:
    """Decrement arq's try counter of the running job (arq increments it as each run
    starts), so that the next run has the same ``job_try``: a refusal is not a try."""
    redis, job_id = ctx.get("redis"), ctx.get("job_id")
    if redis is None or job_id is None:
        return
    try:
        await redis.decr(retry_key_prefix + job_id)
    except Exception as exc:  # the retry still happens; it is counted
        log.warning("job %s: could not give back its try: %r", job_id, exc)


def _check_function(fn: Any) -> inspect.Signature:
    if not callable(fn):
        raise ConfigurationError(f"guarded needs a function, got {fn!r}", argument="fn")
    name = getattr(fn, "__qualname__", repr(fn))
    if not inspect.iscoroutinefunction(fn):
        raise ConfigurationError(
            f"{name} is not async def, but arq runs only coroutine functions: write "
            "'async def task(ctx, ...)' with the async clients (AsyncLocks, AsyncInbox)",
            argument="fn",
        )
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"{name} takes no positional ctx: arq calls a task as task(ctx, *args, **kwargs), "
            "so its first parameter must be ctx",
            argument="fn",
        )
    return signature


def guarded(
    *,
    locks: Any = None,
    inbox: Any = None,
    lock: str | Callable[..., str] | None = None,
    key: str | Callable[..., str] | None = None,
    ttl: float = 30.0,
    timeout: float | None = None,
    claim_ttl: float = DEFAULT_CLAIM_TTL,
    fingerprint: bool | Callable[..., str] | None = None,
    attempts: int = 1,
    retry: RetryPolicy | None = None,
    if_locked: str = "raise",
    skipped_result: Any = None,
    limit: tuple[str | Callable[..., str], int] | None = None,
    retry_delay: float = DEFAULT_RETRY_DELAY,
) -> Callable[[F], F]:
    """Guard an arq task, ``async def task(ctx, ...)``, like :func:`jobfence.guarded`.

    The arguments are :func:`jobfence.guarded`'s (``locks``, ``inbox``, ``lock``/``key``
    templates over the task's arguments after ``ctx``, ``ttl``, ``timeout``, ``claim_ttl``,
    ``fingerprint``, ``attempts`` / ``retry`` for in-process whole-unit retries, ``if_locked``,
    ``skipped_result``, ``limit``), plus
    ``retry_delay``: the seconds arq waits before it runs the job again after a transient
    backend error, raised as ``arq.Retry(defer=retry_delay)``, and after a "not now" refusal
    (a lost lease or claim, ``ClaimInProgress``, ``LockTimeout``) whose holder's expiry is
    unknown; a refusal waits for the holder's known expiry otherwise, and does not use up a
    try. Without ``key`` the idempotency key is
    ``"arq:<job id>"``, the same on every run of the job: a duplicate returns the stored result
    without running. ``locks``/``inbox`` must be ``AsyncLocks``/``AsyncInbox``.

    Configure arq so that those retries and a killed worker's job can finish: ``max_tries``
    (default 5; every run counts, a killed one included, but not a refused one); a
    ``job_timeout`` above
    ``timeout`` plus the task's run time (a job cancelled by its timeout fails without retry);
    and ``claim_ttl`` below ``job_timeout + 10`` s, when arq runs a killed worker's job again.
    """
    delay = check_retry_delay(retry_delay)
    options = guard_options(locals())

    def decorate(fn: F) -> F:
        _check_function(fn)
        inner = guard_task(
            without_first(fn, _job_ctx),
            framework=FRAMEWORK,
            job_id=_job_id,
            retry=_retry,
            defer=_defer,
            retry_delay=delay,
            retry_policy=retry,
            **options,
        )

        @functools.wraps(fn)
        async def task(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            token = _job_ctx.set(ctx)
            try:
                return await inner(*args, **kwargs)
            except _NotNowRetry:
                await _give_back_try(ctx)
                raise
            finally:
                _job_ctx.reset(token)

        return task  # type: ignore[return-value]

    return decorate
