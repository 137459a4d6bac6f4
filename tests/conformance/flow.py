"""The sync counterpart of :mod:`tests.conformance.flow_async`, with the same names.

The generated sync specs run on the calling thread; only a second actor (:func:`spawn`) gets
a thread of its own.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: the flavour the specs of this module run (the name ``_mutex_worker`` takes)
FLAVOUR = "sync"


def spawn(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``fn()`` concurrently with the caller: a daemon thread of its own."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # delivered to whoever asks the future
            future.set_exception(exc)

    threading.Thread(target=run, name="conformance-actor", daemon=True).start()
    return future


def result(future: concurrent.futures.Future[T], timeout: float) -> T:
    """The outcome of what :func:`spawn` started, waiting at most ``timeout`` seconds."""
    return future.result(timeout)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def wait_event(event: threading.Event, timeout: float) -> bool:
    return event.wait(timeout)


def done(future: Any) -> bool:
    return bool(future.done())
