"""The backend interfaces and the types they share, for locks, the inbox and queues, sync and
async.

A backend is a small plugin chosen by URL scheme (see :mod:`jobfence.backends`). Every method
is one atomic operation on the server -- a Lua script, one SQL statement or transaction, or one
step inside the memory store's mutex -- with the owner check done there, never a read followed
by a write decided in Python. Names and keys arrive validated (non-empty, at most 1024 bytes of
UTF-8); ``ttl`` and ``retention`` are seconds > 0; inbox results arrive serialised (bytes).

The async interfaces carry the documentation; each sync interface has the same methods,
blocking instead of awaitable.
"""

from __future__ import annotations

import abc
import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from .._core.clock import get_clock
from ..errors import ConfigurationError

__all__ = [
    "AsyncInboxBackend",
    "AsyncLockBackend",
    "AsyncOutboxBackend",
    "AsyncQueueBackend",
    "ClaimInfo",
    "ClaimItem",
    "ClaimRecord",
    "ClaimState",
    "CompleteItem",
    "DeadLetter",
    "InboxBackend",
    "InboxCapabilities",
    "LockBackend",
    "LockCapabilities",
    "LockHolder",
    "OutboxBackend",
    "OutboxCapabilities",
    "OutboxEntry",
    "OutboxRow",
    "OutboxStats",
    "QueueBackend",
    "QueueCapabilities",
    "QueueStats",
    "QueuedMessage",
    "RenewItem",
    "info_from_row",
    "record_from_row",
]


# -- types ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LockCapabilities:
    """What a lock backend guarantees. The conformance suite reads these.

    * ``cross_process`` -- clients in different processes (or hosts) share the locks.
    * ``ttl_expiry`` -- a lease that is not renewed within ``ttl`` becomes free for others
      even while its holder is alive but paused. Every default mode has it; an opt-in mode
      that holds locks as long as a connection lives (a session advisory lock) does not.
    * ``fifo`` -- waiters get the lease in arrival order.
    * ``handoff`` -- release hands the lease straight to the next waiter (one wake-up, and
      the waiter already owns the lease when it wakes).
    * ``tokens_survive_data_loss`` -- fencing tokens keep increasing even if the backend
      restarts with its data gone.
    * ``queue_follows_connection`` -- a waiter waits in the server, and its place in the queue
      lives exactly as long as its connection (the server drops it when the waiter dies), so
      one wait may last the caller's whole timeout. Other backends hear from a waiter at least
      every few poll intervals, so that a dead waiter drops out of their queue soon.
    * ``wait_ends_on_change`` -- a wait ends by itself when anything can change for the
      waiter (a release, a hand-off, the holder's ttl running out, the waiter leaving the
      queue) and keeps the waiter's place while it lasts: no wake-up can be lost, so one wait
      may last the caller's whole timeout instead of ``poll_interval`` (in-process backends,
      whose waits a virtual clock then skips in one step; not under a clock that moves its
      time by a wait's whole length, an auto-advancing ``ManualClock``).
    """

    cross_process: bool
    ttl_expiry: bool = True
    fifo: bool = False
    handoff: bool = False
    tokens_survive_data_loss: bool = False
    queue_follows_connection: bool = False
    wait_ends_on_change: bool = False


#: one lease or claim to renew: (name or key, owner, ttl seconds)
RenewItem = tuple[str, str, float]
#: one claim of a batch: (key, owner, fingerprint or None, ttl seconds)
ClaimItem = tuple[str, str, "str | None", float]
#: one completion of a batch: (key, owner, serialised result)
CompleteItem = tuple[str, str, bytes]


class LockHolder(NamedTuple):
    """Who holds a lease right now, as :meth:`AsyncLockBackend.holder` reports it.

    ``owner`` is the holder's owner id (``host:pid:uuid``), ``None`` where the server does not
    record it (PostgreSQL session mode); ``token`` its fencing token, ``None`` if unknown;
    ``expires_in`` the seconds left on the lease by the server's clock, ``None`` where a lease
    has no ttl (PostgreSQL session mode).
    """

    owner: str | None
    token: int | None
    expires_in: float | None


# the fields' own help() text, in place of the generated "Alias for field number N"
LockHolder.owner.__doc__ = "The holder's owner id (``host:pid:uuid``), or ``None`` if not recorded."
LockHolder.token.__doc__ = "The holder's fencing token, or ``None`` if unknown."
LockHolder.expires_in.__doc__ = (
    "Seconds left on the lease by the server's clock, or ``None`` where a lease has no ttl."
)


class ClaimState(str, enum.Enum):
    """What :meth:`Inbox.claim` found.

    * ``NEW`` -- the key is yours now: do the work, then ``complete(result)`` or ``release()``.
    * ``IN_PROGRESS`` -- another worker holds an unexpired claim on it (``owner`` and
      ``expires_at`` say who and until when); do not run the work.
    * ``COMPLETED`` -- the work was done; ``result`` is the stored result to replay.
    """

    NEW = "new"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class InboxCapabilities:
    """What an inbox backend guarantees; the conformance suite reads these.

    * ``cross_process`` -- claims are shared between processes (and hosts).
    * ``transactional`` -- :meth:`Inbox.claim_in` works with connections to this database.
    * ``native_expiry`` -- records expire on the server by themselves: ``purge()`` has
      nothing (Redis) or little (etcd: the attempt numbers of claims that ended) to delete.
    * ``scanned_listing`` -- a listing by prefix (:meth:`Inbox.claims`) visits every key on
      the server whatever the prefix (Redis ``SCAN``), not an index range: a caller that
      needs several prefixes of one family lists their common prefix once.
    """

    cross_process: bool
    transactional: bool = False
    native_expiry: bool = False
    scanned_listing: bool = False


@dataclass(frozen=True)
class ClaimRecord:
    """One claim's outcome as a backend reports it.

    ``mine`` is true when this call took the key (a first claim or a takeover); otherwise the
    other fields describe the record that stopped it. ``result`` is the serialised result
    (``None`` unless completed). ``expires_at`` is an aware UTC datetime: the claim's deadline
    while in progress, the end of retention once completed.
    """

    mine: bool
    state: ClaimState
    attempt: int
    owner: str | None = None
    fingerprint: str | None = None
    result: bytes | None = None
    expires_at: datetime | None = None


def record_from_row(
    row: Sequence[Any],
    expires_at: Callable[[Any], datetime | None],
    text: Callable[[Any], Any] = str,
) -> ClaimRecord:
    """A :class:`ClaimRecord` from a SQL row ``(mine, state, owner, attempt, fingerprint,
    result, expires_at)``; ``expires_at`` converts the dialect's time value, ``text`` the
    dialect's strings (MySQL may return bytes)."""
    mine, state, owner, attempt, fingerprint, result, expires = row
    return ClaimRecord(
        mine=bool(mine),
        state=ClaimState(text(state)),
        attempt=int(attempt),
        owner=None if owner is None else text(owner),
        fingerprint=None if fingerprint is None else text(fingerprint),
        result=None if result is None else bytes(result),
        expires_at=expires_at(expires),
    )


@dataclass(frozen=True)
class ClaimInfo:
    """One inbox record as an operator sees it (:meth:`Inbox.claims`, :meth:`Inbox.claim_info`).

    * ``key`` -- the idempotency key.
    * ``state`` -- :attr:`ClaimState.IN_PROGRESS` or :attr:`ClaimState.COMPLETED`.
    * ``owner`` -- the owner id (``host:pid:uuid``) of the current attempt: the worker that
      holds the claim (in progress) or that completed it; ``None`` once the claim was
      released, and for the markers ``claim_in()`` writes.
    * ``attempt`` -- 1 for the key's first claim, + 1 for each takeover.
    * ``fingerprint`` -- the stored fingerprint (``None``: none was given).
    * ``claimed_at`` -- when the current attempt was claimed (aware UTC), by the server's
      clock; ``None`` for records written before jobfence recorded it, and for the markers
      ``claim_in()`` writes.
    * ``expires_in`` -- seconds left by the server's clock: until the claim's deadline (in
      progress) or the end of retention (completed). Negative when that moment has passed:
      an abandoned or released claim that the next claim takes over, or a record that
      ``purge()`` may delete.
    """

    key: str
    state: ClaimState
    owner: str | None
    attempt: int
    fingerprint: str | None
    claimed_at: datetime | None
    expires_in: float

    @property
    def age(self) -> float | None:
        """Seconds since ``claimed_at`` by this host's clock (jobfence's clock, see
        :mod:`jobfence.testing`), ``None`` when ``claimed_at`` is unknown."""
        if self.claimed_at is None:
            return None
        return get_clock().time() - self.claimed_at.timestamp()

    @property
    def stuck(self) -> bool:
        """In progress and past its deadline: its worker died, hung past its ttl or released
        it, and nobody claimed the key since (the next claim takes it over)."""
        return self.state is ClaimState.IN_PROGRESS and self.expires_in <= 0


def info_from_row(
    key: str,
    row: Sequence[Any],
    claimed_at: Callable[[Any], datetime | None],
    text: Callable[[Any], Any] = str,
) -> ClaimInfo:
    """A :class:`ClaimInfo` from the SQL columns ``(state, owner, attempt, fingerprint,
    claimed_at, seconds_left)`` of the record of ``key``; ``claimed_at`` converts the
    dialect's time value, ``text`` its strings (MySQL may return bytes)."""
    state, owner, attempt, fingerprint, claimed, left = row
    return ClaimInfo(
        key=key,
        state=ClaimState(text(state)),
        owner=None if owner is None else text(owner),
        attempt=int(attempt),
        fingerprint=None if fingerprint is None else text(fingerprint),
        claimed_at=None if claimed is None else claimed_at(claimed),
        expires_in=float(left),
    )


# -- locks ---------------------------------------------------------------------------------
class AsyncLockBackend(abc.ABC):
    """Four verbs (acquire, release, extend, renew) plus waiting, and a close."""

    #: short backend name used in errors and metrics ("redis", "sqlite", ...)
    kind: str = "?"
    capabilities: LockCapabilities

    @abc.abstractmethod
    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        """One attempt to take ``name`` for ``owner``; return the fencing token or ``None``.

        ``wait`` is ``None`` for a plain try. Otherwise the caller is about to wait up to
        ``wait`` seconds: a backend with a waiter queue records ``owner`` in it (or refreshes
        its entry), so that :meth:`release` can hand the lease over.
        """

    @abc.abstractmethod
    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Block until ``name`` may be free, at most ``timeout`` seconds.

        Return a fencing token if the lease was handed to ``owner`` while it waited, else
        ``None`` (the caller then tries :meth:`acquire` again). May return early; must not
        block past ``timeout``.
        """

    @abc.abstractmethod
    async def cancel_wait(self, name: str, owner: str) -> int | None:
        """``owner`` stops waiting. Return its token if the lease was handed to it meanwhile."""

    @abc.abstractmethod
    async def release(self, name: str, owner: str) -> bool:
        """Free ``name`` if ``owner`` holds it; return whether it did."""

    @abc.abstractmethod
    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        """Set the remaining lifetime to ``ttl`` if ``owner`` holds ``name``."""

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend many leases in one round trip where the backend can; one bool per item."""
        return [await self.extend(name, owner, ttl) for name, owner, ttl in items]

    async def install(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Create the backend's tables now (idempotent). Backends without a schema do nothing;
        SQL backends also create them on first use of their own connection."""

    async def prepare(self, *, waiting: bool = False) -> None:  # noqa: B027 - optional
        """Open and set up what the next :meth:`acquire` needs (a connection with its session
        settings and scripts, the tables; with ``waiting``, what a waiter needs too), so that
        the grant request itself costs one round trip. A no-op when all is ready.

        ``Locks`` calls it before it reads the clock that a new lease's local deadline counts
        from: connection setup on a slow link does not eat into the lease.
        """

    async def holder(self, name: str) -> LockHolder | None:
        """Who holds ``name`` now (``None``: nobody, or the backend cannot tell). Read-only;
        ``LockTimeout`` and operator tools report it."""
        return None

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """The live leases of this backend's namespace whose names start with ``prefix``:
        ``(name, holder)`` pairs ordered by name (code point order), at most ``limit``.
        Read-only; operator tools (``jobfence locks list``) use it. A backend that cannot
        enumerate its leases raises ``NotImplementedError`` (the default)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot list the leases it holds: it does not implement "
            "holders(prefix, limit); ask for one name with holder(name)"
        )

    async def force_release(self, name: str) -> bool:
        """Administrative: drop the lease on ``name`` whoever holds it (the holder will find
        it lost at its next renewal). Used by tests of lost-lease detection. Returns whether
        a lease was dropped."""
        raise NotImplementedError(f"{type(self).__name__} must implement force_release()")

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Leases still held are left to expire."""

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Called in a child process right after ``fork()`` (never in the parent): forget every
        connection, listener and in-process wait the backend inherited, without closing them
        (closing would end the parent's sessions) and without I/O, so that the child opens
        its own. A backend that keeps no connections does nothing."""


class LockBackend(abc.ABC):
    """The blocking twin of :class:`AsyncLockBackend` (same verbs, same contract)."""

    kind: str = "?"
    capabilities: LockCapabilities

    @abc.abstractmethod
    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None: ...

    @abc.abstractmethod
    def wait(self, name: str, owner: str, timeout: float) -> int | None: ...

    @abc.abstractmethod
    def cancel_wait(self, name: str, owner: str) -> int | None: ...

    @abc.abstractmethod
    def release(self, name: str, owner: str) -> bool: ...

    @abc.abstractmethod
    def extend(self, name: str, owner: str, ttl: float) -> bool: ...

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return [self.extend(name, owner, ttl) for name, owner, ttl in items]

    def install(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass

    def prepare(self, *, waiting: bool = False) -> None:  # noqa: B027 - optional
        pass

    def holder(self, name: str) -> LockHolder | None:
        return None

    def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        raise NotImplementedError(
            f"{type(self).__name__} cannot list the leases it holds: it does not implement "
            "holders(prefix, limit); ask for one name with holder(name)"
        )

    def force_release(self, name: str) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement force_release()")

    @abc.abstractmethod
    def close(self) -> None: ...

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass


# -- inbox ---------------------------------------------------------------------------------
class AsyncInboxBackend(abc.ABC):
    """claim / complete / release / extend, plus renew, install, purge and close."""

    #: short backend name used in errors ("redis", "postgres", ...)
    kind: str = "?"
    capabilities: InboxCapabilities
    #: the validated table name (SQL) or key prefix (Redis, memory)
    table: str

    @abc.abstractmethod
    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        """Take ``key`` for ``owner`` if it is unknown, or in progress past its deadline, or
        completed past its retention; otherwise report the record that is there.

        A takeover of an expired in-progress claim increments ``attempt``; it does not happen
        when both fingerprints are set and differ (the caller raises ``FingerprintMismatch``).
        """

    @abc.abstractmethod
    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        """Store ``result`` and mark ``key`` completed for ``retention`` seconds, if ``owner``
        still owns the claim. Returns whether it did."""

    @abc.abstractmethod
    async def release(self, key: str, owner: str) -> bool:
        """Give ``key`` back (the next claim takes it over, ``attempt`` + 1) if ``owner`` owns
        the in-progress claim. Returns whether it did."""

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """Set the remaining lifetime of the in-progress claim on ``key`` to ``ttl`` if
        ``owner`` owns it and its deadline has not passed. Returns whether it did.

        An expired claim is never extended, even when nobody took it over yet: once its
        deadline passed, another worker may take it over at any moment, and its owner has
        already been told that it is lost.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement extend()")

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """:meth:`extend` every ``(key, owner, ttl)`` of ``items``, in one round trip where the
        backend can; one bool per item, in order."""
        return [await self.extend(key, owner, ttl) for key, owner, ttl in items]

    #: whether :meth:`claim_many` and :meth:`complete_many` send a batch in one round trip
    #: (``AsyncInbox`` then sends concurrent claims and completions together)
    batches: bool = False

    async def claim_many(self, items: Sequence[ClaimItem]) -> list[ClaimRecord]:
        """:meth:`claim` every ``(key, owner, fingerprint, ttl)`` of ``items`` (distinct keys);
        one record per item, in order, each as :meth:`claim` would answer it alone."""
        return [await self.claim(key, owner, fp, ttl) for key, owner, fp, ttl in items]

    async def complete_many(self, items: Sequence[CompleteItem], retention: float) -> list[bool]:
        """:meth:`complete` every ``(key, owner, result)`` of ``items`` (distinct keys); one
        bool per item, in order."""
        return [await self.complete(key, owner, data, retention) for key, owner, data in items]

    @abc.abstractmethod
    async def purge(self, retention: float) -> int:
        """Delete completed records past their retention, and in-progress records abandoned
        for longer than ``retention`` past their deadline. Returns how many were deleted."""

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        """The records whose keys start with ``prefix`` (matched literally), in ``state``
        (``None``: both), ordered by key (code point order), at most ``limit``; expired
        records not yet deleted included. Read-only; operator tools use it. A backend that
        cannot enumerate its records raises ``NotImplementedError`` (the default)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot list its records: it does not implement "
            "claim_infos(state, prefix, limit)"
        )

    async def claim_info(self, key: str) -> ClaimInfo | None:
        """The record of ``key`` (``None``: there is none), as :meth:`claim_infos` reports
        records. Read-only."""
        raise NotImplementedError(f"{type(self).__name__} does not implement claim_info(key)")

    async def forget(self, key: str) -> bool:
        """Administrative: delete the record of ``key`` whatever its state and owner (the
        next claim of the key is NEW; its former owner's ``complete`` finds the claim lost).
        Returns whether there was a record."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forget(key)")

    @abc.abstractmethod
    async def install(self) -> None:
        """Create the schema if it is missing (idempotent)."""

    @abc.abstractmethod
    async def drop(self) -> None:
        """Delete the table / every key this backend stored (tests, uninstall)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Called in a child process right after ``fork()``: as
        :meth:`AsyncLockBackend.after_fork`."""


class InboxBackend(abc.ABC):
    """The blocking twin of :class:`AsyncInboxBackend` (same verbs, same contract)."""

    kind: str = "?"
    capabilities: InboxCapabilities
    table: str

    @abc.abstractmethod
    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord: ...

    @abc.abstractmethod
    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool: ...

    @abc.abstractmethod
    def release(self, key: str, owner: str) -> bool: ...

    def extend(self, key: str, owner: str, ttl: float) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement extend()")

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return [self.extend(key, owner, ttl) for key, owner, ttl in items]

    batches: bool = False

    def claim_many(self, items: Sequence[ClaimItem]) -> list[ClaimRecord]:
        return [self.claim(key, owner, fp, ttl) for key, owner, fp, ttl in items]

    def complete_many(self, items: Sequence[CompleteItem], retention: float) -> list[bool]:
        return [self.complete(key, owner, data, retention) for key, owner, data in items]

    @abc.abstractmethod
    def purge(self, retention: float) -> int: ...

    def claim_infos(self, state: ClaimState | None, prefix: str, limit: int) -> list[ClaimInfo]:
        raise NotImplementedError(
            f"{type(self).__name__} cannot list its records: it does not implement "
            "claim_infos(state, prefix, limit)"
        )

    def claim_info(self, key: str) -> ClaimInfo | None:
        raise NotImplementedError(f"{type(self).__name__} does not implement claim_info(key)")

    def forget(self, key: str) -> bool:
        raise NotImplementedError(f"{type(self).__name__} does not implement forget(key)")

    @abc.abstractmethod
    def install(self) -> None: ...

    @abc.abstractmethod
    def drop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass


# -- queues --------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueCapabilities:
    """What a queue backend guarantees; the conformance suite reads these.

    * ``cross_process`` -- consumers in different processes (and hosts) share the queue.
    * ``visibility_timeout`` -- a delivered message that is neither acked nor renewed within
      its ``visibility`` is delivered again, even while its consumer is alive but paused.
      RabbitMQ has none: an unacked message comes back when its consumer's connection closes
      (or when the broker's ``consumer_timeout`` closes it), and ``renew`` only tells whether
      that connection is still up.
    * ``server_wakeup`` -- a waiting :meth:`AsyncQueueBackend.receive` is woken by the server
      when a message arrives (no polling while idle).
    """

    cross_process: bool
    visibility_timeout: bool = True
    server_wakeup: bool = False


@dataclass(frozen=True)
class QueuedMessage:
    """One delivery of a message, as a backend reports it.

    ``id`` is the message id given at publish time (the same on every delivery); ``delivery``
    counts deliveries, 1 for the first; ``receipt`` is the backend's handle of this delivery,
    opaque to callers, for ``ack``/``nack``/``renew``/``dead_letter`` (a later delivery of the
    same message has another receipt); ``published_at`` is seconds since the epoch by the
    server's clock where it records one; ``last_error`` is the error a ``nack`` recorded.
    """

    id: str
    body: bytes
    headers: dict[str, str]
    delivery: int
    receipt: str
    published_at: float | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class QueueStats:
    """How many messages a queue holds, by state. ``ready`` can be delivered now;
    ``delayed`` wait for their time (published or nacked with a delay); ``in_flight`` are
    delivered and not yet acked; ``dead`` are dead letters. A backend that cannot tell one
    count reports ``None`` for it."""

    ready: int | None
    delayed: int | None
    in_flight: int | None
    dead: int | None


@dataclass(frozen=True)
class DeadLetter:
    """A message moved to the dead letters: after ``deliveries`` deliveries, with the last
    ``error``; ``dead_at`` is seconds since the epoch, if known."""

    id: str
    body: bytes
    headers: dict[str, str]
    deliveries: int
    error: str | None
    dead_at: float | None = None


class AsyncQueueBackend(abc.ABC):
    """One named queue on one server: at-least-once delivery with acks, delays, renewal of
    a delivery's visibility and dead letters.

    ``consumer`` is the receiving client's owner id (``host:pid:uuid``); the verbs that
    finish or renew a delivery are owner-checked on the server where it can tell (a delivery
    that was given to another consumer since, after its visibility passed, is no longer
    this one's: ``ack`` returns False and does not remove the new delivery).
    """

    kind: str = "?"
    capabilities: QueueCapabilities
    #: the queue's validated name
    name: str

    @abc.abstractmethod
    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        """Append ``(id, body, headers)`` messages, deliverable after ``delay`` seconds, in
        one round trip where the backend can. Ids need not be unique: a message published
        twice is delivered twice."""

    @abc.abstractmethod
    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        """Deliver up to ``max_messages`` messages to ``consumer``, each hidden from other
        consumers for ``visibility`` seconds; wait up to ``wait`` seconds for the first one
        (``0``: do not wait) and return ``[]`` if none came. Messages whose visibility passed
        without an ack are delivered again, ``delivery`` + 1."""

    @abc.abstractmethod
    async def ack(self, receipt: str, consumer: str) -> bool:
        """Remove the delivered message if the delivery is still ``consumer``'s."""

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """:meth:`ack` every ``(receipt, consumer)`` of ``items``, in one round trip where the
        backend can; one bool per item, in order."""
        return [await self.ack(receipt, consumer) for receipt, consumer in items]

    async def stream(self, prefetch: int) -> bool:
        """A hint from a client that will receive continuously (a worker): a backend whose
        server pushes deliveries may subscribe now, with at most ``prefetch`` deliveries on
        their way to this client, instead of asking for each batch. Deliveries pushed and not
        yet returned by :meth:`receive` are this client's: they go back to the queue when it
        closes or dies. Returns whether the server pushes from now on (its window, not the
        client, then bounds the unacknowledged deliveries). Backends that pull do nothing and
        return ``False``."""
        return False

    async def unstream(self, consumer: str) -> list[QueuedMessage]:
        """Undo :meth:`stream` (the worker stops receiving): unsubscribe, and deliver to
        ``consumer`` what was pushed and not yet returned by :meth:`receive`, so that the
        caller gives those deliveries back itself (deferred, uncounted) instead of their going
        back with a counted redelivery when the client closes. Backends that pull return
        ``[]``."""
        return []

    @abc.abstractmethod
    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        """Give the message back, to be delivered again after ``delay`` seconds (``0``: at
        once), recording ``error``; only if the delivery is still ``consumer``'s."""

    @abc.abstractmethod
    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """Give the message back, to be delivered again after ``delay`` seconds, WITHOUT
        counting this delivery: the next delivery has the same ``delivery`` number as this
        one, and ``last_error`` is kept as it was. Only if the delivery is still
        ``consumer``'s. For a delivery whose handler was refused for "not now" (see
        :class:`~jobfence.errors.NotNow`): it never ran, so it must not use up the message's
        deliveries. (A consumer that dies holding a delivery never defers it: that delivery
        stays counted, which is what stops a message whose consumers keep dying.)"""

    @abc.abstractmethod
    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """For each ``(receipt, consumer, visibility)``: keep the delivery hidden for
        ``visibility`` more seconds if it is still ``consumer``'s and its visibility has not
        passed; one bool per item, in order, in one round trip where the backend can."""

    @abc.abstractmethod
    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        """Move the delivered message to the dead letters with ``error``, if the delivery is
        still ``consumer``'s."""

    @abc.abstractmethod
    async def stats(self) -> QueueStats:
        """Message counts by state."""

    @abc.abstractmethod
    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first."""

    async def names(self, limit: int) -> list[str]:
        """Up to ``limit`` names of the queues stored where this backend's queue is (the same
        server, namespace or table) that hold messages, sorted. A backend that cannot list
        raises :class:`~jobfence.errors.ConfigurationError` saying so."""
        raise ConfigurationError(
            f"the {self.kind} queue backend cannot list queue names: pass the names",
            argument="url",
        )

    @abc.abstractmethod
    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        """Publish dead letters again (those with ``ids``, or all), with their delivery count
        reset; return how many."""

    @abc.abstractmethod
    async def purge(self) -> int:
        """Delete every message of the queue: ready, delayed, in flight and dead. Returns how
        many, where the backend can count them."""

    async def install(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Create the queue's tables or server objects now (idempotent)."""

    @abc.abstractmethod
    async def drop(self) -> None:
        """Delete the queue and everything the backend stored for it (tests, uninstall)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Deliveries not acked are redelivered later (after their
        visibility, or at once where the server redelivers on disconnect)."""

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Called in a child process right after ``fork()``: as
        :meth:`AsyncLockBackend.after_fork`."""


class QueueBackend(abc.ABC):
    """The blocking twin of :class:`AsyncQueueBackend` (same verbs, same contract)."""

    kind: str = "?"
    capabilities: QueueCapabilities
    name: str

    @abc.abstractmethod
    def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None: ...

    @abc.abstractmethod
    def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]: ...

    @abc.abstractmethod
    def ack(self, receipt: str, consumer: str) -> bool: ...

    def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        return [self.ack(receipt, consumer) for receipt, consumer in items]

    @abc.abstractmethod
    def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool: ...

    @abc.abstractmethod
    def defer(self, receipt: str, consumer: str, delay: float) -> bool: ...

    @abc.abstractmethod
    def renew(self, items: Sequence[RenewItem]) -> list[bool]: ...

    @abc.abstractmethod
    def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool: ...

    @abc.abstractmethod
    def stats(self) -> QueueStats: ...

    @abc.abstractmethod
    def dead_letters(self, limit: int) -> list[DeadLetter]: ...

    def names(self, limit: int) -> list[str]:
        raise ConfigurationError(
            f"the {self.kind} queue backend cannot list queue names: pass the names",
            argument="url",
        )

    @abc.abstractmethod
    def requeue_dead(self, ids: Sequence[str] | None = None) -> int: ...

    @abc.abstractmethod
    def purge(self) -> int: ...

    def install(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass

    @abc.abstractmethod
    def drop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass


# -- outbox --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutboxCapabilities:
    """What an outbox backend offers; the conformance suite and the relay read these.

    * ``server_wakeup`` -- :meth:`AsyncOutboxBackend.wait` returns as soon as a transaction
      that added rows commits (PostgreSQL ``LISTEN/NOTIFY``, SQLite's ``data_version``);
      without it the relay polls with a growing interval while the outbox is empty.
    """

    server_wakeup: bool = False


@dataclass(frozen=True)
class OutboxRow:
    """A committed outbox row handed to a relay by :meth:`AsyncOutboxBackend.claim`.

    ``seq`` is the row's place in insertion order (unique, increasing); ``id`` is the
    message id the consumer sees (the same on every re-send); ``queue`` is the destination
    (a queue name, or a task name for a framework target); ``key`` is the ordering key (rows
    of one key are published in ``seq`` order) or None; ``body`` is the encoded body as
    :meth:`Outbox.add` stored it (JSON bytes); ``attempts`` counts failed publish attempts
    so far; ``created_at`` is seconds since the epoch by the database's clock.
    """

    seq: int
    id: str
    queue: str
    key: str | None
    body: bytes
    headers: dict[str, str]
    attempts: int
    created_at: float

    def value(self) -> Any:
        """The body decoded from its JSON (what was passed to ``Outbox.add`` as ``body``)."""
        return json.loads(self.body)


@dataclass(frozen=True)
class OutboxEntry:
    """One row of the outbox as the admin views show it. ``state`` is ``"pending"`` (waiting
    for a relay, possibly until ``available_at``), ``"claimed"`` (held by the relay
    ``claimed_by`` until ``claimed_until``), ``"published"`` (kept for ``retention`` after
    ``published_at``) or ``"dead"`` (gave up after ``attempts`` failures, ``last_error``).
    Times are seconds since the epoch, None when not set."""

    seq: int
    id: str
    queue: str
    key: str | None
    state: str
    attempts: int
    created_at: float
    available_at: float | None
    claimed_by: str | None
    claimed_until: float | None
    published_at: float | None
    last_error: str | None
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class OutboxStats:
    """How many rows the outbox holds, by state; ``oldest_pending`` is the age in seconds of
    the oldest pending or claimed row (None when there is none)."""

    pending: int
    claimed: int
    published: int
    dead: int
    oldest_pending: float | None


class AsyncOutboxBackend(abc.ABC):
    """The relay's side of one outbox table on one server (rows are added by
    ``Outbox.add`` on the caller's own connection, inside the caller's transaction, not
    through this interface).

    ``relay`` is the calling relay's owner id (``host:pid:uuid``). A row is *held* by a relay
    from :meth:`claim` until its ``lease`` (seconds, by the database's clock) runs out or the
    relay settles it (:meth:`published`, :meth:`failed`, :meth:`release`); the verbs that
    settle or extend rows only touch rows still held by that relay (owner-checked in the
    statement). Every verb is one statement or one short transaction.
    """

    kind: str = "?"
    capabilities: OutboxCapabilities = OutboxCapabilities()
    #: the outbox table's validated name
    table: str

    @abc.abstractmethod
    async def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        """Hold and return up to ``limit`` rows (only rows whose ``queue`` is one of
        ``queues``, when given), in ``seq`` order, that are pending,
        available now (``available_at`` passed) and held by no live relay, skipping every row
        that has an earlier row of the same ``key`` which is not published and not dead and
        not returned by this same call (so a key's rows are published in order, one relay at
        a time). Claims are serialised per table, so two relays never hold one row while both
        are live, and never split one key's run between them."""

    @abc.abstractmethod
    async def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        """Mark the rows ``seqs`` that ``relay`` still holds published (kept ``retention``
        seconds for the admin views, deleted at once when ``retention`` is 0); how many."""

    @abc.abstractmethod
    async def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        """Record a failed publish of row ``seq`` held by ``relay``: ``attempts`` + 1,
        ``last_error = error``, and either pending again after ``retry_in`` seconds or, with
        ``retry_in=None``, dead. False if the relay no longer held it."""

    @abc.abstractmethod
    async def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        """Give back rows ``relay`` holds without counting an attempt (the broker was down,
        the relay stops, a row waits behind a failed row of its key), available again after
        ``retry_in`` seconds; how many."""

    @abc.abstractmethod
    async def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        """Hold the rows ``seqs`` that ``relay`` still holds for ``lease`` more seconds from
        now; how many."""

    async def wait(self, timeout: float) -> bool:
        """Wait until rows may have been added (True) or ``timeout`` seconds pass (False).
        The default sleeps ``timeout``: backends with ``server_wakeup`` return early."""
        import asyncio

        await asyncio.sleep(timeout)
        return False

    @abc.abstractmethod
    async def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]:
        """Up to ``limit`` rows in ``seq`` order (after ``seq == after`` when given),
        filtered by ``state`` (``pending``, ``claimed``, ``published``, ``dead``) and
        ``queue`` when not None."""

    @abc.abstractmethod
    async def stats(self) -> OutboxStats: ...

    @abc.abstractmethod
    async def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        """Make the dead rows ``ids`` (all dead rows when None) pending again with their
        attempts reset; how many."""

    @abc.abstractmethod
    async def purge(self, retention: float) -> int:
        """Delete the published rows published more than ``retention`` seconds ago; how
        many."""

    @abc.abstractmethod
    async def install(self) -> None:
        """Create the outbox table (idempotent, versioned)."""

    @abc.abstractmethod
    async def drop(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        """Called in a child process right after ``fork()``: drop inherited connections
        without closing them."""


class OutboxBackend(abc.ABC):
    """The blocking twin of :class:`AsyncOutboxBackend` (same verbs, same contract)."""

    kind: str = "?"
    capabilities: OutboxCapabilities = OutboxCapabilities()
    table: str

    @abc.abstractmethod
    def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]: ...

    @abc.abstractmethod
    def published(self, relay: str, seqs: Sequence[int], retention: float) -> int: ...

    @abc.abstractmethod
    def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool: ...

    @abc.abstractmethod
    def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int: ...

    @abc.abstractmethod
    def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int: ...

    def wait(self, timeout: float) -> bool:
        import time

        time.sleep(timeout)
        return False

    @abc.abstractmethod
    def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]: ...

    @abc.abstractmethod
    def stats(self) -> OutboxStats: ...

    @abc.abstractmethod
    def retry_dead(self, ids: Sequence[str] | None = None) -> int: ...

    @abc.abstractmethod
    def purge(self, retention: float) -> int: ...

    @abc.abstractmethod
    def install(self) -> None: ...

    @abc.abstractmethod
    def drop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def after_fork(self) -> None:  # noqa: B027 - optional, a no-op by default
        pass
