"""The exceptions jobfence raises.

Every exception derives from :class:`JobfenceError`::

    JobfenceError
    ├── ConfigurationError      bad URL, bad argument (names the argument and what is allowed)
    ├── BackendError            a backend operation failed; the driver error is ``__cause__``
    │   ├── SchemaMissing       a table jobfence needs does not exist (run ``install()``)
    │   └── NotReplicated       fewer replicas than ``wait_replicas`` acknowledged a write in time
    ├── NotNow                  "not now": refused because someone else holds it (a marker)
    ├── LockError
    │   ├── LockTimeout         ``acquire(timeout=...)`` gave up                   (NotNow)
    │   │   └── LimitReached    a guarded call found its concurrency limit full   (NotNow)
    │   └── LockLost            the lease is no longer held (expired, renewal failed, taken over)
    │                                                                                (NotNow)
    ├── StaleToken              a fenced write offered a token older than one already seen
    ├── InboxError
    │   ├── ClaimInProgress     another live worker owns the idempotency key       (NotNow)
    │   ├── ClaimLost           complete() on a claim this worker no longer owns   (NotNow)
    │   └── FingerprintMismatch the key was used before with another payload
    ├── ConflictError           optimistic-concurrency conflict
    │   └── StaleVersion        a versioned update found another version
    └── CommitOutcomeUnknown    a commit may or may not have been applied (connection lost)

:class:`NotNow` marks the refusals that say "not now" rather than "this job failed": the job
did not run (or its result was not stored) because another worker holds its lease or claim.
A :class:`~jobfence.Worker` gives such a message back for later without counting the delivery
(see docs/concepts/delivery.md); the framework integrations retry it the same way.

Messages never contain secrets: a URL is shown masked, with the password of its user-info and
the value of every secret-bearing query option (``password``, ``passwd``, ``sslpassword``,
``sslkey``, ``token``...) replaced by ``***``; a URL whose user-info cannot be told apart from
its host (an unencoded ``/``, ``?`` or ``#`` in the password) is refused with all of it masked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

# The root error and ConfigurationError are defined in a module that imports nothing of
# jobfence, so that the clock and the I/O hook can raise ConfigurationError while this module
# reads the clock (ClaimInProgress.retry_after): no import cycle. They are this module's.
from ._core.clock import get_clock
from ._core.root_errors import ConfigurationError, JobfenceError

__all__ = [
    "BackendError",
    "ClaimInProgress",
    "ClaimLost",
    "CommitOutcomeUnknown",
    "ConfigurationError",
    "ConflictError",
    "FingerprintMismatch",
    "InboxError",
    "JobfenceError",
    "LockError",
    "LockLost",
    "LockTimeout",
    "MessageLost",
    "NotNow",
    "NotReplicated",
    "QueueError",
    "SchemaMissing",
    "StaleToken",
    "StaleVersion",
]


class NotNow(JobfenceError):
    """A refusal for "not now": the work did not run (or its result was not stored) because
    another worker holds what it needs -- an idempotency claim (:class:`ClaimInProgress`), a
    lease (:class:`LockTimeout`), or this worker's lease or claim was lost meanwhile
    (:class:`LockLost`, :class:`ClaimLost`). It is not a failure of the work itself.

    ``retry_after`` is the number of seconds after which the refusal should be over -- the
    holder's known expiry where the backend reported one -- or ``None`` when unknown. A
    :class:`~jobfence.Worker` gives the message back for redelivery after ``retry_after``
    (plus jitter) without counting the delivery towards ``max_deliveries``; raise ``NotNow``
    (or a subclass) from a handler for a refusal of your own, e.g. a concurrency limit.
    """

    retry_after: float | None = None

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = _seconds_hint(retry_after)


def _seconds_hint(value: float | None) -> float | None:
    """A ``retry_after`` hint: ``None``, or seconds >= 0 (a negative one: the holder's expiry
    has passed already, so at once)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value:  # NaN
        return None
    return max(0.0, float(value))


class BackendError(JobfenceError):
    """A backend operation failed. The driver's exception is chained as ``__cause__``."""

    def __init__(self, message: str, *, backend: str = "", operation: str = "") -> None:
        super().__init__(message)
        self.backend = backend
        self.operation = operation


class SchemaMissing(BackendError):
    """A table jobfence needs is missing; the message names the ``install()`` call to run."""


class NotReplicated(BackendError):
    """A write reached the primary, but fewer replicas than the backend's ``wait_replicas``
    acknowledged it within ``wait_timeout`` (Redis ``WAIT``): a failover to a replica now could
    lose it. ``acknowledged`` is how many replicas did, ``required`` how many were asked for.

    What the backend did about the write is in the message: a lease or an inbox claim that
    was granted is given back first (treat it as not obtained); a renewal, an extension or a
    completion is reported unconfirmed (a renewal is retried until the lease expires; a
    completed record may or may not survive a failover). Transient
    (:func:`jobfence.is_transient`): the same call may succeed once the replicas catch up.
    """

    def __init__(
        self,
        message: str,
        *,
        backend: str = "",
        operation: str = "",
        acknowledged: int = 0,
        required: int = 0,
    ) -> None:
        super().__init__(message, backend=backend, operation=operation)
        self.acknowledged = acknowledged
        self.required = required


class LockError(JobfenceError):
    """Base class of lock errors. ``name`` is the lock name."""

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class LockTimeout(LockError, NotNow, TimeoutError):
    """``acquire(..., timeout=...)`` did not get the lease in time.

    Where the backend can tell, the message and the attributes name the lease's holder when
    the timeout passed (else they are ``None``): ``owner`` (its owner id, ``host:pid:uuid``),
    ``token`` (its fencing token) and ``expires_in`` (seconds left on its lease, also its
    :attr:`~NotNow.retry_after`). A :class:`NotNow` refusal.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str = "",
        owner: str | None = None,
        token: int | None = None,
        expires_in: float | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.owner = owner
        self.token = token
        self.expires_in = expires_in
        self.retry_after = _seconds_hint(expires_in)


class LimitReached(LockTimeout):
    """A :func:`~jobfence.guarded` call with ``limit=(name, n)`` found ``n`` leases on ``name``
    held already: it did not run. A :class:`NotNow` refusal; ``retry_after`` is the seconds
    left on the held lease that ends first (``None`` if unknown), ``limit`` is ``n``."""

    def __init__(
        self,
        message: str,
        *,
        name: str = "",
        limit: int = 0,
        owner: str | None = None,
        token: int | None = None,
        expires_in: float | None = None,
    ) -> None:
        super().__init__(message, name=name, owner=owner, token=token, expires_in=expires_in)
        self.limit = limit


class LockLost(LockError, NotNow):
    """The lease is no longer held: it expired, renewal failed, or someone else holds it now.
    A :class:`NotNow` refusal (``retry_after`` unknown): the work was not completed under it."""


class StaleToken(JobfenceError):
    """A fenced write offered a token older than the newest one that wrote the resource."""

    def __init__(self, resource: str, token: int, newest: int) -> None:
        super().__init__(
            f"stale fencing token for resource {resource!r}: offered {token}, "
            f"but token {newest} has already written it"
        )
        self.resource = resource
        self.token = token
        self.newest = newest


class InboxError(JobfenceError):
    """Base class of inbox (idempotency) errors. ``key`` is the idempotency key."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class ClaimInProgress(InboxError, NotNow):
    """Another live worker owns the claim on this key: ``owner`` (its owner id) until
    ``expires_at`` (an aware UTC datetime, by the server's clock), unless it is renewed.

    A :class:`NotNow` refusal: ``retry_after`` is the seconds left until ``expires_at`` (by
    this host's clock), or what the caller passes. A guarded call refused by a claim that a
    call of this same process holds gets a shorter one: as long as that call has run so far,
    at least half a second (it renews its claim while it runs, so the expiry is only a bound).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str = "",
        owner: str | None = None,
        expires_at: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, key=key)
        self.owner = owner
        self.expires_at = expires_at
        if retry_after is None and isinstance(expires_at, datetime):
            retry_after = expires_at.timestamp() - get_clock().time()
        self.retry_after = _seconds_hint(retry_after)


class ClaimLost(InboxError, NotNow):
    """``complete()`` on a claim this worker no longer owns (it expired and was taken over,
    was released, or was purged): the result was not stored. A :class:`NotNow` refusal
    (``retry_after`` unknown)."""


class FingerprintMismatch(InboxError):
    """The key was claimed before with a different payload fingerprint."""


class QueueError(JobfenceError):
    """Base class of queue errors. ``queue`` is the queue's name, ``message_id`` the
    message's id where one is concerned."""

    def __init__(self, message: str, *, queue: str = "", message_id: str | None = None) -> None:
        super().__init__(message)
        self.queue = queue
        self.message_id = message_id


class MessageLost(QueueError):
    """This delivery is no longer the receiver's: its visibility passed (or its renewal
    failed) and the message may be delivered to another consumer, or it was already acked,
    nacked or dead-lettered. Its ``ack`` did not happen."""


class ConflictError(JobfenceError):
    """An optimistic-concurrency conflict: re-run the unit of work from its reads."""


class StaleVersion(ConflictError):
    """A versioned update matched no row at the expected version.

    ``current`` is the row as the database holds it now (``None`` if it was deleted).
    """

    def __init__(
        self,
        message: str,
        *,
        table: str = "",
        key: Any = None,
        expected: Any = None,
        current: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.table = table
        self.key = key
        self.expected = expected
        self.current = current


class CommitOutcomeUnknown(JobfenceError):
    """A commit may or may not have been applied (the connection died while COMMIT was in flight).

    Raise it (``raise CommitOutcomeUnknown("...") from exc``) where your code knows a commit's
    outcome is unknown; a test can raise it from the I/O hook to simulate "commit applied but
    reported failed".
    :func:`jobfence.retry_unit` retries it only for protected units (see docs/concepts/retries.md).
    """
