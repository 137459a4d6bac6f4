"""The SQLite FIFO wait queue under cancellation, in-process hand-offs and a racing close
(found in review): no ``database is locked``, no lease stranded with a waiter that left, no
queue bookkeeping left behind."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.testing import set_hook

pytestmark = pytest.mark.timeout(120)


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'locks.db'}"


async def test_cancelled_waiters_never_strand_a_lease(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A waiter cancelled while it reads the lease must leave no half-read SELECT behind: its
    clean-up (leave the queue, give back a lease just handed to it) must work at once."""
    url = _url(tmp_path)
    holder, waiter, other = (jobfence.AsyncLocks(url) for _ in range(3))
    rng = random.Random(7)
    slow: list[tuple[int, float]] = []
    try:
        with caplog.at_level(logging.WARNING, logger="jobfence"):
            for i in range(200):
                held = await holder.acquire("L", ttl=2)
                task = asyncio.create_task(waiter.acquire("L", ttl=2, timeout=30))
                await asyncio.sleep(rng.uniform(0.005, 0.03))  # cancel at varying points
                task.cancel()
                await held.release()  # may hand the lease to the waiter being cancelled
                try:
                    lease = await task
                    await lease.release()
                except asyncio.CancelledError:
                    pass
                started = time.monotonic()
                taken = await other.acquire("L", ttl=2, timeout=10)
                if time.monotonic() - started > 0.5:
                    slow.append((i, time.monotonic() - started))
                await taken.release()
        assert slow == []  # never waited out a stranded lease's ttl
        assert not [r for r in caplog.records if "locked" in r.getMessage()]
    finally:
        for client in (holder, waiter, other):
            await client.close()


async def test_in_process_hand_offs_leave_no_queue_bookkeeping(tmp_path: Path) -> None:
    async with jobfence.AsyncLocks(_url(tmp_path)) as locks:
        for _ in range(20):
            first = await locks.acquire("x", ttl=5)
            second = asyncio.create_task(locks.acquire("x", ttl=5, timeout=5))
            await asyncio.sleep(0.01)  # the second one is queued (no event across clients)
            await first.release()
            await (await second).release()
        assert locks.backend._queued == set()


def test_close_racing_a_waiter_leaves_no_queue_row(tmp_path: Path) -> None:
    """close() took the waiter out of the queue, then the waiter (already past its 'closed?'
    check) queued again: the backend's own close must take that entry out too."""
    url = _url(tmp_path)
    closing, other = jobfence.Locks(url), jobfence.Locks(url)
    held = other.acquire("L", ttl=30)
    waiter_thread: threading.Thread | None = None
    calls = {"acquire": 0}
    parked, resume = threading.Event(), threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.acquire" and threading.current_thread() is waiter_thread:
            calls["acquire"] += 1
            if calls["acquire"] == 3:  # past the closed check, about to queue again
                parked.set()
                resume.wait(10)

    original_cancel = closing.backend.cancel_wait

    def cancel_wait(name: str, owner: str) -> Any:
        result = original_cancel(name, owner)
        if threading.current_thread() is threading.main_thread():  # close() left the queue
            resume.set()
            time.sleep(0.05)  # ... and the waiter queues again meanwhile
        return result

    closing.backend.cancel_wait = cancel_wait  # type: ignore[method-assign]
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["lease"] = closing.acquire("L", ttl=30, timeout=30)
        except jobfence.JobfenceError as exc:
            outcome["error"] = exc

    old = set_hook(hook)
    try:
        waiter_thread = threading.Thread(target=wait)
        waiter_thread.start()
        assert parked.wait(10)
        closing.close()
        waiter_thread.join(10)
    finally:
        set_hook(old)
    conn = sqlite3.connect(tmp_path / "locks.db")
    try:
        assert conn.execute("SELECT count(*) FROM jobfence_lock_queue").fetchone()[0] == 0
    finally:
        conn.close()
    assert "error" in outcome
    assert held.release() is True
    started = time.monotonic()
    taken = other.acquire("L", ttl=30, timeout=10)  # not handed to the closed client's waiter
    assert time.monotonic() - started < 1.0
    taken.release()
    other.close()
