"""Concurrency primitives for the sync code path (the async twin is ``acompat``)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
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

Event = threading.Event
Lock = threading.Lock
Worker = threading.Thread


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; return whether it is set."""
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    return event.wait(timeout)


def spawn(fn: Callable[[], Any], name: str) -> threading.Thread:
    """Run ``fn`` in the background: a daemon thread."""
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread


def join(worker: threading.Thread | None, timeout: float) -> None:
    """Wait (at most ``timeout`` s) for a background thread to finish."""
    if worker is not None and worker.is_alive() and worker is not threading.current_thread():
        worker.join(timeout)


_bounded_pool = concurrent.futures.ThreadPoolExecutor(
    max_workers=4, thread_name_prefix="jobfence-bounded"
)


def call_bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """Call ``fn()`` for at most ``timeout`` seconds; raise ``TimeoutError`` after that (the
    call goes on in a pool thread: a blocking call cannot be interrupted)."""
    future = _bounded_pool.submit(fn)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"no answer within {timeout:.3f} s") from None


def worker_alive(worker: threading.Thread | None) -> bool:
    return worker is not None and worker.is_alive()


def current_worker() -> threading.Thread:
    return threading.current_thread()


def clean_up(fn: Callable[[], Any], tracked: set[Any], wait: float) -> None:
    """Run the clean-up ``fn()`` of an interrupted operation (the sync twin of
    ``acompat.clean_up``: it simply runs to its end; ``tracked`` and ``wait`` are unused)."""
    fn()
