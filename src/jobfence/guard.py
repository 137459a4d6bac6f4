"""``@jobfence.guarded``: the two-layer pattern (lock + inbox) as one decorator.

```python
@jobfence.guarded(locks=locks, inbox=inbox,
                  lock="inventory:{product_id}", key="order:{order_id}")
def process_order(order_id, product_id, qty): ...
```

For each call: take the lease named by ``lock`` (waiting up to ``timeout``), claim the
idempotency key ``key`` (a duplicate returns the stored result without running; a key owned
by another live worker raises ``ClaimInProgress``), run the function (re-run whole on conflicts
and transient errors when ``attempts > 1``), store the result, release the lease. The claim
is renewed while the function runs, like the lease. Inside, :func:`current_lease` and
:func:`current_claim` return them. If the lease is lost, the claim is released -- never
completed -- and ``LockLost`` is raised; if the claim is lost, ``ClaimLost``. Works with only
``locks``, only ``inbox``, or both; decorates sync functions (with ``Locks``/``Inbox``) and
``async def`` functions (with ``AsyncLocks``/``AsyncInbox``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ._guard_run import run_guarded
from ._guard_run_async import run_guarded_async
from ._guard_spec import (
    GuardSpec,
    LimitSpec,
    NameSpec,
    current_claim_var,
    current_lease_var,
    current_message_var,
)
from .errors import ConfigurationError
from .retry import RetryPolicy

__all__ = ["current_claim", "current_lease", "current_message", "guarded"]

DEFAULT_CLAIM_TTL = 30.0
"""The default ``claim_ttl``: the claim is renewed while the function runs, so this is how soon a
crashed worker's claim is taken over, not a bound on the function's run time."""

F = TypeVar("F", bound=Callable[..., Any])


def current_lease() -> Any:
    """The lease of the guarded call running in this thread or task (``None`` outside one)."""
    return current_lease_var.get()


def current_claim() -> Any:
    """The idempotency claim of the guarded call running in this thread or task (``None``
    outside one, or without an inbox). A long sync function may call its ``check()`` (raises
    ``ClaimLost``) or read its ``lost`` to stop early once the claim is gone."""
    return current_claim_var.get()


def current_message() -> Any:
    """The queue message the :class:`~jobfence.Worker` handler running in this thread or task
    processes (``None`` outside one). Its ``id`` is the default idempotency key of
    :func:`guarded` and ``Inbox.claim_in`` there."""
    return current_message_var.get()


def _check_first() -> None:
    for held in (current_lease_var.get(), current_claim_var.get()):
        if held is not None:
            held.check()


def _check_lease_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, but every attempt first checks the guarded call's lease and claim: a retry
    never starts once either is known lost (``LockLost`` and ``ClaimLost`` are never
    retried)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_attempt(*args: Any, **kwargs: Any) -> Any:
            _check_first()
            return await fn(*args, **kwargs)

        return async_attempt

    @functools.wraps(fn)
    def attempt(*args: Any, **kwargs: Any) -> Any:
        _check_first()
        return fn(*args, **kwargs)

    return attempt


def _check_flavour(fn: Callable[..., Any], locks: Any, inbox: Any) -> None:
    is_async = inspect.iscoroutinefunction(fn)
    for argument, client in (("locks", locks), ("inbox", inbox)):
        if client is None:
            continue
        client_async = type(client).__name__.startswith("Async")
        if client_async != is_async:
            want = "an Async client (AsyncLocks/AsyncInbox)" if is_async else "a sync client"
            raise ConfigurationError(
                f"{argument}: {fn.__qualname__} is {'async' if is_async else 'sync'}, so it "
                f"needs {want}; got {type(client).__name__}",
                argument=argument,
            )


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
    limit: LimitSpec = None,
) -> Callable[[F], F]:
    """Guard a job function with a lease, an idempotency claim, or both.

    For each call: take the lease named by ``lock``, claim the idempotency key ``key`` (a
    duplicate returns the stored result without running the function), run the function,
    store its result, release the lease. Works with only ``locks``, only ``inbox``, or both;
    decorates sync functions (with ``Locks``/``Inbox``) and ``async def`` functions (with
    ``AsyncLocks``/``AsyncInbox``).

    ```python
    @jobfence.guarded(locks=locks, inbox=inbox,
                      lock="inventory:{product_id}", key="order:{order_id}", attempts=5)
    def process_order(order_id: int, product_id: int, qty: int) -> dict: ...
    ```

    Args:
        locks: The ``Locks`` (or ``AsyncLocks`` for an ``async def`` function) that grants
            the lease named by ``lock``. ``None``: no lease is taken.
        inbox: The ``Inbox`` (or ``AsyncInbox``) that holds the idempotency claims and the
            stored results. ``None``: no claim, every call runs.
        lock: The lease's name: a ``str.format`` template over the function's arguments
            (``"inventory:{product_id}"``) or a callable receiving them by name. Required
            with ``locks``.
        key: The idempotency key, a template or callable like ``lock``. Without it, inside a
            `Worker` handler the key is the message's id (the same on every redelivery);
            elsewhere a call without ``key`` raises ``ConfigurationError``.
        ttl: The lease's ttl in seconds (default 30). The lease is renewed while the
            function runs, so this is how soon a crashed worker's lease frees the lock, not
            a bound on the function's run time.
        timeout: Seconds to wait for the lease: ``None`` (the default) waits as long as it
            takes, ``0`` tries once. When it passes, ``LockTimeout`` is raised, or with
            ``if_locked="skip"`` the call returns ``skipped_result`` without running.
        claim_ttl: The ttl of the idempotency claim in seconds (default 30). The inbox's
            renewer extends the claim every ``claim_ttl / 3`` while the function runs, so the
            function may run longer, and a duplicate meanwhile gets ``ClaimInProgress``;
            when a worker dies, its claim is taken over at most ``claim_ttl`` after its last
            renewal. If the renewal fails, the claim is lost: an ``async def`` function is
            cancelled and ``ClaimLost`` raised; a sync one is not interrupted (it may check
            `current_claim`), and its result is stored only if the claim is still its own
            on the backend (else ``ClaimLost``).
        fingerprint: ``True`` hashes the arguments, so that a key reused with other
            arguments raises ``FingerprintMismatch`` (JSON values, sets, bytes, dates and
            times, ``Decimal``, ``UUID``, enums and dataclasses have a stable form; any other
            argument raises ``ConfigurationError``), or a callable receiving the arguments by
            name and returning the fingerprint string. ``None``/``False``: no check.
        attempts: ``attempts > 1`` re-runs the whole function, in the same call, on
            conflicts and transient errors (`jobfence.retry_unit`). Default 1.
        retry: A `RetryPolicy` instead of ``attempts``, for full control (backoff,
            deadline, ``on_retry`` for metrics). Give one or the other.
        if_locked: ``"raise"`` (the default): a lease not obtained within ``timeout``
            raises ``LockTimeout``; ``"skip"``: the call returns ``skipped_result`` without
            running.
        skipped_result: What a skipped call returns (default ``None``).
        limit: A concurrency limit ``(name, n)``: at most ``n`` calls run at once per
            name, a template or callable like ``lock`` (``("tenant:{tenant_id}", 3)``),
            granted by ``locks`` (``acquire(name, limit=n)``, see `jobfence.limits`). A
            call over the limit does not run and raises ``LimitReached``, a ``NotNow``
            refusal whose ``retry_after`` is when the first running call's lease ends; it
            never waits. The limit's lease is taken before ``lock``, renewed while the
            function runs and released when it ends. ``lock`` is optional with a limit.

    Returns:
        The decorator. Inside the guarded call, `current_lease` and `current_claim`
            return its lease and claim. If the lease is lost, the claim is released --
            never completed -- and ``LockLost`` is raised; if the claim is lost,
            ``ClaimLost``.

    Raises:
        ConfigurationError: At decoration, for a bad argument (``attempts`` not an int
            >= 1, ``retry`` not a `RetryPolicy` or given with ``attempts``, a sync client
            for an ``async def`` function or the other way round).
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(
            f"attempts must be an int >= 1, got {attempts!r}", argument="attempts"
        )
    if retry is not None:
        if not isinstance(retry, RetryPolicy):
            raise ConfigurationError(
                f"retry must be a jobfence.RetryPolicy, got {retry!r}", argument="retry"
            )
        if attempts != 1:
            raise ConfigurationError(
                "give either attempts=N or retry=RetryPolicy(attempts=N, ...), not both",
                argument="retry",
            )
    policy: RetryPolicy | None = retry
    if policy is None and attempts > 1:
        policy = RetryPolicy(attempts=attempts)

    def decorate(fn: F) -> F:
        _check_flavour(fn, locks, inbox)
        spec = GuardSpec(
            signature=inspect.signature(fn),
            locks=locks,
            inbox=inbox,
            lock=lock,
            key=key,
            ttl=ttl,
            timeout=timeout,
            claim_ttl=claim_ttl,
            fingerprint=fingerprint,
            if_locked=if_locked,
            skipped_result=skipped_result,
            limit=limit,
        )
        body: Callable[..., Any] = fn if policy is None else policy(_check_lease_first(fn))

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await run_guarded_async(spec, body, args, kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_guarded(spec, body, args, kwargs)

        # what a jobfence Worker reads to run the inbox steps on its event loop and only the
        # function in its handler thread (see jobfence._guard_worker)
        wrapper._jobfence_guard = (spec, body, policy)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
