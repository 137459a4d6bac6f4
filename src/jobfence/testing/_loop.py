"""The simulation's event loop: asyncio with virtual time and a scheduler at the points.

``SimLoop`` is a ``SelectorEventLoop`` whose :meth:`time` is virtual. Its iteration
(``_run_once``, the one CPython's ``BaseEventLoop`` runs) differs in what it does when
nothing is ready to run:

1. if real I/O is in flight (a statement of a real-database table, a registered reader),
   it waits for it, at most ``block_timeout`` real seconds;
2. otherwise it asks the simulation to let one task parked at a point go on (the
   scheduler's choice);
3. if no task is parked, it moves virtual time to the next timer at once (so ttls,
   backoff, visibility timeouts and renewal cost no wall time);
4. if there is no timer either, every task left waits for something that never comes:
   the simulation is told (a deadlock).

Ready callbacks themselves run in FIFO order, as in asyncio, so everything between two
points is deterministic. This relies on CPython's ``BaseEventLoop`` attributes
(``_ready``, ``_scheduled``, ``_selector``, ``_process_events``), stable since 3.8.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import sys
import threading
from typing import TYPE_CHECKING, Any

from ._base import _Crashed, _Stop

if TYPE_CHECKING:
    from ._base import LoopDriver

__all__ = ["SimLoop"]


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Tasks of a crashed process, or of a schedule a check ended, are unwound with
    exceptions nobody retrieves: not worth a report. Anything else is."""
    if isinstance(context.get("exception"), (_Crashed, _Stop)):
        return
    loop.default_exception_handler(context)


def _nothing() -> None:
    """What stands for ``run_until_complete``'s stop callback in :meth:`SimLoop.run_task`."""


_Handle = asyncio.Handle
#: ``asyncio.Handle`` has the slots its ``__init__`` fills, and no ``__new__`` of its own: a
#: handle can be made as its ``__init__`` makes one outside debug mode, in the caller's frame
_BARE_HANDLE = _Handle.__new__ is object.__new__ and set(_Handle.__slots__) == {
    "_callback",
    "_args",
    "_cancelled",
    "_loop",
    "_source_traceback",
    "_repr",
    "__weakref__",
    "_context",
}
_new_object = object.__new__
_copy_context = contextvars.copy_context


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is virtual and whose idle moments are the scheduler's."""

    def __init__(self) -> None:
        super().__init__()
        self.vtime = 0.0
        #: iterations in a row that found something ready (none was idle)
        self.spins = 0
        self.sim: LoopDriver | None = None
        #: a future that is done: what ``testing.point`` returns to a task that goes on
        self.passed: asyncio.Future[None] = self.create_future()
        self.passed.set_result(None)
        self.set_exception_handler(_quiet)
        #: the tasks made with ``create_task`` (``asyncio.create_task``, ``ensure_future``, a
        #: client's background task) since the last schedule ended: one left pending as the
        #: schedule ends is cancelled then (the loop serves the next schedule too)
        self.started: list[asyncio.Task[Any]] = []

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:  # type: ignore[override]
        """``BaseEventLoop.create_task``, the task noted in :attr:`started`."""
        task = super().create_task(coro, **kwargs)
        self.started.append(task)
        return task

    def time(self) -> float:
        return self.vtime

    def call_soon(  # type: ignore[override]  # the same signature, without its type variables
        self, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        """``BaseEventLoop.call_soon`` in one frame (every task's steps, wake-ups and
        futures' callbacks come through here, several per schedule): the same handle,
        queued last; in debug mode, or once closed, asyncio's own (its checks)."""
        if self._debug or self._closed or not _BARE_HANDLE:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        # Handle.__init__'s assignments (not in debug mode), without its call
        handle: Any = _new_object(_Handle)
        handle._context = context if context is not None else _copy_context()
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle  # type: ignore[no-any-return]

    def run_task(self, task: asyncio.Future[Any]) -> Any:
        """``run_until_complete(task)`` for a task of this loop, with less set-up per call
        (a schedule runs one, thousands of times per explore): the same iterations, the one
        after ``task`` is done included (where ``run_until_complete`` runs its stop
        callback: what is ready or due then runs, and nothing is decided), unless nothing is
        ready or scheduled then: that iteration would only run the stop callback."""
        me: Any = self  # BaseEventLoop's private attributes, untyped
        if me._thread_id is not None or me._debug or me.is_closed():
            return self.run_until_complete(task)
        hooks = sys.get_asyncgen_hooks()
        me._thread_id = threading.get_ident()
        sys.set_asyncgen_hooks(
            firstiter=me._asyncgen_firstiter_hook, finalizer=me._asyncgen_finalizer_hook
        )
        asyncio.events._set_running_loop(self)
        try:
            run_once = self._run_once
            ready = me._ready
            scheduled = me._scheduled
            while True:
                run_once()
                if me._stopping:
                    break
                if task.done():
                    sim = self.sim
                    if ready or scheduled or (sim is not None and self.spins >= sim.max_spins):
                        me._ready.append(asyncio.Handle(_nothing, (), self, None))
                        run_once()
                    else:  # that iteration would run the stop callback alone: only count it
                        self.spins += 1
                    break
        finally:
            me._stopping = False
            me._thread_id = None
            asyncio.events._set_running_loop(None)
            sys.set_asyncgen_hooks(*hooks)
        if not task.done():
            raise RuntimeError("Event loop stopped before Future completed.")
        return task.result()

    def _io_pending(self) -> bool:
        sim = self.sim
        if sim is not None and sim.external > 0:
            return True
        # the self-pipe is always registered; anything else is real I/O someone waits for,
        # except the socket of a statement that stalled (it may wait for long)
        registered = self._selector.get_map()  # type: ignore[attr-defined]
        waiting = len(registered) - 1
        if waiting and sim is not None and sim.statements:
            stalled = [s.fd for s in sim.statements if s.stalled and s.fd is not None]
            waiting -= sum(1 for fd in stalled if fd in registered)
        return waiting > 0

    def _run_once(self) -> None:
        ready: Any = self._ready  # type: ignore[attr-defined]
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False
        sim = self.sim
        if ready:
            self.spins += 1
            if sim is not None and self.spins > sim.max_spins and not sim.stopping:
                self.spins = 0
                sim.spinning()
        else:
            self.spins = 0
            if self._io_pending():
                limit = sim.block_timeout if sim is not None else 0.0
                events = self._selector.select(limit)  # type: ignore[attr-defined]
                self._process_events(events)  # type: ignore[attr-defined]
                if not ready and sim is not None and sim.running_threads > 0:
                    sim.thread_running()  # fails the schedule if it runs for too long
                    return  # a thread task runs: nobody else may until it reaches a point
                if not ready and sim is not None and sim.external > 0:
                    sim.stalled_io()  # a statement blocks (e.g. on another task's row lock)
            elif sim is not None and sim.statements:  # stalled ones: take an answer, no wait
                self._process_events(self._selector.select(0))  # type: ignore[attr-defined]
            if not ready and sim is not None and sim.decide():
                pass  # a parked task was let go: its wake-up is ready now
            elif not ready and scheduled:
                if sim is not None and not sim.stopping and scheduled[0]._when > sim.max_time:
                    sim.out_of_time()
                self.vtime = max(self.vtime, scheduled[0]._when)
            elif not ready and sim is not None and not self._io_pending():
                sim.idle_forever()
        now = self.vtime
        while scheduled and scheduled[0]._when <= now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()
