"""8 processes contend for a limit of 3 (``acquire(name, limit=3)``) on Redis and on
PostgreSQL; one is SIGKILLed while it holds a lease. From the rows every process wrote (token,
slot, grant and release times on the host's monotonic clock):

* never more than 3 leases at once, the killed process's lease counted as held until the
  slot was granted again, which must come no sooner than half its ttl after the kill (the
  renewer kept at least two thirds of the ttl ahead; the lease was not given to another
  process while it could still be alive);
* tokens are unique, and increase per slot;
* every process got leases, and the 7 that ran to the end got a fair share: the fewest at
  least a third of the most.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._limit_worker import LIMIT, TTL
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(180)

PROCESSES = 8
SECONDS = 8.0
ROOT = Path(__file__).resolve().parents[2]


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("url", [REDIS_URL, POSTGRES_URL], ids=["redis", "postgres"])
def test_eight_processes_never_hold_more_than_the_limit_through_a_sigkill(
    url: str, tmp_path: Path
) -> None:
    namespace = "jf_limp_" + uuid.uuid4().hex[:8]
    name = "tenant:" + uuid.uuid4().hex[:6]
    start = time.monotonic() + 3.0  # every process has opened its client by then
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    outs = [tmp_path / f"p{i}.jsonl" for i in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.reliability._limit_worker", url, namespace, name]
            + [repr(start), repr(SECONDS), str(out)]
            + (["victim"] if i == 0 else []),
            env=environ,
            cwd=ROOT,
        )
        for i, out in enumerate(outs)
    ]
    try:
        deadline = time.monotonic() + 60
        while not (outs[0].exists() and outs[0].read_text().strip()):  # the victim holds one
            assert time.monotonic() < deadline, "the victim never got a lease"
            assert procs[0].poll() is None
            time.sleep(0.01)
        procs[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        for proc in procs[1:]:
            assert proc.wait(120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows: list[list[dict[str, Any]]] = [
        [json.loads(line) for line in out.read_text().splitlines()] for out in outs
    ]
    (victim,) = rows[0]
    assert victim["release"] is None
    later = sorted(
        r["grant"]
        for rs in rows[1:]
        for r in rs
        if r["slot"] == victim["slot"] and r["grant"] > victim["grant"]
    )
    assert later, "the killed process's slot was never granted again"
    reused = later[0]
    assert reused >= killed_at + TTL / 2, (reused - killed_at, TTL)
    spans = [(r["grant"], r["release"]) for rs in rows[1:] for r in rs]
    spans.append((victim["grant"], reused))
    assert _most_at_once(spans) <= LIMIT
    assert _most_at_once(spans) == LIMIT  # the limit was reached (the test is not idle)
    tokens = [r["token"] for rs in rows for r in rs]
    assert len(set(tokens)) == len(tokens)
    by_slot: dict[int, list[tuple[float, int]]] = {}
    for rs in rows:
        for r in rs:
            by_slot.setdefault(r["slot"], []).append((r["grant"], r["token"]))
    for grants in by_slot.values():
        ordered = [token for _, token in sorted(grants)]
        assert ordered == sorted(ordered)
    counts = [len(rs) for rs in rows[1:]]
    print(
        f"{url.split(':')[0]}: grants per process {counts}, min {min(counts)}, "
        f"max {max(counts)}, slot reused {reused - killed_at:.2f} s after the kill"
    )
    assert min(counts) >= max(counts) / 3, counts
