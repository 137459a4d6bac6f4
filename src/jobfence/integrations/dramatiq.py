"""Dramatiq: guarded actors, with the message id as the default key and Dramatiq's own retries.

Two pieces, both needed:

* :class:`JobfenceMiddleware`, added to the broker once. It gives a guarded actor the id of
  the message it runs (the same on every redelivery and every retry of that message), and it
  adds :class:`~jobfence.FingerprintMismatch` and :class:`~jobfence.ConfigurationError` to
  each guarded actor's ``throws`` option, so the ``Retries`` middleware never retries them
  (it retries every other exception).
* :func:`guarded`, placed under ``@dramatiq.actor``: :func:`jobfence.guarded` with the same
  arguments, plus ``retry_delay``.

```python
import dramatiq
from jobfence.integrations.dramatiq import JobfenceMiddleware, guarded

broker.add_middleware(JobfenceMiddleware())

@dramatiq.actor(max_retries=20)
@guarded(inbox=inbox, locks=locks, lock="inventory:{product_id}", retry_delay=5)
def process_order(order_id: int, product_id: int, qty: int) -> dict: ...
```

Without ``key=``, the idempotency key is ``"dramatiq:<message id>"``: a redelivered or retried
message is a duplicate once it has completed, and returns the stored result without running.
A lost lease or claim, a claim another worker holds (or a killed worker's claim that has not
expired yet) and a lock not obtained within ``timeout`` -- "not now" refusals,
:class:`jobfence.NotNow` -- raise ``dramatiq.Retry`` with the holder's known expiry plus
jitter as its delay (``retry_delay`` when unknown): the ``Retries`` middleware enqueues the
same message again after that delay, and :class:`JobfenceMiddleware` keeps the retry from
counting against ``max_retries``. A transient backend error raises
``dramatiq.Retry(delay=retry_delay)``, which counts. ``async def`` actors (with
Dramatiq's ``AsyncIO`` middleware) take ``AsyncLocks`` / ``AsyncInbox``.

This module imports Dramatiq; ``import jobfence`` does not import it.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Middleware

from .._guard_spec import NameSpec
from ..errors import ConfigurationError, FingerprintMismatch
from ..guard import DEFAULT_CLAIM_TTL
from ..retry import RetryPolicy
from ._task import DEFAULT_RETRY_DELAY, check_retry_delay, guard_options, guard_task

__all__ = ["DEFAULT_RETRY_DELAY", "NOT_RETRIED", "JobfenceMiddleware", "guarded"]

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("jobfence.integrations.dramatiq")

FRAMEWORK = "dramatiq"

NOT_RETRIED: tuple[type[Exception], ...] = (FingerprintMismatch, ConfigurationError)
"""What a guarded actor fails with for good: the same message would fail the same way again, so
:class:`JobfenceMiddleware` puts these in the actor's ``throws`` (never retried)."""

#: the attribute of a :func:`guarded` function that holds its :class:`_Registration`
_REGISTRATION = "__jobfence_dramatiq__"

#: the message the worker thread runs, set by :class:`JobfenceMiddleware`. An ``async def``
#: actor's coroutine runs on the event loop thread in a copy of the worker thread's context,
#: so it sees the message too.
_current_message: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jobfence_dramatiq_message", default=None
)


class _Registration:
    """Whether a guarded function was declared as an actor on a broker that has
    :class:`JobfenceMiddleware` (checked when it runs)."""

    __slots__ = ("actors",)

    def __init__(self) -> None:
        self.actors: list[str] = []


def _with_not_retried(throws: Any) -> tuple[type[BaseException], ...]:
    """The actor's own ``throws`` (a class, a tuple or None) plus :data:`NOT_RETRIED`."""
    if throws is None:
        own: tuple[type[BaseException], ...] = ()
    elif isinstance(throws, tuple):
        own = throws
    else:
        own = (throws,)
    return own + tuple(cls for cls in NOT_RETRIED if cls not in own)


class JobfenceMiddleware(Middleware):
    """Dramatiq middleware for actors decorated with :func:`guarded`. Add it to the broker
    once (``broker.add_middleware(JobfenceMiddleware())``), before or after the actors are
    declared.

    * While a message is processed, it makes the message's id available to the guarded
      actor: without ``key=``, the idempotency key is ``"dramatiq:<message id>"``. Dramatiq
      keeps a message's id on every redelivery (after a worker dies) and on every retry (the
      ``Retries`` middleware enqueues a copy of the same message).
    * For each guarded actor it adds :data:`NOT_RETRIED` (``FingerprintMismatch``,
      ``ConfigurationError``) to the actor's ``throws`` option, keeping the actor's own: the
      ``Retries`` middleware fails such a message at once (dead letter) instead of retrying
      it ``max_retries`` times with the same outcome.
    * A "not now" refusal (:class:`jobfence.NotNow`) goes back to the ``Retries``
      middleware as a ``dramatiq.Retry`` that it does not count against ``max_retries``
      (add this middleware after ``Retries``: ``add_middleware`` appends it after the
      broker's default middleware, which includes ``Retries``).
    * ``clients``: jobfence clients (``Locks``, ``Inbox``, ``AsyncLocks``, ``AsyncInbox``)
      to close when the worker has shut down, after its last message: their renewers stop and
      claims still held are given back. Async clients are closed on Dramatiq's event loop,
      where their renewers run, so add this middleware after ``AsyncIO`` (whose own shutdown,
      later, stops that loop).
    """

    def __init__(self, *, clients: Iterable[Any] = ()) -> None:
        self.clients = list(clients)
        for client in self.clients:
            if not callable(getattr(client, "close", None)):
                raise ConfigurationError(
                    f"clients must be jobfence clients (Locks, Inbox, AsyncLocks, AsyncInbox), "
                    f"got {client!r}",
                    argument="clients",
                )

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        for client in self.clients:
            try:
                closing = client.close()
                if inspect.isawaitable(closing):
                    loop_thread = get_event_loop_thread()
                    if loop_thread is None or not loop_thread.loop.is_running():
                        closing.close()  # type: ignore[attr-defined]
                        log.warning(
                            "cannot close %r: Dramatiq's event loop is not running (add "
                            "JobfenceMiddleware after the AsyncIO middleware)",
                            client,
                        )
                        continue
                    loop_thread.run_coroutine(closing)
            except Exception:
                log.warning("closing %r on worker shutdown failed", client, exc_info=True)

    def after_declare_actor(self, broker: Any, actor: Any) -> None:
        # an async actor's fn is Dramatiq's sync wrapper; functools.wraps copied our attribute
        registration = getattr(actor.fn, _REGISTRATION, None)
        if not isinstance(registration, _Registration):
            return
        registration.actors.append(actor.actor_name)
        actor.options["throws"] = _with_not_retried(actor.options.get("throws"))

    def before_process_message(self, broker: Any, message: Any) -> None:
        _current_message.set(message)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        _current_message.set(None)
        if isinstance(exception, _NotNowRetry):
            # Dramatiq runs the after-hooks in reverse order, so this one runs before the
            # Retries middleware (added to the broker before this one), which counts every
            # exception + 1 in options["retries"]: one less here leaves the count as it was,
            # so a refusal never uses up max_retries
            message.options["retries"] = message.options.get("retries", 0) - 1

    def after_skip_message(self, broker: Any, message: Any) -> None:
        _current_message.set(None)


class _NotNowRetry(dramatiq.Retry):  # type: ignore[misc]
    """A "not now" refusal sent back to Dramatiq's retry, not counted (see
    :meth:`JobfenceMiddleware.after_process_message`)."""


def _defer(exc: BaseException, delay: float) -> BaseException:
    """:func:`_retry` for a "not now" refusal: not counted against ``max_retries``."""
    return _NotNowRetry(
        f"jobfence: not now: {type(exc).__name__}: {exc}", delay=round(delay * 1000)
    )


def _retry(exc: BaseException, delay: float) -> BaseException:
    """Dramatiq's own retry: the ``Retries`` middleware enqueues the message again after
    ``delay`` seconds (``Retry.delay`` is in milliseconds) and does not log it as an error."""
    return dramatiq.Retry(f"jobfence: {type(exc).__name__}: {exc}", delay=round(delay * 1000))


def guarded(
    *,
    locks: Any = None,
    inbox: Any = None,
    lock: NameSpec = None,
    key: NameSpec = None,
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
    """Guard a Dramatiq actor's function like :func:`jobfence.guarded`, for a broker with
    :class:`JobfenceMiddleware`. Place it under ``@dramatiq.actor``.

    The arguments are :func:`jobfence.guarded`'s (``locks``, ``inbox``, ``lock``/``key``
    templates, ``ttl``, ``timeout``, ``claim_ttl``, ``fingerprint``, ``attempts`` / ``retry``
    for in-process whole-unit retries, ``if_locked``, ``skipped_result``, ``limit``), plus
    ``retry_delay`` (below).

    ``lock``/``key`` templates see the actor's own arguments. Without ``key``, the key is
    ``"dramatiq:<message id>"``, so a redelivery or a retry of a message that has completed
    returns the stored result without running (the ``Results`` middleware stores that).
    A lost lease or claim, a claim in progress elsewhere and a ``LockTimeout`` ("not now":
    :class:`jobfence.NotNow`) raise ``dramatiq.Retry`` with the holder's known expiry plus
    jitter (``retry_delay`` seconds, default 5, when unknown), not counted against the actor's
    ``max_retries``; a transient backend error raises it with ``retry_delay``, counted. The
    message runs again after that delay, through the ``Retries`` middleware.
    ``FingerprintMismatch`` and
    ``ConfigurationError`` are never retried (see :class:`JobfenceMiddleware`). Any other
    exception is Dramatiq's as usual. ``async def`` functions need ``AsyncLocks`` /
    ``AsyncInbox`` and Dramatiq's ``AsyncIO`` middleware.
    """
    delay = check_retry_delay(retry_delay)
    options = guard_options(locals())
    options["retry_policy"] = retry

    def decorate(fn: F) -> F:
        if isinstance(fn, dramatiq.Actor):
            raise ConfigurationError(
                f"guarded() got the actor {fn.actor_name!r}: place @guarded(...) under "
                "@dramatiq.actor, so that it wraps the function itself",
                argument="fn",
            )
        if not callable(fn):
            raise ConfigurationError(f"guarded() decorates a function, got {fn!r}", argument="fn")
        registration = _Registration()
        name = getattr(fn, "__qualname__", repr(fn))

        def job_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
            if not registration.actors:
                raise ConfigurationError(
                    f"{name} is guarded for Dramatiq but is not an actor of a broker with "
                    "JobfenceMiddleware: add broker.add_middleware(JobfenceMiddleware()) (it "
                    "gives the actor its message id and keeps fingerprint mismatches from "
                    "being retried) and declare the function with @dramatiq.actor",
                    argument="middleware",
                )
            message = _current_message.get()
            if message is not None:
                return str(message.message_id)
            if key is None:
                raise ConfigurationError(
                    f"{name} ran outside a Dramatiq worker, so there is no message id to use "
                    "as its idempotency key: pass key='...' (a template over its arguments), "
                    "or send it as a message",
                    argument="key",
                )
            return None

        task = guard_task(
            fn,
            framework=FRAMEWORK,
            job_id=job_id,
            retry=_retry,
            defer=_defer,
            retry_delay=delay,
            **options,
        )
        setattr(task, _REGISTRATION, registration)
        return task  # type: ignore[return-value]

    return decorate
