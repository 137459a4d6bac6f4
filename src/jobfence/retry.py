"""Retry the whole unit of work: fresh transaction, fresh reads, recompute, conditional write.

:func:`retry_unit` re-runs a sync or async function when it fails with a *conflict* or a
*transient* error (:mod:`jobfence.conflicts`), with exponential backoff and full jitter, an attempt
cap and a total deadline. Built on tenacity (a dependency of jobfence); sleeps go through
jobfence's clock, so a fake clock (:func:`jobfence.testing.clocked`) drives them in tests.

Three rules keep a retry from re-sending a stale write:

* **The unit is the function.** Each attempt calls the function again; it must open its own
  transaction and read what it writes from. Never retry a single statement.
* **Never retry inside a transaction that is still open.** If a psycopg, asyncpg, sqlite3,
  aiosqlite, PyMySQL, aiomysql or SQLAlchemy connection/session passed as an argument was inside a
  transaction when the unit was called, or still is when it failed, re-running the function would
  continue the caller's (failed or rolled-back) transaction: :func:`retry_unit` refuses with
  :class:`~jobfence.ConfigurationError` (inside an enclosing ``retry_unit`` it re-raises the
  original error unchanged so the outer unit retries as a whole).
* **Commit outcome unknown is retried only for protected units.** If the connection died while a
  commit was in flight, the commit may have been applied; running the unit again would apply it
  twice unless the unit detects that (a transactional inbox claim: ``inbox.claim_in``). Such
  errors are retried only with ``protected=True`` or when the attempt called
  :func:`mark_protected` (``claim_in`` does); otherwise an :class:`UnprotectedRetryWarning` is
  issued and the original error is raised.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from . import telemetry
from ._core.clock import get_clock
from ._core.transaction import transaction_of
from .conflicts import ErrorKind, classify, is_commit_outcome_unknown, never_retry
from .errors import ConfigurationError

if TYPE_CHECKING:
    import tenacity

__all__ = [
    "Attempt",
    "RetryPolicy",
    "UnprotectedRetryWarning",
    "mark_protected",
    "retry_unit",
    "retrying",
]

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("jobfence.retry")

Classifier = Callable[[BaseException], "ErrorKind | str | None"]
RetryOn = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
OnRetry = Callable[[int, BaseException, float], Any]


class UnprotectedRetryWarning(UserWarning):
    """A commit-outcome-unknown error was not retried because the unit is not protected."""


# --------------------------------------------------------------------------- protection flag


@dataclass
class _AttemptState:
    number: int
    parent: _AttemptState | None
    protected: bool = False


_current: ContextVar[_AttemptState | None] = ContextVar("jobfence_retry_attempt", default=None)


def mark_protected() -> None:
    """Declare the running attempt (and any enclosing one) safe to retry after an unknown commit.

    Call it from code that makes a second application of the unit's commit detectable, e.g. a
    transactional idempotency claim committed with the business write (``inbox.claim_in``).
    Outside :func:`retry_unit` it does nothing.
    """
    state = _current.get()
    while state is not None:
        state.protected = True
        state = state.parent


def _tenacity() -> Any:
    try:
        import tenacity

    except ImportError as exc:  # pragma: no cover - only in an install without tenacity
        raise ImportError(
            "jobfence.retry_unit needs tenacity, a dependency of jobfence that is missing here: "
            "pip install 'tenacity>=8.3,<10'"
        ) from exc
    return tenacity


# --------------------------------------------------------------------- open-transaction check


def _startswith(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _in_transaction(obj: object) -> bool | None:
    """True/False for a recognised connection, session or cursor; None for anything else."""
    tx = transaction_of(obj)  # e.g. a jobfence.testing simulated transaction
    if tx is not None:
        return tx.in_transaction
    module = type(obj).__module__ or ""
    try:
        if _startswith(module, "psycopg2") or _startswith(module, "psycopg2.extensions"):
            get = getattr(obj, "get_transaction_status", None)
            if get is None and hasattr(obj, "connection"):
                get = getattr(obj.connection, "get_transaction_status", None)
            return None if get is None else get() in (1, 2, 3)  # ACTIVE, INTRANS, INERROR
        if _startswith(module, "psycopg"):
            info = getattr(obj, "info", None)
            if info is None and hasattr(obj, "connection"):  # a cursor
                info = getattr(obj.connection, "info", None)
            status = getattr(info, "transaction_status", None)
            if status is None:
                return None
            return getattr(status, "name", "") in ("ACTIVE", "INTRANS", "INERROR")
        if _startswith(module, "asyncpg"):
            check = getattr(obj, "is_in_transaction", None)
            return None if check is None else bool(check())
        if module == "sqlite3" or _startswith(module, "aiosqlite"):
            target = obj if hasattr(obj, "in_transaction") else getattr(obj, "connection", None)
            flag = getattr(target, "in_transaction", None)
            return None if flag is None else bool(flag)
        if _startswith(module, "pymysql") or _startswith(module, "aiomysql"):
            target = obj if hasattr(obj, "server_status") else getattr(obj, "connection", None)
            status = getattr(target, "server_status", None)
            return None if not isinstance(status, int) else bool(status & 1)  # IN_TRANS
        if _startswith(module, "sqlalchemy"):
            check = getattr(obj, "in_transaction", None)
            return bool(check()) if callable(check) else None
    except Exception:  # a closed/broken connection: unknown, do not refuse on a guess
        return None
    return None


def _transactional_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for index, value in enumerate(args):
        if _in_transaction(value) is not None:
            found.append((f"#{index}", value))
    for name, value in kwargs.items():
        if _in_transaction(value) is not None:
            found.append((name, value))
    return found


# ----------------------------------------------------------------------------- the policy


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}", argument=name)
    return value


def _check_seconds(value: object, name: str, *, allow_none: bool, allow_zero: bool) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and (value > 0 or (allow_zero and value == 0)):  # type: ignore[operator]
        return
    allowed = "a number of seconds " + (">= 0" if allow_zero else "> 0")
    if allow_none:
        allowed += " or None"
    raise ConfigurationError(f"{name} must be {allowed}, got {value!r}", argument=name)


@dataclass(frozen=True)
class RetryPolicy:
    """How to retry a unit of work. Immutable; :meth:`replace` makes a changed copy.

    ``attempts``: total calls, including the first (>= 1). ``deadline``: seconds from the first
    call after which no new attempt starts (a sleep that would end past it is not taken).
    ``backoff``/``max_backoff``: the n-th retry sleeps ``uniform(0, min(max_backoff,
    backoff * 2**n))`` (full jitter, n from 0). ``retry_on``: extra exception types, or a
    predicate, to retry as transient besides conflicts and transient errors (never a lost
    lease, a stale token or another error :func:`jobfence.conflicts.never_retry` names).
    ``classify``: replaces :func:`jobfence.conflicts.classify`. ``on_retry(attempt, exc,
    delay)``: called before each sleep (may be a coroutine function in async code).
    ``protected``: the unit makes a repeated commit detectable (transactional claim), so
    commit-outcome-unknown errors are retried. ``rng``: anything with ``uniform(a, b)`` (a
    seeded ``random.Random`` for replay).
    """

    attempts: int = 5
    deadline: float | None = None
    backoff: float = 0.05
    max_backoff: float = 2.0
    retry_on: RetryOn | None = None
    classify: Classifier | None = None
    on_retry: OnRetry | None = None
    protected: bool = False
    rng: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check_positive_int(self.attempts, "attempts")
        _check_seconds(self.deadline, "deadline", allow_none=True, allow_zero=False)
        _check_seconds(self.backoff, "backoff", allow_none=False, allow_zero=True)
        _check_seconds(self.max_backoff, "max_backoff", allow_none=False, allow_zero=True)
        ro = self.retry_on
        valid_ro = (
            ro is None
            or (isinstance(ro, type) and issubclass(ro, BaseException))
            or (
                isinstance(ro, tuple)
                and all(isinstance(t, type) and issubclass(t, BaseException) for t in ro)
            )
            or (callable(ro) and not isinstance(ro, type))
        )
        if not valid_ro:
            raise ConfigurationError(
                "retry_on must be an exception class, a tuple of them, or a predicate "
                f"exc -> bool, got {ro!r}",
                argument="retry_on",
            )
        for name in ("classify", "on_retry"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigurationError(
                    f"{name} must be callable or None, got {value!r}", argument=name
                )
        if self.rng is not None and not callable(getattr(self.rng, "uniform", None)):
            raise ConfigurationError(
                f"rng must have a uniform(a, b) method (e.g. random.Random), got {self.rng!r}",
                argument="rng",
            )

    def replace(self, **changes: Any) -> RetryPolicy:
        return replace(self, **changes)

    # -- decisions ---------------------------------------------------------------------------

    def delay(self, retry_number: int) -> float:
        """Seconds to sleep before retry ``retry_number`` (0 for the first retry): full jitter."""
        ceiling = min(self.max_backoff, self.backoff * (2.0 ** min(retry_number, 64)))
        rng = self.rng if self.rng is not None else random
        return float(rng.uniform(0.0, ceiling))

    def is_retryable(self, exc: BaseException) -> bool:
        """Would this policy retry ``exc`` (ignoring protection and transaction checks)?"""
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit, CancelledError: never
        kind = (self.classify or classify)(exc)
        if kind in (ErrorKind.CONFLICT, ErrorKind.TRANSIENT, "conflict", "transient"):
            return True
        if kind in (ErrorKind.LEASE_LOST, "lease_lost") or never_retry(exc):
            return False  # retry_on cannot override these (LockLost, StaleToken, ...)
        ro = self.retry_on
        if ro is None:
            return False
        if isinstance(ro, (type, tuple)):
            return isinstance(exc, ro)
        return bool(ro(exc))

    # -- running -----------------------------------------------------------------------------

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` under this policy (sync)."""
        run = _Run(self, fn, args, kwargs)
        retrying = _tenacity().Retrying(**run.tenacity_options(is_async=False))

        def attempt() -> R:
            token = run.start_attempt()
            try:
                return fn(*args, **kwargs)
            finally:
                _current.reset(token)

        return cast(R, retrying(attempt))

    async def acall(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``await fn(*args, **kwargs)`` under this policy (async)."""
        run = _Run(self, fn, args, kwargs)
        retrying = _tenacity().AsyncRetrying(**run.tenacity_options(is_async=True))

        async def attempt() -> R:
            token = run.start_attempt()
            try:
                return await fn(*args, **kwargs)
            finally:
                _current.reset(token)

        return cast(R, await retrying(attempt))

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``fn`` (sync or async) to run under this policy."""
        if inspect.iscoroutinefunction(fn):
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.acall(afn, *args, **kwargs)

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(fn, *args, **kwargs)

            wrapper = sync_wrapper
        wrapper.retry_policy = self
        return cast(Callable[P, R], wrapper)

    # -- loop form ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Attempt]:
        """``for attempt in retrying(...): with attempt: ...`` (sync)."""
        run = _Run(self, None, (), {})
        for manager in _tenacity().Retrying(**run.tenacity_options(is_async=False)):
            yield Attempt(run, manager)

    async def __aiter__(self) -> AsyncIterator[Attempt]:
        """``async for attempt in retrying(...): with attempt: ...`` (async)."""
        run = _Run(self, None, (), {})
        options = run.tenacity_options(is_async=True)
        async for manager in _tenacity().AsyncRetrying(**options):
            yield Attempt(run, manager)


class Attempt:
    """One attempt of a :func:`retrying` loop: use it as ``with attempt:`` around the unit."""

    def __init__(self, run: _Run, manager: Any) -> None:
        self._run = run
        self._manager = manager
        self._token: Token[_AttemptState | None] | None = None

    @property
    def number(self) -> int:
        """1 for the first attempt."""
        return int(self._manager.retry_state.attempt_number)

    def __enter__(self) -> Attempt:
        self._token = self._run.start_attempt()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        return cast("bool | None", self._manager.__exit__(exc_type, exc, tb))


class _Run:
    """The state of one retried call: start time, attempts, transaction snapshot."""

    def __init__(
        self,
        policy: RetryPolicy,
        fn: Callable[..., Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.policy = policy
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.start = get_clock().monotonic()
        self.parent = _current.get()
        self.attempt: _AttemptState | None = None
        self.conns = _transactional_args(args, kwargs) if (args or kwargs) else []
        self.open_at_start = {label for label, c in self.conns if _in_transaction(c)}

    @property
    def name(self) -> str:
        fn = self.fn
        return getattr(fn, "__qualname__", None) or repr(fn) if fn is not None else "unit"

    def start_attempt(self) -> Token[_AttemptState | None]:
        number = 1 if self.attempt is None else self.attempt.number + 1
        self.attempt = _AttemptState(number, self.parent)
        return _current.set(self.attempt)

    # -- tenacity callbacks --------------------------------------------------------------------

    def tenacity_options(self, *, is_async: bool) -> dict[str, Any]:
        options: dict[str, Any] = {
            "retry": self._retry,
            "stop": self._stop,
            "wait": self._wait,
            "reraise": True,
        }
        if is_async:
            options["sleep"] = _asleep
            options["before_sleep"] = self._abefore_sleep
        else:
            options["sleep"] = _sleep
            options["before_sleep"] = self._before_sleep
        return options

    def _retry(self, retry_state: tenacity.RetryCallState) -> bool:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is None or not self.policy.is_retryable(exc):
            return False
        self._check_transaction(exc)
        protected = self.policy.protected or (self.attempt is not None and self.attempt.protected)
        if not protected and is_commit_outcome_unknown(exc):
            message = (
                f"retry_unit({self.name}) did not retry {type(exc).__name__}: the commit outcome "
                "is unknown (it may have been applied), and re-running an unprotected unit "
                "could apply it twice. Make the unit detect a repeat (inbox.claim_in in the same "
                "transaction) and declare it with retry_unit(protected=True)."
            )
            logger.warning("%s", message)
            warnings.warn(message, UnprotectedRetryWarning, stacklevel=2)
            return False
        return True

    def _check_transaction(self, exc: BaseException) -> None:
        still_open = {label for label, c in self.conns if _in_transaction(c)}
        culprits = sorted(self.open_at_start | still_open)
        if not culprits:
            return
        if self.parent is not None:
            # An enclosing retry_unit owns the transaction: let it re-run the whole unit.
            logger.debug("not retrying %s inside an enclosing unit's transaction", self.name)
            raise exc
        names = ", ".join(self._describe(label) for label in culprits)
        when = (
            "was inside a transaction when the unit was called"
            if (self.open_at_start & set(culprits))
            else "is still inside a transaction after the failure"
        )
        raise ConfigurationError(
            f"retry_unit({self.name}) refuses to retry {type(exc).__name__}: the connection "
            f"passed as {names} {when}. Retrying there would re-run statements inside a "
            "transaction the database has aborted or rolled back. Let the unit open (and roll "
            "back) its own transaction, or put retry_unit around the code that owns the "
            "transaction.",
            argument=names,
        ) from exc

    def _describe(self, label: str) -> str:
        if not label.startswith("#"):
            return f"argument {label!r}"
        index = int(label[1:])
        try:
            params = list(inspect.signature(self.fn).parameters) if self.fn else []
        except (TypeError, ValueError):
            params = []
        if index < len(params):
            return f"argument {params[index]!r}"
        return f"positional argument {index}"

    def _stop(self, retry_state: tenacity.RetryCallState) -> bool:
        policy = self.policy
        if retry_state.attempt_number >= policy.attempts:
            self._give_up(retry_state, f"after {policy.attempts} attempts")
            return True
        if policy.deadline is not None:
            elapsed = get_clock().monotonic() - self.start
            if elapsed + retry_state.upcoming_sleep > policy.deadline:
                self._give_up(retry_state, f"at the {policy.deadline:g} s deadline")
                return True
        return False

    def _wait(self, retry_state: tenacity.RetryCallState) -> float:
        if retry_state.attempt_number >= self.policy.attempts:
            return 0.0  # about to give up: draw no random number (keeps seeded runs replayable)
        return self.policy.delay(retry_state.attempt_number - 1)

    def _give_up(self, retry_state: tenacity.RetryCallState, why: str) -> None:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        logger.warning("giving up on %s %s: %s: %s", self.name, why, type(exc).__name__, exc)

    def _log_retry(self, retry_state: tenacity.RetryCallState) -> tuple[int, Any, float]:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        attempt, delay = retry_state.attempt_number, retry_state.upcoming_sleep
        cause = self._cause(exc)
        telemetry.retry(cause)
        logger.warning(
            "retrying %s (attempt %d of %d failed with %s: %s); sleeping %.3f s",
            self.name,
            attempt,
            self.policy.attempts,
            type(exc).__name__,
            exc,
            delay,
            extra={"jobfence.cause": cause},
        )
        return attempt, exc, delay

    def _cause(self, exc: BaseException | None) -> str:
        """Why ``exc`` is retried: ``commit_unknown``, ``conflict`` or ``transient`` (also
        for an error retried by ``retry_on``)."""
        if exc is None:
            return "transient"
        if is_commit_outcome_unknown(exc):
            return "commit_unknown"
        kind = (self.policy.classify or classify)(exc)
        return "conflict" if kind in (ErrorKind.CONFLICT, "conflict") else "transient"

    def _before_sleep(self, retry_state: tenacity.RetryCallState) -> None:
        attempt, exc, delay = self._log_retry(retry_state)
        if self.policy.on_retry is not None:
            result = self.policy.on_retry(attempt, exc, delay)
            close = getattr(result, "close", None)
            if inspect.iscoroutine(result) and close is not None:
                close()  # an async hook in sync code: not awaited

    async def _abefore_sleep(self, retry_state: tenacity.RetryCallState) -> None:
        attempt, exc, delay = self._log_retry(retry_state)
        if self.policy.on_retry is not None:
            result = self.policy.on_retry(attempt, exc, delay)
            if inspect.isawaitable(result):
                await result


def _sleep(seconds: float) -> None:
    get_clock().sleep(seconds)


async def _asleep(seconds: float) -> None:
    await get_clock().asleep(seconds)


# ---------------------------------------------------------------------------- public API


@overload
def retry_unit(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def retry_unit(
    fn: None = None,
    /,
    *,
    policy: RetryPolicy | None = None,
    attempts: int = ...,
    deadline: float | None = ...,
    backoff: float = ...,
    max_backoff: float = ...,
    retry_on: RetryOn | None = ...,
    classify: Classifier | None = ...,
    on_retry: OnRetry | None = ...,
    protected: bool = ...,
    rng: Any = ...,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def retry_unit(
    fn: Callable[P, R] | None = None, /, *, policy: RetryPolicy | None = None, **options: Any
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Re-run the whole function on conflicts and transient errors.

    Use as ``@retry_unit`` or ``@retry_unit(attempts=3, deadline=10, on_retry=...)`` on a sync
    or async function (``fn``) that opens its own transaction and does its reads inside it.
    The keyword options (``**options``) are the fields of :class:`RetryPolicy` (``attempts``,
    ``deadline``, ``backoff``, ...); ``policy`` gives a base policy that they override.
    A non-retryable error is raised at once, unchanged; after the last attempt the last
    original error is raised (never a tenacity ``RetryError``).
    """
    base = policy if policy is not None else RetryPolicy()
    if policy is not None and not isinstance(policy, RetryPolicy):
        raise ConfigurationError(f"policy must be a RetryPolicy, got {policy!r}", argument="policy")
    unknown = set(options) - set(RetryPolicy.__dataclass_fields__)
    if unknown:
        raise ConfigurationError(
            f"retry_unit() got unknown option(s) {sorted(unknown)}; allowed: "
            f"{sorted(RetryPolicy.__dataclass_fields__)}",
            argument=sorted(unknown)[0],
        )
    resolved = base.replace(**options) if options else base
    if fn is None:
        return resolved.__call__
    if not callable(fn):
        raise ConfigurationError(
            f"retry_unit decorates a function, got {fn!r}; use retry_unit(attempts=...) "
            "for options",
            argument="fn",
        )
    return resolved(fn)


def retrying(*, policy: RetryPolicy | None = None, **options: Any) -> RetryPolicy:
    """The loop form, for a unit that is a block rather than a function::

        for attempt in jobfence.retrying(attempts=3):
            with attempt:
                with pool.connection() as conn, conn.transaction():
                    ...

        async for attempt in jobfence.retrying(attempts=3):
            with attempt:
                ...

    Same options and rules as :func:`retry_unit` (``policy``, a base :class:`RetryPolicy`,
    and ``**options``, its fields to override), except that no argument is there to check
    for an open transaction: the block must open its own.
    """
    base = policy if policy is not None else RetryPolicy()
    return base.replace(**options) if options else base
