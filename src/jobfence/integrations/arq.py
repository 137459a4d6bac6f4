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
* **"Not now" becomes arq's own retry**: a lost lease or claim, a claim another worker holds
  (``ClaimInProgress``, also what a killed worker's claim gives until ``claim_ttl`` passes),
  a lock not obtained within ``timeout`` and a transient backend error raise
  ``arq.Retry(defer=retry_delay)``: the job stays in the queue, its score moves
  ``retry_delay`` seconds on, and its next run has ``job_try`` one higher, counted against
  ``max_tries``.
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
from collections.abc import Callable
from typing import Any, TypeVar

import arq

from ..errors import ConfigurationError
from ..guard import DEFAULT_CLAIM_TTL
from ..retry import RetryPolicy
from ._task import DEFAULT_RETRY_DELAY, check_retry_delay, guard_options, guard_task, without_first

__all__ = ["DEFAULT_RETRY_DELAY", "FRAMEWORK", "guarded", "job_key"]

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
    retry_delay: float = DEFAULT_RETRY_DELAY,
) -> Callable[[F], F]:
    """Guard an arq task, ``async def task(ctx, ...)``, like :func:`jobfence.guarded`.

    The arguments are :func:`jobfence.guarded`'s (``locks``, ``inbox``, ``lock``/``key``
    templates over the task's arguments after ``ctx``, ``ttl``, ``timeout``, ``claim_ttl``,
    ``fingerprint``, ``attempts`` / ``retry`` for in-process whole-unit retries, ``if_locked``,
    ``skipped_result``), plus
    ``retry_delay``: the seconds arq waits before it runs the job again when jobfence says
    "not now" (a lost lease or claim, ``ClaimInProgress``, ``LockTimeout``, a transient backend
    error), raised as ``arq.Retry(defer=retry_delay)``. Without ``key`` the idempotency key is
    ``"arq:<job id>"``, the same on every run of the job: a duplicate returns the stored result
    without running. ``locks``/``inbox`` must be ``AsyncLocks``/``AsyncInbox``.

    Configure arq so that those retries and a killed worker's job can finish: ``max_tries``
    (default 5, and every run counts, a killed one included) large enough to outlast
    ``claim_ttl`` and ``timeout`` at ``retry_delay`` per try; a ``job_timeout`` above
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
            retry_delay=delay,
            retry_policy=retry,
            **options,
        )

        @functools.wraps(fn)
        async def task(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            token = _job_ctx.set(ctx)
            try:
                return await inner(*args, **kwargs)
            finally:
                _job_ctx.reset(token)

        return task  # type: ignore[return-value]

    return decorate
