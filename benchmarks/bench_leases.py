#!/usr/bin/env python3
"""Many live leases on one client: memory per lease and renewal round trips per tick.

For each backend, one ``AsyncLocks`` client takes ``--leases`` leases (distinct names,
``renew=True``, a long ttl, taken 50 at a time) and keeps them:

* memory: the Python heap the client grew by while taking them, measured with ``tracemalloc``
  (started after a warm-up lease, so connections and scripts are already there; the list
  holding the leases, 8 bytes a lease, is included), divided by the number of leases;
* renewal: the client's clock (``jobfence.testing``) is moved on by a third of the ttl, which
  makes every lease due at once, and the backend calls of the renewer are counted with the
  I/O hook (point ``lock.renew``; each is one batched backend call) until every lease has been
  renewed: round trips per renewal tick, and leases renewed per round trip.

Usage: ``python benchmarks/bench_leases.py [--leases 10000] [--only redis,postgres,sqlite]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.servers import POSTGRES_URL, REDIS_URL

import jobfence
from jobfence.testing import Clock, clocked, hooked

TTL = 600.0
"""The leases' ttl: long enough that taking them all never outlasts it."""

BATCH = 50
"""Leases taken at once."""


class MovableClock(Clock):
    """Real time plus an offset the benchmark moves on; waits last at most 50 ms, so a
    renewer notices a move at once."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        return await super().wait_async(event, min(timeout, 0.05))


@dataclass
class Measured:
    """One backend's figures for ``leases`` live leases on one client."""

    backend: str
    leases: int
    bytes_per_lease: float
    acquire_seconds: float
    ticks: int  # renewer wake-ups that renewed something
    round_trips: int  # backend renewal calls (lock.renew)
    renewed: int  # leases renewed by those calls

    @property
    def trips_per_tick(self) -> float:
        return self.round_trips / self.ticks if self.ticks else float("nan")


async def _measure(backend: str, url: str, leases: int, cleanup: Callable[[str], None]) -> Measured:
    ns = "bench" + uuid.uuid4().hex[:8]
    clock = MovableClock()
    calls: list[int] = []

    def count(point: str, **info: Any) -> None:
        if point == "lock.renew":
            calls.append(len(info.get("names", ())))

    with clocked(clock):
        locks = jobfence.AsyncLocks(url, namespace=ns)
        try:
            warm = await locks.try_acquire("warm-up", ttl=TTL)
            assert warm is not None
            held: list[Any] = [warm]
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            started = time.perf_counter()
            for first in range(0, leases, BATCH):
                names = [f"lease-{i}" for i in range(first, min(first + BATCH, leases))]
                got = await asyncio.gather(*(locks.try_acquire(n, ttl=TTL) for n in names))
                if any(lease is None for lease in got):
                    raise RuntimeError("a lease was not taken")
                held.extend(got)
            acquire_seconds = time.perf_counter() - started
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            with hooked(count):
                clock.offset += TTL / 3 + 1  # every lease is due now
                deadline = time.monotonic() + max(60.0, acquire_seconds * 4)
                while sum(calls) < len(held) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                renewed_at = len(calls)
                await asyncio.sleep(0.3)  # a tick that split its batch would go on here
                round_trips = len(calls)
            if sum(calls) < len(held):
                raise RuntimeError(f"only {sum(calls)} of {len(held)} leases were renewed")
            # the renewer's wake-ups that renewed something: all of them in one tick unless
            # more calls came after the one that completed the renewal
            ticks = 1 if round_trips == renewed_at else 2
            for first in range(0, len(held), BATCH):
                await asyncio.gather(*(lease.release() for lease in held[first : first + BATCH]))
        finally:
            await locks.close()
            cleanup(ns)
    return Measured(
        backend, leases, grown / leases, acquire_seconds, ticks, round_trips, sum(calls)
    )


def _redis_cleanup(ns: str) -> None:
    from bench_redis_locks import _cleanup

    _cleanup(REDIS_URL, ns)


def _postgres_cleanup(ns: str) -> None:
    from bench_sql_locks import _cleanup

    _cleanup(POSTGRES_URL, ns)


async def measure_redis(leases: int) -> Measured:
    return await _measure("Redis", REDIS_URL, leases, _redis_cleanup)


async def measure_postgres(leases: int) -> Measured:
    return await _measure("PostgreSQL (lease mode)", POSTGRES_URL, leases, _postgres_cleanup)


async def measure_sqlite(leases: int) -> Measured:
    tmp = tempfile.mkdtemp(prefix="jobfence-bench-")
    try:
        return await _measure("SQLite", f"sqlite:///{tmp}/leases.db", leases, lambda ns: None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


MEASURES: dict[str, Callable[[int], Awaitable[Measured]]] = {
    "redis": measure_redis,
    "postgres": measure_postgres,
    "sqlite": measure_sqlite,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--only", default=",".join(MEASURES))
    args = parser.parse_args()
    for name in args.only.split(","):
        m = asyncio.run(MEASURES[name.strip()](args.leases))
        print(
            f"{m.backend}: {m.leases} leases taken in {m.acquire_seconds:.1f} s; "
            f"{m.bytes_per_lease:.0f} bytes per lease (tracemalloc); one renewal: "
            f"{m.round_trips} round trip(s) in {m.ticks} tick(s), {m.renewed} leases renewed"
        )


if __name__ == "__main__":
    main()
