#!/usr/bin/env python3
"""etcd beside Redis and PostgreSQL: a lock cycle and an inbox claim + complete, as ratios.

Per fresh key, on each backend: the lock cycle (``Locks.try_acquire`` + ``release``,
``renew=False``) and the inbox's ``claim`` + ``complete``, in interleaved rounds; the table
gives the median and p99 µs per operation and the ratio to Redis's. etcd pays more round
trips (a lock: a read of the holder, a lease grant, the transaction that puts the key and
reads the holder again, and a lease revocation to release; a claim: a lease grant and a
transaction, its completion a read, a lease grant and a transaction), writes are Raft commits
and reads linearizable: the price of a store whose leases and records survive a leader
failover (docs/how-to/backends/etcd.md). The disposable etcd keeps its data in ``/dev/shm``
where the host has it: its fsyncs cost nothing there, unlike on a disk.

Usage: ``python benchmarks/bench_etcd_locks.py [--url etcd://127.0.0.1:2379]
[--redis redis://127.0.0.1:6379/0] [--postgres postgresql://postgres@127.0.0.1:5432/test]
[--rounds 11] [--ops 100]``. Without ``--url``, a disposable one-member etcd is started
(``tests/etcd_cluster.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests

import _harness as h

import jobfence

REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ("Redis", "PostgreSQL", "etcd")
LOCK = "lock cycle"
INBOX = "inbox claim+complete"
#: each case and the case it is compared with: the same operation on Redis
ANCHORS = {
    f"{backend}: {case}": f"Redis: {case}" for backend in BACKENDS[1:] for case in (LOCK, INBOX)
}


def _lock_cycle(locks: jobfence.Locks) -> Callable[[str], Any]:
    def cycle(key: str) -> None:
        lease = locks.try_acquire(key, ttl=h.TTL, renew=False)
        if lease is None or not lease.release():
            raise RuntimeError("lock cycle failed")

    return cycle


def _inbox_cycle(inbox: jobfence.Inbox) -> Callable[[str], Any]:
    def cycle(key: str) -> None:
        with inbox.claim(key, ttl=30) as claim:
            claim.complete("done")

    return cycle


def measure(
    rounds: int, ops: int, *, etcd: str = "", redis: str = REDIS, postgres: str = POSTGRES
) -> dict[str, h.Stats]:
    """The six cases, interleaved; ``etcd`` empty starts a disposable one-member etcd."""
    if not etcd:
        from tests.etcd_cluster import etcd_url

        etcd = etcd_url()
    urls = {"Redis": redis, "PostgreSQL": postgres, "etcd": etcd}
    ns = h.new_namespace()
    table = f"bench_inbox_{ns}"
    locks = {label: jobfence.Locks(url, namespace=ns) for label, url in urls.items()}
    inboxes = {label: jobfence.Inbox(url, table=table) for label, url in urls.items()}
    try:
        cases: dict[str, Callable[[str], Any]] = {}
        for label in BACKENDS:
            cases[f"{label}: {LOCK}"] = _lock_cycle(locks[label])
        for label in BACKENDS:
            cases[f"{label}: {INBOX}"] = _inbox_cycle(inboxes[label])
        return h.interleave_stats(cases, ops, rounds)
    finally:
        for inbox in inboxes.values():
            try:
                inbox.drop()
            finally:
                inbox.close()
        for client in locks.values():
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ETCD_URL", ""))
    parser.add_argument("--redis", default=REDIS)
    parser.add_argument("--postgres", default=POSTGRES)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--ops", type=int, default=100)
    args = parser.parse_args()
    started = time.perf_counter()
    stats = measure(args.rounds, args.ops, etcd=args.url, redis=args.redis, postgres=args.postgres)
    print(f"{args.rounds} interleaved rounds of {args.ops} fresh keys per case")
    print(f"{'case':36} {'median µs':>10} {'p99 µs':>10} {'x Redis':>8}")
    for label, st in stats.items():
        anchor = ANCHORS.get(label)
        ratio = f"{st.median / stats[anchor].median:.2f}x" if anchor else "1.00x"
        print(f"{label:36} {st.median:10.1f} {st.p99:10.1f} {ratio:>8}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
