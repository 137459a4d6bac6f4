"""SQLAlchemy: optimistic concurrency (``version_id_col``) that retries the whole unit.

SQLAlchemy's ``version_id_col`` adds ``WHERE version = :old`` to every ORM ``UPDATE`` and raises
``StaleDataError`` when another transaction changed the row first. That is the right detection;
the wrong reaction is to retry *with the same session*: its identity map still holds the stale
objects, so the retry recomputes from stale values. :func:`run_transaction` runs the unit in a
**new session and a new transaction per attempt** (as CockroachDB's ``run_transaction`` does),
commits it, and re-runs it whole on conflicts (``StaleDataError``, serialization failures,
deadlocks) and transient errors, through :func:`jobfence.retry_unit`:

```python
from jobfence.integrations.sqlalchemy import run_transaction

def deduct(session: Session) -> int:
    item = session.get(Inventory, 1)          # fresh read in a fresh session
    item.stock -= 5                           # recompute
    return item.stock                         # flushed + committed with the version check

stock = run_transaction(SessionLocal, deduct, attempts=5)
```

Return plain values, not ORM objects: the session is closed when the attempt ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import ConfigurationError
from ..retry import RetryPolicy

__all__ = ["run_transaction", "run_transaction_async"]

T = TypeVar("T")


def _policy(policy: RetryPolicy | None, options: dict[str, Any]) -> RetryPolicy:
    base = policy if policy is not None else RetryPolicy()
    unknown = set(options) - set(RetryPolicy.__dataclass_fields__)
    if unknown:
        raise ConfigurationError(
            f"run_transaction() got unknown option(s) {sorted(unknown)}; allowed: "
            f"{sorted(RetryPolicy.__dataclass_fields__)}",
            argument=sorted(unknown)[0],
        )
    return base.replace(**options) if options else base


def _check_factory(factory: object, fn: object) -> None:
    if not callable(factory):
        raise ConfigurationError(
            "session_factory must be a callable returning a new Session (a sessionmaker), "
            f"got {factory!r}",
            argument="session_factory",
        )
    if not callable(fn):
        raise ConfigurationError(f"fn must be callable, got {fn!r}", argument="fn")


def run_transaction(
    session_factory: Callable[[], Any],
    fn: Callable[[Any], T],
    *,
    policy: RetryPolicy | None = None,
    **options: Any,
) -> T:
    """Run ``fn(session)`` in a new session and transaction per attempt, commit, and retry the
    whole unit on conflicts and transient errors. ``session_factory`` makes the sessions (a
    ``sessionmaker``); ``policy`` is a base :class:`jobfence.RetryPolicy`, and the keyword
    options (``**options``) are its fields to override (``attempts``, ``deadline``,
    ``on_retry``, ...). Returns what ``fn`` returns."""
    _check_factory(session_factory, fn)
    resolved = _policy(policy, options)

    def attempt() -> T:
        with session_factory() as session, session.begin():
            return fn(session)

    return resolved(attempt)()


async def run_transaction_async(
    session_factory: Callable[[], Any],
    fn: Callable[[Any], Awaitable[T]],
    *,
    policy: RetryPolicy | None = None,
    **options: Any,
) -> T:
    """The ``AsyncSession`` twin of :func:`run_transaction`: ``session_factory`` is an
    ``async_sessionmaker``, ``fn`` an ``async def fn(session)``; ``policy`` and
    ``**options`` as there."""
    _check_factory(session_factory, fn)
    resolved = _policy(policy, options)

    async def attempt() -> T:
        async with session_factory() as session, session.begin():
            return await fn(session)

    return await resolved(attempt)()
