"""What every test must leave behind: no open lock client and no running lease renewer.

A client a test does not close keeps its renewer (a thread for ``Locks``, a task for
``AsyncLocks``) renewing leases nobody uses, and its leases are reported lost long after the
test, in the middle of other tests' output. So every ``Locks`` / ``AsyncLocks`` created during a
test must be closed by its end (its own fixtures included), and every renewer thread it started
must have stopped; otherwise the test fails (as an error in its teardown) naming what it left.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence

#: every lock client created in this process (weakly: a collected client leaks nothing)
_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()
#: how long a test's renewer threads may take to stop after their clients were closed
_GRACE = 5.0


def _track(cls: type) -> None:
    init = cls.__init__  # type: ignore[misc]

    @functools.wraps(init)
    def tracking_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _CLIENTS.add(self)

    cls.__init__ = tracking_init  # type: ignore[misc]


_track(jobfence.Locks)
_track(jobfence.AsyncLocks)


def _renewer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("jobfence-renewer")}


def _left_open(client: Any) -> bool:
    return not client.closed or client._renewer.running


@pytest.fixture(autouse=True)
def _no_leaked_lock_clients() -> Iterator[None]:
    before = weakref.WeakSet(_CLIENTS)
    threads = _renewer_threads()
    yield
    leaked = [c for c in list(_CLIENTS) if c not in before and _left_open(c)]
    for client in leaked:  # stop what can be stopped, so the next tests start clean
        if isinstance(client, jobfence.Locks) and not client.closed:
            try:
                client.close()
            except Exception:
                pass
    deadline = time.monotonic() + _GRACE
    running = []
    for thread in _renewer_threads() - threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            running.append(thread.name)
    if not leaked and not running:
        return
    pytest.fail(
        "the test left lock clients open or renewers running (close every Locks/AsyncLocks "
        f"it creates): clients {[repr(c) for c in leaked]}, renewer threads {running}",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def _no_leaked_clock_or_hook() -> Iterator[None]:
    """A test that replaces jobfence's clock or I/O hook must put the real ones back: a fake
    clock left behind freezes every later test's timeouts."""
    from jobfence._core import clock as clock_module
    from jobfence.testing import get_clock, get_hook, set_clock, set_hook

    real = clock_module.Clock
    if type(get_clock()) is not real or get_hook() is not None:  # left by an earlier test
        set_clock(real())
        set_hook(None)
    yield
    leaked = []
    if type(get_clock()) is not real:
        leaked.append(f"the clock ({get_clock()!r})")
        set_clock(real())
    if get_hook() is not None:
        leaked.append(f"the I/O hook ({get_hook()!r})")
        set_hook(None)
    if leaked:
        pytest.fail(f"the test left {' and '.join(leaked)} replaced", pytrace=False)
