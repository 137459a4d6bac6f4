"""Concurrency primitives for the async code path (the sync twin is ``compat``).

The ``*_async`` modules use only these names, so that the generated sync modules get threads,
``threading.Event`` and ``threading.Lock`` by renaming ``acompat`` to ``compat``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "Event",
    "Lock",
    "Worker",
    "call_bounded",
    "current_worker",
    "join",
    "spawn",
    "wait_event",
]

Event = asyncio.Event
Lock = asyncio.Lock
Worker = asyncio.Task


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
