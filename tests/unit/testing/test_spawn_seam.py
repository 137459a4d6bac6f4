"""_core.compat's spawner seam: what the sync code paths do with and without a spawner."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobfence._core import compat


class _Recorder:
    """A spawner that starts nothing: it keeps what it was given, and says whether the
    calling thread is controlled (``controlled``)."""

    def __init__(self, controlled: bool, take: bool = True) -> None:
        self.controlled = controlled
        self.take = take
        self.spawned: list[tuple[Callable[[], Any], str, Callable[[], None] | None]] = []
        self.waits: list[float] = []
        self.joins: list[threading.Thread] = []

    def spawn(
        self, fn: Callable[[], Any], name: str, abandon: Callable[[], None] | None
    ) -> threading.Thread | None:
        if not self.take:
            return None
        self.spawned.append((fn, name, abandon))
        return threading.Thread(target=fn, name=name)  # never started: the "simulation's"

    def controls(self) -> bool:
        return self.controlled

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.waits.append(timeout)
        return event.is_set()

    def join(self, worker: threading.Thread, timeout: float) -> bool:
        self.joins.append(worker)
        return True


@pytest.fixture
def install() -> Iterator[Callable[[compat.Spawner | None], None]]:
    before = compat._spawner

    def put(spawner: compat.Spawner | None) -> None:
        compat.set_spawner(spawner)

    yield put
    compat.set_spawner(before)


def test_without_a_spawner_threads_are_plain_daemon_threads() -> None:
    assert compat._spawner is None
    ran = threading.Event()
    thread = compat.spawn(ran.set, "plain")
    compat.join(thread, 5)
    assert ran.is_set() and thread.daemon and not thread.is_alive()


def test_set_spawner_returns_the_previous_one(install: Any) -> None:
    first, second = _Recorder(False), _Recorder(False)
    install(first)
    assert compat.set_spawner(second) is first
    assert compat.set_spawner(None) is second


def test_a_spawner_that_declines_gets_a_plain_thread(install: Any) -> None:
    spawner = _Recorder(controlled=False, take=False)
    install(spawner)
    ran = threading.Event()
    thread = compat.spawn(ran.set, "declined")
    thread.join(5)
    assert ran.is_set() and spawner.spawned == []


def test_a_spawned_thread_goes_to_the_spawner_and_its_join_too(install: Any) -> None:
    spawner = _Recorder(controlled=True)
    install(spawner)
    ran = threading.Event()
    thread = compat.spawn(ran.set, "renewer")
    assert [(name, abandon) for _, name, abandon in spawner.spawned] == [("renewer", None)]
    assert not ran.is_set()  # the spawner runs it, when it wants
    thread.start()  # as the spawner would: then join goes through it
    thread.join(5)
    alive = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    alive.start()
    compat.join(alive, 5)
    assert spawner.joins == [alive]  # handled by the spawner: no real join of 5 s


def test_a_background_call_the_spawner_never_runs_is_cancelled_and_untracked(
    install: Any,
) -> None:
    spawner = _Recorder(controlled=False)
    install(spawner)
    tracked: set[Any] = set()
    future = compat.start(lambda: 1, tracked, "give-back")
    [(_, _, abandon)] = spawner.spawned
    assert abandon is not None and not future.done() and tracked == {future}
    abandon()  # its process died before it ran
    assert future.cancelled() and tracked == set()
    done, _ = concurrent.futures.wait([future], timeout=0)  # waiters are told, too
    assert done == {future}


def test_waits_of_a_controlled_thread_go_to_the_spawner(install: Any) -> None:
    spawner = _Recorder(controlled=True)
    install(spawner)
    pending: concurrent.futures.Future[Any] = concurrent.futures.Future()
    assert compat.wait_done(pending, 7) is False
    compat.wait_all({pending}, 3)
    finished: concurrent.futures.Future[Any] = concurrent.futures.Future()
    finished.set_result(1)
    compat.wait_all({finished}, 4)  # all done already: no wait at all
    assert spawner.waits == [7, 3]


def test_a_bounded_call_runs_in_a_controlled_thread_itself(install: Any) -> None:
    caller = compat.BoundedCaller("test")
    try:
        install(_Recorder(controlled=True))
        assert caller.call(threading.get_ident, 1) == threading.get_ident()
        install(_Recorder(controlled=False, take=False))
        assert caller.call(threading.get_ident, 5) != threading.get_ident()  # a worker's
    finally:
        caller.close()
    with pytest.raises(RuntimeError, match="closed"):
        install(_Recorder(controlled=True))
        caller.call(threading.get_ident, 1)
