"""One contender of ``test_limit_processes.py``: ``python -m tests.reliability._limit_worker URL
NAMESPACE NAME START SECONDS OUT [victim]``.

From the monotonic time START on (``time.monotonic()`` is one clock for every process of the
host), it acquires the limit of 3 on NAME again and again for SECONDS seconds, holds each
lease a short while and releases it, appending one JSON line per lease to OUT: its token, its
slot, when the grant was in hand and when the release began. A ``victim`` writes its first
lease's line (``release`` null) and then blocks holding it until the test SIGKILLs it.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

import jobfence

LIMIT = 3
TTL = 3.0


def main(argv: list[str]) -> None:
    url, namespace, name, start, seconds, out = argv[:6]
    victim = argv[6:] == ["victim"]
    with jobfence.Locks(url, namespace=namespace) as locks, open(out, "a") as rows:
        time.sleep(max(0.0, float(start) - time.monotonic()))
        end = float(start) + float(seconds)
        while time.monotonic() < end:
            lease = locks.acquire(name, ttl=TTL, timeout=60, limit=LIMIT)
            granted = time.monotonic()
            row = {"token": lease.token, "slot": lease.slot, "grant": granted, "release": None}
            if victim:
                rows.write(json.dumps(row) + "\n")
                rows.flush()
                threading.Event().wait()  # held (and renewed) until the test kills us
            time.sleep(random.uniform(0.01, 0.06))  # the work
            row["release"] = time.monotonic()
            lease.release()
            rows.write(json.dumps(row) + "\n")
            rows.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
