"""Concurrency primitives for the async code path (the sync twin is ``compat``).

The ``*_async`` modules use only these names, so that the generated sync modules get threads,
``threading.Event`` and ``threading.Lock`` by renaming ``acompat`` to ``compat``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

__all__ = [
    "BlockWatch",
    "BoundedCaller",
    "Event",
    "Lock",
    "Worker",
    "call_bounded",
    "current_worker",
    "join",
    "raise_if_cancelling",
    "run_callbacks",
    "set_event",
    "spawn",
    "start",
    "wait_all",
    "wait_done",
    "wait_event",
]

Event = asyncio.Event
Lock = asyncio.Lock
Worker = asyncio.Task


def set_event(event: asyncio.Event, loop: asyncio.AbstractEventLoop | None) -> None:
    """Set ``event``, which belongs to ``loop`` (None: not known yet), from any thread or a
    signal handler: on ``loop`` itself directly, from elsewhere through
    ``call_soon_threadsafe``; a loop that is closed already has nobody waiting."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if loop is None or loop is here:
        event.set()
        return
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # its loop is closed: whoever waited has returned
        pass


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; return whether it is set."""
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    # Not asyncio.wait_for: on Python < 3.12 it can swallow a cancellation that arrives as
    # the inner wait completes, and a background loop would then never stop.
    loop = asyncio.get_running_loop()
    waiter = loop.create_task(event.wait())
    timer = loop.call_later(timeout, waiter.cancel) if timeout is not None else None
    try:
        await asyncio.wait({waiter})
    finally:
        if timer is not None:
            timer.cancel()
        waiter.cancel()
    return event.is_set()


def spawn(fn: Callable[[], Awaitable[Any]], name: str) -> asyncio.Task[Any]:
    """Run ``fn`` in the background: a task on the running loop."""
    return asyncio.get_running_loop().create_task(fn(), name=name)  # type: ignore[arg-type]


async def join(worker: asyncio.Task[Any] | None, timeout: float) -> None:
    """Wait (at most ``timeout`` s) for a background task of this loop to finish."""
    if worker is None or worker.done():
        return
    if worker.get_loop() is not asyncio.get_running_loop():
        return
    await asyncio.wait({worker}, timeout=timeout)


async def call_bounded(fn: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Await ``fn()`` for at most ``timeout`` seconds; raise ``TimeoutError`` after that
    (the call is cancelled)."""
    task = asyncio.ensure_future(fn())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise TimeoutError(f"no answer within {timeout:.3f} s")
    return task.result()


class BoundedCaller:
    """Awaits calls bounded in time (the async twin of ``compat.BoundedCaller``).

    Each call is a task of its own on the running loop, cancelled when its bound passes: a
    call that hangs holds up nobody else, and one cancelled before it sent its request never
    sends it.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    async def call(self, fn: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        """Await ``fn()`` for at most ``timeout`` seconds; raise ``TimeoutError`` after that."""
        return await call_bounded(fn, timeout)

    def close(self) -> None:
        """Nothing to stop: every call is its own task."""


def start(fn: Callable[[], Awaitable[Any]], tracked: set[Any], name: str) -> asyncio.Task[Any]:
    """Run ``fn()`` in the background (a task on the running loop) and return the task;
    ``tracked`` holds it until it is done (the loop keeps only weak references)."""
    task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(fn(), name=name)  # type: ignore[arg-type]
    tracked.add(task)
    task.add_done_callback(_finished)
    task.add_done_callback(tracked.discard)
    return task


def _finished(task: asyncio.Task[Any]) -> None:
    # An error nobody asked for (its caller gave up waiting) is not reported again when the
    # task is collected: whoever asks the task later still gets it.
    if not task.cancelled():
        task.exception()


async def wait_done(task: asyncio.Task[Any], timeout: float) -> bool:
    """Wait (at most ``timeout`` s) for ``task`` to finish, without cancelling it; return
    whether it has."""
    if not task.done():
        await asyncio.wait({task}, timeout=max(0.0, timeout))
    return task.done()


async def wait_all(tracked: set[Any], timeout: float) -> None:
    """Wait (at most ``timeout`` s) for the background tasks in ``tracked`` to finish."""
    loop = asyncio.get_running_loop()
    mine = {task for task in tracked if task.get_loop() is loop}  # another loop's cannot run
    if mine:
        await asyncio.wait(mine, timeout=timeout)


def worker_alive(worker: asyncio.Task[Any] | None) -> bool:
    if worker is None or worker.done():
        return False
    try:
        return worker.get_loop() is asyncio.get_running_loop()
    except RuntimeError:
        return False


def current_worker() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def raise_if_cancelling() -> None:
    """Raise CancelledError if this task was asked to cancel but the request got lost on the
    way (``asyncio.wait_for`` before Python 3.12 can swallow one): a waiter must not loop on."""
    task = current_worker()
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


async def clean_up(fn: Callable[[], Awaitable[Any]], tracked: set[Any], wait: float) -> None:
    """Run the clean-up ``fn()`` of an interrupted operation: wait for it at most ``wait``
    seconds (an interrupted call must end promptly), then let it go on in the background
    (also if we are cancelled again); ``tracked`` holds it until it is done, so that a
    ``close()`` can wait for it."""
    task = asyncio.ensure_future(fn())
    tracked.add(task)
    task.add_done_callback(tracked.discard)
    try:
        await asyncio.wait({task}, timeout=wait)
    except asyncio.CancelledError:
        pass


class BlockWatch:
    """The task running a block (``async with lease:``, a claim's work): a loss found
    meanwhile cancels it, but only while it is still inside the block (a cancellation
    delivered after the block ended would hit unrelated code), from any thread. When the block
    ends, :meth:`exit` withdraws that cancellation: it was ours, not the caller's."""

    __slots__ = ("_cancelled", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def enter(self) -> None:
        """The current task runs the block now."""
        self._task = asyncio.current_task()

    def cancel(self) -> None:
        """Cancel the block's task if it is still inside the block (and is not the caller)."""
        task = self._task
        if task is None or task.done() or task is current_worker():
            return
        self._cancelled = True
        loop = task.get_loop()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()  # delivered when the task next resumes, inside the block
        else:
            loop.call_soon_threadsafe(self._cancel_inside, task)

    def _cancel_inside(self, task: asyncio.Task[Any]) -> None:
        if self._task is task and not task.done():
            task.cancel()

    def exit(self) -> bool:
        """The block ended. Returns whether :meth:`cancel` cancelled it; that cancellation
        is withdrawn."""
        self._task = None
        if not self._cancelled:
            return False
        self._cancelled = False
        current = asyncio.current_task()
        cancelling = getattr(current, "cancelling", None)  # Python >= 3.11
        if cancelling is not None and cancelling():
            current.uncancel()  # type: ignore[union-attr]
        return True


#: coroutine callbacks still running (the event loop keeps only weak references)
_CALLBACK_TASKS: set[asyncio.Task[Any]] = set()


def run_callbacks(
    callbacks: Sequence[Callable[[Any], Any]],
    arg: Any,
    log: logging.Logger,
    message: str,
    *args: Any,
    background: bool = False,
) -> None:
    """Call each ``callback(arg)`` in turn; one that returns a coroutine gets a task of its
    own. An error is logged on ``log`` with ``message % args``, never raised. ``background``
    (the caller is a renewer) matters only to the sync twin."""
    for callback in callbacks:
        try:
            result = callback(arg)
            if asyncio.iscoroutine(result):
                task = asyncio.get_running_loop().create_task(result)
                _CALLBACK_TASKS.add(task)  # a strong reference until it is done
                task.add_done_callback(partial(_callback_done, log, message, args))
        except Exception:
            log.exception(message, *args)


def _callback_done(
    log: logging.Logger, message: str, args: tuple[Any, ...], task: asyncio.Task[Any]
) -> None:
    _CALLBACK_TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error(message, *args, exc_info=task.exception())
