"""Group commit for asyncio clients: calls made while one round trip is under way wait for it
to end, then go together in the next one.

A lone call is sent at once (no added latency); under concurrency, N callers pay about one
round trip per batch instead of N. :class:`GroupCommit` is used by ``AsyncQueue`` for acks
and by ``AsyncInbox`` for claims and completions.

* Items may carry a ``key``: two items with the same key never go in one batch (the later one
  waits for the next), so a backend's batch statement may assume distinct keys.
* A flush that raises fails every item of its batch with that exception; one that answers
  gives each item its own result, in order.
* A caller cancelled while its item waits to be sent withdraws it (``withdraw=True``: nothing
  was sent, there is nothing to undo) or leaves it to be sent (``withdraw=False``). A caller
  cancelled while its item is being sent waits for the answer before the cancellation is
  raised, so that whatever it does to undo the call (release a claim it may have got) comes
  after the call, never before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["GroupCommit", "take_batch"]

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")

#: items per batch unless told otherwise
DEFAULT_LIMIT = 64


class _Entry(Generic[I, R]):
    __slots__ = ("batch", "future", "item", "key", "withdrawn")

    def __init__(self, item: I, key: Hashable | None, future: asyncio.Future[R]) -> None:
        self.item = item
        self.key = key
        self.future = future
        #: once sent: a future of its batch, done when the batch has been answered
        self.batch: asyncio.Future[None] | None = None
        self.withdrawn = False


class GroupCommit(Generic[I, R]):
    """Send items through ``flush(items) -> results`` (one result per item, in order), one
    batch at a time, at most ``limit`` items per batch."""

    def __init__(
        self,
        flush: Callable[[list[I]], Awaitable[Sequence[R]]],
        *,
        limit: int = DEFAULT_LIMIT,
        withdraw: bool = True,
        name: str = "jobfence-group-commit",
    ) -> None:
        self._flush = flush
        self._limit = limit
        self._withdraw = withdraw
        self._name = name
        self._pending: list[_Entry[I, R]] = []
        self._task: asyncio.Task[None] | None = None
        #: round trips made and items sent (for tests and benchmarks)
        self.flushes = 0
        self.items = 0

    async def submit(self, item: I, key: Hashable | None = None) -> R:
        """Send ``item`` in the next batch and return its result."""
        loop = asyncio.get_running_loop()
        entry: _Entry[I, R] = _Entry(item, key, loop.create_future())
        self._pending.append(entry)
        if self._task is None:
            self._task = loop.create_task(self._run(), name=self._name)
        try:
            return await entry.future
        except asyncio.CancelledError:
            # (the caller's cancellation cancelled entry.future: its answer is not needed, as
            # the caller undoes whatever the call did, once the call is over)
            if entry.batch is None:
                if self._withdraw:
                    entry.withdrawn = True  # never sent
                raise
            await _wait_uncancelled(entry.batch)
            raise

    async def _run(self) -> None:
        batch: list[_Entry[I, R]] = []
        done: asyncio.Future[None] | None = None
        try:
            while self._pending:
                done = asyncio.get_running_loop().create_future()
                batch = self._take(done)
                if not batch:
                    done.set_result(None)
                    continue
                items = [entry.item for entry in batch]
                self.flushes += 1
                self.items += len(items)
                try:
                    results = await self._flush(items)
                    if len(results) != len(items):
                        raise RuntimeError(f"a batch of {len(items)} got {len(results)} answers")
                except Exception as exc:
                    for entry in batch:
                        if not entry.future.done():
                            entry.future.set_exception(exc)
                    done.set_result(None)
                    continue
                for entry, result in zip(batch, results, strict=True):
                    if not entry.future.done():
                        entry.future.set_result(result)
                done.set_result(None)
        finally:
            self._task = None
            if done is not None and not done.done():
                done.set_result(None)
            # only if this task itself was cancelled (its event loop is closing): nobody is
            # left waiting for an answer that will not come
            for entry in [*batch, *self._pending]:
                if not entry.future.done():
                    entry.future.set_exception(
                        RuntimeError("the batch was cut off as its event loop closed")
                    )
            self._pending = []

    def _take(self, done: asyncio.Future[None]) -> list[_Entry[I, R]]:
        """The next batch: up to ``limit`` pending items with distinct keys, oldest first;
        ``done`` is the future of the batch, set when it has been answered."""
        batch, self._pending = take_batch(
            [entry for entry in self._pending if not entry.withdrawn], self._limit
        )
        for entry in batch:
            entry.batch = done
        return batch


class _Keyed(Protocol):
    key: Hashable | None


E = TypeVar("E", bound=_Keyed)


def take_batch(pending: list[E], limit: int) -> tuple[list[E], list[E]]:
    """Split ``pending`` (oldest first) into the next batch, up to ``limit`` entries with
    distinct keys (an entry whose key is ``None`` conflicts with none), and the rest, both
    in their order. Shared by :class:`GroupCommit` and its blocking twin."""
    batch: list[E] = []
    rest: list[E] = []
    keys: set[Hashable] = set()
    for entry in pending:
        if len(batch) >= limit or (entry.key is not None and entry.key in keys):
            rest.append(entry)
            continue
        if entry.key is not None:
            keys.add(entry.key)
        batch.append(entry)
    return batch, rest


async def _wait_uncancelled(future: asyncio.Future[None]) -> None:
    """Wait until ``future`` is done, through any number of cancellations (the flush that
    resolves it is bounded by its backend's timeout)."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
