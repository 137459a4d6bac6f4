"""Group commit for threads: the blocking twin of :class:`~jobfence._core.groupcommit.GroupCommit`.

Calls made by other threads while one batch's round trip is under way wait for it to end,
then go together in the next one. A lone call is sent at once, by its own thread (no added
latency); under concurrency, N threads pay about one round trip per batch instead of N.
Used by the blocking ``Inbox`` for claims and completions.

There is no background thread: the first caller to find no batch under way becomes the
*sender* and sends the batches, in its own thread, until its own item has been answered;
then it hands the turn to send to the oldest thread still waiting to be sent (which wakes and sends
the next batch) and returns. Nothing is left to a thread that may not exist: a batch is
always sent by a thread that waits for one of its answers, and an instance that nobody uses
holds no thread (so a forked child, which gets fresh instances, inherits none either).

The same rules as ``GroupCommit``:

* Items may carry a ``key``: two items with the same key never go in one batch (the later one
  waits for the next), so a backend's batch statement may assume distinct keys.
* A flush that raises fails every item of its batch with that exception; one that answers
  gives each item its own result, in order.
* Threads cannot be cancelled, but a thread can be interrupted (``KeyboardInterrupt`` in the
  main thread, or any exception raised into it). One interrupted while its item waits to be
  sent withdraws it (nothing was sent, there is nothing to undo) and, if the turn to send had just
  been handed to it, hands it on. One interrupted while its item is being sent waits for the
  answer before the interruption is raised, so that whatever it does to undo the call
  (release a claim it may have got) comes after the call, never before it. A sender
  interrupted in the middle of a flush fails every item of that batch (their outcome is
  unknown, as after a lost reply) and raises the interruption; the turn to send passes on, so that
  nothing else waits for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from .groupcommit import DEFAULT_LIMIT, take_batch

__all__ = ["BatchInterrupted", "ThreadGroupCommit"]

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")


class BatchInterrupted(RuntimeError):
    """The thread sending a batch was interrupted before the batch's answer came: the items
    of that batch may or may not have been applied."""


class _Entry(Generic[I, R]):
    __slots__ = ("done", "error", "item", "key", "result", "sending", "sent", "waiter")

    def __init__(self, item: I, key: Hashable | None) -> None:
        self.item = item
        self.key = key
        #: held until the entry is answered or handed the turn to send (a lock: the cheapest
        #: wake-up)
        self.waiter = threading.Lock()
        self.waiter.acquire()
        self.sent = False  # taken into a batch
        self.done = False  # answered: ``result`` or ``error`` is set
        self.sending = False  # its thread holds the turn to send (it started it, or was handed it)
        self.result: R | None = None
        self.error: BaseException | None = None


class ThreadGroupCommit(Generic[I, R]):
    """Send items through ``flush(items) -> results`` (one result per item, in order), one
    batch at a time, at most ``limit`` items per batch, from any number of threads."""

    def __init__(
        self,
        flush: Callable[[list[I]], Sequence[R]],
        *,
        limit: int = DEFAULT_LIMIT,
        name: str = "jobfence-group-commit",
    ) -> None:
        self._flush = flush
        self._limit = limit
        self.name = name
        self._mutex = threading.Lock()
        #: items not sent yet, oldest first (a withdrawn one is removed)
        self._pending: list[_Entry[I, R]] = []
        #: a thread is sending batches, or has been handed the turn to send and is waking up
        self._sending = False
        #: round trips made and items sent (for tests and benchmarks)
        self.flushes = 0
        self.items = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} flushes={self.flushes} items={self.items}>"

    def submit(self, item: I, key: Hashable | None = None) -> R:
        """Send ``item`` in the next batch and return its result."""
        entry: _Entry[I, R] = _Entry(item, key)
        with self._mutex:
            self._pending.append(entry)
            if not self._sending:
                self._sending = entry.sending = True
        try:
            if not entry.sending:
                entry.waiter.acquire()  # answered, or handed the turn to send
            if entry.sending:
                self._send_batches(entry)
        except BaseException:
            self._interrupted(entry)
            raise
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]

    def _send_batches(self, own: _Entry[I, R]) -> None:
        """Send batches until ``own`` has been answered, then hand the turn to send on."""
        batch: list[_Entry[I, R]] = []
        try:
            while not own.done:
                with self._mutex:
                    batch = self._take()
                if not batch:  # (cannot happen: own is pending, and this thread sends)
                    raise RuntimeError("the group commit lost track of a pending item")
                self._send(batch)
                batch = []
        finally:
            with self._mutex:
                # interrupted between taking a batch and sending it: nobody will answer it
                for entry in batch:
                    if not entry.done:
                        entry.error = BatchInterrupted(
                            "the thread sending this batch was interrupted before sending it"
                        )
                        entry.done = True
                        entry.waiter.release()
                if not own.sent:  # interrupted before its own item went: withdraw it
                    self._remove(own)
                own.sending = False
                self._hand_on()

    def _send(self, batch: list[_Entry[I, R]]) -> None:
        """One round trip for ``batch``; every entry of it is answered (or failed) and its
        thread woken. An interruption of this thread is raised after that."""
        items = [entry.item for entry in batch]
        self.flushes += 1
        self.items += len(items)
        try:
            results = self._flush(items)
            if len(results) != len(items):
                raise RuntimeError(f"a batch of {len(items)} got {len(results)} answers")
        except Exception as exc:
            self._answer(batch, None, exc)
            return
        except BaseException as exc:
            failed = BatchInterrupted(
                f"the thread sending this batch was interrupted ({type(exc).__name__}) "
                "before its answer came"
            )
            failed.__cause__ = exc
            self._answer(batch, None, failed)
            raise
        self._answer(batch, results, None)

    def _answer(
        self,
        batch: list[_Entry[I, R]],
        results: Sequence[R] | None,
        error: BaseException | None,
    ) -> None:
        with self._mutex:
            for i, entry in enumerate(batch):
                if results is not None:
                    entry.result = results[i]
                else:
                    entry.error = error
                entry.done = True
                entry.waiter.release()

    def _take(self) -> list[_Entry[I, R]]:
        """The next batch (under the mutex): up to ``limit`` pending items with distinct
        keys, oldest first."""
        batch, self._pending = take_batch(self._pending, self._limit)
        for entry in batch:
            entry.sent = True
        return batch

    def _hand_on(self) -> None:
        """(Under the mutex.) Hand the turn to send to the oldest waiting thread (it wakes and
        sends), or end the turn."""
        if self._pending:
            nxt = self._pending[0]
            nxt.sending = True
            nxt.waiter.release()
        else:
            self._sending = False

    def _remove(self, entry: _Entry[I, R]) -> None:
        try:
            self._pending.remove(entry)
        except ValueError:
            pass

    def _interrupted(self, entry: _Entry[I, R]) -> None:
        """The thread of ``entry`` was interrupted: withdraw its item if it was not sent, and
        hand on the turn to send if it holds it (it was handed the turn, or started to send,
        but was interrupted before sending); if its item was sent, wait for the batch's
        answer."""
        with self._mutex:
            if entry.done:
                return
            if not entry.sent:
                self._remove(entry)
            if entry.sending:  # (a sender's own _send_batches hands on the turn and clears this)
                entry.sending = False
                self._hand_on()
            if not entry.sent:
                return
        # being sent by another thread: its flush is bounded by its backend's timeout
        while True:
            try:
                entry.waiter.acquire()
                return
            except BaseException:  # interrupted again: still wait, raise the first one
                continue
