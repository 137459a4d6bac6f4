"""What every test must leave behind: no open lock client and no running lease renewer; and
the order in which pytest-xdist workers start the slow tests.

A client a test does not close keeps its renewer (a thread for ``Locks``, a task for
``AsyncLocks``) renewing leases nobody uses, and its leases are reported lost long after the
test, in the middle of other tests' output. So every ``Locks`` / ``AsyncLocks`` created during a
test must be closed by its end (its own fixtures included), and every renewer thread it started
must have stopped; otherwise the test fails (as an error in its teardown) naming what it left.
"""

from __future__ import annotations

import functools
import os
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, every worker starts with its share of the ``slow`` tests (processes
    killed, servers restarted, timeouts waited out: 10-90 s each).

    ``--dist worksteal`` hands worker ``k`` the ``k``-th of equal contiguous chunks of this
    list, and a worker that runs out takes the back half of another's queue. Slow tests left
    in collection order would sit in whichever chunks hold their modules, and one of them
    started last keeps the whole run waiting for it. So the slow tests, a module's kept
    together (its module-scoped fixtures, such as a disposable server, start once for them;
    a module with fast tests too starts them again for those), are dealt to the chunks'
    fronts, the largest groups first to the chunk with the fewest; the other tests keep
    their order. The order is a function of the collection alone, the same in
    every worker, as pytest-xdist requires."""
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker (a pytest it runs
        return  # inherits PYTEST_XDIST_WORKER_COUNT, and keeps its own order)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    groups: dict[str, list[pytest.Item]] = {}
    rest: list[pytest.Item] = []
    for item in items:
        if item.get_closest_marker("slow") is not None:
            groups.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        else:
            rest.append(item)
    if not groups:
        return
    fronts: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(fronts, key=len).extend(group)
    ordered: list[pytest.Item] = []
    left = len(items)
    taken = 0
    for k, front in enumerate(fronts):
        size = left // (workers - k)  # worksteal's first share for the k-th worker
        fill = max(0, size - len(front))
        ordered += front + rest[taken : taken + fill]
        taken += fill
        left -= size
    ordered += rest[taken:]
    assert len(ordered) == len(items)
    items[:] = ordered
