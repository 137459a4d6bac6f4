"""A ``guarded`` inbox-only job longer than its claim ttl, and a worker killed mid-job.

The job runs in a worker process of its own (sync and async API), with the idempotency claim
as its only protection (no lock). While it runs, far longer than its ``claim_ttl``, every
redelivery from this test's process gets ``ClaimInProgress`` naming the worker: the inbox's
renewer keeps the claim alive, so the job is never run a second time meanwhile. Then the
worker is killed with SIGKILL (no clean-up runs): a redelivery takes the claim over within
the claim's ttl of the kill (``attempt`` 2) and stores its result.

The last test does the same with the default ``claim_ttl`` (30 s): a crashed worker blocks its
key for at most that long, not for the former 300 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.guard import current_claim
from tests.conformance.specs import (
    FLAVOURS,
    INBOX,
    SPECS,
    Spec,
    inbox_table,
    new_namespace,
    spec_params,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CROSS_PROCESS = spec_params(INBOX, lambda s: s.cross_process)

# Runs the guarded job, which prints "RUNNING <pid>" and then works "forever".
WORKER = r"""
import asyncio, os, sys, time
import jobfence

url, table, key, flavour, claim_ttl = sys.argv[1:6]
options = {} if claim_ttl == "default" else {"claim_ttl": float(claim_ttl)}

if flavour == "sync":
    inbox = jobfence.Inbox(url, table=table)

    @jobfence.guarded(inbox=inbox, key="{k}", **options)
    def job(k):
        print("RUNNING", os.getpid(), flush=True)
        time.sleep(3600)

    job(key)
else:
    async def main():
        inbox = jobfence.AsyncInbox(url, table=table)

        @jobfence.guarded(inbox=inbox, key="{k}", **options)
        async def job(k):
            print("RUNNING", os.getpid(), flush=True)
            await asyncio.sleep(3600)

        await job(key)

    asyncio.run(main())
"""


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    try:
        yield url, inbox_table(namespace)
    finally:
        spec.cleanup(url, namespace)


def _start_worker(
    url: str, table: str, key: str, flavour: str, claim_ttl: str
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, url, table, key, flavour, claim_ttl],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line.startswith("RUNNING"):
        worker.kill()
        _, err = worker.communicate(timeout=10)
        raise AssertionError(f"the worker did not start its job: {line!r} {err}")
    return worker


def _kill(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        worker.kill()
    worker.communicate(timeout=10)


def _redeliver(inbox: jobfence.Inbox, key: str, claim_ttl: float, runs: list[Any]) -> Any:
    @jobfence.guarded(inbox=inbox, key="{k}", claim_ttl=claim_ttl)
    def job(k: str) -> str:
        runs.append(current_claim().attempt)
        return "recovered"

    return job(key)


def _take_over_after_kill(
    inbox: jobfence.Inbox,
    worker: subprocess.Popen[str],
    key: str,
    claim_ttl: float,
    runs: list[Any],
) -> float:
    """SIGKILL the worker, then redeliver until the key is taken over; returns how long it
    took from the kill."""
    os.kill(worker.pid, signal.SIGKILL)
    killed = time.monotonic()
    worker.wait(10)
    while True:
        try:
            assert _redeliver(inbox, key, claim_ttl, runs) == "recovered"
            return time.monotonic() - killed
        except jobfence.ClaimInProgress as busy:
            assert f":{worker.pid}:" in str(busy.owner)  # still the dead worker's claim
        assert time.monotonic() - killed < claim_ttl + 10, "never taken over"
        time.sleep(0.1)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("backend", CROSS_PROCESS, indirect=True)
def test_a_long_job_is_not_run_twice_and_a_killed_one_is_taken_over_within_its_ttl(
    backend: tuple[str, str], flavour: str
) -> None:
    url, table = backend
    key, claim_ttl = "order:long", 1.0
    worker = _start_worker(url, table, key, flavour, str(claim_ttl))
    runs: list[Any] = []
    inbox = jobfence.Inbox(url, table=table)
    try:
        # three claim ttls of redeliveries while the job runs: every one is refused
        started = time.monotonic()
        refused = 0
        while time.monotonic() - started < 3 * claim_ttl:
            with pytest.raises(jobfence.ClaimInProgress) as busy:
                _redeliver(inbox, key, claim_ttl, runs)
            assert f":{worker.pid}:" in str(busy.value.owner)
            refused += 1
            time.sleep(0.1)
        assert runs == [] and refused >= 10
        assert worker.poll() is None

        took = _take_over_after_kill(inbox, worker, key, claim_ttl, runs)
        assert took <= claim_ttl + 2.0, f"taken over {took:.2f} s after the kill"
        assert runs == [2]  # the dead worker's claim was attempt 1
        assert _redeliver(inbox, key, claim_ttl, runs) == "recovered"  # replayed
        assert runs == [2]
    finally:
        _kill(worker)
        inbox.close()


@pytest.mark.parametrize(
    "backend", [pytest.param(s, id=s.id) for s in SPECS if s.id == "sqlite"], indirect=True
)
def test_a_killed_worker_blocks_its_key_for_the_default_claim_ttl_only(
    backend: tuple[str, str],
) -> None:
    url, table = backend
    key = "order:crashed"
    worker = _start_worker(url, table, key, "sync", "default")
    runs: list[Any] = []
    inbox = jobfence.Inbox(url, table=table)
    try:
        with pytest.raises(jobfence.ClaimInProgress):
            _redeliver(inbox, key, 30.0, runs)
        took = _take_over_after_kill(inbox, worker, key, 30.0, runs)
        assert took <= 30.0 + 2.0, f"taken over {took:.2f} s after the kill"
        assert runs == [2]
    finally:
        _kill(worker)
        inbox.close()
