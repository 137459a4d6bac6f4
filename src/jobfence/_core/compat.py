"""Concurrency primitives for the sync code path (the async twin is ``acompat``)."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

__all__ = [
    "BlockWatch",
    "BoundedCaller",
    "Event",
    "Lock",
    "Spawner",
    "Worker",
    "call_bounded",
    "current_worker",
    "join",
    "raise_if_cancelling",
    "run_callbacks",
    "set_spawner",
    "spawn",
    "start",
    "wait_all",
    "wait_done",
    "wait_event",
]

Event = threading.Event
Lock = threading.Lock
Worker = threading.Thread


class Spawner(Protocol):
    """Who runs jobfence's background threads while one is installed (:func:`set_spawner`).

    The simulation of ``jobfence.testing`` installs one for the duration of a schedule, so
    that the threads a simulated thread task starts (a sync client's renewer, a give-back in
    the background, the ``on_lost`` callbacks) are tasks of the simulation too, run at its
    points and wait in its virtual time, instead of running beside it on real time. Without
    one (production, ordinary tests), every function here is a plain thread operation and
    pays a single ``is None`` test for the seam.
    """

    def spawn(
        self, fn: Callable[[], Any], name: str, abandon: Callable[[], None] | None
    ) -> threading.Thread | None:
        """Start ``fn`` as a controlled thread named after ``name`` and return its thread;
        ``None`` to let a plain daemon thread run it (a caller the spawner does not
        control). ``abandon()``, if given, is called instead of ``fn`` when the thread is
        never let run (its process died first, or the simulation ended)."""
        ...

    def controls(self) -> bool:
        """Whether the calling thread is one the spawner controls: its waits go through
        :meth:`wait`, its calls bounded in time run in it (:class:`BoundedCaller`)."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait (a controlled caller only) until ``event`` is set or ``timeout`` seconds of
        the spawner's time pass; return whether it is set."""
        ...

    def join(self, worker: threading.Thread, timeout: float) -> bool:
        """Wait for ``worker`` to finish if it is a controlled thread (True: handled, the
        caller need not join it itself); False for a plain thread."""
        ...


#: the spawner installed now (``None``: plain threads); see :class:`Spawner`
_spawner: Spawner | None = None


def set_spawner(spawner: Spawner | None) -> Spawner | None:
    """Install ``spawner`` (``None``: plain threads again); return the previous one."""
    global _spawner
    old, _spawner = _spawner, spawner
    return old


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; return whether it is set."""
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    return event.wait(timeout)


def spawn(
    fn: Callable[[], Any], name: str, *, abandon: Callable[[], None] | None = None
) -> threading.Thread:
    """Run ``fn`` in the background: a daemon thread (a controlled one while a
    :class:`Spawner` is installed and controls the caller; ``abandon`` is then called instead
    of ``fn`` if that thread never runs)."""
    spawner = _spawner
    if spawner is not None:
        controlled = spawner.spawn(fn, name, abandon)
        if controlled is not None:
            return controlled
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread


def join(worker: threading.Thread | None, timeout: float) -> None:
    """Wait (at most ``timeout`` s) for a background thread to finish."""
    if worker is not None and worker.is_alive() and worker is not threading.current_thread():
        spawner = _spawner
        if spawner is not None and spawner.join(worker, timeout):
            return
        worker.join(timeout)


def start(fn: Callable[[], Any], tracked: set[Any], name: str) -> concurrent.futures.Future[Any]:
    """Run ``fn()`` in the background (a daemon thread of its own) and return its future;
    ``tracked`` holds the future until it is done."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    tracked.add(future)

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # delivered to whoever asks the future
            future.set_exception(exc)
        finally:
            tracked.discard(future)

    def never_run() -> None:  # a controlled thread that was never let run
        future.cancel()
        future.set_running_or_notify_cancel()  # wakes concurrent.futures.wait() callers
        tracked.discard(future)

    spawn(run, name, abandon=never_run)
    return future


def wait_done(future: concurrent.futures.Future[Any], timeout: float) -> bool:
    """Wait (at most ``timeout`` s) for ``future`` to finish; return whether it has."""
    spawner = _spawner
    if spawner is not None and spawner.controls():
        _controlled_wait(spawner, [future], timeout)
    else:
        concurrent.futures.wait([future], timeout=max(0.0, timeout))
    return future.done()


def wait_all(tracked: set[Any], timeout: float) -> None:
    """Wait (at most ``timeout`` s) for the background calls in ``tracked`` to finish."""
    if tracked:
        spawner = _spawner
        if spawner is not None and spawner.controls():
            _controlled_wait(spawner, list(tracked), timeout)
        else:
            concurrent.futures.wait(set(tracked), timeout=timeout)


def _controlled_wait(
    spawner: Spawner, futures: list[concurrent.futures.Future[Any]], timeout: float
) -> None:
    """Wait through ``spawner`` until every one of ``futures`` is done (or ``timeout``)."""
    left = [len(futures)]
    mutex = threading.Lock()
    all_done = threading.Event()

    def one_done(_: concurrent.futures.Future[Any]) -> None:
        with mutex:
            left[0] -= 1
            if left[0] <= 0:
                all_done.set()

    for future in futures:
        future.add_done_callback(one_done)  # at once if it is done already
    if not all_done.is_set():
        spawner.wait(all_done, max(0.0, timeout))


class _Call:
    __slots__ = ("done", "error", "fn", "result", "started")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.started = False
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class BoundedCaller:
    """Runs calls bounded in time on worker threads of its own, started on first use.

    Each renewer has one, so a call that hangs (a stalled connection) holds up only the calls
    of that renewer's client, never those of another client. Calls run one at a time on one
    worker; a call that does not answer within its bound keeps its worker until it returns, and
    the next call gets a new worker (at most ``workers`` in all: a client whose every call
    hangs does not pile up threads). A call still queued when its bound passes is dropped and
    never made, so a request given up on before it started cannot reach the server later (one
    already sent can: see ``_core/renewer_async.py``). A worker beyond the first ends after
    ``IDLE_EXIT`` idle seconds.
    """

    IDLE_EXIT = 5.0

    def __init__(self, name: str, *, workers: int = 3) -> None:
        self._name = name
        self._limit = workers
        self._cond = threading.Condition()
        self._queue: collections.deque[_Call] = collections.deque()
        self._workers = 0  # threads alive
        self._idle = 0  # threads waiting for a call
        self._closed = False

    def call(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Call ``fn()`` on a worker and wait at most ``timeout`` seconds for its answer;
        raise ``TimeoutError`` after that (a call already running goes on; a queued one is
        dropped)."""
        spawner = _spawner
        if spawner is not None and spawner.controls():
            # a controlled (simulated) thread: the call runs in it, so its points are its
            # own and it takes virtual time; there is no real hang to bound
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            return fn()
        job = _Call(fn)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            self._queue.append(job)
            if self._idle < len(self._queue) and self._workers < self._limit:
                self._workers += 1
                try:
                    spawn(self._work, self._name)
                except BaseException:
                    self._workers -= 1
                    raise
            self._cond.notify()
        if not job.done.wait(max(0.0, timeout)):
            with self._cond:
                if not job.started:  # never made: it cannot reach the server any more
                    self._queue.remove(job)
            raise TimeoutError(f"no answer within {timeout:.3f} s")
        if job.error is not None:
            raise job.error
        return job.result

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue and not self._closed:
                    idle_long = not self._cond.wait(self.IDLE_EXIT) and not self._queue
                    if idle_long and self._workers > 1:  # an extra worker: not needed now
                        break
                self._idle -= 1
                if not self._queue:  # closed, or idle for long
                    self._workers -= 1
                    return
                job = self._queue.popleft()
                job.started = True
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller
                job.error = exc
            finally:
                job.done.set()
            del job

    def close(self) -> None:
        """Drop the queued calls; each worker ends after the call it is running, if any."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()


def call_bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """Call ``fn()`` for at most ``timeout`` seconds; raise ``TimeoutError`` after that (the
    call goes on in a thread of its own: a blocking call cannot be interrupted, and a call
    that hangs must not hold up anyone else's)."""
    caller = BoundedCaller("jobfence-bounded")
    try:
        return caller.call(fn, timeout)
    finally:
        caller.close()


def worker_alive(worker: threading.Thread | None) -> bool:
    return worker is not None and worker.is_alive()


def current_worker() -> threading.Thread:
    return threading.current_thread()


def raise_if_cancelling() -> None:
    """Nothing: a thread is never cancelled (the twin of ``acompat.raise_if_cancelling``)."""


def clean_up(fn: Callable[[], Any], tracked: set[Any], wait: float) -> None:
    """Run the clean-up ``fn()`` of an interrupted operation (the sync twin of
    ``acompat.clean_up``: it simply runs to its end; ``tracked`` and ``wait`` are unused)."""
    fn()


class BlockWatch:
    """The sync twin of ``acompat.BlockWatch``: a thread cannot be interrupted, so a loss
    cancels nothing (a long block looks at ``lost`` or calls ``check()``)."""

    __slots__ = ()

    def enter(self) -> None:
        """Nothing to watch."""

    def cancel(self) -> None:
        """Nothing to cancel."""

    def exit(self) -> bool:
        """Never cancelled."""
        return False


def run_callbacks(
    callbacks: Sequence[Callable[[Any], Any]],
    arg: Any,
    log: logging.Logger,
    message: str,
    *args: Any,
    background: bool = False,
) -> None:
    """Call each ``callback(arg)`` in turn; an error is logged on ``log`` with
    ``message % args``, never raised. ``background`` (the caller is a renewer, which has
    other leases to renew): in a thread of their own."""
    if background and callbacks:
        spawn(partial(_run_all, list(callbacks), arg, log, message, args), "jobfence-on-lost")
    else:
        _run_all(callbacks, arg, log, message, args)


def _run_all(
    callbacks: Sequence[Callable[[Any], Any]],
    arg: Any,
    log: logging.Logger,
    message: str,
    args: tuple[Any, ...],
) -> None:
    for callback in callbacks:
        try:
            callback(arg)
        except Exception:
            log.exception(message, *args)
