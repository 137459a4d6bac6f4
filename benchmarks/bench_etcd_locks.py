#!/usr/bin/env python3
"""etcd locks beside Redis and PostgreSQL: uncontended acquire+release, as ratios.

Each backend runs jobfence ``Locks.try_acquire()`` + ``release()`` pairs (``renew=False``) on
one name, in interleaved rounds; the table gives the median µs per pair and its ratio to
Redis's. etcd pays more round trips per pair (a read of the holder, a lease grant, the
transaction that puts the key and reads the holder again; a lease revocation to release),
writes are Raft commits and reads linearizable. The disposable etcd keeps its data in
``/dev/shm`` where the host has it: its fsyncs cost nothing there, unlike on a disk.

Usage: ``python benchmarks/bench_etcd_locks.py [--url etcd://127.0.0.1:2379]
[--redis redis://127.0.0.1:6379/0] [--postgres postgresql://postgres@127.0.0.1:5432/test]
[--rounds 11] [--ops 100]``. Without ``--url``, a disposable one-member etcd is started
(``tests/etcd_cluster.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests

import _harness as h

import jobfence


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ETCD_URL", ""))
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--ops", type=int, default=100)
    args = parser.parse_args()
    url = args.url
    if not url:
        from tests.etcd_cluster import etcd_url

        url = etcd_url()
    urls = {"Redis": args.redis, "PostgreSQL": args.postgres, "etcd": url}
    ns = h.new_namespace()
    clients = {label: jobfence.Locks(u, namespace=ns) for label, u in urls.items()}
    runs = {label: h.jobfence_sync(c, "bench-etcd", False) for label, c in clients.items()}
    times: dict[str, list[float]] = {label: [] for label in runs}
    try:
        for run in runs.values():
            run(max(10, args.ops // 10))  # warm-up: connections, tables, scripts
        for _ in range(args.rounds):
            for label, run in runs.items():
                times[label].append(h.us_per_op(run, args.ops))
    finally:
        for c in clients.values():
            c.close()
    base = statistics.median(times["Redis"])
    print(f"{args.rounds} interleaved rounds x {args.ops} pairs, median µs per pair")
    print(f"{'backend':<12} {'µs/pair':>10} {'x Redis':>8}")
    for label, samples in times.items():
        median = statistics.median(samples)
        print(f"{label:<12} {median:>10.0f} {median / base:>8.2f}")


if __name__ == "__main__":
    main()
