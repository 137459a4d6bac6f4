"""Several processes, one lock: watch jobfence keep them from overlapping.

Run it::

    python examples/lock_contention.py                 # 4 worker processes, temp directory
    python examples/lock_contention.py --workers 6 --holds 20 --db /tmp/demo/locks.db
    python examples/lock_contention.py --no-lock        # the same work unprotected: it fails

Each worker process repeatedly takes the same SQLite-backed lock
(``jobfence.Locks("sqlite:///...")``, the embedded backend: one file, no server), and while it
holds it does a read-modify-write of a shared counter file -- the kind of update that loses
increments when two processes interleave. The counter file also records the fencing token of
its last writer, and every write first checks that its own token is newer (a fenced write).

The parent then prints who held the lock with which tokens and checks that:

* the counter equals the number of holds (no lost update),
* no two holds overlapped in time (every process reads the same host-wide monotonic clock),
* the fencing tokens strictly increase in the order the holds happened.

It exits with status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import jobfence

LOCK_NAME = "counter-file"


@dataclass(frozen=True)
class Hold:
    worker: int
    pid: int
    token: int
    start_ns: int  # time.monotonic_ns(): one clock for every process on this host
    end_ns: int
    value_read: int
    stale_write: bool  # the counter file had already been written by a newer token


def read_counter(path: Path) -> tuple[int, int]:
    """(value, token of its last writer); (-1, 0) for a torn read of a half-written file."""
    try:
        value, token = (int(x) for x in path.read_text().split())
    except ValueError:
        return -1, 0
    return value, token


def worker(
    index: int, db: str, counter: str, holds: int, use_lock: bool, start: Any, results: Any
) -> None:
    """One worker process: take the lock ``holds`` times, update the counter each time."""
    try:
        path = Path(counter)
        rng = random.Random(index)
        done: list[Hold] = []
        with jobfence.Locks(f"sqlite:///{db}") as locks:
            start.wait()  # all workers begin together
            for _ in range(holds):
                guard = locks.acquire(LOCK_NAME, ttl=10, timeout=30) if use_lock else nullcontext()
                with guard as lease:  # released when the block ends
                    token = lease.token if lease is not None else 0
                    began = time.monotonic_ns()
                    value, last_token = read_counter(path)
                    time.sleep(0.001)  # widen the window a racing writer would need
                    stale = lease is not None and last_token >= token
                    if lease is not None:
                        lease.check()  # still ours? (raises LockLost if not)
                    if not stale and value >= 0:  # fenced: never overwrite a newer holder
                        path.write_text(f"{value + 1} {token}")
                    ended = time.monotonic_ns()
                done.append(Hold(index, os.getpid(), token, began, ended, value, stale))
                time.sleep(rng.uniform(0.005, 0.03))  # other work between holds
        results.put((index, done, None))
    except Exception as exc:  # report, so that the parent never waits forever
        results.put((index, [], f"{type(exc).__name__}: {exc}"))
        sys.exit(1)


def run(
    workers: int, holds: int, db: Path, use_lock: bool = True
) -> list[tuple[int, list[Hold], str | None]]:
    counter = db.with_name(db.name + ".counter")
    counter.write_text("0 0")
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, str(db), str(counter), holds, use_lock, start, results))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    start.wait(timeout=120)  # every worker has started: let them go
    outcome = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sorted(outcome, key=lambda item: item[0])


def report(outcome: list[tuple[int, list[Hold], str | None]], counter: Path, holds: int) -> bool:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    every = sorted((h for _, hs, _ in outcome for h in hs), key=lambda h: h.start_ns)

    base = min((h.token for h in every), default=1) - 1
    table = Table(title=f"Who held {LOCK_NAME!r} (fencing tokens shown as token - {base})")
    table.add_column("worker", justify="right")
    table.add_column("pid", justify="right")
    table.add_column("holds", justify="right")
    table.add_column("fencing tokens, in the order this worker got them")
    for index, hs, error in outcome:
        shown = " ".join(str(h.token - base) for h in hs) if hs else f"[red]failed: {error}[/red]"
        pid = str(hs[0].pid) if hs else "-"
        table.add_row(str(index), pid, str(len(hs)), shown)
    console.print(table)
    order = " ".join(f"w{h.worker}" for h in every)
    console.print(f"hold order: {order}")

    checks: list[tuple[bool, str]] = []
    errors = [f"worker {i}: {e}" for i, _, e in outcome if e]
    failed = f" ({'; '.join(errors)})" if errors else ""
    checks.append((not errors, "every worker finished" + failed))
    expected = len(outcome) * holds
    final, _ = read_counter(counter)
    checks.append((final == expected, f"counter = {final}, expected {expected} (no lost update)"))
    overlaps = [(a, b) for a, b in pairwise(every) if b.start_ns < a.end_ns]
    gaps = [b.start_ns - a.end_ns for a, b in pairwise(every)]
    if overlaps:
        a, b = overlaps[0]
        checks.append((False, f"holds overlapped: worker {a.worker} and worker {b.worker}"))
    else:
        smallest = f"; smallest gap between holds {min(gaps) / 1000:.0f} µs" if gaps else ""
        checks.append((True, f"no two holds overlapped ({len(every)} holds{smallest})"))
    tokens = [h.token for h in every]
    increasing = all(a < b for a, b in pairwise(tokens))
    checks.append((increasing, "fencing tokens strictly increase in hold order"))
    stale = sum(h.stale_write for h in every)
    checks.append((stale == 0, f"fenced writes refused as stale: {stale}"))
    reads_in_order = [h.value_read for h in every] == list(range(len(every)))
    checks.append((reads_in_order, "each hold read the value the previous hold wrote"))

    for ok, text in checks:
        console.print(("[green]PASS[/green] " if ok else "[red]FAIL[/red] ") + text)
    return all(ok for ok, _ in checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--holds", type=int, default=10, help="holds per worker (default 10)")
    parser.add_argument("--db", type=Path, help="SQLite file for the locks (default: temp dir)")
    parser.add_argument(
        "--no-lock",
        action="store_true",
        help="run the same workload WITHOUT the lock, to see the checks catch the races",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.holds < 1:
        parser.error("--workers and --holds must be at least 1")
    if args.db is not None and not args.db.resolve().parent.is_dir():
        parser.error(f"--db: the directory {args.db.resolve().parent} does not exist")

    with tempfile.TemporaryDirectory(prefix="jobfence-example-") as tmp:
        db = (args.db or Path(tmp) / "locks.db").resolve()
        how = "WITHOUT the lock" if args.no_lock else "of one lock"
        print(f"{args.workers} processes x {args.holds} holds {how} in sqlite:///{db}")
        started = time.monotonic()
        outcome = run(args.workers, args.holds, db, use_lock=not args.no_lock)
        print(f"finished in {time.monotonic() - started:.2f} s")
        ok = report(outcome, db.with_name(db.name + ".counter"), args.holds)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
