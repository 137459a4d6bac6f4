#!/usr/bin/env python3
"""Walk one lease through jobfence's code and count the source files it passes through.

What runs (asyncio, on the real PostgreSQL at ``postgresql://127.0.0.1:5432/test`` unless
``--url`` says otherwise, namespace ``jobfence_walk``):

1. ``await AsyncLocks(...).acquire("walk", ttl=30)`` takes a free lease;
2. the client's renewer renews it once in the background;
3. at its second renewal, just before the batched renewal is sent (the I/O hook's
   ``lock.renew`` call), another connection deletes the lease's row, so that renewal finds
   the lease gone and the lease is marked lost (its ``on_lost`` callback runs);
4. ``fence_async`` records the lease's token for a resource in a transaction on another
   connection (rolled back).

A clock of the script's own (``jobfence.testing.set_clock``) makes the walk deterministic:
the renewer's pause between checks ends when the script says so, and time moves by the pause
(so the renewals happen at once, on cue, and the renewer does nothing else meanwhile; it
looks at its lease once a (simulated) second, about ten times before each renewal). The
clock, the hook and the row deletion are script code, not jobfence code.

What it counts: ``sys.setprofile`` is on from just before ``acquire`` to just after
``fence_async`` returns, in the event loop's thread (everything above runs there: the
renewer is a task, the backend uses psycopg's asyncio connections). Every ``call`` and
``return`` event of a Python frame whose code is in a file of the ``jobfence`` package is
recorded with that file (coroutine resumptions and suspensions are ``call`` / ``return``
events too; C functions and frames of other packages are not recorded). It prints

* the jobfence files entered, in the order of their first ``call`` event;
* the number of distinct files;
* the number of file boundaries crossed: how often two successive recorded events are in
  different jobfence files (a call from one file into another and its return each count
  once; calls through non-jobfence code in between are not seen).

Usage: ``PYTHONPATH=src python tools/lease_walk.py [--url URL] [--events]``; to measure
another tree, point ``PYTHONPATH`` at its ``src``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import jobfence
from jobfence.fencing_async import fence_async, install_async
from jobfence.locks_async import AsyncLocks
from jobfence.testing import Clock, set_clock, set_hook

NAMESPACE = "jobfence_walk"
NAME = "walk"
PACKAGE = Path(jobfence.__file__).resolve().parent


class CueClock(Clock):
    """Real wall-clock time; monotonic time that moves only by the waits it ends. A wait
    for an event that is not set tells the script it is waiting (``idle``) and ends when
    the event is set, or when the script calls :meth:`step` (time then moves by the wait's
    timeout)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.idle = asyncio.Event()
        self._go = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    async def asleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        raise AssertionError("no sync waits in an asyncio walk")

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self.idle.set()
        woken = asyncio.ensure_future(event.wait())
        go = asyncio.ensure_future(self._go.wait())
        await asyncio.wait({woken, go}, return_when=asyncio.FIRST_COMPLETED)
        woken.cancel()
        go.cancel()
        if self._go.is_set():
            self._go.clear()
            self.now += max(0.0, timeout)
        return event.is_set()

    async def settle(self) -> None:
        """Wait until something (the renewer) waits on the clock."""
        await self.idle.wait()
        self.idle.clear()

    async def step(self) -> None:
        """End the wait going on, and wait until the next one begins."""
        self._go.set()
        await self.settle()


class Recorder:
    """The profile function: the jobfence file of every call and return event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._files: dict[str, str | None] = {}

    def _jobfence_file(self, filename: str) -> str | None:
        known = self._files.get(filename, "")
        if known != "":
            return known
        path = Path(filename).resolve()
        rel = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None
        self._files[filename] = rel
        return rel

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        rel = self._jobfence_file(frame.f_code.co_filename)
        if rel is not None:
            self.events.append((event, rel))

    def report(self, show_events: bool) -> None:
        entered: list[str] = []
        for event, rel in self.events:
            if event == "call" and rel not in entered:
                entered.append(rel)
        crossings = sum(
            1 for (_, a), (_, b) in zip(self.events, self.events[1:], strict=False) if a != b
        )
        print(f"jobfence: {PACKAGE}")
        print("files entered, in order:")
        for rel in entered:
            print(f"  {rel}")
        print(f"distinct files: {len(entered)}")
        print(f"file boundaries crossed: {crossings}")
        print(f"events recorded: {len(self.events)}")
        if show_events:
            for event, rel in self.events:
                print(f"  {event:6} {rel}")


async def walk(url: str, show_events: bool) -> None:
    clock = CueClock()
    set_clock(clock)
    lost = asyncio.Event()
    renewals = 0

    # the other connections: one deletes the lease's row, one writes under the fence
    thief = psycopg.connect(url, autocommit=True)
    writer = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await install_async(writer)
    writer_tx = await psycopg.AsyncConnection.connect(url)

    def hook(point: str, **info: Any) -> None:
        nonlocal renewals
        if point == "lock.renew" and NAME in info.get("names", ()):
            renewals += 1
            if renewals == 2:  # steal it: this renewal finds the lease gone
                thief.execute(f"DELETE FROM {NAMESPACE}_locks WHERE name = %s", (NAME,))

    locks = AsyncLocks(url, namespace=NAMESPACE)
    await locks.install()
    await locks.force_release(NAME)
    set_hook(hook)
    recorder = Recorder()
    sys.setprofile(recorder)
    try:
        lease = await locks.acquire(NAME, ttl=30.0)
        lease.on_lost(lambda _lease: lost.set())
        await clock.settle()  # the renewer's first look: nothing due yet
        # its pauses last at most a second (IDLE_WAIT): step through them to the renewals
        while renewals < 1:
            await clock.step()  # ... to the first renewal, which ends before the next pause
        while not lost.is_set():
            await clock.step()  # ... to the second, which finds the lease gone
        async with writer_tx.transaction(force_rollback=True):
            await fence_async(writer_tx, "walk-resource", lease.token)
    finally:
        sys.setprofile(None)
        set_hook(None)
    assert renewals == 2 and lease.lost, (renewals, lease)
    await locks.close()
    thief.close()
    await writer.close()
    await writer_tx.close()
    recorder.report(show_events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("LEASE_WALK_URL", ""))
    parser.add_argument("--events", action="store_true", help="also print every event")
    args = parser.parse_args()
    url = args.url or "postgresql://127.0.0.1:5432/test"
    asyncio.run(walk(url, args.events))


if __name__ == "__main__":
    main()
