#!/usr/bin/env python3
"""Redis locks: jobfence against a hand-written lock and redis-py's ``Lock``, in one run.

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written ``SET key token NX PX`` + ``EVALSHA`` compare-and-delete (the baseline)
  (b) redis-py ``Lock``: ``acquire(blocking=False)`` + ``release()``
  (c) jobfence ``Locks.try_acquire()`` + ``release()`` (renew=True, the default)
  (d) the same with ``renew=False``
  (e) jobfence ``AsyncLocks`` (renew=True), and (f) the hand-written lock on ``redis.asyncio``

Contended hand-off: 4 processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
quarter). jobfence (``acquire``, fair FIFO hand-off) against redis-py ``Lock(blocking=True)``,
and, as a reference for what the machine allows, one process running the same loop alone
(no contention: every cycle is sleep + release + acquire, one after the other).

Usage: ``python benchmarks/bench_redis_locks.py [--url redis://127.0.0.1:6379/0]
[--rounds 31] [--ops 400] [--seconds 3] [--workers 4]``
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

import jobfence

DELETE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
TTL = 30


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> Callable[[int], None]:
    r = redis.Redis.from_url(url)
    delete = r.register_script(DELETE_IF_OWNER)
    key = f"{ns}:hand"

    def run(n: int) -> None:
        for _ in range(n):
            token = uuid.uuid4().hex
            if not r.set(key, token, nx=True, px=TTL * 1000):
                raise RuntimeError("hand-written lock not acquired")
            if not delete(keys=[key], args=[token]):
                raise RuntimeError("hand-written lock not released")

    return run


def redis_py_lock(url: str, ns: str) -> Callable[[int], None]:
    r = redis.Redis.from_url(url)
    key = f"{ns}:redis-py"

    def run(n: int) -> None:
        for _ in range(n):
            lock = r.lock(key, timeout=TTL)
            if not lock.acquire(blocking=False):
                raise RuntimeError("redis-py lock not acquired")
            lock.release()

    return run


def jobfence_sync(url: str, ns: str, renew: bool) -> Callable[[int], None]:
    locks = jobfence.Locks(url, namespace=ns)
    name = f"jobfence-{renew}"

    def run(n: int) -> None:
        for _ in range(n):
            lease = locks.try_acquire(name, ttl=TTL, renew=renew)
            if lease is None:
                raise RuntimeError("jobfence lock not acquired")
            if not lease.release():
                raise RuntimeError("jobfence lock not released")

    return run


_CLOSERS: list[Callable[[], Any]] = []


def jobfence_async(url: str, ns: str, loop: asyncio.AbstractEventLoop) -> Callable[[int], None]:
    locks = loop.run_until_complete(_make_async_locks(url, ns))
    _CLOSERS.append(lambda: loop.run_until_complete(locks.close()))

    async def body(n: int) -> None:
        for _ in range(n):
            lease = await locks.try_acquire("jobfence-async", ttl=TTL)
            if lease is None:
                raise RuntimeError("jobfence async lock not acquired")
            if not await lease.release():
                raise RuntimeError("jobfence async lock not released")

    return lambda n: loop.run_until_complete(body(n))


async def _make_async_locks(url: str, ns: str) -> jobfence.AsyncLocks:
    return jobfence.AsyncLocks(url, namespace=ns)


def hand_written_async(url: str, ns: str, loop: asyncio.AbstractEventLoop) -> Callable[[int], None]:
    r = redis.asyncio.Redis.from_url(url)
    delete = r.register_script(DELETE_IF_OWNER)
    key = f"{ns}:hand-async"

    async def body(n: int) -> None:
        for _ in range(n):
            token = uuid.uuid4().hex
            if not await r.set(key, token, nx=True, px=TTL * 1000):
                raise RuntimeError("hand-written async lock not acquired")
            if not await delete(keys=[key], args=[token]):
                raise RuntimeError("hand-written async lock not released")

    return lambda n: loop.run_until_complete(body(n))


def uncontended(url: str, rounds: int, ops: int) -> list[tuple[str, float]]:
    ns = "bench" + uuid.uuid4().hex[:8]
    loop = asyncio.new_event_loop()
    variants: list[tuple[str, Callable[[int], None]]] = [
        ("(a) hand-written SET NX PX + EVALSHA delete", hand_written(url, ns)),
        ("(b) redis-py Lock", redis_py_lock(url, ns)),
        ("(c) jobfence Locks, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence AsyncLocks, renew=True", jobfence_async(url, ns, loop)),
        ("(f) hand-written on redis.asyncio", hand_written_async(url, ns, loop)),
    ]
    for _, run in variants:  # warm up: connect, load scripts
        run(max(50, ops // 20))
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    for i in range(rounds):
        order = variants[i % len(variants) :] + variants[: i % len(variants)]
        for label, run in order:
            started = time.perf_counter()
            run(ops)
            samples[label].append((time.perf_counter() - started) / ops * 1e6)
    for close in _CLOSERS:
        close()
    loop.run_until_complete(asyncio.sleep(0.01))  # let the renewer task finish
    loop.close()
    _cleanup(url, ns)
    return [(label, statistics.median(samples[label])) for label, _ in variants]


# -- contended hand-off -----------------------------------------------------------------------
def _worker(kind: str, url: str, ns: str, seconds: float, start: Any, ready: Any, out: Any) -> None:
    count = 0
    if kind == "jobfence":
        locks = jobfence.Locks(url, namespace=ns)
        ready.put(1)
        start.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            with locks.acquire("contended", ttl=10, timeout=30):
                time.sleep(0.001)
                count += 1
        locks.close()
    else:
        sleep = 0.1 if kind == "redis-py" else 0.001
        r = redis.Redis.from_url(url)
        ready.put(1)
        start.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            with r.lock(f"{ns}:contended", timeout=10, sleep=sleep, blocking_timeout=30):
                time.sleep(0.001)
                count += 1
        r.close()
    out.put(count)


def contended(url: str, kind: str, workers: int, seconds: float) -> tuple[float, list[float]]:
    ns = "bench" + uuid.uuid4().hex[:8]
    ctx = mp.get_context("spawn")
    start, ready, out = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(kind, url, ns, seconds, start, ready, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    start.set()
    counts = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(30)
    _cleanup(url, ns)
    total = sum(counts)
    fair = total / workers if total else 1
    return total / seconds, sorted((c / fair for c in counts), reverse=True)


def sleep_cost() -> float:
    n = 200
    started = time.perf_counter()
    for _ in range(n):
        time.sleep(0.001)
    return (time.perf_counter() - started) / n


def _cleanup(url: str, ns: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip-contended", action="store_true")
    args = parser.parse_args()

    info = redis.Redis.from_url(args.url).info("server")
    print(
        f"Redis {info['redis_version']} at {args.url}; redis-py {redis.__version__}; "
        f"{os.cpu_count()} CPUs; {args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    rows = uncontended(args.url, args.rounds, args.ops)
    base = rows[0][1]
    async_base = rows[5][1]
    table: list[tuple[str, str, str]] = []
    for label, us in rows:
        ratio = f"{us / base:.2f}x"
        if label.startswith("(e)"):
            ratio += f" ({us / async_base:.2f}x of (f))"
        table.append((label, f"{us:.1f}", ratio))
    _print_table("Uncontended acquire+release", ("variant", "µs/op", "vs (a)"), table)

    if args.skip_contended:
        return
    per_sleep = sleep_cost()
    sleep_ideal = 1 / per_sleep
    crows: list[tuple[str, str, str, str, str]] = []
    solo, _ = contended(args.url, "jobfence", 1, args.seconds)
    crows.append(
        (
            "(reference) jobfence, 1 process alone: the same loop without contention",
            f"{solo:.0f}",
            f"{solo / 1000:.0%}",
            f"{solo / sleep_ideal:.0%}",
            "-",
        )
    )
    for kind, label in (
        ("jobfence", "jobfence Locks.acquire (FIFO hand-off)"),
        ("redis-py", "redis-py Lock(blocking=True), sleep=0.1 (default)"),
        ("redis-py-fast", "redis-py Lock(blocking=True), sleep=0.001"),
    ):
        rate, shares = contended(args.url, kind, args.workers, args.seconds)
        crows.append(
            (
                label,
                f"{rate:.0f}",
                f"{rate / 1000:.0%}",
                f"{rate / sleep_ideal:.0%}",
                " ".join(f"{s:.2f}" for s in shares),
            )
        )
    _print_table(
        f"Contended: {args.workers} processes, 1 ms critical sections, {args.seconds:g} s "
        f"(sleep(0.001) takes {per_sleep * 1000:.3f} ms here: ideal {sleep_ideal:.0f}/s)",
        ("variant", "ops/s", "of 1000/s", "of sleep-ideal", "worker shares (1.00 = fair)"),
        crows,
    )


def _print_table(title: str, header: tuple[str, ...], rows: list[Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        print(f"\n{title}")
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
