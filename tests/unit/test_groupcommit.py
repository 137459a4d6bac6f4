"""GroupCommit: calls made while a round trip is under way go together in the next one.

The flush here is an asyncio function that records each batch and waits on an event the
test controls, so which items travel together is decided by the test, not by timing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jobfence._core.groupcommit import GroupCommit


class Server:
    """A flush that records its batches and answers each when the test lets it."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.seen = 0  # batches handed to the test by next_batch()
        self.arrived = asyncio.Condition()
        self.go = asyncio.Event()
        self.fail: Exception | None = None

    async def flush(self, items: list[Any]) -> list[Any]:
        async with self.arrived:
            self.batches.append(list(items))
            self.arrived.notify_all()
        await self.go.wait()
        self.go.clear()
        if self.fail is not None:
            raise self.fail
        return [f"done:{item}" for item in items]

    async def next_batch(self) -> list[Any]:
        """The next batch the flush received (waits for it)."""
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.batches) > self.seen)
        self.seen += 1
        return self.batches[self.seen - 1]


async def test_a_lone_call_goes_at_once_and_later_ones_wait_for_the_next_batch() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    first = asyncio.ensure_future(gc.submit("a"))
    assert await server.next_batch() == ["a"]
    later = [asyncio.ensure_future(gc.submit(x)) for x in "bcd"]
    await asyncio.sleep(0)
    assert len(server.batches) == 1  # b, c, d wait while a's round trip is under way
    server.go.set()
    assert await first == "done:a"
    assert await server.next_batch() == ["b", "c", "d"]
    server.go.set()
    assert await asyncio.gather(*later) == ["done:b", "done:c", "done:d"]
    assert (gc.flushes, gc.items) == (2, 4)


async def test_calls_made_together_travel_together_up_to_the_limit() -> None:
    server = Server()
    gc: GroupCommit[int, str] = GroupCommit(server.flush, limit=3)
    calls = [asyncio.ensure_future(gc.submit(i)) for i in range(5)]
    assert await server.next_batch() == [0, 1, 2]
    server.go.set()
    assert await server.next_batch() == [3, 4]
    server.go.set()
    assert await asyncio.gather(*calls) == [f"done:{i}" for i in range(5)]


async def test_two_items_with_one_key_never_share_a_batch() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    calls = [
        asyncio.ensure_future(gc.submit(item, key))
        for item, key in (("k1-a", "k1"), ("k2", "k2"), ("k1-b", "k1"), ("k3", None))
    ]
    assert await server.next_batch() == ["k1-a", "k2", "k3"]
    server.go.set()
    assert await server.next_batch() == ["k1-b"]
    server.go.set()
    assert await asyncio.gather(*calls) == ["done:k1-a", "done:k2", "done:k1-b", "done:k3"]


async def test_a_failed_batch_fails_each_of_its_calls_and_the_next_batch_still_goes() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    first = asyncio.ensure_future(gc.submit("a"))
    await server.next_batch()
    second = asyncio.ensure_future(gc.submit("b"))
    await asyncio.sleep(0)
    server.fail = ConnectionError("reset")
    server.go.set()
    with pytest.raises(ConnectionError):
        await first
    server.fail = None
    assert await server.next_batch() == ["b"]
    server.go.set()
    assert await second == "done:b"


async def test_a_wrong_number_of_answers_fails_the_batch() -> None:
    async def flush(items: list[str]) -> list[str]:
        return ["only one"]

    gc: GroupCommit[str, str] = GroupCommit(flush)
    calls = [asyncio.ensure_future(gc.submit(x)) for x in "ab"]
    for call in calls:
        with pytest.raises(RuntimeError, match="batch of 2 got 1 answers"):
            await call


async def test_a_call_cancelled_before_it_is_sent_is_withdrawn() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    first = asyncio.ensure_future(gc.submit("a"))
    await server.next_batch()
    withdrawn = asyncio.ensure_future(gc.submit("b"))
    kept = asyncio.ensure_future(gc.submit("c"))
    await asyncio.sleep(0)
    withdrawn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await withdrawn
    server.go.set()
    await first
    assert await server.next_batch() == ["c"]  # b was never sent
    server.go.set()
    assert await kept == "done:c"


async def test_without_withdraw_a_cancelled_call_is_still_sent() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush, withdraw=False)
    first = asyncio.ensure_future(gc.submit("a"))
    await server.next_batch()
    cancelled = asyncio.ensure_future(gc.submit("ack"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    server.go.set()
    await first
    assert await server.next_batch() == ["ack"]
    server.go.set()


async def test_a_call_cancelled_in_flight_waits_for_the_answer_before_it_is_cancelled() -> None:
    """Whatever the caller does to undo its call must come after the call: the cancellation
    is raised only once the batch it was sent in has been answered."""
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    call = asyncio.ensure_future(gc.submit("a"))
    await server.next_batch()
    call.cancel()
    await asyncio.sleep(0.01)
    assert not call.done()  # still waiting for the answer it is owed
    call.cancel()  # a second cancellation does not cut the wait short either
    await asyncio.sleep(0.01)
    assert not call.done()
    server.go.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert gc.flushes == 1


async def test_callers_are_not_left_waiting_when_the_flusher_is_cancelled() -> None:
    server = Server()
    gc: GroupCommit[str, str] = GroupCommit(server.flush)
    call = asyncio.ensure_future(gc.submit("a"))
    await server.next_batch()
    later = asyncio.ensure_future(gc.submit("b"))
    await asyncio.sleep(0)
    assert gc._task is not None
    gc._task.cancel()  # as when its event loop closes
    for pending in (call, later):
        with pytest.raises(RuntimeError, match="event loop closed"):
            await pending
    # the next call starts a flusher of its own
    again = asyncio.ensure_future(gc.submit("c"))
    assert await server.next_batch() == ["c"]
    server.go.set()
    assert await again == "done:c"
