"""Real ``rq worker`` processes run guarded jobs; one is SIGKILLed in the middle of a job.

The scenario of ``_support.py`` on RQ (``_rq_app.py``), against the test Redis (its own queue
name: every key and job id starts with it) and a PostgreSQL ledger:

* worker B (no scheduler) takes the stalling order ``o-stall`` (``place_order_by_job``: the
  key is RQ's job id) and stalls in it;
* workers A (with the scheduler, which moves retries with a delay back into the queue) and C
  run one order enqueued 5 times and 20 distinct orders on one product, half of them as
  ``async def`` jobs;
* B and its work horse are SIGKILLed mid-job; a new worker D starts. RQ finds the execution
  abandoned once its heartbeat expires and retries the job (enqueued with
  ``retry=Retry(...)``); the dead worker's claim has not expired yet, so jobfence sends the job
  back to RQ's retry (``ClaimInProgress``) until it has, and a retry then takes the claim over
  and applies the order;
* the ledger shows exactly one effect per order and the right stock; running the stalled job
  once more under the same job id returns the stored result without running the body.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import rq
from rq.job import Job
from rq.results import Result

import jobfence
from tests.frameworks._support import (
    DSN,
    STOCK,
    Ledger,
    Workers,
    env,
    wait_until,
    workers,
)
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = "tests.frameworks._rq_app"
DUPLICATES = 5
DISTINCT = 20


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    book = Ledger()
    book.create()
    inbox = jobfence.Inbox(DSN, table=book.inbox_table)
    inbox.install()  # once, at deploy
    inbox.close()
    try:
        yield book
    finally:
        book.drop()


@pytest.fixture
def queue(ledger: Ledger) -> Iterator[rq.Queue]:
    name = f"jf-rqw-{uuid.uuid4().hex[:12]}"
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        yield rq.Queue(name, connection=conn)
    finally:
        members = [m for m in conn.smembers("rq:workers") if name.encode() in m]
        if members:
            conn.srem("rq:workers", *members)
        conn.close()
        delete_redis_keys(f"rq:*{name}*")
        delete_redis_keys(f"{ledger.schema}*")  # the leases


def start_worker(pool: Workers, queue: rq.Queue, environ: dict[str, str], *, scheduler: bool):
    name = f"{queue.name}-{len(pool.procs)}"
    argv = [
        *(sys.executable, "-m", "rq.cli", "worker", "--url", REDIS_URL),
        *("--worker-class", f"{APP}.FastAbandonWorker", "--name", name),
        # a heartbeat every second (FastAbandonWorker: abandoned 5 s after the last one);
        # maintenance (which finds abandoned jobs) every second; an idle worker wakes up
        # from its blocking dequeue every second (worker ttl - 15 s) to run it
        *("--job-monitoring-interval", "1", "--maintenance-interval", "1"),
        *("--worker-ttl", "16"),
        *(["--with-scheduler"] if scheduler else []),
        queue.name,
    ]
    return pool.start(argv, environ)


def enqueue(queue: rq.Queue, task: str, order: str, qty: int, job_id: str | None = None) -> Job:
    # retry=Retry(...): RQ retries a job whose worker died only if it has retries left
    return queue.enqueue(
        f"{APP}.{task}",
        order,
        1,
        qty,
        job_id=job_id or f"{queue.name}-{uuid.uuid4().hex[:10]}",
        retry=rq.Retry(max=3, interval=1),
    )


def finished(jobs: list[Job]) -> bool:
    """All jobs finished; a failed one fails the test at once, with its error."""
    statuses = [job.get_status(refresh=True) for job in jobs]
    failed = [job for job, status in zip(jobs, statuses, strict=True) if status == "failed"]
    if failed:
        result = failed[0].latest_result()
        raise AssertionError(f"job {failed[0].id} failed: {result and result.exc_string}")
    return all(status == "finished" for status in statuses)


def test_rq_workers_apply_each_order_once_across_duplicates_and_a_killed_worker(
    ledger: Ledger, queue: rq.Queue, tmp_path: Path
) -> None:
    environ = {**env(ledger.schema), "JOBFENCE_RQ_REDIS": REDIS_URL, "JOBFENCE_FW_STALL": "o-stall"}
    with workers(tmp_path) as pool:
        doomed = start_worker(pool, queue, environ, scheduler=False)
        stalled = enqueue(queue, "place_order_by_job", "o-stall", 7, job_id=f"{queue.name}-stall")
        horse = wait_until("the stalling order to start", lambda: ledger.started("o-stall"))[0]
        assert horse != doomed.pid  # RQ runs the job in a forked work horse

        start_worker(pool, queue, environ, scheduler=True)
        start_worker(pool, queue, environ, scheduler=False)
        jobs = []
        for n in range(DUPLICATES):
            task = "place_order" if n % 2 == 0 else "place_order_async"
            jobs.append(enqueue(queue, task, "o-dup", 5))
        qty = {f"o-{n}": 1 + n % 4 for n in range(DISTINCT)}
        for n, (order, q) in enumerate(qty.items()):
            jobs.append(enqueue(queue, "place_order" if n % 2 else "place_order_async", order, q))

        wait_until("a few orders to be applied", lambda: len(ledger.effects()) >= 3, timeout=30)
        pool.kill(doomed)  # the worker ...
        os.kill(horse, signal.SIGKILL)  # ... and its work horse (RQ puts it in its own group)
        start_worker(pool, queue, environ, scheduler=False)

        try:
            wait_until("every job to finish", lambda: finished([*jobs, stalled]), timeout=60)
        except AssertionError:
            raise AssertionError(pool.logs()) from None

        effects = ledger.effects()
        assert effects == {order: 1 for order in [*qty, "o-dup", "o-stall"]}, pool.logs()
        assert ledger.stock() == STOCK - sum(qty.values()) - 5 - 7

        # the 5 jobs of one order: one ran, the others returned its stored result
        dup_results = [job.return_value(refresh=True) for job in jobs[:DUPLICATES]]
        assert all(r == dup_results[0] for r in dup_results), dup_results

        # the killed job: RQ found it abandoned and retried it (one of its 3 retries used);
        # while the dead worker's claim lived, jobfence returned rq.Retry (ClaimInProgress),
        # not counted; then a retry took the expired claim over and applied the order in
        # another process
        stalled.refresh()
        assert stalled.retries_left == 2
        assert not stalled.number_of_retries  # the refusals used up none of max_retries
        assert Result.Type.RETRIED in [r.type for r in stalled.results()]
        runs = ledger.started("o-stall")
        assert len(runs) == 2 and runs[0] == horse
        (applied_by,) = ledger.query("SELECT pid FROM {s}.effects WHERE order_id = 'o-stall'")[0]
        assert applied_by == runs[1] != horse
        stored = stalled.return_value()
        assert stored == {"order_id": "o-stall", "pid": applied_by}

        # the same job run again (its id is the default key): a duplicate, the body not run
        again = enqueue(queue, "place_order_by_job", "o-stall", 7, job_id=stalled.id)
        wait_until("the re-run to finish", lambda: finished([again]), timeout=30)
        assert again.return_value(refresh=True) == stored
        assert ledger.started("o-stall") == runs  # the body did not start again
        assert ledger.effects()["o-stall"] == 1


#: what docs/how-to/rq.md recommends, and the bound it states for a SIGKILLed worker's job:
#: the execution heartbeat's ttl (--job-monitoring-interval 30 + RQ's fixed 60 s), then an
#: idle worker's next wake-up (--worker-ttl 45 - 15 s) runs the maintenance that finds it
#: abandoned, then the job's Retry interval
RECOMMENDED = ("--worker-ttl", "45", "--maintenance-interval", "30")
HEARTBEAT_TTL = 30 + 60
IDLE_WAKE_UP = 45 - 15
RETRY_INTERVAL = 1


@pytest.mark.timeout(300)
def test_the_recommended_worker_flags_retry_a_killed_job_within_the_stated_bound(
    ledger: Ledger, queue: rq.Queue, tmp_path: Path
) -> None:
    """Stock ``rq.Worker`` processes with the rq.md command: a job whose worker and work horse
    are SIGKILLed runs again, and completes, within the bound the page states. With RQ's
    default ``--worker-ttl`` (420) an idle worker blocks 405 s in its dequeue and looks for
    abandoned jobs only then, whatever ``--maintenance-interval`` says."""
    environ = {**env(ledger.schema), "JOBFENCE_RQ_REDIS": REDIS_URL, "JOBFENCE_FW_STALL": "o-kill"}

    def rq_worker(name: str, *, scheduler: bool) -> list[str]:
        return [
            *(sys.executable, "-m", "rq.cli", "worker", "--url", REDIS_URL),
            *("--name", f"{queue.name}-{name}", *RECOMMENDED),
            *(["--with-scheduler"] if scheduler else []),
            queue.name,
        ]

    with workers(tmp_path) as pool:
        doomed = pool.start(rq_worker("doomed", scheduler=False), environ)
        job = queue.enqueue(
            f"{APP}.place_order_by_job",
            "o-kill",
            1,
            3,
            job_id=f"{queue.name}-kill",
            retry=rq.Retry(max=3, interval=RETRY_INTERVAL),
        )
        horse = wait_until("the stalling order to start", lambda: ledger.started("o-kill"))[0]
        # the worker that will find the job abandoned: idle, past its start-up maintenance
        pool.start(rq_worker("idle", scheduler=True), environ)
        wait_until(
            "the second worker to be idle",
            lambda: any(
                w.name == f"{queue.name}-idle" and w.get_state() == "idle"
                for w in rq.Worker.all(queue=queue)
            ),
            timeout=30,
        )
        pool.kill(doomed)
        os.kill(horse, signal.SIGKILL)
        killed = time.monotonic()
        bound = HEARTBEAT_TTL + IDLE_WAKE_UP + RETRY_INTERVAL
        try:
            # a few seconds over the bound for the scheduler's poll and the run itself
            wait_until("the killed job to finish", lambda: finished([job]), timeout=bound + 15)
        except AssertionError:
            raise AssertionError(pool.logs()) from None
        took = time.monotonic() - killed

    assert ledger.effects() == {"o-kill": 1}
    runs = ledger.started("o-kill")
    assert len(runs) == 2 and runs[0] == horse  # run again, in another process
    job.refresh()
    assert job.retries_left == 2  # RQ's abandoned-job retry, not a new job
    # rq.md's stated bound (the wait above allowed 15 s more for the scheduler and the run)
    assert took <= bound + 15, f"the killed job ran again {took:.0f} s after the kill"
