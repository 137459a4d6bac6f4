"""The one clock jobfence reads.

Local deadlines (renewal schedule, ``acquire`` timeouts, a lease's local expiry) use
:meth:`Clock.monotonic`; lease lifetimes on a server are measured by that server's clock
(Redis ``PX``, SQL ``now()``), never by comparing clocks of two machines. Every sleep goes
through :meth:`Clock.sleep` / :meth:`Clock.asleep`, which call the I/O hook with ``"sleep"``.
A test can replace the clock with :func:`set_clock` (the testing toolkit's virtual clock).
"""

from __future__ import annotations

import asyncio
import time

from .hooks import ahook, hook

__all__ = ["Clock", "get_clock", "set_clock"]


class Clock:
    """Real time: ``time.monotonic`` for deadlines, ``time.time`` for wall-clock stamps."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        hook("sleep", seconds=seconds)
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await ahook("sleep", seconds=seconds)
        await asyncio.sleep(max(seconds, 0))


_clock: Clock = Clock()


def get_clock() -> Clock:
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Replace the clock (tests); returns the previous one."""
    global _clock
    old, _clock = _clock, clock
    return old
