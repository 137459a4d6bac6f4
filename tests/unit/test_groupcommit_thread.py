"""ThreadGroupCommit: calls made by other threads while a round trip is under way go together
in the next one, sent by one of the waiting threads (no background thread).

The flush here records each batch and waits on an event the test controls, so which items
travel together is decided by the test, not by timing."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from jobfence._core.groupcommit_thread import BatchInterrupted, ThreadGroupCommit

WAIT = 10.0  # bound on every wait of a test (a hang fails the test instead of the run)


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt (or any exception raised into a thread) in a flush."""


class Server:
    """A flush that records its batches and answers each when the test lets it."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.threads: list[str] = []
        self.arrived = threading.Condition()
        self.go = threading.Semaphore(0)
        self.fail: list[BaseException | None] = []  # per batch, in order (None: answer)

    def flush(self, items: list[Any]) -> list[Any]:
        with self.arrived:
            self.batches.append(list(items))
            self.threads.append(threading.current_thread().name)
            n = len(self.batches)
            self.arrived.notify_all()
        assert self.go.acquire(timeout=WAIT), "the test never answered the batch"
        fail = self.fail[n - 1] if len(self.fail) >= n else None
        if fail is not None:
            raise fail
        return [f"done:{item}" for item in items]

    def wait_batches(self, n: int) -> list[Any]:
        """The ``n``-th batch the flush received (waits for it)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.batches) >= n, WAIT)
        return self.batches[n - 1]


def waiting(gc: ThreadGroupCommit[Any, Any], n: int) -> None:
    """Until ``n`` items wait to be sent (their threads are blocked in submit)."""
    deadline = threading.Event()
    for _ in range(int(WAIT / 0.002)):
        with gc._mutex:
            if len(gc._pending) >= n:
                return
        deadline.wait(0.002)
    raise AssertionError(f"{n} items never waited: {gc._pending}")


@pytest.fixture
def pool() -> Any:
    with ThreadPoolExecutor(16, thread_name_prefix="caller") as executor:
        yield executor


def test_a_lone_call_is_sent_at_once_by_its_own_thread() -> None:
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    server.go.release()
    assert gc.submit("a") == "done:a"
    assert server.batches == [["a"]]
    assert server.threads == [threading.current_thread().name]  # no helper thread
    assert (gc.flushes, gc.items) == (1, 1)
    assert not gc._sending and not gc._pending


def test_calls_made_during_a_round_trip_go_together_in_the_next(pool: Any) -> None:
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    first = pool.submit(gc.submit, "a")
    assert server.wait_batches(1) == ["a"]
    later = [pool.submit(gc.submit, x) for x in "bcd"]
    waiting(gc, 3)
    assert len(server.batches) == 1  # b, c, d wait while a's round trip is under way
    server.go.release()
    assert first.result(WAIT) == "done:a"
    assert sorted(server.wait_batches(2)) == ["b", "c", "d"]
    server.go.release()
    assert [f.result(WAIT) for f in later] == ["done:b", "done:c", "done:d"]
    assert (gc.flushes, gc.items) == (2, 4)
    assert not gc._sending and not gc._pending


def test_batches_hold_at_most_limit_items_and_never_one_key_twice(pool: Any) -> None:
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush, limit=3)
    first = pool.submit(gc.submit, "x0", "k0")
    server.wait_batches(1)
    later = [pool.submit(gc.submit, f"x{i}", key) for i, key in enumerate("ABACDE", 1)]
    waiting(gc, 6)
    for _ in range(4):
        server.go.release()
    assert first.result(WAIT) == "done:x0"
    assert [f.result(WAIT) for f in later] == [f"done:x{i}" for i in range(1, 7)]
    for batch in server.batches:
        assert len(batch) <= 3
    # the second "A" never travelled with the first
    assert not any({"x1", "x3"} <= set(batch) for batch in server.batches)
    assert gc.items == 7 and gc.flushes < 7


def test_a_failed_flush_fails_every_item_of_its_batch_and_the_next_call_works(
    pool: Any,
) -> None:
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    boom = ConnectionError("connection closed")
    server.fail = [None, boom]
    first = pool.submit(gc.submit, "a")
    server.wait_batches(1)
    later = [pool.submit(gc.submit, x) for x in "bcd"]
    waiting(gc, 3)
    server.go.release()
    server.go.release()
    assert first.result(WAIT) == "done:a"
    for future in later:
        assert future.exception(WAIT) is boom
    server.go.release()
    assert gc.submit("e") == "done:e"
    assert not gc._sending and not gc._pending


def test_a_sender_interrupted_in_its_flush_fails_the_batch_and_hands_on_the_turn(
    pool: Any,
) -> None:
    """The thread sending a batch is interrupted before its answer: that thread raises the
    interruption, every other item of the batch fails (its outcome is unknown), and the
    items that came meanwhile still go, sent by one of their own threads."""
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    server.go.release()
    assert gc.submit("warm") == "done:warm"
    stop = Interrupt()
    server.fail = [None, None, stop]
    first = pool.submit(gc.submit, "a")
    server.wait_batches(2)
    batched = [pool.submit(gc.submit, x) for x in "bc"]
    waiting(gc, 2)
    server.go.release()  # a answered; b and c go next, sent by b's or c's thread
    assert first.result(WAIT) == "done:a"
    sender = server.wait_batches(3)
    assert sorted(sender) == ["b", "c"]
    after = [pool.submit(gc.submit, x) for x in "de"]
    waiting(gc, 2)
    server.go.release()  # b and c's batch: its sender is interrupted
    outcomes = [f.exception(WAIT) for f in batched]
    assert sum(exc is stop for exc in outcomes) == 1
    others = [exc for exc in outcomes if exc is not stop]
    assert isinstance(others[0], BatchInterrupted) and others[0].__cause__ is stop
    assert sorted(server.wait_batches(4)) == ["d", "e"]  # the turn to send passed on
    server.go.release()
    assert [f.result(WAIT) for f in after] == ["done:d", "done:e"]
    assert not gc._sending and not gc._pending


def _interrupt_main_when(condition: Any) -> threading.Thread:
    """A thread that sends SIGINT to the main thread once ``condition()`` holds."""
    main = threading.main_thread().ident
    assert main is not None

    def run() -> None:
        for _ in range(int(WAIT / 0.002)):
            if condition():
                signal.pthread_kill(main, signal.SIGINT)
                return
            threading.Event().wait(0.002)

    thread = threading.Thread(target=run, name="interrupter")
    thread.start()
    return thread


@pytest.fixture
def in_main_thread() -> Iterator[None]:
    """The test runs in the main thread with Python's own SIGINT handler (a KeyboardInterrupt
    interrupts a wait in the main thread only; pytest-xdist's workers ignore SIGINT, so the
    handler is put in place for the test and the previous one restored after it)."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_call_interrupted_before_it_was_sent_is_withdrawn(
    pool: Any, in_main_thread: None
) -> None:
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    first = pool.submit(gc.submit, "a")
    server.wait_batches(1)
    interrupter = _interrupt_main_when(lambda: len(gc._pending) == 1)
    with pytest.raises(KeyboardInterrupt):
        gc.submit("never")
    interrupter.join()
    assert not gc._pending
    server.go.release()
    assert first.result(WAIT) == "done:a"
    server.go.release()
    assert gc.submit("b") == "done:b"
    assert server.batches == [["a"], ["b"]]  # "never" was never sent
    assert not gc._sending


def test_a_call_interrupted_while_its_batch_is_sent_waits_for_the_answer(
    pool: Any, in_main_thread: None
) -> None:
    """The main thread's item goes in a batch another thread sends; interrupted then, it
    raises only once that batch has been answered (so that its undo comes after the call)."""
    server = Server()
    gc: ThreadGroupCommit[str, str] = ThreadGroupCommit(server.flush)
    first = pool.submit(gc.submit, "a")
    server.wait_batches(1)
    other = pool.submit(gc.submit, "c")  # older than the main thread's: c's thread sends
    waiting(gc, 1)
    handled = threading.Event()
    answered = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        handled.set()
        raise KeyboardInterrupt

    def drive() -> None:
        waiting(gc, 2)
        server.go.release()  # a answered: c's thread sends c and b together
        server.wait_batches(2)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        assert handled.wait(WAIT)
        answered.set()
        server.go.release()

    previous = signal.signal(signal.SIGINT, on_sigint)
    helper = threading.Thread(target=drive, name="driver")
    try:
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            gc.submit("b")
        assert answered.is_set()  # raised after the answer, not before
    finally:
        helper.join()
        signal.signal(signal.SIGINT, previous)
    assert first.result(WAIT) == "done:a"
    assert other.result(WAIT) == "done:c"
    assert sorted(server.batches[1]) == ["b", "c"]
    assert not gc._sending and not gc._pending
