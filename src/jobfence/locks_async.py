"""Locks (leases) with fencing tokens: the client.

``AsyncLocks`` / ``Locks`` is a client for one backend URL; ``AsyncLease`` / ``Lease`` is one
held lease. The async classes live in ``*_async.py`` modules; the sync ones are generated from
them by ``tools/async_to_sync.py``:

* ``locks_async.py`` (``locks.py``): the client -- acquire, try_acquire, the backend calls
  through the I/O hook, its renewer, close;
* ``lease_async.py`` (``lease.py``): the lease -- its deadlines, extend, release, its loss;
* ``acquire_async.py`` (``acquire.py``): ``AsyncAcquireContext`` and the bookkeeping of a
  waiting acquire (owner ids, wait lengths, late grants, pauses after transient errors).

The lease classes stay importable from here, and ``AsyncAcquireContext`` from ``locks_async``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from . import telemetry
from ._core import acompat, forks
from ._core.clock import get_clock
from ._core.flavour import ASYNC
from ._core.hooks import ahook, get_hook
from ._core.renewer_async import AsyncRenewer
from ._core.validate import check_listing, check_timeout, check_ttl
from .acquire_async import GRANT_MIN_LEFT as GRANT_MIN_LEFT
from .acquire_async import SERVER_WAIT as SERVER_WAIT
from .acquire_async import WAIT_RETRY_PAUSE as WAIT_RETRY_PAUSE
from .acquire_async import WAIT_RETRY_PAUSE_MAX as WAIT_RETRY_PAUSE_MAX
from .acquire_async import (
    WaitRetry,
    new_owner,
    timed_out,
    usable,
    wait_length,
    warn_late_grant,
)
from .backends import open_lock_backend
from .backends.base import AsyncLockBackend, LockCapabilities, LockHolder
from .backends.clients import Client, describe_target
from .conflicts import is_transient
from .errors import BackendError, ConfigurationError, JobfenceError, LockTimeout
from .lease_async import EXIT_RELEASE_WAIT as EXIT_RELEASE_WAIT
from .lease_async import AsyncLease
from .limited_async import acquire_limited, holder_limited, try_acquire_limited
from .limits import check_limit, check_lock_name, split_listing

if ASYNC:
    from .acquire_async import AsyncAcquireContext as AsyncAcquireContext

__all__ = ["DEFAULT_TTL", "DEFAULT_URL", "AsyncLease", "AsyncLocks"]

log = logging.getLogger("jobfence.locks")

T = TypeVar("T")

DEFAULT_TTL = 30.0
#: the embedded default backend, used when no URL is given and JOBFENCE_URL is not set
DEFAULT_URL = "sqlite:///jobfence.db"
#: upper bound of one wait for a wake-up; a lost notification costs at most this much
DEFAULT_POLL_INTERVAL = 1.0
#: how long an interrupted acquire waits for its clean-up before leaving it to the background
CLEANUP_WAIT = 1.0
#: how many names a client remembers the concurrency limit of (to refuse a second limit)
_LIMITS_KEPT = 10_000
#: how many checked lock names a client remembers (not checked again on their next use)
_NAMES_KEPT = 10_000
_NEVER = float("inf")


def _mapped(exc: BaseException, wrap: Callable[[Exception], BaseException]) -> BaseException:
    """What a backend call that raised ``exc`` raises, as :meth:`AsyncLocks.call_backend`
    maps it: a driver error ``wrap(exc)``, anything else (ours, ``NotImplementedError``, a
    cancellation) itself."""
    if isinstance(exc, Exception) and not isinstance(exc, (JobfenceError, NotImplementedError)):
        return wrap(exc)
    return exc


class AsyncLocks:
    """A lock client for one backend, chosen by URL.

    The URL: ``"redis://localhost:6379/0"``, ``"postgresql://..."``, ``"mysql://..."``,
    ``"sqlite:///path/file.db"`` or ``"memory://"``. Without a URL, ``$JOBFENCE_URL`` or the
    embedded SQLite file ``jobfence.db`` in the working directory is used.

    ``url`` may instead be a client of your own, used as you configured it (pool, TLS,
    credentials, Sentinel, Cluster) and never closed by :meth:`close`: a ``redis.Redis`` /
    ``redis.asyncio.Redis`` (or ``RedisCluster``), a ``psycopg_pool`` pool or a callable
    returning a psycopg connection, or a SQLAlchemy ``Engine`` / ``AsyncEngine`` on
    PostgreSQL, MySQL or SQLite -- a blocking one for ``Locks``, an asyncio one for
    ``AsyncLocks``.

    ``namespace`` prefixes every key or row this client creates (default ``"jobfence"``);
    ``poll_interval`` bounds a single wait for a wake-up (``memory://``, whose waits end
    by themselves whenever anything can change, waits in one go). Other keyword options
    (``**options``) go to the backend (see its documentation).
    """

    def __init__(
        self,
        url: str | AsyncLockBackend | Client | None = None,
        *,
        namespace: str = "jobfence",
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        **options: Any,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or len(namespace) > 64:
            raise ConfigurationError(
                f"namespace must be a non-empty str of at most 64 characters, got {namespace!r}",
                argument="namespace",
            )
        self.poll_interval = check_ttl(poll_interval, argument="poll_interval")
        if isinstance(url, AsyncLockBackend):
            self.backend = url
            self.url = f"{url.kind}://"
        else:
            if url is None:
                url = os.environ.get("JOBFENCE_URL") or DEFAULT_URL
            self.backend = open_lock_backend(url, asynchronous=True, namespace=namespace, **options)
            self.url = describe_target(url)
        self.namespace = namespace
        self._renewer = self._new_renewer(give_back=self._give_back_later)
        #: background work still running: clean-ups of interrupted acquires (async), releases
        self._cleanups: set[Any] = set()
        self._closed = False
        #: (name, owner) of every acquire waiting right now
        self._waiting: dict[tuple[str, str], None] = {}
        #: the concurrency limit each name was used with by this client (limit > 1 only)
        self._limits: dict[str, int] = {}
        #: the names this client checked (with limit 1) lately: not checked again
        self._names: dict[str, None] = {}
        forks.register(self)  # a child process forked from here resets it: _after_fork

    def _new_renewer(self, give_back: Callable[[str, str], None] | None) -> AsyncRenewer:
        """The renewer of this client's leases (one task or thread per client, one batched
        backend call per tick), announcing each batch at ``lock.renew``."""
        return AsyncRenewer(
            self.backend.renew,
            give_back=give_back,
            counted=("lock", self.backend.kind),
            announce=lambda names: ahook("lock.renew", names=names),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def capabilities(self) -> LockCapabilities:
        return self.backend.capabilities

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: no more acquires, no more renewals."""
        return self._closed

    async def call_backend(
        self, operation: str, name: str, call: Callable[[], Awaitable[T]], *, hooked: bool = True
    ) -> T:
        """Internal (used by the client and its leases): run one backend operation through
        the I/O hook (unless not ``hooked``); wrap driver errors in :class:`BackendError`."""
        try:
            if hooked and get_hook() is not None:
                await ahook(operation, name=name, backend=self.backend.kind)
            return await call()
        except (JobfenceError, NotImplementedError):  # ours, or a backend lacking a verb
            raise
        except Exception as exc:
            raise self.backend_error(operation, name, exc) from exc

    def backend_error(self, operation: str, name: str, exc: Exception) -> JobfenceError:
        """Internal (used by the client and its leases): what a driver error ``exc`` of a
        backend call raises (chained to it): :class:`BackendError`, or
        :class:`ConfigurationError` if the client was closed under the call (e.g. a waiting
        acquire). The hot paths call the backend without :meth:`call_backend`'s extra layer
        of calls and map its errors with this."""
        if self._closed:
            return ConfigurationError("this Locks client is closed", argument="self")
        return BackendError(
            f"{self.backend.kind} backend ({self.url}): {operation} of {name!r} failed: "
            f"{type(exc).__name__}: {exc}",
            backend=self.backend.kind,
            operation=operation,
        )

    def _lease(
        self,
        name: str,
        owner: str,
        token: int,
        ttl: float,
        started: float,
        renew: bool,
        *,
        backend_name: str | None = None,
        slot: int | None = None,
    ) -> AsyncLease:
        """The lease object for a grant (a closed client first runs :meth:`_refuse_closed`);
        ``backend_name`` and ``slot`` for a slot of a concurrency limit."""
        lease = AsyncLease(
            self, name, owner, token, ttl, started, renew, backend_name=backend_name, slot=slot
        )
        self._renewer.add(lease)
        return lease

    def _give_back_later(self, name: str, owner: str) -> None:
        """Give a lease back in the background (owner-checked): one the renewer gave up on,
        or one garbage-collected without a release."""
        acompat.start(
            partial(self._give_back_quietly, name, owner), self._cleanups, "jobfence-release"
        )

    async def _give_back_quietly(self, name: str, owner: str) -> None:
        try:
            await self.call_backend(
                "lock.release", name, partial(self.backend.release, name, owner)
            )
        except Exception as exc:
            log.warning("giving back the lease on %r failed (it will expire): %r", name, exc)

    def in_background(self, fn: Callable[[], Awaitable[Any]], name: str) -> Any:
        """Internal (used by the client's leases): run ``fn()`` in the background (a task; a
        thread for ``Locks``) that :meth:`close` waits for; returns its task (future)."""
        return acompat.start(fn, self._cleanups, name)

    def stop_renewing(self, lease: AsyncLease) -> None:
        """Internal (used by the client's leases): forget a lease that was released or found
        lost, so the renewer no longer renews it and :meth:`close` no longer gives it back."""
        self._renewer.discard(lease)

    async def _refuse_closed(self, name: str, owner: str) -> None:
        """A grant that arrived as the client closed: nobody would renew or release it, so
        give it back and raise."""
        await self._abandon(name, owner)
        self._check_open()

    async def try_acquire(
        self, name: str, *, ttl: float = DEFAULT_TTL, renew: bool = True, limit: int = 1
    ) -> AsyncLease | None:
        """Take ``name`` if it is free right now; never waits. Returns the lease or ``None``.

        ``limit`` = N > 1: take one of the N leases the name allows at once (a concurrency
        limit, see :mod:`jobfence.limits`), ``None`` if all N are held."""
        self._check_open()
        name, limit = self._checked(name, limit)
        ttl = check_ttl(ttl)
        if limit > 1:
            return await try_acquire_limited(self, name, limit, ttl, renew)
        return await self._try_acquire(name, new_owner(), ttl, renew)

    def _checked(self, name: object, limit: object) -> tuple[str, int]:
        """A name and its concurrency limit, validated; a name this client used with another
        limit is refused (every process must use one limit per name)."""
        limits = self._limits
        if limit == 1 and type(limit) is int and type(name) is str and name in self._names:
            # a name this client checked before: only its limit is looked at again
            if limits and limits.get(name, 1) != 1:
                raise ConfigurationError(
                    f"limit: {name!r} was acquired with limit={limits[name]} by this client, "
                    "now with limit=1; use one limit per name everywhere",
                    argument="limit",
                )
            return name, 1
        limit = check_limit(limit)
        name = check_lock_name(name, limit=limit)
        known = limits.get(name) if limits else None
        if known is not None and known != limit:
            raise ConfigurationError(
                f"limit: {name!r} was acquired with limit={known} by this client, now with "
                f"limit={limit}; use one limit per name everywhere",
                argument="limit",
            )
        if known is None and limit > 1:
            if len(limits) >= _LIMITS_KEPT:
                limits.clear()
            limits[name] = limit
        if limit == 1:
            if len(self._names) >= _NAMES_KEPT:
                self._names.clear()
            self._names[name] = None
        return name, limit

    async def _try_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        renew: bool,
        grant: Callable[[], Awaitable[int | None]] | None = None,
    ) -> AsyncLease | None:
        """:meth:`try_acquire` as ``owner`` (an owner id unique to this attempt). ``grant``:
        the backend call that asks for the lease (default: the backend's plain try), such as
        :func:`jobfence.guarded`'s script that also claims its key on the same server."""
        backend = self.backend
        # a grant sent on another client (jobfence.guarded's one script on the inbox's Redis)
        # does not use this client's own connection: only what its renewals need is set up
        await self._prepare(name, waiting=False, renewals_only=grant is not None)
        started = get_clock().monotonic()  # right before the grant request
        try:
            if grant is not None:
                token = await self.call_backend("lock.acquire", name, grant)
            else:  # the plain try: call_backend's work, without its layer of calls
                if get_hook() is not None:
                    await ahook("lock.acquire", name=name, backend=backend.kind)
                token = await backend.acquire(name, owner, ttl, wait=None)
        except BaseException as exc:  # the grant may have happened with its reply lost:
            error = _mapped(exc, partial(self.backend_error, "lock.acquire", name))
            await self._abandon_quietly(name, owner, queued=False)  # give it back
            if error is exc:
                raise
            raise error from exc
        kind = backend.kind
        if token is None:
            telemetry.lock_wait(kind, started, False)
            return None
        if self._closed:  # granted as the client closed
            await self._refuse_closed(name, owner)
        if not usable(started, ttl):  # the reply came too late: the lease is (nearly) lost
            warn_late_grant(name, token, started, ttl)
            await self._abandon_quietly(name, owner, queued=False)
            telemetry.lock_wait(kind, started, False)
            return None
        telemetry.lock_wait(kind, started, True)
        return self._lease(name, owner, token, ttl, started, renew)

    async def _acquire(
        self, name: str, ttl: float, timeout: float | None, renew: bool, owner: str | None = None
    ) -> AsyncLease:
        """:meth:`acquire`, as ``owner`` if given (an owner id unique to this attempt)."""
        owner = owner or new_owner()
        began = get_clock().monotonic()
        self._waiting[(name, owner)] = None  # close() takes it out of the wait queue
        try:
            lease = await self._acquire_as(name, owner, ttl, timeout, renew, began)
        except LockTimeout:
            telemetry.lock_wait(self.backend.kind, began, False)
            raise
        finally:
            self._waiting.pop((name, owner), None)
        telemetry.lock_wait(self.backend.kind, began, True)
        return lease

    async def _acquire_as(
        self, name: str, owner: str, ttl: float, timeout: float | None, renew: bool, began: float
    ) -> AsyncLease:
        """The waiting acquire of :meth:`_acquire`, called at ``began`` (the clock's time)."""
        clock = get_clock()
        deadline = None if timeout is None else began + timeout
        backend = self.backend
        long_waits = backend.capabilities.queue_follows_connection
        # a backend whose wait ends by itself whenever anything can change for us may wait up
        # to the timeout in one go -- unless the clock moves its time by a wait's whole length
        # (an auto-advancing ManualClock), which would run past the holder's renewals
        ends_on_change = backend.capabilities.wait_ends_on_change and not getattr(
            clock, "auto_advance", False
        )
        await self._prepare(name, waiting=True)
        retry = WaitRetry(name, timeout, deadline)
        try:
            while True:
                acompat.raise_if_cancelling()  # a library that swallowed our cancellation
                self._check_open()  # closed while we waited: stop (close left the queue)
                started = clock.monotonic()
                remaining = None if deadline is None else deadline - started
                wait = wait_length(long_waits, self.poll_interval, remaining)
                token = await self._call_waiting(
                    retry, started, partial(self._acquire_once, name, owner, ttl, wait)
                )
                if token is not None:
                    lease = await self._granted(retry, owner, token, ttl, started, renew)
                    if lease is not None:
                        return lease
                    if deadline is not None and clock.monotonic() >= deadline:
                        break  # given back, and no time left to wait
                    continue  # given back: try again
                if not retry.failing:
                    retry.since = _NEVER  # answered: no grant of ours is pending
                if remaining is not None and remaining <= 0:
                    break
                log.debug(
                    "waiting for %r: %.1f s so far (timeout %s)",
                    name,
                    clock.monotonic() - began,
                    timeout,
                )
                longest = SERVER_WAIT if ends_on_change else self.poll_interval
                limit = longest if remaining is None else min(longest, remaining)
                token = await self._call_waiting(
                    retry, started, partial(self._wait_once, name, owner, limit)
                )
                if token is not None:
                    lease = await self._granted(retry, owner, token, ttl, started, renew)
                    if lease is not None:
                        return lease
                    if deadline is not None and clock.monotonic() >= deadline:
                        break  # given back, and no time left to wait
        except BaseException:
            # interrupted (cancelled, Ctrl-C, a failing backend call): leave the wait queue and
            # give back a lease that may have been handed to us meanwhile
            await self._abandon_quietly(name, owner)
            raise
        try:
            token = await self.call_backend(
                "lock.cancel_wait", name, lambda: backend.cancel_wait(name, owner)
            )
        except BackendError as err:
            await self._abandon_quietly(name, owner)
            if not is_transient(err):
                raise
            retry.error = err
            token = None
        if token is not None:  # handed to us just as we gave up: keep it (counted from before)
            lease = await self._granted(retry, owner, token, ttl, started, renew)
            if lease is not None:
                return lease
        holder = await self._holder(name)
        raise timed_out(name, timeout, holder) from retry.error

    async def _acquire_once(self, name: str, owner: str, ttl: float, wait: float) -> int | None:
        return await self.call_backend(
            "lock.acquire", name, partial(self.backend.acquire, name, owner, ttl, wait=wait)
        )

    async def _wait_once(self, name: str, owner: str, limit: float) -> int | None:
        return await self.call_backend(
            "lock.wait", name, partial(self.backend.wait, name, owner, limit)
        )

    async def _call_waiting(
        self, retry: WaitRetry, started: float, call: Callable[[], Awaitable[T]]
    ) -> T | None:
        """One backend call of a waiting acquire (begun at ``started``). A transient error
        (a restarting server, a dropped connection) counts as "nothing yet": the wait goes on
        after a short pause, within the timeout; past it, :class:`LockTimeout` is raised from
        the error."""
        name = retry.name
        try:
            answer = await call()
        except BackendError as err:
            if not is_transient(err):
                raise
            # the call may have made a grant whose answer never came: a grant we see later
            # may be that one, counted from this call on
            retry.since = min(retry.since, started)
            pause = retry.failed(err, get_clock().monotonic())
            if pause is None:
                raise LockTimeout(
                    f"could not acquire {name!r} within {retry.timeout} s: the backend kept "
                    f"failing ({err})",
                    name=name,
                ) from err
            await get_clock().asleep(pause)
            return None
        retry.answered()
        return answer

    async def _granted(
        self, retry: WaitRetry, owner: str, token: int, ttl: float, started: float, renew: bool
    ) -> AsyncLease | None:
        """The lease for a grant to a waiting acquire, or ``None`` if the grant came too late
        to be of use: it was given back (owner-checked) and the wait goes on."""
        name = retry.name
        started = min(started, retry.since)  # the grant may be an earlier call's
        if self._closed:  # granted as the client closed
            await self._refuse_closed(name, owner)
        if usable(started, ttl):
            return self._lease(name, owner, token, ttl, started, renew)
        warn_late_grant(name, token, started, ttl)
        try:
            await self.call_backend(
                "lock.release", name, partial(self.backend.release, name, owner)
            )
        except BackendError as err:
            if not is_transient(err):
                raise
            retry.error = err  # still ours, maybe: a later grant counts from before
            retry.since = min(retry.since, started)
        else:
            retry.since = _NEVER  # given back: nothing of ours is pending
        return None

    async def _prepare(self, name: str, *, waiting: bool, renewals_only: bool = False) -> None:
        """Let the backend open and set up its connection (scripts, tables, a listener) before
        a lease's clock starts: connection setup on a slow link must not eat into the lease.
        Nothing was asked of the lock yet, so a failure here leaves nothing to clean up.
        ``renewals_only``: the grant is sent on another client, so only what the renewals
        need is set up, where the backend tells them apart (``prepare_renewals``)."""
        try:  # call_backend(hooked=False), without its layer of calls
            renewals = getattr(self.backend, "prepare_renewals", None) if renewals_only else None
            if renewals is not None:
                await renewals()
            else:
                await self.backend.prepare(waiting=waiting)
        except (JobfenceError, NotImplementedError):
            raise
        except Exception as exc:
            raise self.backend_error("lock.acquire", name, exc) from exc

    async def _holder(self, name: str) -> LockHolder | None:
        """Who holds ``name`` now, for a :class:`LockTimeout` (``None`` if the backend cannot
        tell, or the question fails: the timeout is what the caller must hear about)."""
        try:
            return await self.backend.holder(name)
        except Exception as exc:
            log.debug("could not ask who holds %r: %r", name, exc)
            return None

    async def _abandon(self, name: str, owner: str, *, queued: bool = True) -> None:
        """An acquire was interrupted: leave the wait queue (``queued``: a waiting acquire
        may have joined one) and give back a lease that may have been granted to us
        meanwhile (even if the reply never reached us)."""
        kind = self.backend.kind
        try:
            if queued:
                await ahook("lock.abandon_wait", name=name, backend=kind)
                await self.backend.cancel_wait(name, owner)
            await ahook("lock.abandon_release", name=name, backend=kind)
            await self.backend.release(name, owner)  # owner-checked: a no-op if not ours
        except Exception as exc:
            if queued:
                log.warning("could not leave the wait queue of %r (it will expire): %r", name, exc)
            else:
                log.warning(
                    "could not give back %r in case it was granted (it will expire): %r",
                    name,
                    exc,
                )

    async def _abandon_quietly(self, name: str, owner: str, *, queued: bool = True) -> None:
        # Wait for the clean-up a little (a release right after an interrupted waiter must
        # not hand it the lease), but not long: an interrupted acquire must end promptly.
        await acompat.clean_up(
            partial(self._abandon, name, owner, queued=queued), self._cleanups, CLEANUP_WAIT
        )

    if ASYNC:

        def acquire(
            self,
            name: str,
            *,
            ttl: float = DEFAULT_TTL,
            timeout: float | None = None,
            renew: bool = True,
            limit: int = 1,
        ) -> AsyncAcquireContext:
            """Wait for ``name`` (at most ``timeout`` seconds; ``None`` waits forever).

            ``await locks.acquire(...)`` returns the :class:`AsyncLease`;
            ``async with locks.acquire(...) as lease:`` also releases it on exit.
            Raises :class:`LockTimeout` when the timeout passes. ``limit`` = N > 1: wait for
            one of the N leases the name allows at once (a concurrency limit, see
            :mod:`jobfence.limits`); waiters are served in turn.
            """
            self._check_open()
            name, limit = self._checked(name, limit)
            return AsyncAcquireContext(
                self._acquire_any(name, check_ttl(ttl), check_timeout(timeout), renew, limit)
            )

    else:

        def acquire(
            self,
            name: str,
            *,
            ttl: float = DEFAULT_TTL,
            timeout: float | None = None,
            renew: bool = True,
            limit: int = 1,
        ) -> AsyncLease:
            """Wait for ``name`` (at most ``timeout`` seconds; ``None`` waits forever).

            Returns the :class:`Lease`; ``with locks.acquire(...) as lease:`` also releases it
            on exit. Raises :class:`LockTimeout` when the timeout passes. ``limit`` = N > 1:
            wait for one of the N leases the name allows at once (a concurrency limit, see
            :mod:`jobfence.limits`); waiters are served in turn.
            """
            self._check_open()
            name, limit = self._checked(name, limit)
            return self._acquire_any(name, check_ttl(ttl), check_timeout(timeout), renew, limit)

    async def _acquire_any(
        self, name: str, ttl: float, timeout: float | None, renew: bool, limit: int
    ) -> AsyncLease:
        """:meth:`acquire` with its arguments checked: a plain lease, or one of a limit."""
        if limit > 1:
            return await acquire_limited(self, name, limit, ttl, timeout, renew)
        return await self._acquire(name, ttl, timeout, renew)

    async def install(self) -> None:
        """Create the backend's tables now (idempotent; SQL backends also do it on first use).

        Run it from a deploy step when the application's database user may not create tables.
        The SQL ships in ``jobfence/backends/<server>/sql/locks.sql`` for migration tools.
        """
        self._check_open()
        await self.call_backend("lock.install", "*", self.backend.install)

    async def force_release(self, name: str) -> bool:
        """Administrative: drop the lease on ``name`` whoever holds it. Its holder finds the
        lease lost at its next renewal. Returns whether a lease was dropped."""
        self._check_open()
        name = check_lock_name(name)
        return bool(
            await self.call_backend(
                "lock.force_release", name, partial(self.backend.force_release, name)
            )
        )

    async def holder(self, name: str, *, limit: int = 1) -> LockHolder | None:
        """Who holds ``name`` now, by the server's own record: a :class:`LockHolder`
        (``owner`` id ``host:pid:uuid``, fencing ``token``, ``expires_in`` seconds left by the
        server's clock), or ``None`` if nobody does. Read-only, one round trip; any client on
        the same backend and namespace may ask, not only the holder's. Where the server does
        not record a field it is ``None`` (PostgreSQL session mode: no owner id, no ttl).

        ``limit`` = N > 1: the holder of the concurrency limit's lease that ends first (with
        its token), ``None`` if none of the N is held; :meth:`holders` lists them all."""
        self._check_open()
        limit = check_limit(limit)
        name = check_lock_name(name, limit=limit)
        if limit > 1:
            return await holder_limited(self, name, limit)
        return await self.call_backend("lock.holder", name, partial(self.backend.holder, name))

    async def holders(self, prefix: str = "", limit: int = 1000) -> list[tuple[str, LockHolder]]:
        """Every live lease of this client's namespace whose name starts with ``prefix``, as
        ``(name, holder)`` pairs ordered by name, at most ``limit`` (1 to 100000) of them.

        For operators and dashboards ("what is held right now, by whom, until when"), not
        for coordination: a lease may end or start just after the server answered. Each
        :class:`LockHolder` is what :meth:`holder` reports for that name. The SQL backends
        read their lease table in one query; Redis walks the namespace with ``SCAN`` (never
        ``KEYS``) and reads each lease; PostgreSQL session mode cannot list (its advisory
        locks are keyed by a hash of the name) and raises ``ConfigurationError``. A
        third-party backend without ``holders()`` raises ``NotImplementedError``.

        The leases of a concurrency limit (``acquire(name, limit=N)``) are listed under
        ``name``, one pair per held slot, with their tokens; its waiters' gate is left out.
        """
        self._check_open()
        prefix, limit = check_listing(prefix, limit)
        rows = await self.call_backend(
            "lock.holders", prefix, partial(self.backend.holders, prefix, limit)
        )
        shown = [row for row in (split_listing(n, h) for n, h in rows) if row is not None]
        shown.sort(key=lambda row: row[0])  # a slot's name sorts after its base name's
        return shown

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this Locks client is closed", argument="self")

    async def close(self) -> None:
        """Stop the renewer, give back the leases still held (best effort: their holders are
        told they are lost, and other workers need not wait out their ttl), and close the
        backend's connections."""
        if self._closed:
            return
        self._closed = True
        # interrupted acquires still leaving their queues, releases in the background
        await acompat.wait_all(self._cleanups, 5)
        for name, owner in list(self._waiting):  # acquires still waiting: a release must not
            await self._abandon(name, owner)  # hand a lease to an owner nobody will use
        # Every lease the renewer still tracks, released or not: a release in flight may lose
        # its race with close (an owner-checked release is harmless twice).
        for name, owner in await self._renewer.close():
            try:
                await ahook("lock.close_release", name=name, backend=self.backend.kind)
                await self.backend.release(name, owner)
            except Exception as exc:
                log.warning("releasing %r on close failed (it will expire): %r", name, exc)
        await acompat.wait_all(self._cleanups, 5)  # what the renewer gave back as it stopped
        await self.backend.close()

    def _after_fork(self) -> None:
        """In a child process right after ``fork()`` (``jobfence/_core/forks.py``): a renewer
        of its own, so that the parent's leases stay the parent's -- the child neither renews,
        nor releases on close, nor reports them lost -- and a backend that opens its own
        connections."""
        forks.keep(self._renewer, self._cleanups)
        self._renewer = self._new_renewer(give_back=None)
        self._cleanups = set()
        self._waiting = {}
        self._limits = {}
        self.backend.after_fork()

    async def __aenter__(self) -> AsyncLocks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
