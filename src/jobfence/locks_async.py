"""Locks (leases) with fencing tokens.

``AsyncLocks`` / ``Locks`` is a client for one backend URL; ``AsyncLease`` / ``Lease`` is one
held lease. The async classes live in ``locks_async.py``; ``locks.py``, with the sync ones, is
generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from . import telemetry
from ._core import acompat, forks
from ._core.clock import get_clock
from ._core.flavour import ASYNC
from ._core.hooks import ahook, get_hook
from ._core.lease_state import LeaseState
from ._core.renewer_async import AsyncRenewer
from ._core.validate import check_listing, check_name, check_timeout, check_ttl
from .backends import open_lock_backend
from .backends.base import AsyncLockBackend, LockCapabilities, LockHolder
from .backends.clients import Client, describe_target
from .conflicts import is_transient
from .errors import BackendError, ConfigurationError, JobfenceError, LockLost, LockTimeout

if ASYNC:
    import asyncio
    import collections.abc
    from collections.abc import Generator

__all__ = ["DEFAULT_TTL", "DEFAULT_URL", "AsyncLease", "AsyncLocks"]

log = logging.getLogger("jobfence.locks")

T = TypeVar("T")

DEFAULT_TTL = 30.0
#: the embedded default backend, used when no URL is given and JOBFENCE_URL is not set
DEFAULT_URL = "sqlite:///jobfence.db"
#: upper bound of one wait for a wake-up; a lost notification costs at most this much
DEFAULT_POLL_INTERVAL = 1.0
#: one wait in a server-side queue when the caller waits forever (then it queues again)
SERVER_WAIT = 3600.0
#: how long an interrupted acquire waits for its clean-up before leaving it to the background
CLEANUP_WAIT = 1.0
#: how long leaving a ``with`` block waits for the release of a lease that is lost (or of a
#: block that raised) before it raises: the release goes on in the background after that
EXIT_RELEASE_WAIT = 1.0
#: a grant that arrives with less than this fraction of its ttl left is given back: the reply
#: took most of the ttl, and too little is left to renew it (the wait goes on)
GRANT_MIN_LEFT = 1 / 3
#: first pause after a transient backend error while waiting; it doubles up to the next one
WAIT_RETRY_PAUSE = 0.05
WAIT_RETRY_PAUSE_MAX = 1.0
if ASYNC:
    #: coroutine ``on_lost`` callbacks still running (the event loop keeps only weak references)
    _CALLBACK_TASKS: set[asyncio.Task[Any]] = set()

_HOST = socket.gethostname()[:64]


if ASYNC:

    def _current_task() -> asyncio.Task[Any] | None:
        try:
            return asyncio.current_task()
        except RuntimeError:  # no running loop (a sync thread, e.g. a sync renewer)
            return None

    def _raise_if_cancelling() -> None:
        """Raise CancelledError if this task was asked to cancel but the request got lost on the
        way (``asyncio.wait_for`` before Python 3.12 can swallow one): a waiter must not loop on."""
        task = _current_task()
        cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
        if cancelling is not None and cancelling():
            raise asyncio.CancelledError

    def _running_loop() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None


def _new_owner() -> str:
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex}"


def _held_by(holder: LockHolder | None) -> str:
    """The end of a LockTimeout message: who holds the lease, as far as the backend tells."""
    if holder is None:
        return ""
    text = f"; held by {holder.owner or 'another session'}"
    if holder.token is not None:
        text += f" (token {holder.token})"
    if holder.expires_in is not None:
        text += f", {holder.expires_in:.1f} s left on its lease"
    return text


class AsyncLease:
    """A held lease on ``name``.

    ``token`` is the fencing token: it strictly increases per name, so a resource can refuse
    writes from an older holder (:func:`jobfence.fence`). While ``renew`` is on, the client's
    renewer keeps the lease alive; if that fails, the lease is *lost*: :attr:`lost` turns
    true, :meth:`on_lost` callbacks run and :meth:`check` raises :class:`LockLost`. In
    ``async with`` the body is cancelled and :class:`LockLost` raised; a sync ``with`` body
    cannot be cancelled, so a long one should look at :attr:`lost` or call :meth:`check`; the
    ``with`` raises :class:`LockLost` when the body ends. Leaving the block of a lost lease
    waits at most ``EXIT_RELEASE_WAIT`` seconds for its release (which goes on in the
    background after that); a release error is chained to the :class:`LockLost`.

    ``state`` (internal: a :class:`jobfence._core.lease_state.LeaseState`) holds the local
    deadlines; the lease and the client's renewer read and update it.
    """

    def __init__(
        self,
        locks: AsyncLocks,
        name: str,
        owner: str,
        token: int,
        ttl: float,
        started: float,
        renew: bool,
    ) -> None:
        self.name = name
        self.owner = owner
        self.token = token
        self.state = LeaseState(ttl, started, renews=renew)
        self._locks = locks
        self._started = started  # the grant request was sent: the hold time counts from here
        self._lost_reason: str | None = None
        self._released = False
        self._gave_back = False  # a release() freed the name on the server
        self._callbacks: list[Callable[[AsyncLease], Any]] = []
        self._mutex = threading.Lock()  # guards _lost_reason, _released and _callbacks
        if ASYNC:
            self._task: asyncio.Task[Any] | None = None
            self._cancelled_for_loss = False
            #: the release on the server in flight, or done with an answer nobody took yet
            self._releasing: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        status = "released" if self._released else ("lost" if self.lost else "held")
        return f"<{type(self).__name__} {self.name!r} token={self.token} {status}>"

    # -- state ---------------------------------------------------------------------------
    @property
    def ttl(self) -> float:
        """The ttl renewals carry: the acquire's, or that of the last successful extend."""
        return self.state.ttl

    @property
    def renews(self) -> bool:
        """Whether the client's renewer keeps this lease alive (``renew=`` of the acquire)."""
        return self.state.renews

    @property
    def lost(self) -> bool:
        """True once the lease was lost (renewal failed, expired, deleted behind our back)."""
        if self._lost_reason is not None:
            return True
        return not self._released and self.state.expired()

    @property
    def released(self) -> bool:
        return self._released

    @property
    def label(self) -> str:
        """What log lines call the lease: ``the lease on 'NAME' (token N)``."""
        return f"the lease on {self.name!r} (token {self.token})"

    @property
    def held(self) -> bool:
        """Held as far as this process knows: neither released nor lost."""
        return not self._released and not self.lost

    @property
    def expires_in(self) -> float:
        """Seconds left before the lease expires unless renewed (local, conservative)."""
        return self.state.remaining()

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is still held."""
        if self._released:
            raise LockLost(f"the lease on {self.name!r} was released", name=self.name)
        if self.lost:
            reason = self._lost_reason or self.state.expiry_reason()
            raise LockLost(
                f"the lease on {self.name!r} (token {self.token}) was lost: {reason}",
                name=self.name,
            )

    def on_lost(self, callback: Callable[[AsyncLease], Any]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is).

        A loss the renewer finds runs them in a thread of their own for ``Locks`` (a slow
        callback delays no renewal) and in the renewer's task for ``AsyncLocks`` (coroutine
        callbacks become tasks of their own); keep them short. A loss found by the holder's
        own call (``extend``, ``release``, the release at the end of a block, ``close``) runs
        them in that call. They do not run after a release that freed the name, nor after a
        release that found the lease already given back by this holder (a second
        ``release()``, or the client's ``close()``).
        """
        if self._lost_reason is None and not self._released and self.state.expired():
            # expired by the local clock, but the renewer has not marked it yet (it may be
            # late under load): the holder's call finds the loss, as ``lost`` already says
            self.mark_lost(self.state.expiry_reason())
        with self._mutex:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def _run_callback(self, callback: Callable[[AsyncLease], Any]) -> None:
        try:
            if ASYNC:
                result = callback(self)
                if asyncio.iscoroutine(result):
                    task = asyncio.get_running_loop().create_task(result)
                    _CALLBACK_TASKS.add(task)  # a strong reference until it is done
                    task.add_done_callback(self._callback_done)
            else:
                callback(self)
        except Exception:
            log.exception("on_lost callback for %r raised", self.name)

    if ASYNC:

        def _callback_done(self, task: asyncio.Task[Any]) -> None:
            _CALLBACK_TASKS.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("on_lost callback for %r raised", self.name, exc_info=task.exception())

    def mark_lost(
        self, reason: str, *, after_release: bool = False, background: bool = False
    ) -> None:
        """Internal (called by the lease, its client and the client's renewer): record the
        loss once and tell the holder (callbacks; async: cancel the block).

        A lease already lost, or released, is left as it is. ``after_release``: the loss was
        only noticed by the release at the end of the block; the holder is still told.
        ``background``: the renewer found the loss; ``Lease`` runs the callbacks in a thread
        of their own.
        """
        with self._mutex:
            if self._lost_reason is not None or (self._released and not after_release):
                return
            self._lost_reason = reason
            callbacks, self._callbacks = self._callbacks, []
        kind = self._locks.backend.kind
        telemetry.lost("lock", kind)
        log.warning(
            "lease on %r (token %s) lost: %s",
            self.name,
            self.token,
            reason,
            extra={
                "jobfence.lock.name": self.name,
                "jobfence.lock.token": self.token,
                "jobfence.backend": kind,
            },
        )
        if ASYNC:
            task = self._task
            if task is not None and not task.done() and task is not _current_task():
                # Cancel the block's task, but only while it is still inside the block: a
                # cancellation delivered after the block ended would hit unrelated code.
                self._cancelled_for_loss = True
                loop = task.get_loop()
                if _running_loop() is loop:
                    task.cancel()  # delivered when the task next resumes, inside the block
                else:
                    loop.call_soon_threadsafe(self._cancel_inside_block, task)
        if ASYNC:
            self._run_callbacks(callbacks)
        else:
            if background and callbacks:  # off the renewer's thread: it has leases to renew
                acompat.spawn(partial(self._run_callbacks, callbacks), "jobfence-on-lost")
            else:
                self._run_callbacks(callbacks)

    def _run_callbacks(self, callbacks: list[Callable[[AsyncLease], Any]]) -> None:
        for callback in callbacks:
            self._run_callback(callback)

    if ASYNC:

        def _cancel_inside_block(self, task: asyncio.Task[Any]) -> None:
            if self._task is task and not task.done():
                task.cancel()

    # -- operations ----------------------------------------------------------------------
    async def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining lifetime to ``ttl`` (default: the lease's ttl).

        Raises :class:`LockLost` if the lease is no longer held. A new ``ttl`` also becomes
        the ttl used by later renewals.
        """
        new_ttl = self.ttl if ttl is None else check_ttl(ttl)
        self.check()
        state = self.state
        sent = state.now()
        state.extend_started()
        try:
            ok = await self._locks.call_backend(
                "lock.extend",
                self.name,
                lambda: self._locks.backend.extend(self.name, self.owner, new_ttl),
            )
        except BaseException:
            state.extend_done(None, new_ttl, answered=False)  # it may still land, later
            raise
        if not ok:
            state.extend_done(None)
            self._locks.stop_renewing(self)
            self.mark_lost("extend found the lease gone or held by another owner")
            self.check()
        state.extend_done(sent, new_ttl)

    async def release(self) -> bool:
        """Give the lease back. Returns False if it was no longer held by us (also once its
        client is closed: closing gave it back).

        A release that finds on the server that the lease is no longer this holder's -- it
        expired (the holder was paused, or its renewals did not get through) and may have been
        taken by another worker, or it was broken -- marks the lease lost: the loss is logged
        and the :meth:`on_lost` callbacks run in this call (if the renewer had not found the
        loss already), because work done under the lease may have overlapped another holder's.
        A False for a lease this holder had already given back (a second ``release()``, or
        after its client's ``close()``) is not a loss.

        A release that failed (a :class:`BackendError`: the backend could not be reached) can
        be called again; the lease is no longer renewed meanwhile. An ``AsyncLease.release()``
        cancelled while its command is in flight is finished in the background, and calling
        it again returns that release's answer.
        """
        locks = self._locks
        if ASYNC and self._resume_release():
            pass  # a release whose caller was cancelled goes on: its answer is ours
        else:
            with self._mutex:
                if self._released:
                    return False
                self._released = True
            if locks.closed:
                return False  # close() gives back every lease its renewer still tracked
        try:
            answer = bool(await locks.call_backend("lock.release", self.name, self._release_call))
            telemetry.lock_hold(locks.backend.kind, self._started)
        except BaseException as exc:
            if locks.closed and isinstance(exc, JobfenceError):
                return False  # closed while we released: close() gave it back
            self._release_failed(exc)
            raise
        finally:
            locks.stop_renewing(self)  # only now: close() still sees it until here
        if answer:
            self._gave_back = True
        elif not locks.closed:  # (closed meanwhile: close() gave it back first)
            self.mark_lost(
                "the release found it not held any more: it had expired (and may have been "
                "taken by another worker) or was broken before the release reached the backend",
                after_release=True,
            )
        return answer

    def _release_failed(self, exc: BaseException) -> None:
        if ASYNC and isinstance(exc, asyncio.CancelledError) and self._releasing is not None:
            return  # the release goes on in the background; release() takes its answer
        with self._mutex:
            self._released = False  # it may be released again

    async def _release_call(self) -> bool:
        """The owner-checked release on the server. ``AsyncLease``: in a task of its own, so
        that a cancelled caller does not cut it off (it finishes in the background)."""
        backend = self._locks.backend
        if ASYNC:
            task = self._releasing
            waiting: Awaitable[bool]
            if task is None:
                # The caller waits on a future of its own that the task answers: one hop from
                # the reply to the caller (asyncio.shield would take two), and a cancelled
                # caller cancels only that future, never the release.
                reply: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                task = acompat.start(
                    partial(self._release_into, reply), self._locks._cleanups, "jobfence-release"
                )
                self._releasing = task
                waiting = reply
            else:  # an earlier caller's release still goes on: wait for its answer
                waiting = asyncio.shield(task)
            try:
                answer: bool = await waiting
            except asyncio.CancelledError:
                if task.cancelled() and self._releasing is task:
                    self._releasing = None  # the release itself was cancelled: none goes on
                raise  # else it goes on; the next release() takes its answer
            except BaseException:
                if self._releasing is task:
                    self._releasing = None
                raise
            if self._releasing is task:
                self._releasing = None
            return answer
        else:
            return await backend.release(self.name, self.owner)

    if ASYNC:

        async def _release_into(self, reply: asyncio.Future[bool]) -> bool:
            """The release task's body: the owner-checked release, its answer (or error) also
            set on ``reply`` unless its caller stopped waiting (``reply`` cancelled)."""
            try:
                answer = await self._locks.backend.release(self.name, self.owner)
            except BaseException as exc:
                if not reply.done():
                    if isinstance(exc, asyncio.CancelledError):
                        reply.cancel()
                    else:
                        reply.set_exception(exc)
                raise
            if not reply.done():
                reply.set_result(answer)
            return answer

        def _resume_release(self) -> bool:
            """Whether a release whose caller was cancelled is still to be answered (the
            next release() takes its answer); one that failed meanwhile is forgotten."""
            task = self._releasing
            if task is None:
                return False
            if task.done() and (task.cancelled() or task.exception() is not None):
                self._releasing = None
                with self._mutex:
                    self._released = False
                return False
            return True

    async def _release_on_exit(self) -> tuple[bool | None, BaseException | None]:
        """Release, waiting at most ``EXIT_RELEASE_WAIT`` s: ``(answer, None)``, ``(None,
        error)``, or ``(None, None)`` if no answer came in time (the release goes on in the
        background)."""
        handle = acompat.start(self.release, self._locks._cleanups, "jobfence-release")
        if not await acompat.wait_done(handle, EXIT_RELEASE_WAIT):
            log.warning(
                "releasing %r got no answer within %s s; it goes on in the background",
                self.name,
                EXIT_RELEASE_WAIT,
            )
            return None, None
        if handle.cancelled():
            return None, None
        error = handle.exception()
        if error is not None:
            return None, error
        return bool(handle.result()), None

    async def __aenter__(self) -> AsyncLease:
        if ASYNC:
            self._task = asyncio.current_task()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if ASYNC:
            self._task = None
            if self._cancelled_for_loss:
                self._cancelled_for_loss = False
                current = _current_task()
                cancelling = getattr(current, "cancelling", None)  # Python >= 3.11
                if cancelling is not None and cancelling():
                    current.uncancel()  # type: ignore[union-attr]  # ours, not the caller's
                if exc_type is asyncio.CancelledError:
                    _answer, error = await self._release_on_exit()
                    raise LockLost(
                        f"the lease on {self.name!r} (token {self.token}) was lost while its "
                        f"block ran: {self._lost_reason}",
                        name=self.name,
                    ) from (exc if error is None else error)
        if self._gave_back:  # the body released it itself: nothing left to give back
            return
        was_lost = self.lost
        if exc is not None:  # the body's error goes on; the release only must not hang
            answer, error = await self._release_on_exit()
            if answer is False:
                self.mark_lost(
                    "the lease was not held any more when its block ended", after_release=True
                )
            elif error is not None:
                log.warning("releasing %r failed (it will expire): %s", self.name, error)
            return
        if was_lost:
            answer, error = await self._release_on_exit()
            self.mark_lost(self.state.expiry_reason(), after_release=True)
            raise LockLost(
                f"the lease on {self.name!r} (token {self.token}) was lost before its block "
                f"ended: {self._lost_reason}",
                name=self.name,
            ) from error
        try:
            released = await self.release()
        except JobfenceError as err:
            if self.lost:  # the release took so long that the lease ran out meanwhile
                self.mark_lost(self.state.expiry_reason(), after_release=True)
                raise LockLost(
                    f"the lease on {self.name!r} (token {self.token}) was lost before its "
                    f"release at the end of its block: {self._lost_reason}",
                    name=self.name,
                ) from err
            # The block ended while the lease was held; only the early release failed. It is
            # no longer renewed and expires within its ttl (release() may be called again).
            log.warning(
                "releasing %r at the end of its block failed (it expires within %.1f s): %s",
                self.name,
                self.expires_in,
                err,
            )
            return
        if not released:
            self.mark_lost(
                "the lease was not held any more when its block ended", after_release=True
            )
            raise LockLost(
                f"the lease on {self.name!r} (token {self.token}) was lost before its block "
                f"ended: {self._lost_reason}",
                name=self.name,
            )


if ASYNC:

    class AsyncAcquireContext(collections.abc.Coroutine[Any, Any, AsyncLease]):
        """What :meth:`AsyncLocks.acquire` returns: await it, pass it to
        ``asyncio.create_task``, or use it with ``async with`` (which also releases)."""

        def __init__(self, coro: collections.abc.Coroutine[Any, Any, AsyncLease]) -> None:
            self._coro = coro
            self._lease: AsyncLease | None = None

        def __await__(self) -> Generator[Any, None, AsyncLease]:
            return self._coro.__await__()

        def send(self, value: Any) -> Any:
            return self._coro.send(value)

        def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # type: ignore[override]
            if val is None and tb is None:
                return self._coro.throw(typ)
            return self._coro.throw(typ, val, tb)

        def close(self) -> None:
            self._coro.close()

        async def __aenter__(self) -> AsyncLease:
            self._lease = await self._coro
            return await self._lease.__aenter__()

        async def __aexit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
        ) -> None:
            assert self._lease is not None
            await self._lease.__aexit__(exc_type, exc, tb)


_NEVER = float("inf")


class _WaitRetry:
    """One waiting acquire's transient errors: the last one, the pause before the next try,
    and since when a grant may have been made whose answer never reached us."""

    def __init__(self, name: str, timeout: float | None, deadline: float | None) -> None:
        self.name = name
        self.timeout = timeout
        self.deadline = deadline
        self.error: BaseException | None = None
        self.failing = False
        self.since = _NEVER
        self._pause = WAIT_RETRY_PAUSE

    def answered(self) -> None:
        self.failing = False
        self._pause = WAIT_RETRY_PAUSE

    def failed(self, error: BaseException, now: float) -> float | None:
        """Record ``error``; return the pause before the next try, ``None`` if the deadline
        passed."""
        if not self.failing:
            log.warning("waiting for %r: the backend failed, trying again: %s", self.name, error)
        self.error = error
        self.failing = True
        pause = self._pause
        self._pause = min(WAIT_RETRY_PAUSE_MAX, pause * 2)
        if self.deadline is None:
            return pause
        left = self.deadline - now
        return None if left <= 0 else min(pause, left)


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
    ``poll_interval`` bounds a single wait for a wake-up. Other keyword options
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
            if self._closed:  # the client was closed under this call (e.g. a waiting acquire)
                raise ConfigurationError("this Locks client is closed", argument="self") from exc
            raise BackendError(
                f"{self.backend.kind} backend ({self.url}): {operation} of {name!r} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=self.backend.kind,
                operation=operation,
            ) from exc

    def _lease(
        self, name: str, owner: str, token: int, ttl: float, started: float, renew: bool
    ) -> AsyncLease:
        """The lease object for a grant (a closed client first runs :meth:`_refuse_closed`)."""
        lease = AsyncLease(self, name, owner, token, ttl, started, renew)
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
        self, name: str, *, ttl: float = DEFAULT_TTL, renew: bool = True
    ) -> AsyncLease | None:
        """Take ``name`` if it is free right now; never waits. Returns the lease or ``None``."""
        self._check_open()
        return await self._try_acquire(check_name(name), _new_owner(), check_ttl(ttl), renew)

    async def _try_acquire(
        self, name: str, owner: str, ttl: float, renew: bool
    ) -> AsyncLease | None:
        """:meth:`try_acquire` as ``owner`` (an owner id unique to this attempt)."""
        await self._prepare(name, waiting=False)
        started = get_clock().monotonic()  # right before the grant request
        try:
            token = await self.call_backend(
                "lock.acquire", name, lambda: self.backend.acquire(name, owner, ttl, wait=None)
            )
        except BaseException:  # the grant may have happened with its reply lost: give it back
            await self._abandon_quietly(name, owner, queued=False)
            raise
        kind = self.backend.kind
        if token is None:
            telemetry.lock_wait(kind, started, False)
            return None
        if self._closed:  # granted as the client closed
            await self._refuse_closed(name, owner)
        if not self._usable(started, ttl):  # the reply came too late: the lease is (nearly) lost
            self._warn_late_grant(name, token, started, ttl)
            await self._abandon_quietly(name, owner, queued=False)
            telemetry.lock_wait(kind, started, False)
            return None
        telemetry.lock_wait(kind, started, True)
        return self._lease(name, owner, token, ttl, started, renew)

    async def _acquire(
        self, name: str, ttl: float, timeout: float | None, renew: bool, owner: str | None = None
    ) -> AsyncLease:
        """:meth:`acquire`, as ``owner`` if given (an owner id unique to this attempt)."""
        owner = owner or _new_owner()
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
        await self._prepare(name, waiting=True)
        retry = _WaitRetry(name, timeout, deadline)
        try:
            while True:
                if ASYNC:
                    _raise_if_cancelling()  # a library that swallowed our cancellation
                self._check_open()  # closed while we waited: stop (close left the queue)
                started = clock.monotonic()
                remaining = None if deadline is None else deadline - started
                if long_waits:  # the server queues us as long as our connection lives
                    wait = SERVER_WAIT if remaining is None else max(0.0, remaining)
                else:
                    # how long the backend keeps our place in its queue without hearing from
                    # us: we come back every poll_interval, so a dead waiter drops out soon
                    wait = self.poll_interval * 3
                    if remaining is not None:
                        wait = min(wait, max(0.0, remaining))
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
                limit = (
                    self.poll_interval if remaining is None else min(self.poll_interval, remaining)
                )
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
        raise LockTimeout(
            f"could not acquire {name!r} within {timeout} s{_held_by(holder)}",
            name=name,
            owner=None if holder is None else holder.owner,
            token=None if holder is None else holder.token,
            expires_in=None if holder is None else holder.expires_in,
        ) from retry.error

    async def _acquire_once(self, name: str, owner: str, ttl: float, wait: float) -> int | None:
        return await self.call_backend(
            "lock.acquire", name, partial(self.backend.acquire, name, owner, ttl, wait=wait)
        )

    async def _wait_once(self, name: str, owner: str, limit: float) -> int | None:
        return await self.call_backend(
            "lock.wait", name, partial(self.backend.wait, name, owner, limit)
        )

    async def _call_waiting(
        self, retry: _WaitRetry, started: float, call: Callable[[], Awaitable[T]]
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
        self, retry: _WaitRetry, owner: str, token: int, ttl: float, started: float, renew: bool
    ) -> AsyncLease | None:
        """The lease for a grant to a waiting acquire, or ``None`` if the grant came too late
        to be of use: it was given back (owner-checked) and the wait goes on."""
        name = retry.name
        started = min(started, retry.since)  # the grant may be an earlier call's
        if self._closed:  # granted as the client closed
            await self._refuse_closed(name, owner)
        if self._usable(started, ttl):
            return self._lease(name, owner, token, ttl, started, renew)
        self._warn_late_grant(name, token, started, ttl)
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

    def _usable(self, started: float, ttl: float) -> bool:
        """Whether a grant for a request sent at ``started`` is worth keeping now: enough of
        its ttl is left to use and renew it."""
        return started + ttl - get_clock().monotonic() >= ttl * GRANT_MIN_LEFT

    def _warn_late_grant(self, name: str, token: int, started: float, ttl: float) -> None:
        left = started + ttl - get_clock().monotonic()
        log.warning(
            "the lease on %r (token %s) was granted with %.2f s of its %g s ttl left (the "
            "reply took %.2f s): given back",
            name,
            token,
            max(0.0, left),
            ttl,
            ttl - left,
        )

    async def _prepare(self, name: str, *, waiting: bool) -> None:
        """Let the backend open and set up its connection (scripts, tables, a listener) before
        a lease's clock starts: connection setup on a slow link must not eat into the lease.
        Nothing was asked of the lock yet, so a failure here leaves nothing to clean up."""
        await self.call_backend(
            "lock.acquire", name, partial(self.backend.prepare, waiting=waiting), hooked=False
        )

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
        ) -> AsyncAcquireContext:
            """Wait for ``name`` (at most ``timeout`` seconds; ``None`` waits forever).

            ``await locks.acquire(...)`` returns the :class:`AsyncLease`;
            ``async with locks.acquire(...) as lease:`` also releases it on exit.
            Raises :class:`LockTimeout` when the timeout passes.
            """
            self._check_open()
            return AsyncAcquireContext(
                self._acquire(check_name(name), check_ttl(ttl), check_timeout(timeout), renew)
            )

    else:

        def acquire(
            self,
            name: str,
            *,
            ttl: float = DEFAULT_TTL,
            timeout: float | None = None,
            renew: bool = True,
        ) -> AsyncLease:
            """Wait for ``name`` (at most ``timeout`` seconds; ``None`` waits forever).

            Returns the :class:`Lease`; ``with locks.acquire(...) as lease:`` also releases it
            on exit. Raises :class:`LockTimeout` when the timeout passes.
            """
            self._check_open()
            return self._acquire(check_name(name), check_ttl(ttl), check_timeout(timeout), renew)

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
        name = check_name(name)
        return bool(
            await self.call_backend(
                "lock.force_release", name, partial(self.backend.force_release, name)
            )
        )

    async def holder(self, name: str) -> LockHolder | None:
        """Who holds ``name`` now, by the server's own record: a :class:`LockHolder`
        (``owner`` id ``host:pid:uuid``, fencing ``token``, ``expires_in`` seconds left by the
        server's clock), or ``None`` if nobody does. Read-only, one round trip; any client on
        the same backend and namespace may ask, not only the holder's. Where the server does
        not record a field it is ``None`` (PostgreSQL session mode: no owner id, no ttl)."""
        self._check_open()
        name = check_name(name)
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
        """
        self._check_open()
        prefix, limit = check_listing(prefix, limit)
        return await self.call_backend(
            "lock.holders", prefix, partial(self.backend.holders, prefix, limit)
        )

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
        self.backend.after_fork()

    async def __aenter__(self) -> AsyncLocks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
