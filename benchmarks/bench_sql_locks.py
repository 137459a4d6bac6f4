#!/usr/bin/env python3
"""PostgreSQL locks: jobfence (both modes) against hand-written SQL locks, in one run.

(MySQL/MariaDB has its own script: ``benchmarks/bench_mysql_locks.py``.)

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written lease row: ``INSERT ... ON CONFLICT DO NOTHING`` + owner-checked ``DELETE``
      (two autocommit statements, like jobfence's two; no expiry, no tokens) -- the baseline
  (b) ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` (session lock: nothing is written, no
      commit; no ttl, no tokens -- a lower bound, not a like-for-like comparison)
  (c) jobfence ``Locks.try_acquire()`` + ``release()``, mode=lease (default), renew=True
  (d) the same with ``renew=False``
  (e) jobfence mode=session (advisory lock + token bump in one statement, checked unlock)
  (f) jobfence ``AsyncLocks``, mode=lease, and (g) the hand-written pair (a) on psycopg async

Contended hand-off: N processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
share). jobfence lease mode (LISTEN/NOTIFY wake-ups; and ``notify=false``, plain polling),
jobfence session mode (the server's FIFO lock queue) and a hand-written blocking
``pg_advisory_lock``.

Usage: ``python benchmarks/bench_sql_locks.py [--url postgresql://postgres@127.0.0.1/test]
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

import psycopg

import jobfence
from jobfence._url import mask_url
from jobfence.backends.postgres_async import advisory_key

TTL = 30


def _with(url: str, **options: str) -> str:
    return url + ("&" if "?" in url else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def _hand_table(url: str, ns: str) -> str:
    table = f"{ns}_hand"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{table}" (name text PRIMARY KEY, owner text NOT NULL)'
        )
    return table


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> Callable[[int], None]:
    table = _hand_table(url, ns)
    conn = psycopg.connect(url, autocommit=True)
    insert = f'INSERT INTO "{table}" (name, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING'
    delete = f'DELETE FROM "{table}" WHERE name = %s AND owner = %s'

    def run(n: int) -> None:
        for _ in range(n):
            owner = uuid.uuid4().hex
            if conn.execute(insert, ("hand", owner)).rowcount != 1:
                raise RuntimeError("hand-written lock not acquired")
            if conn.execute(delete, ("hand", owner)).rowcount != 1:
                raise RuntimeError("hand-written lock not released")

    return run


def advisory(url: str, ns: str) -> Callable[[int], None]:
    conn = psycopg.connect(url, autocommit=True)
    key = advisory_key(ns, "advisory")

    def run(n: int) -> None:
        for _ in range(n):
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if not row or not row[0]:
                raise RuntimeError("advisory lock not acquired")
            row = conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()
            if not row or not row[0]:
                raise RuntimeError("advisory lock not released")

    return run


def jobfence_sync(url: str, ns: str, renew: bool, mode: str = "lease") -> Callable[[int], None]:
    locks = jobfence.Locks(_with(url, mode=mode), namespace=ns)
    name = f"jobfence-{mode}-{renew}"

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


def jobfence_async(
    url: str, ns: str, loop: asyncio.AbstractEventLoop, opened: list[jobfence.AsyncLocks]
) -> Callable[[int], None]:
    locks = loop.run_until_complete(_make_async_locks(url, ns))
    opened.append(locks)

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
    conn = loop.run_until_complete(psycopg.AsyncConnection.connect(url, autocommit=True))
    insert = f'INSERT INTO "{table}" (name, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING'
    delete = f'DELETE FROM "{table}" WHERE name = %s AND owner = %s'

    async def body(n: int) -> None:
        for _ in range(n):
            owner = uuid.uuid4().hex
            if (await conn.execute(insert, ("hand-async", owner))).rowcount != 1:
                raise RuntimeError("hand-written async lock not acquired")
            if (await conn.execute(delete, ("hand-async", owner))).rowcount != 1:
                raise RuntimeError("hand-written async lock not released")

    return lambda n: loop.run_until_complete(body(n))


def uncontended(url: str, rounds: int, ops: int) -> list[tuple[str, float]]:
    ns = "bench" + uuid.uuid4().hex[:8]
    loop = asyncio.new_event_loop()
    opened: list[jobfence.AsyncLocks] = []
    variants: list[tuple[str, Callable[[int], None]]] = [
        ("(a) hand-written INSERT ON CONFLICT + DELETE", hand_written(url, ns)),
        ("(b) pg_try_advisory_lock + unlock (no write)", advisory(url, ns)),
        ("(c) jobfence Locks lease, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks lease, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence Locks session, renew=True", jobfence_sync(url, ns, True, "session")),
        ("(f) jobfence AsyncLocks lease, renew=True", jobfence_async(url, ns, loop, opened)),
        ("(g) hand-written (a) on psycopg async", hand_written_async(url, ns, loop)),
    ]
    try:
        for _, run in variants:  # warm up: connect, create tables, prepare statements
            run(max(20, ops // 10))
        samples: dict[str, list[float]] = {label: [] for label, _ in variants}
        for i in range(rounds):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for label, run in order:
                started = time.perf_counter()
                run(ops)
                samples[label].append((time.perf_counter() - started) / ops * 1e6)
    finally:
        for locks in opened:
            loop.run_until_complete(locks.close())
        loop.run_until_complete(asyncio.sleep(0.05))  # let the closed renewer task finish
        loop.close()
        _cleanup(url, ns)
    return [(label, statistics.median(samples[label])) for label, _ in variants]


# -- contended hand-off -----------------------------------------------------------------------
def _worker(kind: str, url: str, ns: str, seconds: float, start: Any, ready: Any, out: Any) -> None:
    count = 0
    if kind.startswith("jobfence"):
        options = {
            "jobfence-lease": {"mode": "lease"},
            "jobfence-poll": {"mode": "lease", "notify": "false"},
            "jobfence-session": {"mode": "session"},
        }[kind]
        locks = jobfence.Locks(_with(url, **options), namespace=ns)
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
        conn = psycopg.connect(url, autocommit=True)
        key = advisory_key(ns, "contended")
        ready.put(1)
        start.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            time.sleep(0.001)
            count += 1
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        conn.close()
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
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (ns + "%",),
        ).fetchall()
        for (table,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip-contended", action="store_true")
    args = parser.parse_args()

    with psycopg.connect(args.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
            "current_setting('fsync')"
        ).fetchone()
    assert row is not None
    version, sync_commit, fsync = row
    print(
        f"PostgreSQL {version} at {mask_url(args.url)} (synchronous_commit={sync_commit}, "
        f"fsync={fsync}); psycopg {psycopg.__version__}; {os.cpu_count()} CPUs; "
        f"{args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    rows = uncontended(args.url, args.rounds, args.ops)
    base = rows[0][1]
    async_base = rows[6][1]
    table: list[tuple[str, str, str]] = []
    for label, us in rows:
        ratio = f"{us / base:.2f}x"
        if label.startswith("(f)"):
            ratio += f" ({us / async_base:.2f}x of (g))"
        table.append((label, f"{us:.0f}", ratio))
    _print_table("Uncontended acquire+release", ("variant", "µs/op", "vs (a)"), table)

    if args.skip_contended:
        return
    per_sleep = sleep_cost()
    sleep_ideal = 1 / per_sleep
    crows: list[tuple[str, str, str, str, str]] = []
    for kind, label in (
        ("jobfence-lease", "jobfence lease mode (LISTEN/NOTIFY)"),
        ("jobfence-poll", "jobfence lease mode, notify=false (polling)"),
        ("jobfence-session", "jobfence session mode (server FIFO queue)"),
        ("advisory", "hand-written pg_advisory_lock (server queue)"),
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
