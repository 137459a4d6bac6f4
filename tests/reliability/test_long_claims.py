"""A ``guarded`` inbox-only job longer than its claim ttl, and a worker killed mid-job.

The job runs in a worker process of its own (sync and async API), with the idempotency claim
as its only protection (no lock). While it runs, far longer than its ``claim_ttl``, every
redelivery from this test's process gets ``ClaimInProgress`` naming the worker: the inbox's
renewer keeps the claim alive, so the job is never run a second time meanwhile. Then the
worker is killed with SIGKILL (no clean-up runs): a redelivery takes the claim over within
the claim's ttl of the kill (``attempt`` 2) and stores its result.

Then the same with the default ``claim_ttl`` (30 s): a crashed worker blocks its key for at
most that long, not for the former 300 s. Last, a worker whose link to the backend hangs (a
stalled TCP proxy) loses its claim when the claim ttl runs out, and its async job is cancelled
then.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
from tests.netproxy import FaultProxy

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


# -- a backend that stops answering ----------------------------------------------------------
NETWORKED = spec_params(INBOX, lambda s: s.id in ("redis", "postgres", "mysql"))


@pytest.mark.parametrize("backend", NETWORKED, indirect=True)
async def test_a_job_whose_claim_cannot_be_renewed_is_cancelled_at_the_claim_ttl(
    backend: tuple[str, str],
) -> None:
    """The link to the backend hangs (a stalled TCP proxy) while an async guarded job runs:
    its claim is lost when the claim ttl runs out without a renewal, and the job is cancelled
    then (``ClaimLost``), not left running while a redelivery may take the key over."""
    url, table = backend
    port = (
        urlsplit(url).port
        or {"redis": 6379, "postgresql": 5432, "mysql": 3306}[urlsplit(url).scheme]
    )
    claim_ttl = 1.5
    with FaultProxy(port) as proxy:
        inbox = jobfence.AsyncInbox(proxy.url_for(url, port), table=table)
        started = asyncio.Event()
        times: dict[str, float] = {}

        @jobfence.guarded(inbox=inbox, key="{k}", claim_ttl=claim_ttl)
        async def job(k: str) -> str:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                times["cancelled"] = time.monotonic()
                proxy.resume()  # let the guard give the claim back
                raise
            return "finished"

        try:
            await inbox.install()
            task = asyncio.ensure_future(job("order:stalled"))
            await asyncio.wait_for(started.wait(), 10)
            proxy.stall()
            times["stalled"] = time.monotonic()
            with pytest.raises(jobfence.ClaimLost):
                await asyncio.wait_for(task, 30)
            took = times["cancelled"] - times["stalled"]
            assert took <= claim_ttl + 1.0, f"cancelled {took:.2f} s after the link hung"
        finally:
            proxy.resume()
            await inbox.close()
