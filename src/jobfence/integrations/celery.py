"""Celery: guard a task with a lease, an idempotency claim, or both.

Put :func:`guarded` UNDER ``@app.task``, so that Celery registers the guarded function:

```python
from jobfence.integrations import celery as jfcelery

@app.task(acks_late=True, reject_on_worker_lost=True, max_retries=None)
@jfcelery.guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}")
def apply_order(order_id: int, product_id: int, qty: int) -> dict: ...
```

What it adds to :func:`jobfence.guarded`:

* **The default key is the Celery task id** (``request.id``, read from
  ``celery.current_task``, so ``bind=True`` is not needed): ``"celery:<task id>"``. A message
  RabbitMQ or Redis delivers again (its worker died before the ack) and every ``retry()`` of
  the task keep that id, so a redelivery of a task that completed is a duplicate: it returns
  the stored result without running. Give ``key="order:{order_id}"`` when the same piece of
  work may be sent as *different* tasks.
* **"Not now" is sent again without using a retry**: a lost lease or claim, a claim another
  worker holds (``ClaimInProgress``, also what a killed worker's claim gives until
  ``claim_ttl`` passes) and a lock not obtained within ``timeout`` (:class:`jobfence.NotNow`)
  send the task again as ``Task.retry`` does -- same id, state RETRY -- after the holder's
  known expiry plus jitter (``retry_delay`` when unknown), but with its ``retries`` count
  unchanged: the task's ``max_retries`` is not used up by refusals.
* A transient backend error calls ``Task.retry(exc=..., countdown=retry_delay)``; the task's
  ``max_retries`` applies.
* ``FingerprintMismatch`` and ``ConfigurationError`` are raised as they are: Celery does not
  retry a task's exceptions unless ``autoretry_for`` says so (then also give
  ``dont_autoretry_for=NOT_RETRIED``).

With ``@app.task(bind=True)`` the function's first parameter, ``self``, is the task: it is not
one of the arguments the ``lock``/``key`` templates and ``fingerprint`` see. Celery runs tasks
synchronously (Celery 5 has no ``async def`` tasks), so this module guards sync functions with
the sync clients (``Locks``, ``Inbox``); an ``async def`` function is refused.

Importing this module imports Celery; ``import jobfence`` does not.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import celery
from celery import current_task
from celery.exceptions import Reject, Retry

from ..errors import ConfigurationError, FingerprintMismatch
from ..guard import DEFAULT_CLAIM_TTL
from ..retry import RetryPolicy
from ._task import DEFAULT_RETRY_DELAY, check_retry_delay, guard_options, guard_task, without_first

__all__ = ["DEFAULT_RETRY_DELAY", "FRAMEWORK", "NOT_RETRIED", "guarded", "job_key"]

log = logging.getLogger("jobfence.integrations.celery")

FRAMEWORK = "celery"
"""The prefix of the default idempotency key: ``"celery:<task id>"``."""

NOT_RETRIED: tuple[type[Exception], ...] = (FingerprintMismatch, ConfigurationError)
"""The jobfence errors that fail the same way on every run of a message: give them as
``dont_autoretry_for`` to a task whose ``autoretry_for`` would catch them, e.g.
``@app.task(autoretry_for=(Exception,), dont_autoretry_for=NOT_RETRIED)``."""

F = TypeVar("F", bound=Callable[..., Any])

#: the bound task (``self``) of the ``bind=True`` task running in this context
_bound_task: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jobfence_celery_bound_task", default=None
)


def _running_task() -> Any:
    """The Celery task executing in this thread (``None`` outside a task): Celery pushes it
    on its task stack for a worker's execution, ``apply()`` and a direct call alike."""
    return current_task if current_task else None


def _task_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    task = _running_task()
    if task is None:
        return None
    ident = task.request.id
    return None if ident is None else str(ident)


def job_key() -> str | None:
    """The default idempotency key of the Celery task running here, ``"celery:<task id>"``
    (the same on every redelivery and every ``retry()`` of that task); ``None`` outside a
    task executed by a worker or by ``apply()`` (a plain function call has no task id)."""
    ident = _task_id((), {})
    return None if ident is None else f"{FRAMEWORK}:{ident}"


def _retry(exc: BaseException, delay: float) -> BaseException:
    """``Task.retry(exc=exc, countdown=delay)`` of the running task: the task is sent again
    with the same id and arguments, and the worker records the state RETRY (with
    ``acks_late``, it acknowledges the current message only after the retry was sent). Once
    ``max_retries`` is reached, Celery raises ``exc`` itself and the task fails. Called
    directly (not by a worker), ``exc`` is raised as it is.

    If the retry cannot be sent (the broker is unreachable), Celery rejects the message
    without requeueing it, which with ``acks_late`` drops it: the rejection is turned into one
    that requeues it, so the broker delivers the same message again (at once, not after
    ``delay``) instead of losing it."""
    task = _running_task()
    if task is None or task.request.called_directly:
        return exc
    try:
        retry: BaseException = task.retry(exc=exc, countdown=delay, throw=False)
    except Reject as rejected:
        if rejected.requeue:
            raise
        log.warning(
            "sending the retry of task %s failed (%s): requeueing its message instead",
            task.request.id,
            rejected.reason,
        )
        requeue: BaseException = Reject(rejected.reason, requeue=True)
        return requeue
    return retry


def _defer(exc: BaseException, delay: float) -> BaseException:
    """A "not now" refusal: the task is sent again after ``delay`` seconds exactly as
    ``Task.retry`` sends it (same id and arguments, state RETRY), but with the request's
    ``retries`` count as it is, so refusals never use up ``max_retries``. Called directly, or
    in eager mode (nothing to send), it is an ordinary :func:`_retry`."""
    task = _running_task()
    if task is None or task.request.called_directly or task.request.is_eager:
        return _retry(exc, delay)
    request = task.request
    signature = task.signature_from_request(
        request, None, None, countdown=delay, retries=request.retries or 0
    )
    try:
        signature.apply_async()
    except Exception as err:  # the broker is unreachable: requeue the message itself
        log.warning(
            "sending task %s again failed (%s): requeueing its message instead", request.id, err
        )
        requeue: BaseException = Reject(str(err), requeue=True)
        return requeue
    deferred: BaseException = Retry(exc=exc, when=delay, sig=signature)
    return deferred


def _check_function(fn: Any) -> None:
    if isinstance(fn, celery.Task):
        raise ConfigurationError(
            f"jobfence.integrations.celery.guarded got the Celery task {fn.name!r}: put "
            "@guarded(...) UNDER @app.task(...), so that Celery registers the guarded function",
            argument="fn",
        )
    if not callable(fn):
        raise ConfigurationError(f"guarded needs a function, got {fn!r}", argument="fn")
    if inspect.iscoroutinefunction(fn):
        raise ConfigurationError(
            f"{fn.__qualname__} is async def, but Celery runs tasks synchronously (Celery 5 "
            "has no async def tasks): write a sync task with the sync Locks/Inbox clients",
            argument="fn",
        )


def _is_bound(fn: Callable[..., Any]) -> bool:
    """Does ``fn`` take the task as its first parameter (``@app.task(bind=True)``)? By
    Celery's convention that parameter is named ``self``."""
    params = list(inspect.signature(fn).parameters.values())
    return bool(params) and params[0].name == "self"


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
    """Guard a Celery task function like :func:`jobfence.guarded`; place it under
    ``@app.task(...)``.

    The arguments are :func:`jobfence.guarded`'s (``locks``, ``inbox``, ``lock``/``key``
    templates over the task's own arguments, ``ttl``, ``timeout``, ``claim_ttl``,
    ``fingerprint``, ``attempts`` / ``retry`` for in-process whole-unit retries, ``if_locked``,
    ``skipped_result``, ``limit``), plus
    ``retry_delay``: the seconds Celery waits before it runs the task again after a transient
    backend error, and after a "not now" refusal (a lost lease or claim, ``ClaimInProgress``,
    ``LockTimeout``) whose holder's expiry is unknown; a refusal is sent again without using
    up ``max_retries``. Without ``key`` the idempotency key is ``"celery:<task id>"``, the same
    on every
    redelivery and retry of the task: a duplicate returns the stored result without running.

    Configure the task with ``acks_late=True`` and ``reject_on_worker_lost=True`` (a task
    whose worker dies is delivered again instead of acknowledged and lost). Refusals do not
    count against ``max_retries`` (Celery's default, 3, applies to the task's failures and
    transient backend errors only).
    """
    delay = check_retry_delay(retry_delay)
    options = guard_options(locals())

    def decorate(fn: F) -> F:
        _check_function(fn)
        bound = _is_bound(fn)
        inner = guard_task(
            without_first(fn, _bound_task) if bound else fn,
            framework=FRAMEWORK,
            job_id=_task_id,
            retry=_retry,
            defer=_defer,
            retry_delay=delay,
            retry_policy=retry,
            **options,
        )
        if not bound:
            return inner  # type: ignore[return-value]

        @functools.wraps(fn)
        def bound_task(*args: Any, **kwargs: Any) -> Any:
            if not args or not isinstance(args[0], celery.Task):
                raise ConfigurationError(
                    f"{fn.__qualname__}'s first parameter is named self, the task of "
                    "@app.task(bind=True), but it was not called as a bound task: declare "
                    "it with @app.task(bind=True), or rename the parameter",
                    argument="fn",
                )
            token = _bound_task.set(args[0])
            try:
                return inner(*args[1:], **kwargs)
            finally:
                _bound_task.reset(token)

        return bound_task  # type: ignore[return-value]

    return decorate
