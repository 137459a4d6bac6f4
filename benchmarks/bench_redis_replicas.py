#!/usr/bin/env python3
"""What ``wait_replicas=1`` costs on Redis: the lock cycle and the inbox's claim + complete,
with and without waiting for one replica, in one run (interleaved rounds, median).

A disposable primary and one replica (``redis-server`` on free loopback ports, temporary
directories, no persistence) are started for the run and stopped after it; the shared server
is not used. Cases, per fresh key:

  * lock cycle: ``Locks.try_acquire(name)`` + ``release()`` (the grant waits; the release
    does not)
  * inbox: ``Inbox.claim(key)`` + ``complete(result)`` (both wait)

each with ``wait_replicas=0`` (the default: no ``WAIT``) and ``wait_replicas=1`` (the script
call and ``WAIT 1 1000`` in one pipeline). The replica is on the same host, so the figures
are the floor of the cost: on a network, add one round trip between primary and replica to
every waiting write.

Usage: ``python benchmarks/bench_redis_replicas.py [--rounds 15] [--ops 300]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h
from tests.reliability._redis_server import RedisServer, wait_until

import jobfence

LOCK_0 = "lock cycle, wait_replicas=0"
LOCK_1 = "lock cycle, wait_replicas=1"
INBOX_0 = "inbox claim+complete, wait_replicas=0"
INBOX_1 = "inbox claim+complete, wait_replicas=1"
#: each waiting case and the case it is compared with
ANCHORS = {LOCK_1: LOCK_0, INBOX_1: INBOX_0}


@contextmanager
def primary_and_replica() -> Iterator[str]:
    """A disposable primary with one replica in sync; the primary's URL."""
    with RedisServer() as primary, RedisServer(replica_of=primary.port) as replica:
        wait_until(lambda: replica.info()["master_link_status"] == "up", 30, "the replica")
        yield primary.url


def _lock_cycle(locks: jobfence.Locks) -> Callable[[str], Any]:
    def cycle(key: str) -> None:
        lease = locks.try_acquire(key, ttl=h.TTL)
        if lease is None or not lease.release():
            raise RuntimeError("lock cycle failed")

    return cycle


def _inbox_cycle(inbox: jobfence.Inbox) -> Callable[[str], Any]:
    def cycle(key: str) -> None:
        with inbox.claim(key, ttl=30) as claim:
            claim.complete("done")

    return cycle


def measure(rounds: int, ops: int) -> dict[str, h.Stats]:
    """The four cases, interleaved, against a fresh primary and replica."""
    with primary_and_replica() as url:
        ns = h.new_namespace()
        waiting = f"{url}?wait_replicas=1&wait_timeout=1"
        clients: list[Any] = [
            jobfence.Locks(url, namespace=ns),
            jobfence.Locks(waiting, namespace=ns),
            jobfence.Inbox(url),
            jobfence.Inbox(waiting),
        ]
        try:
            cases = {
                LOCK_0: _lock_cycle(clients[0]),
                LOCK_1: _lock_cycle(clients[1]),
                INBOX_0: _inbox_cycle(clients[2]),
                INBOX_1: _inbox_cycle(clients[3]),
            }
            return h.interleave_stats(cases, ops, rounds)
        finally:
            for client in clients:
                client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    stats = measure(args.rounds, args.ops)
    print(f"{args.rounds} interleaved rounds of {args.ops} per case")
    print(f"{'case':45} {'median µs':>10} {'p99 µs':>10} {'ratio':>8}")
    for label, st in stats.items():
        anchor = ANCHORS.get(label)
        ratio = f"{st.median / stats[anchor].median:.2f}x" if anchor else "1.00x"
        print(f"{label:45} {st.median:10.1f} {st.p99:10.1f} {ratio:>8}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
