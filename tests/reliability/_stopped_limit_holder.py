"""A process that holds one lease of a limit of 2 (ttl 1.5 s, renewed), for a test that
freezes it with SIGSTOP: ``python -m tests.reliability._stopped_limit_holder URL NAMESPACE``.

It prints ``held <slot> <token>``, waits for a line on stdin, then prints ``lost=<bool>
released=<bool>`` (what its lease says, and whether its late release freed anything)."""

from __future__ import annotations

import sys

import jobfence


def main() -> None:
    url, namespace = sys.argv[1], sys.argv[2]
    with jobfence.Locks(url, namespace=namespace) as locks:
        lease = locks.acquire("stopped", ttl=1.5, timeout=10, limit=2)
        print(f"held {lease.slot} {lease.token}", flush=True)
        sys.stdin.readline()
        lost = lease.lost
        released = lease.release()
        print(f"lost={lost} released={released}", flush=True)


if __name__ == "__main__":
    main()
