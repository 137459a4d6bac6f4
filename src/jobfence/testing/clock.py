"""A clock for tests whose time moves only when the test says so.

:class:`ManualClock` is a :class:`~jobfence.testing.Clock`: install it (``with ManualClock()
as clock:``, or :func:`~jobfence.testing.clocked`) and everything jobfence times locally
(lease expiry, renewal schedule, ``acquire`` timeouts, retry backoff, the ``memory://``
backends' leases and records) reads its time. Time stands still until :meth:`ManualClock.advance`
or :meth:`ManualClock.set` moves it; a sleep or a timed wait for an event returns when an
advance reaches its deadline (a wait returns earlier when its event is set). With
``auto_advance=True`` nothing ever blocks: a sleep, or a wait for an event that is not set,
moves the time by its whole length itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timezone, tzinfo
from types import TracebackType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .._core.clock import Clock, set_clock
from .._core.hooks import ahook, hook
from ..errors import ConfigurationError

__all__ = ["ManualClock"]

#: ``ManualClock().time()`` at ``monotonic() == 0``: a fixed date (2023-11-14 22:13:20 UTC)
EPOCH = 1_700_000_000.0
#: real seconds between two looks at a ``threading.Event`` a sync wait waits for (the
#: event has no callback: the wait waits for the clock's wake-up and looks at it in between)
_EVENT_POLL = 0.001


class _Sleeper:
    """One sleep or timed wait in progress: its deadline and how to wake it."""

    __slots__ = ("deadline", "future", "loop", "woken")

    def __init__(
        self,
        deadline: float,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[None] | None = None,
    ) -> None:
        self.deadline = deadline
        self.loop = loop
        self.future = future
        self.woken = threading.Event()

    def wake(self) -> None:
        self.woken.set()
        if self.loop is not None and self.future is not None:
            try:
                self.loop.call_soon_threadsafe(_resolve, self.future)
            except RuntimeError:  # the loop is closed: nobody awaits the future any more
                pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ManualClock(Clock):
    """Time that moves only when the test moves it; thread-safe.

    ``monotonic()`` starts at ``start`` and ``time()`` is ``epoch + monotonic()``. Sleeps
    (:meth:`sleep`, :meth:`asleep`) and timed waits for an event (:meth:`wait`,
    :meth:`wait_async`) from any thread or event loop block until :meth:`advance` or
    :meth:`set` reaches their deadline, or, for a wait, until its event is set. Every sleep
    calls the I/O hook with ``"sleep"`` first, like the real clock's.

    With ``auto_advance=True`` nothing blocks: a sleep moves the time by its length, and a
    wait for an event that is still not set after letting other threads or tasks run moves
    it by the whole ``timeout`` (a retry's backoff or a minutes-long scenario then runs at
    once). A client's renewer, pausing between its checks, then moves the time as well: a
    test that needs exact times uses the default mode.

    :attr:`sleeps` and :attr:`waits` record the seconds every sleep and the timeout every
    wait asked for, in order; :attr:`waiting` counts the sleeps and waits blocked now, and
    :meth:`wait_for_waiters` lets a test wait until its workers have got there before it
    advances the time.

    The clock is its own context manager: ``with ManualClock() as clock:`` installs it as
    jobfence's clock (:func:`~jobfence.testing.set_clock`) and puts the previous clock back
    at the end. Create the clients it should drive inside the block.

    To start at a given wall time (near a daylight saving change, say), use :meth:`at`;
    :meth:`now` reads the time as an aware ``datetime`` in the clock's time zone.

    Args:
        start: the first value of :meth:`monotonic`.
        epoch: what :meth:`time` adds to :meth:`monotonic` (a fixed date by default, so that
            wall-clock stamps are the same in every run).
        auto_advance: let sleeps and waits move the time themselves instead of blocking.
        tz: the time zone :meth:`now` shows the time in (a ``tzinfo`` or an IANA name such
            as ``"Europe/Paris"``; default UTC). It changes nothing else: :meth:`time` is
            always seconds since the epoch.
    """

    def __init__(
        self,
        start: float = 0.0,
        *,
        epoch: float = EPOCH,
        auto_advance: bool = False,
        tz: tzinfo | str | None = None,
    ) -> None:
        self._now = float(start)
        self.epoch = float(epoch)
        self.auto_advance = auto_advance
        #: the time zone :meth:`now` shows the time in
        self.tz: tzinfo = _zone(tz)
        #: the seconds each :meth:`sleep` / :meth:`asleep` asked for, in order
        self.sleeps: list[float] = []
        #: the timeout each :meth:`wait` / :meth:`wait_async` asked for, in order
        self.waits: list[float] = []
        self._cond = threading.Condition()
        self._sleepers: list[_Sleeper] = []
        self._installed: list[Clock] = []

    @classmethod
    def at(
        cls,
        when: datetime | str,
        tz: tzinfo | str | None = None,
        *,
        auto_advance: bool = False,
    ) -> ManualClock:
        """A clock whose :meth:`time` is ``when`` now (``monotonic()`` is 0), shown in ``tz``
        by :meth:`now`.

        ``when`` is an aware ``datetime``, or a wall time in ``tz`` (a naive ``datetime``, or
        an ISO string such as ``"2026-03-29T01:59:00"``; an ISO string with an offset or
        ``Z`` is that instant). A wall time a daylight saving change skips (02:30 on the
        spring change in Paris) raises :class:`~jobfence.ConfigurationError`; one it repeats
        (02:30 on the autumn change) is its first occurrence, unless a ``datetime`` with
        ``fold=1`` asks for the second. ``tz``: a ``tzinfo`` or an IANA name (default: the
        ``tzinfo`` of an aware ``when``, else UTC). ``auto_advance`` as in the constructor.
        """
        if isinstance(when, str):
            try:
                moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
            except ValueError:
                raise ConfigurationError(
                    f"when must be an ISO date and time such as '2026-03-29T01:59:00', "
                    f"got {when!r}",
                    argument="when",
                ) from None
        elif isinstance(when, datetime):
            moment = when
        else:
            raise ConfigurationError(
                f"when must be a datetime or an ISO string, got {when!r}", argument="when"
            )
        if tz is None and moment.tzinfo is not None:
            zone: tzinfo = moment.tzinfo
        else:
            zone = _zone(tz)
        if moment.tzinfo is None or moment.utcoffset() is None:
            moment = moment.replace(tzinfo=zone)
            back = moment.astimezone(timezone.utc).astimezone(zone)
            if back.replace(tzinfo=None) != moment.replace(tzinfo=None):
                raise ConfigurationError(
                    f"when: {moment.replace(tzinfo=None).isoformat()} does not exist in {zone} "
                    "(a daylight saving change skips it); give a wall time that exists, or an "
                    "aware datetime",
                    argument="when",
                )
        return cls(0.0, epoch=moment.timestamp(), auto_advance=auto_advance, tz=zone)

    def now(self, tz: tzinfo | str | None = None) -> datetime:
        """:meth:`time` as an aware ``datetime`` in ``tz`` (default: the clock's :attr:`tz`):
        the wall time jumps at a daylight saving change as the time zone says, while
        :meth:`time` goes on second by second."""
        zone = self.tz if tz is None else _zone(tz)
        return datetime.fromtimestamp(self.time(), zone)

    # -- reading and moving the time -----------------------------------------------------------
    def monotonic(self) -> float:
        """The clock's time: ``start`` plus every advance so far."""
        with self._cond:
            return self._now

    def time(self) -> float:
        """``epoch + monotonic()``: the wall-clock stamp of the current time."""
        return self.epoch + self.monotonic()

    def advance(self, seconds: float) -> float:
        """Move the time ``seconds`` forward, wake every sleep and wait whose deadline it
        reaches, and return the new :meth:`monotonic`. Raises ``ValueError`` for a negative
        ``seconds``: the time never goes backwards."""
        if seconds < 0:
            raise ValueError(f"a clock never goes backwards: advance({seconds!r})")
        with self._cond:
            return self._move_to(self._now + seconds)

    def set(self, monotonic: float) -> float:
        """Move the time to ``monotonic`` (not earlier than now: ``ValueError``), waking what
        :meth:`advance` would; return it."""
        with self._cond:
            if monotonic < self._now:
                raise ValueError(
                    f"a clock never goes backwards: set({monotonic!r}) at {self._now!r}"
                )
            return self._move_to(float(monotonic))

    def _move_to(self, now: float) -> float:
        # called holding self._cond
        self._now = now
        due = [s for s in self._sleepers if s.deadline <= now]
        for sleeper in due:
            self._sleepers.remove(sleeper)
            sleeper.wake()
        self._cond.notify_all()
        return now

    @property
    def waiting(self) -> int:
        """How many sleeps and timed waits are blocked now, waiting for the time to move."""
        with self._cond:
            return len(self._sleepers)

    @property
    def next_deadline(self) -> float | None:
        """The earliest deadline of a blocked sleep or wait (``None`` when nothing waits):
        ``clock.set(clock.next_deadline)`` wakes the first of them."""
        with self._cond:
            return min((s.deadline for s in self._sleepers), default=None)

    def wait_for_waiters(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block the calling thread until at least ``count`` sleeps or waits are blocked on
        this clock, or ``timeout`` real seconds pass; return whether they are. Call it from a
        thread other than the ones that should get there (from async code: run it with
        ``asyncio.to_thread``, or use :meth:`wait_for_waiters_async`)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._sleepers) >= count, timeout)

    async def wait_for_waiters_async(self, count: int = 1, timeout: float = 10.0) -> bool:
        """:meth:`wait_for_waiters` for a test on an event loop: the loop goes on running
        (the tasks that should get there run on it) while a worker thread waits."""
        return await asyncio.to_thread(self.wait_for_waiters, count, timeout)

    # -- the Clock seam ------------------------------------------------------------------------
    def _register(self, seconds: float, sleeper_loop: bool = False) -> _Sleeper:
        with self._cond:
            deadline = self._now + seconds
            if sleeper_loop:
                loop = asyncio.get_running_loop()
                sleeper = _Sleeper(deadline, loop, loop.create_future())
            else:
                sleeper = _Sleeper(deadline)
            self._sleepers.append(sleeper)
            self._cond.notify_all()
            return sleeper

    def _unregister(self, sleeper: _Sleeper) -> None:
        with self._cond:
            if sleeper in self._sleepers:
                self._sleepers.remove(sleeper)
                self._cond.notify_all()

    def sleep(self, seconds: float) -> None:
        """Call the hook with ``"sleep"``, then block until the time has moved ``seconds``
        (nothing if <= 0; with ``auto_advance``, move it)."""
        hook("sleep", seconds=seconds)
        with self._cond:
            self.sleeps.append(seconds)
        if seconds <= 0:
            return
        if self.auto_advance:
            self.advance(seconds)
            return
        sleeper = self._register(seconds)
        try:
            sleeper.woken.wait()
        finally:
            self._unregister(sleeper)

    async def asleep(self, seconds: float) -> None:
        """The async :meth:`sleep`: only the awaiting task waits."""
        await ahook("sleep", seconds=seconds)
        with self._cond:
            self.sleeps.append(seconds)
        if seconds <= 0 or self.auto_advance:
            if seconds > 0:
                self.advance(seconds)
            await asyncio.sleep(0)
            return
        sleeper = self._register(seconds, sleeper_loop=True)
        assert sleeper.future is not None
        try:
            await sleeper.future
        finally:
            self._unregister(sleeper)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or the time has moved ``timeout`` (nothing if <= 0);
        return whether ``event`` is set."""
        if event.is_set():
            return True
        with self._cond:
            self.waits.append(timeout)
        if timeout <= 0:
            return event.is_set()
        if self.auto_advance:
            time.sleep(0)  # let other threads run first; takes no time
            if not event.is_set():
                self.advance(timeout)
            return event.is_set()
        sleeper = self._register(timeout)
        try:
            while not event.wait(_EVENT_POLL) and not sleeper.woken.is_set():
                pass
        finally:
            self._unregister(sleeper)
        return event.is_set()

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        """The async :meth:`wait`, on an ``asyncio.Event`` of the running loop."""
        if event.is_set():
            return True
        with self._cond:
            self.waits.append(timeout)
        if timeout <= 0:
            return event.is_set()
        if self.auto_advance:
            await asyncio.sleep(0)  # let other tasks run first
            if not event.is_set():
                self.advance(timeout)
            return event.is_set()
        sleeper = self._register(timeout, sleeper_loop=True)
        assert sleeper.future is not None
        setter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        woken: asyncio.Future[Any] = sleeper.future
        try:
            await asyncio.wait({setter, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            setter.cancel()
            self._unregister(sleeper)
        return event.is_set()

    # -- installing it -------------------------------------------------------------------------
    def __enter__(self) -> ManualClock:
        self._installed.append(set_clock(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        set_clock(self._installed.pop())

    def __repr__(self) -> str:
        return f"ManualClock(monotonic={self.monotonic()!r}, waiting={self.waiting})"


def _zone(tz: tzinfo | str | None) -> tzinfo:
    """``tz`` as a ``tzinfo``: UTC for ``None``, a ``ZoneInfo`` for an IANA name."""
    if tz is None:
        return timezone.utc
    if isinstance(tz, tzinfo):
        return tz
    if isinstance(tz, str) and tz:
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise ConfigurationError(
        f"tz must be a tzinfo or an IANA time zone name such as 'Europe/Paris', got {tz!r}",
        argument="tz",
    )
