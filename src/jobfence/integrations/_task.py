"""What the framework integrations (Celery, RQ, Dramatiq, arq) share.

Each framework module turns its task function into a :func:`jobfence.guarded` one, with two
things only the framework knows:

* ``job_id``: the framework's own id of the message or job being run (the same on every
  redelivery of that message). Without a ``key=`` template the idempotency key is
  ``"<framework>:<job id>"``, so a redelivery is a duplicate and returns the stored result.
* ``retry``: how to fail the task into the framework's own retry, after ``delay`` seconds.
  jobfence's "try again" outcomes go there (see :func:`wants_retry`); every other
  exception, the task's own included, is left to the framework as it is.
* ``defer``: the same for a "not now" refusal (:class:`~jobfence.errors.NotNow`: another
  worker holds the claim or lease, or this one lost them), but WITHOUT using up the task's
  retry budget where the framework allows it, after the refusal's ``retry_after`` (the
  holder's known expiry) plus jitter, or ``retry_delay`` when unknown (:func:`not_now_delay`).
  A framework without one sends refusals to ``retry``.

``FingerprintMismatch`` and ``ConfigurationError`` are never retried: the same message would
fail the same way each time. A framework that retries every exception by default gets
``final`` to stop that (e.g. Dramatiq); the others let them through unchanged.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import random
from collections.abc import Callable
from typing import Any

from .._guard_spec import current_job_key_var
from ..conflicts import is_transient
from ..errors import (
    BackendError,
    ClaimInProgress,
    ClaimLost,
    ConfigurationError,
    FingerprintMismatch,
    LockLost,
    LockTimeout,
    NotNow,
)
from ..guard import guarded
from ..retry import RetryPolicy

__all__ = [
    "DEFAULT_RETRY_DELAY",
    "GUARD_ARGUMENTS",
    "check_retry_delay",
    "guard_options",
    "guard_task",
    "not_now_delay",
    "wants_retry",
    "without_first",
]

DEFAULT_RETRY_DELAY = 5.0
"""Seconds a task that jobfence sends back to the framework's retry waits before it runs again."""

#: the outcomes that mean "this message is fine, run it again later"
RETRIED = (NotNow, LockLost, ClaimLost, ClaimInProgress, LockTimeout)
#: the longest wait of a "not now" refusal (as the worker's ``MAX_DEFER``)
MAX_DEFER = 3600.0

JobId = Callable[[tuple[Any, ...], dict[str, Any]], "str | None"]
Retry = Callable[[BaseException, float], BaseException]
Final = Callable[[BaseException], BaseException]


#: the arguments of :func:`jobfence.guarded` a framework's ``guarded`` passes on as they are
GUARD_ARGUMENTS = (
    "locks",
    "inbox",
    "lock",
    "key",
    "ttl",
    "timeout",
    "claim_ttl",
    "fingerprint",
    "attempts",
    "if_locked",
    "skipped_result",
    "limit",
)


def guard_options(arguments: dict[str, Any]) -> dict[str, Any]:
    """The :data:`GUARD_ARGUMENTS` out of a framework ``guarded``'s ``locals()``."""
    return {name: arguments[name] for name in GUARD_ARGUMENTS}


def wants_retry(exc: BaseException) -> bool:
    """Should a task that raised ``exc`` go back to its framework's retry? Yes for a lost
    lease or claim, a claim another worker holds, a lock not obtained in time and a
    transient backend error; no for a fingerprint mismatch, bad configuration and anything
    else (the task's own exceptions follow the framework's own rules)."""
    if isinstance(exc, (FingerprintMismatch, ConfigurationError)):
        return False
    if isinstance(exc, RETRIED):
        return True
    return isinstance(exc, BackendError) and is_transient(exc)


def not_now_delay(exc: BaseException, retry_delay: float) -> float:
    """When a task refused with ``exc`` (a :class:`~jobfence.errors.NotNow`) runs again: after
    its ``retry_after`` -- the holder's known expiry -- or ``retry_delay`` when unknown, plus
    jitter (up to a tenth of it, and half a second), so that the refusals of one holder do not
    all come back in the same instant."""
    hint = getattr(exc, "retry_after", None)
    base = min(retry_delay if hint is None else float(hint), MAX_DEFER)
    return base + random.uniform(0.0, 0.1 * base + 0.5)


def check_retry_delay(retry_delay: Any) -> float:
    if (
        isinstance(retry_delay, bool)
        or not isinstance(retry_delay, (int, float))
        or not retry_delay >= 0
        or retry_delay == float("inf")
    ):
        raise ConfigurationError(
            f"retry_delay must be a finite number of seconds >= 0, got {retry_delay!r}",
            argument="retry_delay",
        )
    return float(retry_delay)


def without_first(
    fn: Callable[..., Any], holder: contextvars.ContextVar[Any]
) -> Callable[..., Any]:
    """``fn`` with its first parameter (Celery's bound task, arq's ``ctx``) taken from
    ``holder``, which the framework's wrapper sets: the signature the ``lock``/``key``
    templates and ``fingerprint=True`` see lacks that parameter."""
    signature = inspect.signature(fn)
    body: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def async_body(*args: Any, **kwargs: Any) -> Any:
            return await fn(holder.get(), *args, **kwargs)

        body = async_body
    else:

        def sync_body(*args: Any, **kwargs: Any) -> Any:
            return fn(holder.get(), *args, **kwargs)

        body = sync_body
    functools.update_wrapper(body, fn)
    body.__signature__ = signature.replace(  # type: ignore[attr-defined,union-attr]
        parameters=list(signature.parameters.values())[1:]
    )
    return body


def guard_task(
    fn: Callable[..., Any],
    *,
    framework: str,
    job_id: JobId,
    retry: Retry,
    retry_delay: float,
    final: Final | None = None,
    retry_policy: RetryPolicy | None = None,
    defer: Retry | None = None,
    **options: Any,
) -> Callable[..., Any]:
    """``fn`` guarded like :func:`jobfence.guarded` (``options`` are its arguments),
    with the framework's job id as the default key and jobfence's retryable outcomes raised
    as the framework's retry. Works for sync and ``async def`` functions.

    ``retry`` is the framework's retry here, so :func:`jobfence.guarded`'s own ``retry=``
    (a :class:`jobfence.RetryPolicy` for in-process re-runs) is passed as ``retry_policy``."""
    delay = check_retry_delay(retry_delay)
    inner = guarded(retry=retry_policy, **options)(fn)

    def translate(exc: BaseException) -> BaseException | None:
        if defer is not None and isinstance(exc, NotNow):
            return defer(exc, not_now_delay(exc, delay))
        if wants_retry(exc):
            return retry(exc, delay)
        if final is not None and isinstance(exc, (FingerprintMismatch, ConfigurationError)):
            return final(exc)
        return None

    def job_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        ident = job_id(args, kwargs)
        return None if ident is None else f"{framework}:{ident}"

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_task(*args: Any, **kwargs: Any) -> Any:
            token = current_job_key_var.set(job_key(args, kwargs))
            try:
                return await inner(*args, **kwargs)
            except Exception as exc:
                replacement = translate(exc)
                if replacement is None or replacement is exc:
                    raise
                raise replacement from exc
            finally:
                current_job_key_var.reset(token)

        return async_task

    @functools.wraps(fn)
    def task(*args: Any, **kwargs: Any) -> Any:
        token = current_job_key_var.set(job_key(args, kwargs))
        try:
            return inner(*args, **kwargs)
        except Exception as exc:
            replacement = translate(exc)
            if replacement is None or replacement is exc:
                raise
            raise replacement from exc
        finally:
            current_job_key_var.reset(token)

    return task
