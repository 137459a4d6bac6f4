"""The inbox: atomic idempotency claims, result replay, and the transactional claim.

``AsyncInbox``/``AsyncClaim`` live in ``inbox_async.py``; ``Inbox``/``Claim`` in ``inbox.py``,
generated from it.

Check-then-mark idempotency ("has it been processed? ... do the work ... mark it processed")
has three holes: two workers can both pass the check; a crash between the work and the mark
re-runs the work; the mark can fail after the work. The inbox's ``claim`` closes the first
(one atomic claim, states new / in progress / completed, takeover of a dead worker's claim
after its ttl); its ``claim_in`` closes the other two for database effects (the marker
commits in the same transaction as the effect). See docs/concepts/inbox.md.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import warnings
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from . import telemetry
from ._core import acompat, forks
from ._core.clock import get_clock
from ._core.flavour import ASYNC
from ._core.hooks import ahook, get_hook
from ._core.inbox_support import (
    DEFAULT_CLAIM_TTL,
    DEFAULT_RETENTION,
    DEFAULT_TABLE,
    ClaimLost,
    Serializer,
    check_fingerprint,
    check_serializer,
    hold_here,
)
from ._core.lease_state import LeaseState
from ._core.renewable import Renewable, RenewableHandle
from ._core.renewer_async import AsyncRenewer
from ._core.sqlconn import WARNING_KINDS, adapt_async, is_undefined_table
from ._core.transaction import AsyncTransaction, own_transaction_async
from ._core.validate import check_listing, check_name, check_namespace, check_ttl
from ._guard_spec import current_claim_var, default_key
from .backends import open_inbox_backend, sql_dialect
from .backends.base import (
    AsyncInboxBackend,
    ClaimInfo,
    ClaimItem,
    ClaimRecord,
    ClaimState,
    CompleteItem,
)
from .backends.clients import Client, describe_target
from .errors import (
    BackendError,
    ConfigurationError,
    FingerprintMismatch,
    InboxError,
    JobfenceError,
    SchemaMissing,
)
from .retry import mark_protected

if ASYNC:
    import asyncio

    from ._core.groupcommit import GroupCommit
else:
    from ._core.groupcommit_thread import ThreadGroupCommit as GroupCommit

__all__ = ["DEFAULT_URL", "AsyncClaim", "AsyncInbox"]

log = logging.getLogger("jobfence.inbox")

T = TypeVar("T")

#: how long an interrupted claim waits for the give-back of a key it may have been given
CLEANUP_WAIT = 1.0

#: the embedded default backend, used when no URL is given and JOBFENCE_URL is not set
DEFAULT_URL = "sqlite:///jobfence.db"
#: the ``outcome`` attribute of the ``jobfence.inbox.claims`` metric for each claim state
_CLAIM_OUTCOMES = {
    ClaimState.NEW: "new",
    ClaimState.COMPLETED: "duplicate",
    ClaimState.IN_PROGRESS: "in_progress",
}

_HOST = socket.gethostname()[:64]
_MISSING: Any = object()


def _new_owner() -> str:
    # 128 random bits in hex, as a lease's owner id (``acquire.new_owner``): no UUID object
    return f"{_HOST}:{os.getpid()}:{os.urandom(16).hex()}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


#: the states a record can be in, for ``claims(state=...)``
_LISTED_STATES = (ClaimState.IN_PROGRESS, ClaimState.COMPLETED)


def _check_state(state: object) -> ClaimState | None:
    """``None`` or one of :data:`_LISTED_STATES`, given as a :class:`ClaimState` or its value
    (``"in_progress"``, ``"completed"``)."""
    if state is None:
        return None
    if isinstance(state, str):
        for allowed in _LISTED_STATES:
            if state == allowed or state.lower() == allowed.value:
                return allowed
    raise ConfigurationError(
        f"state must be None, ClaimState.IN_PROGRESS or ClaimState.COMPLETED (or "
        f"'in_progress' / 'completed'), got {state!r}",
        argument="state",
    )


def _serialize(serializer: Serializer, result: Any) -> bytes:
    """The bytes ``complete`` stores for ``result``; a result the serializer cannot turn into
    bytes (or UTF-8 text) raises :class:`ConfigurationError` naming ``result``, before
    anything is sent, so the claim stays owned and ``complete`` may be called again."""
    name = getattr(serializer, "__name__", None) or type(serializer).__name__
    try:
        data = serializer.dumps(result)
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
    except Exception as exc:
        raise ConfigurationError(
            f"result cannot be stored: {name}.dumps failed on a "
            f"{type(result).__name__} ({type(exc).__name__}: {exc}); pass a value the inbox's "
            "serializer can store (JSON by default), or give the Inbox another serializer",
            argument="result",
        ) from exc
    if not isinstance(data, bytes):
        raise ConfigurationError(
            f"result cannot be stored: {name}.dumps returned "
            f"{type(data).__name__}, not bytes or str",
            argument="result",
        )
    return data


class AsyncClaim:
    """The outcome of one :meth:`AsyncInbox.claim` / :meth:`Inbox.claim`.

    ``state`` is :attr:`ClaimState.NEW` (the key is yours: do the work, then
    :meth:`complete` or :meth:`release`), :attr:`ClaimState.IN_PROGRESS` (``owner`` holds it
    until ``expires_at``) or :attr:`ClaimState.COMPLETED` (``result`` is the stored result).
    ``attempt`` is 1 for a key's first claim and grows by one with each takeover of an expired
    or released claim. Used as ``async with claim:`` (sync: ``with claim:``), a NEW claim is
    released if the block raises or ends without :meth:`complete`.

    A NEW claim lives ``ttl`` seconds unless it is extended: by :meth:`extend`, or, when it
    was claimed with ``renew=True``, by its inbox's renewer, which extends it every ``ttl / 3``
    like a lease until it is completed or released. If that fails (the backend says the claim
    is gone, or the ttl runs out before a renewal gets through), the claim is *lost*:
    :attr:`lost` turns true, :meth:`on_lost` callbacks run, :meth:`check` raises
    :class:`ClaimLost`, and an ``async with claim:`` body is cancelled and raises
    :class:`ClaimLost`.
    """

    def __init__(
        self,
        inbox: AsyncInbox,
        key: str,
        record: ClaimRecord,
        owner: str | None,
        *,
        ttl: float | None = None,
        started: float | None = None,
        renew: bool = False,
    ) -> None:
        self._inbox = inbox
        self.key = key
        self.state = ClaimState.NEW if record.mine else record.state
        self.attempt = record.attempt
        #: who owns the claim: this claim's owner id when NEW, the other worker's when
        #: IN_PROGRESS (``None`` for a released one), ``None`` when COMPLETED
        self.owner = record.owner if record.state is ClaimState.IN_PROGRESS else None
        #: IN_PROGRESS: the other worker's deadline; NEW: the deadline the backend gave this
        #: claim (renewals and :meth:`extend` move it on the backend); COMPLETED: when the
        #: record expires (UTC)
        self.expires_at: datetime | None = record.expires_at
        self.fingerprint = record.fingerprint
        #: True once a :meth:`AsyncInbox.claim_in` without a key, run while this claim was the
        #: current one (:func:`jobfence.current_claim`), found the key already applied: an
        #: earlier attempt's transaction committed the effect, but that attempt never completed
        #: the claim (it crashed after its commit). The work must not be done again, and its
        #: result was never stored.
        self.applied_before = False
        self._raw_result = record.result
        self._result: Any = _MISSING
        self._mine = owner if record.mine else None
        self._finished: str | None = None
        self._finishing = False  # a complete() or release() is in flight
        #: a NEW claim's local deadlines, as the renewer sees it (None: not ours)
        self._lease: RenewableHandle | None = None
        #: a NEW claim's monotonic start time (None: not ours)
        self._started: float | None = None
        if self._mine is not None:
            if started is None:
                started = get_clock().monotonic()
            self._started = started
            hold_here(self._mine, self)  # a call of this process holds the key
            state = LeaseState(inbox.ttl if ttl is None else ttl, started, renews=renew)
            self._lease = RenewableHandle(
                key,
                self._mine,
                state,
                label=f"the claim on {key!r} (attempt {self.attempt})",
                released=self._settled,
                lost=self._renewal_lost,
            )
        self._lost_reason: str | None = None
        self._callbacks: list[Callable[[AsyncClaim], Any]] = []
        self._mutex = threading.Lock()  # guards _lost_reason and _callbacks
        self._block = acompat.BlockWatch()  # async: the task running the claim's work

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.key!r} {self.state.name} attempt={self.attempt}"
            + (f" owner={self.owner!r}" if self.state is ClaimState.IN_PROGRESS else "")
            + ">"
        )

    @property
    def result(self) -> Any:
        """The stored result when ``state`` is COMPLETED (deserialised), else ``None``."""
        if self.state is not ClaimState.COMPLETED:
            return None
        if self._result is _MISSING:
            raw = self._raw_result
            self._result = None if raw is None else self._inbox.serializer.loads(raw)
        return self._result

    @property
    def owned(self) -> bool:
        """True while this claim is NEW and neither completed nor released by us."""
        return self._mine is not None and self._finished is None

    @property
    def renews(self) -> bool:
        """Whether the inbox's renewer keeps this claim alive (``claim(..., renew=True)``)."""
        return self._lease is not None and self._lease.state.renews

    @property
    def lost(self) -> bool:
        """True once this NEW claim is known lost: a renewal or :meth:`extend` found it gone
        or owned by another worker, :meth:`complete` or :meth:`release` found it no longer
        ours, or its ttl ran out (locally) before it was completed, released or extended."""
        if self._lost_reason is not None or self._finished == "lost":
            return True
        lease = self._lease
        return self._finished is None and lease is not None and lease.state.expired()

    def check(self) -> None:
        """Raise :class:`ClaimLost` if this claim was lost or released; :class:`InboxError`
        if it was never ours (IN_PROGRESS / COMPLETED when claimed)."""
        if self._mine is None:
            raise InboxError(
                f"the claim on {self.key!r} is {self.state.name}: it was never ours", key=self.key
            )
        if self._finished == "released":
            raise ClaimLost(f"the claim on {self.key!r} was released", key=self.key)
        if self.lost:
            reason = self._lost_reason or "its ttl ran out before it was renewed or extended"
            raise ClaimLost(
                f"the claim on {self.key!r} (attempt {self.attempt}) was lost: {reason}",
                key=self.key,
            )

    def on_lost(self, callback: Callable[[AsyncClaim], Any]) -> None:
        """Call ``callback(claim)`` when the claim is found lost (at once if it already was).

        Callbacks run where the loss is found: in the inbox's renewer (a thread for
        ``Inbox``, a task for ``AsyncInbox``) or in the call that found it; keep them short.
        They do not run after a normal completion or release.
        """
        with self._mutex:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def _run_callback(self, callback: Callable[[AsyncClaim], Any]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("on_lost callback for the claim on %r raised", self.key)

    @property
    def renewal(self) -> Renewable | None:
        """Internal (used by its inbox): what the inbox's renewer renews for this NEW claim
        (``None`` if it was never ours)."""
        return self._lease

    def _settled(self) -> bool:
        """Completed, released, found lost by its holder, or being completed or released right
        now: the renewer leaves it alone (a renewal that crossed the completion finds it
        completed, which is no loss)."""
        return self._finished is not None or self._finishing

    def _renewal_lost(self, reason: str) -> None:
        """The inbox's renewer found the claim lost (a claim's ``on_lost`` callbacks are short
        and run in place, in the renewer)."""
        if self._inbox.closed:
            reason = "its Inbox was closed, so the claim is no longer renewed"
        self._mark_lost(reason)

    def _stop_renewal(self) -> None:
        """No more renewals: the claim was completed, released or found lost, or is given up
        (then it expires after its ttl)."""
        if self._lease is not None:
            self._inbox.stop_renewing(self._lease)

    def _mark_lost(self, reason: str) -> None:
        """Record the loss once and tell the holder (callbacks; async: cancel the watched
        block). A claim already completed or released is left as it is."""
        with self._mutex:
            if self._lost_reason is not None or self._finishing:
                return  # lost already; or its complete() / release() will say
            if self._finished in ("completed", "released"):
                return
            self._lost_reason = reason
            callbacks, self._callbacks = self._callbacks, []
        kind = self._inbox.backend.kind
        telemetry.lost("inbox", kind)
        log.warning(
            "claim on %r (attempt %s) lost: %s",
            self.key,
            self.attempt,
            reason,
            extra={"jobfence.key": self.key, "jobfence.backend": kind},
        )
        self._block.cancel()  # async: the work's task, while it runs the work
        for callback in callbacks:
            self._run_callback(callback)

    if ASYNC:

        def _lost_while_running(self) -> ClaimLost:
            return ClaimLost(
                f"the claim on {self.key!r} (attempt {self.attempt}) was lost while its work "
                f"ran: {self._lost_reason}",
                key=self.key,
            )

    async def _run_work(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Internal (used by :func:`jobfence.guarded`): ``fn(*args, **kwargs)`` as this
        claim's work. ``AsyncClaim``: awaited, and cancelled if the claim is found lost
        meanwhile, which then raises :class:`ClaimLost`. ``Claim``: called (a thread cannot
        be interrupted: the work may look at :attr:`lost` or call :meth:`check`)."""
        if ASYNC:
            self._block.enter()
            try:
                result = await fn(*args, **kwargs)
            except asyncio.CancelledError as exc:
                if self._block.exit():
                    raise self._lost_while_running() from exc
                raise
            except BaseException:
                self._block.exit()
                raise
            self._block.exit()
            return result
        else:
            return fn(*args, **kwargs)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the claim's remaining lifetime to ``ttl`` seconds (default: the claim's ttl),
        owner-checked on the backend. A new ``ttl`` also becomes the ttl renewals carry.

        Raises :class:`ClaimLost` if the claim is no longer ours (expired, taken over,
        released or purged; it is then marked lost), :class:`InboxError` if it was never ours
        or is already completed.
        """
        new_ttl = None if ttl is None else check_ttl(ttl)
        self.check()
        lease = self._lease
        if lease is None or self._finished == "completed":
            raise InboxError(
                f"the claim on {self.key!r} is completed: there is nothing to extend",
                key=self.key,
            )
        inbox = self._inbox
        state = lease.state
        if new_ttl is None:
            new_ttl = state.ttl
        sent = state.now()
        state.extend_started()
        try:
            ok = await inbox.call_hooked(
                "inbox.extend", self.key, inbox.backend.extend, self.key, lease.owner, new_ttl
            )
        except BaseException:
            state.extend_done(None)
            raise
        if not ok:
            state.extend_done(None)
            self._stop_renewal()
            self._mark_lost("extend found the claim gone or owned by another worker")
            self.check()
        state.extend_done(sent, new_ttl)

    async def complete(self, result: Any = None) -> None:
        """Store ``result`` and mark the key completed (kept for the inbox's ``retention``).

        Owner-checked on the backend: raises :class:`ClaimLost` if the claim expired and was
        taken over, was released, or was purged; :class:`InboxError` if this claim was never
        ours (IN_PROGRESS / COMPLETED) or was already completed (a claim completes once).
        A ``result`` the inbox's serializer cannot store raises :class:`ConfigurationError`
        (``argument="result"``) before anything is sent: the claim stays owned, and
        ``complete`` may be called again with a result that can be stored.
        """
        await self._complete(result, None)

    async def _complete_if_held(
        self, result: Any, lease_key: str, lease_owner: str, *, release: Any = None
    ) -> bool:
        """Internal (used by :func:`jobfence.guarded`): :meth:`complete`, only while the
        lease at ``lease_key`` on the inbox's own Redis is ``lease_owner``'s, checked in the
        same script (``RedisInboxBackend.complete_held``). False: the lease is not held,
        nothing was stored, and the claim is still ours (renewed, to be released).

        ``release``: that lease (an ``AsyncLease`` / ``Lease``), released by the same script
        once the result is stored or the claim found not ours (through the I/O hook points
        ``inbox.complete`` then ``lock.release``); the lease is then told it was given back."""
        return await self._complete(result, (lease_key, lease_owner), release)

    async def _complete(
        self, result: Any, held: tuple[str, str] | None, release: Any = None
    ) -> bool:
        if self._mine is None:
            raise InboxError(
                f"the claim on {self.key!r} is {self.state.name}, not NEW: only the worker "
                "that claimed a key can complete it",
                key=self.key,
            )
        if self._finished == "released":
            raise ClaimLost(f"the claim on {self.key!r} was released", key=self.key)
        if self._finished == "completed":
            raise InboxError(
                f"the claim on {self.key!r} is already completed: its stored result is what "
                "duplicates replay, and it is never overwritten",
                key=self.key,
            )
        inbox = self._inbox
        data = _serialize(inbox.serializer, result)
        self._start_finishing()
        try:
            if held is None:
                ok = await inbox.complete_claim(self.key, self._mine, data)
            else:
                lease_name = None if release is None else release.name
                answer = await inbox.complete_claim_held(
                    self.key, self._mine, data, *held, release=lease_name
                )
                if answer < 0:  # the lease is gone: nothing written, the claim still ours
                    return False
                if release is not None:  # the script released the lease too
                    release._given_back()
                ok = answer > 0
            self._finished = "completed" if ok else "lost"
        finally:
            self._finishing = False
        self._stop_renewal()
        if not ok:
            raise ClaimLost(
                f"the claim on {self.key!r} (attempt {self.attempt}) is no longer ours: it "
                "expired and was taken over, or was released or purged; result not stored",
                key=self.key,
            )
        self.state = ClaimState.COMPLETED
        self._result = result
        self.owner = None
        return True

    async def release(self) -> bool:
        """Give the key back so that a redelivery can retry it (its ``attempt`` + 1).

        Returns False if the claim was not ours any more (or never was)."""
        if self._mine is None or self._finished is not None:
            return False
        inbox = self._inbox
        self._start_finishing()
        try:
            released = bool(  # a failed call leaves the claim ours: release() may be retried
                await inbox.call_hooked(
                    "inbox.release", self.key, inbox.backend.release, self.key, self._mine
                )
            )
            self._finished = "released" if released else "lost"
        except JobfenceError:
            # the give-back did not reach the backend (it is down, or timed out): remember
            # it, so that this inbox's next claim retries it -- at once for this very key
            # (and no longer renewed: given up, it must expire if the retries fail too)
            if self._lease is not None:
                inbox.orphan(self.key, self._mine, self._lease.state.ttl)
            self._stop_renewal()
            raise
        finally:
            self._finishing = False
        self._stop_renewal()
        return released

    def _start_finishing(self) -> None:
        with self._mutex:  # ordered with _mark_lost: a loss found from now on is not reported
            self._finishing = True

    async def __aenter__(self) -> AsyncClaim:
        self._block.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if ASYNC and self._block.exit() and exc_type is asyncio.CancelledError:
            assert exc is not None
            if self.owned:
                await self._release_quietly()
            raise self._lost_while_running() from exc
        if self.owned:
            try:
                await self.release()
            except JobfenceError as err:
                if exc is None:
                    raise
                log.warning("releasing the claim on %r failed (it will expire): %s", self.key, err)

    if ASYNC:

        async def _release_quietly(self) -> None:
            try:
                await self.release()
            except JobfenceError as err:
                log.warning("releasing the claim on %r failed (it will expire): %s", self.key, err)


class AsyncInbox:
    """An idempotency inbox on one backend, chosen by URL.

    ``url``: ``"postgresql://..."``, ``"mysql://..."``, ``"sqlite:///path.db"``,
    ``"redis://..."`` or ``"memory://"``; without a URL, ``$JOBFENCE_URL`` or the embedded
    SQLite file ``jobfence.db``. It may instead be a client of your own (a redis-py client,
    a ``psycopg_pool`` pool or connection factory, a SQLAlchemy engine), used as configured
    and never closed by :meth:`close`: a blocking one for ``Inbox``, an asyncio one for
    ``AsyncInbox``.

    * ``table`` -- the table (SQL) or key prefix (Redis, memory): an SQL identifier
      (``^[A-Za-z_][A-Za-z0-9_]*$``) within the backend's limit (63 characters; 64 on
      MySQL/MariaDB); default ``jobfence_inbox``. Also a URL option. The backend validates it.
    * ``ttl`` -- default lifetime of an in-progress claim (seconds, default 300). A claim made
      with ``renew=True`` is kept alive by the inbox's renewer, so its ttl can be short: it
      is how soon another worker takes over after this one died.
    * ``retention`` -- how long completed records are kept for replay (default 7 days);
      older ones are deleted by :meth:`purge` (Redis expires them natively).
    * ``serializer`` -- an object with ``dumps``/``loads`` for results (default JSON).
    * ``**options`` -- the backend's own options (also accepted as URL query options; see the
      backend options reference).
    """

    def __init__(
        self,
        url: str | AsyncInboxBackend | Client | None = None,
        *,
        table: str = DEFAULT_TABLE,
        ttl: float = DEFAULT_CLAIM_TTL,
        retention: float = DEFAULT_RETENTION,
        serializer: Serializer | None = None,
        **options: Any,
    ) -> None:
        self.ttl = check_ttl(ttl)
        self.retention = check_ttl(retention, argument="retention")
        self.serializer: Serializer = check_serializer(serializer)
        #: the URL and options of the backend, when it was opened from a URL
        self._opened_from: tuple[str, dict[str, Any]] | None = None
        if isinstance(url, AsyncInboxBackend):
            self.backend = url
            self.url = f"{url.kind}://"
        else:
            if url is None:
                url = os.environ.get("JOBFENCE_URL") or DEFAULT_URL
            self.backend = open_inbox_backend(
                url, asynchronous=True, table=table, retention=self.retention, **options
            )
            self.url = describe_target(url)
            if isinstance(url, str):
                # what opens this inbox's backend again (a jobfence Worker running a guarded
                # plain function opens the asyncio inbox of the same URL on its event loop)
                self._opened_from = (
                    url,
                    dict(
                        options,
                        table=table,
                        ttl=self.ttl,
                        retention=self.retention,
                        serializer=self.serializer,
                    ),
                )
        self.table = self.backend.table
        self._closed = False
        self._cleanups: set[Any] = set()  # clean-ups still running (async; sync ones finish)
        #: claims this inbox gave up whose release failed: key -> (owner, monotonic time after
        #: which the claim has expired by itself); retried by the next claim (``_orphans_go``)
        self._orphans: dict[str, tuple[str, float]] = {}
        self._renewer = self._new_renewer()
        self._new_batches()
        forks.register(self)  # a child process forked from here resets it: _after_fork

    def _new_renewer(self) -> AsyncRenewer:
        """The renewer of this inbox's claims (one task or thread per inbox, one batched
        backend call per tick), announcing each batch at the hook point ``inbox.renew``."""
        return AsyncRenewer(
            self.backend.renew,
            name="jobfence-inbox-renewer",
            counted=("inbox", self.backend.kind),
            announce=lambda keys: ahook("inbox.renew", keys=keys),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} table={self.table}>"

    @property
    def capabilities(self) -> Any:
        return self.backend.capabilities

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    async def call_hooked(
        self, operation: str, key: str | None, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """Internal (used by the inbox and its claims): call the I/O hook at ``operation``
        (for ``key``), then ``fn(*args)``; wrap driver errors -- and faults a hook injects,
        which stand for them -- in :class:`BackendError`."""
        try:
            if get_hook() is not None:
                await ahook(operation, key=key, backend=self.backend.kind)
            return await fn(*args)
        except (JobfenceError, NotImplementedError):  # ours, or a backend lacking a verb
            raise
        except Exception as exc:
            what = f"{operation} of {key!r}" if key is not None else operation
            raise BackendError(
                f"{self.backend.kind} inbox ({self.url}): {what} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=self.backend.kind,
                operation=operation,
            ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this Inbox is closed", argument="self")

    async def _send_claim(
        self, key: str, owner: str, fingerprint: str | None, ttl: float
    ) -> ClaimRecord:
        """The backend's claim (in the group commit, where the backend batches)."""
        if self._claims is not None:
            return await self._claims.submit((key, owner, fingerprint, ttl), key)
        return await self.backend.claim(key, owner, fingerprint, ttl)

    async def complete_claim(self, key: str, owner: str, result: bytes) -> bool:
        """Internal (used by its claims): complete the claim on ``key`` of ``owner`` with the
        serialised ``result``, through the I/O hook (``inbox.complete``)."""
        return await self.call_hooked(
            "inbox.complete", key, self._send_complete, key, owner, result
        )

    async def complete_claim_held(
        self,
        key: str,
        owner: str,
        result: bytes,
        lease_key: str,
        lease_owner: str,
        *,
        release: str | None = None,
    ) -> int:
        """Internal (used by its claims): :meth:`complete_claim` while the lease at
        ``lease_key`` is ``lease_owner``'s, one script on a Redis inbox (through the same
        I/O hook, ``inbox.complete``): 1 stored, 0 the claim is not ours, -1 the lease is
        not held. ``release``: the lease's name; the same script then releases it (unless
        -1), and the call also passes the I/O hook point ``lock.release`` for it."""
        backend: Any = self.backend  # a Redis inbox's (see RedisInboxBackend.shares_server)

        async def send() -> int:
            if release is not None and get_hook() is not None:
                await ahook("lock.release", name=release, backend=backend.kind)
            return int(
                await backend.complete_held(
                    key,
                    owner,
                    result,
                    self.retention,
                    lease_key,
                    lease_owner,
                    release=release is not None,
                )
            )

        return await self.call_hooked("inbox.complete", key, send)

    async def _send_complete(self, key: str, owner: str, result: bytes) -> bool:
        """The backend's complete, kept for the inbox's ``retention`` (in the group commit,
        where the backend batches)."""
        if self._completions is not None:
            return await self._completions.submit((key, owner, result), key)
        return await self.backend.complete(key, owner, result, self.retention)

    def _new_batches(self) -> None:
        """Group commit of claims and completions, on a backend that takes a batch in one
        round trip: the claims (completions) made while one is under way go together in the
        next; a lone one is sent at once, alone. ``AsyncInbox``: across its tasks
        (``_core/groupcommit.py``); ``Inbox``: across its threads, the first waiting thread
        sending the batch (``_core/groupcommit_thread.py``)."""
        self._claims: GroupCommit[ClaimItem, ClaimRecord] | None = None
        self._completions: GroupCommit[CompleteItem, bool] | None = None
        if self.backend.batches:
            self._claims = GroupCommit(self._flush_claims, name="jobfence-inbox-claims")
            self._completions = GroupCommit(
                self._flush_completions, name="jobfence-inbox-completions"
            )

    async def _flush_claims(self, items: list[ClaimItem]) -> list[ClaimRecord]:
        if len(items) == 1:  # the single-key statement is the cheaper one
            return [await self.backend.claim(*items[0])]
        return await self.backend.claim_many(items)

    async def _flush_completions(self, items: list[CompleteItem]) -> list[bool]:
        if len(items) == 1:
            return [await self.backend.complete(*items[0], self.retention)]
        return await self.backend.complete_many(items, self.retention)

    async def claim(
        self,
        key: str,
        *,
        fingerprint: str | None = None,
        ttl: float | None = None,
        renew: bool = False,
    ) -> AsyncClaim:
        """Claim ``key`` in ONE atomic backend operation; see :class:`AsyncClaim` / :class:`Claim`.

        ``fingerprint`` (e.g. a digest of the payload) is stored with the key; claiming a
        known key with a different one raises :class:`FingerprintMismatch` rather than
        replaying another payload's result. ``ttl`` (default: the inbox's) bounds how long the
        claim lives unless completed, released or extended; after it, another worker may take
        it over. ``renew=True``: the inbox's renewer extends a NEW claim every ``ttl / 3``
        until it is completed or released (batched: one backend call per tick for all of the
        inbox's claims), so the work may outlast ``ttl`` while a dead worker's claim is still
        taken over ``ttl`` after its last renewal.
        """
        key, fingerprint, ttl, owner = self._new_claim(key, fingerprint, ttl)
        if self._orphans:
            await self._orphans_go(key)
        started = get_clock().monotonic()
        try:
            record = await self.call_hooked(
                "inbox.claim", key, self._send_claim, key, owner, fingerprint, ttl
            )
        except BaseException:
            # cancelled, interrupted, or the reply was lost: the backend may have given us the
            # key all the same, and nobody else would release it before its ttl
            await self._abandon_quietly(key, owner)
            raise
        return await self._claimed(key, owner, fingerprint, ttl, started, renew, record)

    def _new_claim(
        self, key: str, fingerprint: str | None, ttl: float | None
    ) -> tuple[str, str | None, float, str]:
        """A claim's key, fingerprint and ttl, checked (the inbox open), and its new owner
        id. Internal (also used by :func:`jobfence.guarded`, whose claim may go with its
        lease in one backend call; it then sends the releases that failed earlier,
        :meth:`_orphans_go`, as a claim does)."""
        self._check_open()
        key = check_name(key, argument="key")
        fingerprint = check_fingerprint(fingerprint)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        return key, fingerprint, ttl, _new_owner()

    async def _claimed(
        self,
        key: str,
        owner: str,
        fingerprint: str | None,
        ttl: float,
        started: float,
        renew: bool,
        record: ClaimRecord,
    ) -> AsyncClaim:
        """The claim of ``record``, the backend's answer to a claim of ``key`` as ``owner``
        sent at ``started``: a fingerprint mismatch raised, the outcome counted, a NEW claim
        renewed (``renew``). Internal (also used by :func:`jobfence.guarded`)."""
        if (
            not record.mine
            and fingerprint is not None
            and record.fingerprint is not None
            and record.fingerprint != fingerprint
        ):
            telemetry.inbox_claim(self.backend.kind, "mismatch")
            raise FingerprintMismatch(
                f"idempotency key {key!r} was claimed with fingerprint {record.fingerprint!r}, "
                f"not {fingerprint!r}: the key was reused for another payload",
                key=key,
            )
        claim = AsyncClaim(self, key, record, owner, ttl=ttl, started=started, renew=renew)
        telemetry.inbox_claim(self.backend.kind, _CLAIM_OUTCOMES[claim.state])
        renewal = claim.renewal
        if renewal is not None and renew:
            if self._closed:  # granted as the inbox closed: nobody would renew or release it
                await self._abandon(key, owner)
                self._check_open()
            self._renewer.add(renewal)
        return claim

    def orphan(self, key: str, owner: str, ttl: float) -> None:
        """Internal (used by its claims): remember a claim on ``key`` (of ``owner``, with
        ``ttl``) whose release failed, to release it later (see :meth:`_orphans_go`)."""
        self._orphans[key] = (owner, get_clock().monotonic() + ttl)
        log.warning(
            "releasing the claim on %r failed: it is released by this inbox's next claim, "
            "or expires after its ttl",
            key,
        )

    async def _orphans_go(self, key: str) -> None:
        """Release the claims whose release failed before (owner-checked, as the failed
        release would have): the one on ``key`` first, so that a redelivery handled here
        takes the key over at once instead of waiting out the ttl. Each is the release this
        inbox already decided on, sent late: the backend drops the claim only if it is still
        that attempt's (not completed, not taken over). One that fails again stays for the
        next claim (and so do the others: the backend is still down), until its ttl has
        passed (then it expired by itself)."""
        now = get_clock().monotonic()
        keys = sorted(self._orphans, key=lambda k: k != key)
        for orphan in keys:
            entry = self._orphans.pop(orphan, None)
            if entry is None:  # another claim is releasing it
                continue
            owner, expired_at = entry
            if expired_at <= now:
                continue
            try:
                await self.call_hooked("inbox.release", orphan, self.backend.release, orphan, owner)
            except JobfenceError as err:
                self._orphans.setdefault(orphan, entry)
                log.debug("releasing the earlier claim on %r failed again: %s", orphan, err)
                return  # the backend is still down: the rest wait for the next claim
            else:
                log.info("released the earlier claim on %r, whose release had failed", orphan)

    def stop_renewing(self, renewal: Renewable) -> None:
        """Internal (used by its claims): forget the ``renewal`` of a claim that was
        completed, released or found lost, so the renewer no longer renews it and
        :meth:`close` leaves it alone."""
        self._renewer.discard(renewal)

    async def _abandon(self, key: str, owner: str) -> None:
        """A claim was interrupted: give back the key in case the backend gave it to us (the
        release is owner-checked: a no-op when it did not)."""
        try:
            await ahook("inbox.abandon", key=key, backend=self.backend.kind)
            await self.backend.release(key, owner)
        except Exception as exc:
            log.warning("could not give back the claim on %r (it expires): %r", key, exc)

    async def _abandon_quietly(self, key: str, owner: str) -> None:
        await acompat.clean_up(partial(self._abandon, key, owner), self._cleanups, CLEANUP_WAIT)

    async def claim_in(
        self, conn: Any, key: str | None = None, *, fingerprint: str | None = None
    ) -> bool:
        """Mark ``key`` applied INSIDE the caller's open transaction on ``conn``.

        Without ``key``: the key of the current claim (:func:`jobfence.current_claim`: a
        :func:`jobfence.guarded` call's, or an HTTP request's under the Idempotency-Key
        middleware), else the id of the message a :class:`~jobfence.Worker` handler processes
        here (the same on every redelivery); elsewhere ``ConfigurationError``. When it finds
        the current claim's key already applied, it sets that claim's ``applied_before``.

        Returns True iff this transaction is the first to apply ``key`` (the marker row was
        inserted, or a key held by :meth:`claim` was marked applied): do the effect in the
        same transaction, and both commit or roll back together. False: already applied, do
        nothing. A concurrent duplicate waits on the unique key, then sees False. One
        statement (MySQL: a second one only on the duplicate path). Never creates the table:
        :class:`SchemaMissing` says to run :meth:`install` first.

        ``conn``: a PostgreSQL, MySQL/MariaDB or SQLite connection (psycopg, asyncpg,
        PyMySQL, aiomysql, sqlite3, aiosqlite, SQLAlchemy Connection / Session).
        """
        self._check_open()
        claim = None
        if key is None:
            claim = current_claim_var.get()
            key = claim.key if claim is not None else default_key()
        first = await self._claim_in(conn, check_name(key, argument="key"), fingerprint)
        if not first and claim is not None and hasattr(claim, "applied_before"):
            # tell the claim's holder (e.g. the Idempotency-Key middleware) that the effect
            # was committed by an earlier attempt of the same key
            claim.applied_before = True
        return first

    async def _claim_in(self, conn: Any, key: str, fingerprint: str | None) -> bool:
        """:meth:`claim_in` of a checked ``key``."""
        fingerprint = check_fingerprint(fingerprint)
        tx = own_transaction_async(conn)
        if tx is not None:  # e.g. a jobfence.testing simulated table or transaction
            return await self._claim_in_transaction(tx, key, fingerprint)
        sc = adapt_async(conn, argument="conn", operation="inbox.claim_in")
        dialect = sql_dialect(sc.dialect)
        table = check_namespace(
            self.table, limit=dialect.table_limit, backend=sc.dialect, argument="table"
        )
        queries = dialect.inbox_queries(table)
        params = dialect.claim_in_params(key, fingerprint, self.retention)
        try:
            await ahook("inbox.claim_in", key=key, backend=sc.dialect)
            # the dialect's statements, each only while the ones before affected no row
            for step in dialect.claim_in_steps:
                if sc.kind in WARNING_KINDS and dialect.name == "mysql":
                    with warnings.catch_warnings():  # see WARNING_KINDS
                        warnings.filterwarnings("ignore", message="Duplicate entry")
                        res = await sc.execute(queries[step], params)
                else:
                    res = await sc.execute(queries[step], params)
                # From here a repeat of this unit's commit is detectable (its next claim_in
                # sees the marker), so retry_unit may re-run it after "commit outcome unknown".
                mark_protected()
                if res.rowcount == 1:
                    telemetry.inbox_claim(sc.dialect, "new")
                    return True
            if fingerprint is not None:
                res = await sc.execute(queries["fingerprint"], {"key": params["key"]})
                stored = _text(res.rows[0][0]) if res.rows else None
                if stored is not None and stored != fingerprint:
                    telemetry.inbox_claim(sc.dialect, "mismatch")
                    raise FingerprintMismatch(
                        f"idempotency key {key!r} was applied with fingerprint {stored!r}, "
                        f"not {fingerprint!r}: the key was reused for another payload",
                        key=key,
                    )
            telemetry.inbox_claim(sc.dialect, "duplicate")
            return False
        except JobfenceError:
            raise
        except Exception as exc:
            if is_undefined_table(exc):
                raise SchemaMissing(
                    f"the inbox table {self.table!r} does not exist in this {sc.dialect} "
                    f"database: run inbox.install() (or inbox.install(conn)) first; claim_in "
                    "never creates tables inside your transaction",
                    backend=sc.dialect,
                    operation="inbox.claim_in",
                ) from exc
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): inbox.claim_in of {key!r} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="inbox.claim_in",
            ) from exc

    async def _claim_in_transaction(
        self, tx: AsyncTransaction, key: str, fingerprint: str | None
    ) -> bool:
        """:meth:`claim_in` on an object that is a transaction of its own (see
        ``jobfence._core.transaction``): the same hook point, protection and outcomes."""
        try:
            await ahook("inbox.claim_in", key=key, backend=tx.dialect)
            first, stored = await tx.claim_in(self.table, key, fingerprint, self.retention)
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{tx.dialect} transaction: inbox.claim_in of {key!r} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=tx.dialect,
                operation="inbox.claim_in",
            ) from exc
        # a repeat of this unit's commit is detectable now, as after the statement
        mark_protected()
        if first:
            telemetry.inbox_claim(tx.dialect, "new")
            return True
        if fingerprint is not None and stored is not None and stored != fingerprint:
            telemetry.inbox_claim(tx.dialect, "mismatch")
            raise FingerprintMismatch(
                f"idempotency key {key!r} was applied with fingerprint {stored!r}, "
                f"not {fingerprint!r}: the key was reused for another payload",
                key=key,
            )
        telemetry.inbox_claim(tx.dialect, "duplicate")
        return False

    async def install(self, conn: Any = None) -> None:
        """Create the inbox table (idempotent, versioned).

        Without ``conn``: on the inbox's own backend (SQL backends also do this on first
        use). With ``conn``: on that caller connection (PostgreSQL, MySQL, SQLite), for use
        with :meth:`claim_in`; the caller commits. The SQL also ships in
        ``jobfence/backends/<server>/sql/inbox.sql`` for migration tools.
        """
        self._check_open()
        if conn is None:
            await self.call_hooked("inbox.install", None, self.backend.install)
            return
        sc = adapt_async(conn, argument="conn", operation="inbox.install")
        dialect = sql_dialect(sc.dialect)
        table = check_namespace(
            self.table, limit=dialect.table_limit, backend=sc.dialect, argument="table"
        )
        try:
            await ahook("inbox.install", key=None, backend=sc.dialect)
            queries = dialect.inbox_queries(table)
            for statement in queries.statements("schema"):
                await sc.execute(statement, {})
            if "upgrade_needed" in queries:  # a dialect that upgrades an older table apart
                needed = await sc.execute(queries["upgrade_needed"], {})
                if needed.rows and needed.rows[0][0]:
                    await sc.execute(queries["upgrade"], {})
        except JobfenceError:  # e.g. a closed connection, which execute() names
            raise
        except Exception as exc:
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): inbox.install failed: "
                f"{type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="inbox.install",
            ) from exc

    async def purge(self) -> int:
        """Delete completed records older than ``retention`` (and in-progress claims abandoned
        for longer than that past their deadline). Returns how many were deleted; 0 on Redis,
        where records expire by themselves (it still checks that the server answers: a
        wrong password or an unreachable server raises :class:`BackendError`)."""
        self._check_open()
        return await self.call_hooked("inbox.purge", None, self.backend.purge, self.retention)

    async def claims(
        self,
        *,
        state: ClaimState | str | None = None,
        prefix: str = "",
        limit: int = 100,
    ) -> list[ClaimInfo]:
        """The inbox's records whose keys start with ``prefix``, sorted by key (code point
        order), at most ``limit`` (1 to 100000) of them: every state, or only ``state``
        (:attr:`ClaimState.IN_PROGRESS` / :attr:`ClaimState.COMPLETED`, or ``"in_progress"``
        / ``"completed"``).

        For operators and dashboards ("which claims are in progress, since when, which are
        stuck"), not for deciding whether to run work: use :meth:`claim` for that. Records
        past their deadline or retention that nobody has claimed or purged yet are listed
        too, with a negative :attr:`ClaimInfo.expires_in`. The prefix is matched literally
        (``%``, ``_``, ``*``, ``?`` and ``[`` are plain characters). The SQL backends read
        their table in one query, by the server's clock; Redis walks the table's keys with
        ``SCAN`` (never ``KEYS``) and reads them in batches; a third-party backend without
        ``claim_infos()`` raises ``NotImplementedError``.
        """
        self._check_open()
        checked = _check_state(state)
        prefix, limit = check_listing(prefix, limit)
        return await self.call_hooked(
            "inbox.claims", prefix, self.backend.claim_infos, checked, prefix, limit
        )

    async def claim_info(self, key: str) -> ClaimInfo | None:
        """The record of ``key`` as :meth:`claims` reports it, or ``None`` when there is
        none. Read-only: unlike :meth:`claim`, it never takes the key."""
        self._check_open()
        key = check_name(key, argument="key")
        return await self.call_hooked("inbox.claim_info", key, self.backend.claim_info, key)

    async def forget(self, key: str) -> bool:
        """Delete the record of ``key`` whatever its state: an operator's action on a stuck
        or wrong record. Returns whether there was one.

        The next claim of the key is NEW (attempt 1): the work runs again, and a completed
        key's stored result is gone. A worker that still holds the forgotten claim finds it
        lost: its :meth:`Claim.complete` raises :class:`ClaimLost` (and stores nothing),
        its :meth:`Claim.extend` raises :class:`ClaimLost`, its renewer reports it lost.
        """
        self._check_open()
        key = check_name(key, argument="key")
        return bool(await self.call_hooked("inbox.forget", key, self.backend.forget, key))

    async def drop(self) -> None:
        """Delete the inbox's table / keys entirely (tests, uninstall)."""
        await self.call_hooked("inbox.drop", None, self.backend.drop)

    async def close(self) -> None:
        """Stop the renewer, give back the renewed claims still in progress (best effort:
        their holders are told they are lost, and a redelivery need not wait out their ttl),
        and close the backend's connections."""
        if self._closed:
            return
        self._closed = True
        if self._orphans:
            await self._orphans_go("")
        for key, owner in await self._renewer.close():
            try:
                await self.backend.release(key, owner)
            except Exception as exc:
                log.warning("releasing the claim on %r on close failed: %r", key, exc)
        await self.backend.close()

    def _after_fork(self) -> None:
        """In a child process right after ``fork()`` (``jobfence/_core/forks.py``): a renewer
        of its own, so that the parent's claims stay the parent's, and a backend that opens
        its own connections."""
        forks.keep(self._renewer, self._cleanups)
        self._renewer = self._new_renewer()
        self._cleanups = set()
        self._orphans = {}  # the parent's to retry
        # batches of the parent's own: a parent thread may have been sending one (its lock
        # held, the turn to send taken) at the fork, which no thread of the child would ever end
        forks.keep(self._claims, self._completions)
        self._new_batches()
        self.backend.after_fork()

    async def __aenter__(self) -> AsyncInbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
