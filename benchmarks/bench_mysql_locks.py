#!/usr/bin/env python3
"""MySQL/MariaDB locks: jobfence against hand-written SQL locks, in one run.

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written lease row: ``INSERT IGNORE`` + owner-checked ``DELETE`` (two autocommit
      statements, like jobfence's two; no expiry, no tokens) -- the baseline
  (b) ``GET_LOCK(name, 0)`` + ``RELEASE_LOCK(name)`` (session lock: nothing is written, no
      commit; no ttl, no tokens -- a lower bound, not a like-for-like comparison)
  (c) jobfence ``Locks.try_acquire()`` + ``release()`` (renew=True, the default)
  (d) the same with ``renew=False``
  (e) jobfence ``AsyncLocks`` (renew=True), and (f) the hand-written pair (a) on aiomysql

Contended hand-off: N processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
quarter). jobfence (default, with its "next in line" waiter) against jobfence with
``next_in_line=0`` (plain polling) and ``GET_LOCK(name, 30)`` (the server's own wait queue).

Usage: ``python benchmarks/bench_mysql_locks.py [--url mysql://root@127.0.0.1:3306/test]
[--rounds 5] [--ops 300] [--seconds 3] [--workers 4]``
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
from urllib.parse import urlsplit

import aiomysql
import pymysql

import jobfence

TTL = 30


def _params(url: str) -> dict[str, Any]:
    u = urlsplit(url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
        "autocommit": True,
        "charset": "utf8mb4",
    }


def _db(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _connect(url: str) -> Any:
    return pymysql.connect(database=_db(url), **_params(url))


def _hand_table(url: str, ns: str) -> str:
    table = f"{ns}_hand"
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{table}` (name VARCHAR(255) PRIMARY KEY, "
            "owner VARCHAR(64) NOT NULL) ENGINE=InnoDB"
        )
    conn.close()
    return table


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> Callable[[int], None]:
    table = _hand_table(url, ns)
    cur = _connect(url).cursor()
    insert = f"INSERT IGNORE INTO `{table}` (name, owner) VALUES (%s, %s)"
    delete = f"DELETE FROM `{table}` WHERE name = %s AND owner = %s"

    def run(n: int) -> None:
        for _ in range(n):
            owner = uuid.uuid4().hex
            if cur.execute(insert, ("hand", owner)) != 1:
                raise RuntimeError("hand-written lock not acquired")
            if cur.execute(delete, ("hand", owner)) != 1:
                raise RuntimeError("hand-written lock not released")

    return run


def get_lock(url: str, ns: str) -> Callable[[int], None]:
    cur = _connect(url).cursor()
    name = f"{ns}:get_lock"

    def run(n: int) -> None:
        for _ in range(n):
            cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
            if cur.fetchone()[0] != 1:
                raise RuntimeError("GET_LOCK not acquired")
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
            if cur.fetchone()[0] != 1:
                raise RuntimeError("RELEASE_LOCK failed")

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


async def _make_async_locks(url: str, ns: str) -> jobfence.AsyncLocks:
    return jobfence.AsyncLocks(url, namespace=ns)


CLOSERS: list[Callable[[], None]] = []


def jobfence_async(url: str, ns: str, loop: asyncio.AbstractEventLoop) -> Callable[[int], None]:
    locks = loop.run_until_complete(_make_async_locks(url, ns))
    CLOSERS.append(lambda: loop.run_until_complete(locks.close()))

    async def body(n: int) -> None:
        for _ in range(n):
            lease = await locks.try_acquire("jobfence-async", ttl=TTL)
            if lease is None:
                raise RuntimeError("jobfence async lock not acquired")
            if not await lease.release():
                raise RuntimeError("jobfence async lock not released")

    return lambda n: loop.run_until_complete(body(n))


def hand_written_async(url: str, ns: str, loop: asyncio.AbstractEventLoop) -> Callable[[int], None]:
    table = _hand_table(url, ns)
    conn = loop.run_until_complete(aiomysql.connect(db=_db(url), **_params(url)))
    CLOSERS.append(lambda: loop.run_until_complete(conn.ensure_closed()))
    insert = f"INSERT IGNORE INTO `{table}` (name, owner) VALUES (%s, %s)"
    delete = f"DELETE FROM `{table}` WHERE name = %s AND owner = %s"

    async def body(n: int) -> None:
        async with conn.cursor() as cur:
            for _ in range(n):
                owner = uuid.uuid4().hex
                if await cur.execute(insert, ("hand-async", owner)) != 1:
                    raise RuntimeError("hand-written async lock not acquired")
                if await cur.execute(delete, ("hand-async", owner)) != 1:
                    raise RuntimeError("hand-written async lock not released")

    return lambda n: loop.run_until_complete(body(n))


def uncontended(url: str, rounds: int, ops: int) -> list[tuple[str, float]]:
    ns = "bench" + uuid.uuid4().hex[:8]
    loop = asyncio.new_event_loop()
    variants: list[tuple[str, Callable[[int], None]]] = [
        ("(a) hand-written INSERT IGNORE + DELETE", hand_written(url, ns)),
        ("(b) GET_LOCK + RELEASE_LOCK (no write)", get_lock(url, ns)),
        ("(c) jobfence Locks, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence AsyncLocks, renew=True", jobfence_async(url, ns, loop)),
        ("(f) hand-written (a) on aiomysql", hand_written_async(url, ns, loop)),
    ]
    try:
        for _, run in variants:  # warm up: connect, create tables
            run(max(20, ops // 10))
        samples: dict[str, list[float]] = {label: [] for label, _ in variants}
        for i in range(rounds):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for label, run in order:
                started = time.perf_counter()
                run(ops)
                samples[label].append((time.perf_counter() - started) / ops * 1e6)
    finally:
        for close in CLOSERS:
            close()
        loop.close()
        _cleanup(url, ns)
    return [(label, statistics.median(samples[label])) for label, _ in variants]


# -- contended hand-off -----------------------------------------------------------------------
def _worker(kind: str, url: str, ns: str, seconds: float, start: Any, ready: Any, out: Any) -> None:
    count = 0
    if kind.startswith("jobfence"):
        options = {"next_in_line": 0} if kind == "jobfence-polling" else {}
        locks = jobfence.Locks(url, namespace=ns, **options)
        locks.backend.install()
        ready.put(1)
        start.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            with locks.acquire("contended", ttl=10, timeout=30):
                time.sleep(0.001)
                count += 1
        locks.close()
    else:
        cur = _connect(url).cursor()
        name = f"{ns}:contended"
        ready.put(1)
        start.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            cur.execute("SELECT GET_LOCK(%s, 30)", (name,))
            if cur.fetchone()[0] != 1:
                raise RuntimeError("GET_LOCK timed out")
            time.sleep(0.001)
            count += 1
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
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
    try:
        for _ in procs:
            ready.get(timeout=60)
        start.set()
        counts = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
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
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s",
            (ns + "%",),
        )
        for (table,) in cur.fetchall():
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
    conn.close()


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip-contended", action="store_true")
    args = parser.parse_args()

    conn = _connect(args.url)
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
        version, flush = cur.fetchone()
    conn.close()
    print(
        f"{version} at {jobfence._url.mask_url(args.url)} "
        f"(innodb_flush_log_at_trx_commit={flush}); PyMySQL {pymysql.__version__}, "
        f"aiomysql {aiomysql.__version__}; {os.cpu_count()} CPUs; "
        f"{args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    rows = uncontended(args.url, args.rounds, args.ops)
    base = rows[0][1]
    async_base = rows[5][1]
    table: list[tuple[str, str, str]] = []
    for label, us in rows:
        ratio = f"{us / base:.2f}x"
        if label.startswith("(e)"):
            ratio += f" ({us / async_base:.2f}x of (f))"
        table.append((label, f"{us:.0f}", ratio))
    _print_table("Uncontended acquire+release", ("variant", "µs/op", "vs (a)"), table)

    if args.skip_contended:
        return
    per_sleep = sleep_cost()
    sleep_ideal = 1 / per_sleep
    crows: list[tuple[str, str, str, str, str]] = []
    for kind, label in (
        ("jobfence", "jobfence Locks.acquire (next in line)"),
        ("jobfence-polling", "jobfence Locks.acquire, next_in_line=0"),
        ("get_lock", "GET_LOCK(name, 30) (server queue, no ttl)"),
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
    Console().print(table)


if __name__ == "__main__":
    main()
