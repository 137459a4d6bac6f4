"""The few concurrency steps the conformance specs take, for the async specs.

The specs are written once, as async code over ``AsyncLocks``; their sync twins are generated
(``tools/conformance_twins.py``), which renames this module to :mod:`tests.conformance.flow`,
its sync counterpart with the same names. A spec starts a second actor with :func:`spawn`
(a task here, a thread there), waits for it with :func:`result`, pauses with :func:`sleep`
and waits for a ``threading.Event`` set by a callback (``on_lost``) with :func:`wait_event`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: the flavour the specs of this module run (the name ``_mutex_worker`` takes)
FLAVOUR = "async"


def spawn(fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
    """Run ``fn()`` concurrently with the caller: a task on the running loop."""

    async def run() -> T:
        return await fn()

    return asyncio.ensure_future(run())


async def result(future: asyncio.Future[T], timeout: float) -> T:
    """The outcome of what :func:`spawn` started, waiting at most ``timeout`` seconds."""
    return await asyncio.wait_for(future, timeout)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def wait_event(event: threading.Event, timeout: float) -> bool:
    """Wait (without blocking the loop) for ``event``, set from any thread."""
    return await asyncio.to_thread(event.wait, timeout)


def done(future: Any) -> bool:
    return bool(future.done())
