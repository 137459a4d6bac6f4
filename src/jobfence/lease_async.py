"""One held lease: ``AsyncLease`` (``lease_async.py``) and ``Lease`` (``lease.py``, generated
from it by ``tools/async_to_sync.py``); both are importable from ``jobfence.locks_async`` /
``jobfence.locks`` and from ``jobfence``.

A lease is what a lock client's acquire hands out: its local deadlines
(:class:`~jobfence._core.lease_state.LeaseState`), ``extend`` and ``release``, and its loss
(``on_lost`` callbacks; ``async with``: the block cancelled). It is
:class:`~jobfence._core.renewable.Renewable`, so its client's renewer keeps it alive. It
reaches the backend only through its client (:class:`AsyncLeaseClient`), which runs each call
through the I/O hook, forgets the leases it no longer renews and runs releases in the
background.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar

from . import telemetry
from ._core import acompat
from ._core.flavour import ASYNC
from ._core.hooks import ahook, get_hook
from ._core.lease_state import LeaseState
from ._core.validate import check_ttl
from .backends.base import AsyncLockBackend
from .errors import JobfenceError, LockLost

if ASYNC:
    import asyncio

__all__ = ["EXIT_RELEASE_WAIT", "AsyncLease", "AsyncLeaseClient"]

log = logging.getLogger("jobfence.locks")

T = TypeVar("T")

#: how long leaving a ``with`` block waits for the release of a lease that is lost (or of a
#: block that raised) before it raises: the release goes on in the background after that
EXIT_RELEASE_WAIT = 1.0


class AsyncLeaseClient(Protocol):
    """What a lease needs of the client that acquired it (``AsyncLocks`` / ``Locks``)."""

    @property
    def backend(self) -> AsyncLockBackend:
        """The client's lock backend."""

    @property
    def closed(self) -> bool:
        """Whether the client was closed (its ``close()`` gives back every lease)."""

    async def call_backend(
        self, operation: str, name: str, call: Callable[[], Awaitable[T]], *, hooked: bool = True
    ) -> T:
        """Run one backend call through the I/O hook at ``operation``."""

    def backend_error(self, operation: str, name: str, exc: Exception) -> JobfenceError:
        """What a driver error ``exc`` of a backend call at ``operation`` raises."""

    def stop_renewing(self, lease: AsyncLease) -> None:
        """Forget ``lease``: no more renewals, and ``close()`` leaves it alone."""

    def in_background(self, fn: Callable[[], Awaitable[Any]], name: str) -> Any:
        """Run ``fn()`` in the background (a task, or a thread for ``Locks``) that the
        client's ``close()`` waits for; returns its task or future."""


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
        locks: AsyncLeaseClient,
        name: str,
        owner: str,
        token: int,
        ttl: float,
        started: float,
        renew: bool,
        *,
        backend_name: str | None = None,
        slot: int | None = None,
    ) -> None:
        self.name = name
        self.owner = owner
        self.token = token
        #: the name the backend knows the lease by: ``name``, or for a slot of a concurrency
        #: limit (``acquire(name, limit=N)``) the slot's own name
        self.backend_name = name if backend_name is None else backend_name
        #: the slot (0 to N - 1) of a concurrency limit's lease, ``None`` for a plain lease
        self.slot = slot
        self.state = LeaseState(ttl, started, renews=renew)
        self._locks = locks
        self._started = started  # the grant request was sent: the hold time counts from here
        self._lost_reason: str | None = None
        self._released = False
        self._gave_back = False  # a release() freed the name on the server
        self._callbacks: list[Callable[[AsyncLease], Any]] = []
        self._mutex = threading.Lock()  # guards _lost_reason, _released and _callbacks
        self._block = acompat.BlockWatch()  # async: the task of the ``async with`` block
        if ASYNC:
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
        self._run_callbacks([callback])

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
        self._block.cancel()  # async: the block's task, while it is inside the block
        self._run_callbacks(callbacks, background=background)

    def _run_callbacks(
        self, callbacks: list[Callable[[AsyncLease], Any]], *, background: bool = False
    ) -> None:
        """Run ``on_lost`` callbacks; coroutine ones (async) become tasks of their own.
        ``background``: the renewer found the loss; ``Lease`` runs them in a thread of their
        own, off the renewer's thread (it has leases to renew)."""
        acompat.run_callbacks(
            callbacks,
            self,
            log,
            "on_lost callback for %r raised",
            self.name,
            background=background,
        )

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
                lambda: self._locks.backend.extend(self.backend_name, self.owner, new_ttl),
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
        try:  # locks.call_backend's work, without its layer of calls
            if get_hook() is not None:
                await ahook("lock.release", name=self.name, backend=locks.backend.kind)
            answer = bool(await self._release_call())
            telemetry.lock_hold(locks.backend.kind, self._started)
        except BaseException as exc:
            error = exc
            if isinstance(exc, Exception) and not isinstance(
                exc, (JobfenceError, NotImplementedError)
            ):
                error = locks.backend_error("lock.release", self.name, exc)
            if locks.closed and isinstance(error, JobfenceError):
                return False  # closed while we released: close() gave it back
            self._release_failed(exc)
            if error is exc:
                raise
            raise error from exc
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

    def _given_back(self) -> None:
        """Internal (used by :func:`jobfence.guarded`): the lease was released on the server
        by another call of its holder (a Redis script that also completed the guarded call's
        claim), as :meth:`release` releases it: recorded as given back, no longer renewed,
        and leaving the block releases nothing more."""
        with self._mutex:
            if self._released:
                return
            self._released = True
        self._gave_back = True
        self._locks.stop_renewing(self)
        telemetry.lock_hold(self._locks.backend.kind, self._started)

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
            call = backend.release
            if task is None and getattr(call, "answers_at_once", False):
                # a backend call that never waits (memory://): no cancellation can cut it
                # off, so it needs no task of its own
                return await call(self.backend_name, self.owner)
            if task is None and getattr(backend, "resendable_release", False):
                # The backend answers a re-sent release as it answered the first: release
                # in the caller's own task (no task to start, no hop back to the caller). A
                # caller cancelled meanwhile leaves a release that may or may not have reached
                # the server: it is sent again in the background, and the next release()
                # takes that answer, as below.
                try:
                    return await backend.release(self.backend_name, self.owner)
                except asyncio.CancelledError:
                    self._releasing = self._locks.in_background(
                        partial(self._release_into, None), "jobfence-release"
                    )
                    raise
            waiting: Awaitable[bool]
            if task is None:
                # The caller waits on a future of its own that the task answers: one hop from
                # the reply to the caller (asyncio.shield would take two), and a cancelled
                # caller cancels only that future, never the release.
                reply: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                task = self._locks.in_background(
                    partial(self._release_into, reply), "jobfence-release"
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
            return await backend.release(self.backend_name, self.owner)

    if ASYNC:

        async def _release_into(self, reply: asyncio.Future[bool] | None) -> bool:
            """The release task's body: the owner-checked release, its answer (or error) also
            set on ``reply`` (if any) unless its caller stopped waiting (``reply``
            cancelled)."""
            try:
                answer = await self._locks.backend.release(self.backend_name, self.owner)
            except BaseException as exc:
                if reply is not None and not reply.done():
                    if isinstance(exc, asyncio.CancelledError):
                        reply.cancel()
                    else:
                        reply.set_exception(exc)
                raise
            if reply is not None and not reply.done():
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
        handle = self._locks.in_background(self.release, "jobfence-release")
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
        self._block.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # a loss cancelled the block: that cancellation was ours, not the caller's
        if ASYNC and self._block.exit() and exc_type is asyncio.CancelledError:
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
