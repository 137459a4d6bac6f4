"""The one clock jobfence reads (public API: :mod:`jobfence.testing`).

Local deadlines (renewal schedule, ``acquire`` timeouts, a lease's local expiry, retry
deadlines) use :meth:`Clock.monotonic`; lease lifetimes on a server are measured by that
server's clock (Redis ``PX``, SQL ``now()``), never by comparing clocks of two machines; the
``memory://`` backends measure theirs by this clock (:meth:`Clock.monotonic` for leases,
:meth:`Clock.time` for inbox records and the floor of their tokens). Every sleep goes through
:meth:`Clock.sleep` / :meth:`Clock.asleep`, which call the I/O hook with ``"sleep"``, and
every wait for an event with a time limit (the renewer's pause between checks, a backend's
wait for a release notification) through :meth:`Clock.wait` / :meth:`Clock.wait_async`. A
test replaces the clock with :func:`set_clock` (e.g. a subclass whose time only moves when
the test says so, and whose waits move it instead of waiting).
"""

from __future__ import annotations

import asyncio
import threading
import time

from . import acompat, compat
from .hooks import ahook, hook
from .root_errors import ConfigurationError

__all__ = ["Clock", "get_clock", "set_clock"]


class Clock:
    """Real time: ``time.monotonic`` for deadlines, ``time.time`` for wall-clock stamps.

    To control time in a test, subclass it: override :meth:`monotonic` and :meth:`time` to
    move deadlines and expiry by hand, :meth:`sleep` / :meth:`asleep` so that sleeps (retry
    backoff, polling) advance that time instead of waiting, and :meth:`wait` /
    :meth:`wait_async` so that a wait for an event that is not set advances it by the
    ``timeout``. The ``"sleep"`` hook call is part of :meth:`sleep` / :meth:`asleep`: an
    override replaces it too.
    """

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (deadlines, expiry)."""
        return time.monotonic()

    def time(self) -> float:
        """Seconds since the epoch (wall-clock stamps)."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Call the hook with ``"sleep"``, then sleep ``seconds`` (nothing if <= 0)."""
        hook("sleep", seconds=seconds)
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        """The async :meth:`sleep`."""
        await ahook("sleep", seconds=seconds)
        await asyncio.sleep(max(seconds, 0))

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass (nothing if <= 0); return
        whether it is set. A sync renewer's pause between checks and a sync backend's wait
        for a release notification are waits through here (no hook call: a wait is no I/O)."""
        return compat.wait_event(event, timeout)

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        """The async :meth:`wait`, on an ``asyncio.Event`` of the running loop."""
        return await acompat.wait_event(event, timeout)


_clock: Clock = Clock()
_METHODS = ("monotonic", "time", "sleep", "asleep", "wait", "wait_async")


def get_clock() -> Clock:
    """The clock jobfence reads now."""
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Replace the clock, process-wide; returns the previous one.

    Install it before creating the clients it should drive: a client's renewer reads the
    clock once, when it starts with the client's first lease. Raises
    :class:`~jobfence.ConfigurationError` (``argument="clock"``) unless ``clock`` has callable
    ``monotonic``, ``time``, ``sleep``, ``asleep``, ``wait`` and ``wait_async`` methods (a
    :class:`Clock` subclass has them all).
    """
    missing = [name for name in _METHODS if not callable(getattr(clock, name, None))]
    if missing:
        raise ConfigurationError(
            f"clock must be a jobfence Clock ({', '.join(_METHODS)} methods: subclass "
            f"jobfence.testing.Clock); {clock!r} lacks {', '.join(missing)}",
            argument="clock",
        )
    global _clock
    old, _clock = _clock, clock
    return old
