"""Real arq workers (``python -m arq``, in subprocesses) on Redis run guarded tasks of the shared
scenario, and one worker is SIGKILLed in the middle of a task.

* the same order enqueued as 5 jobs (``key="order:{order_id}"``): applied once, every job
  returns the one stored result;
* 20 distinct orders on one product at once (a lease per product): each applied once;
* an order whose key is the test's own claim: the worker gets ``ClaimInProgress``, raises
  ``arq.Retry`` and arq runs the job again (``job_try`` 2, 3, ...) until the test gives the key
  back, then it runs once;
* a task without a key template (the key is the arq job id) stalls in the first worker, which
  is killed: the job stays in arq's queue, its in-progress key expires ``job_timeout + 10`` s
  after it started, a second worker runs it again (``job_try`` 2, the same job id), takes the
  dead worker's claim over (attempt 2, the same key) and applies it once; the same job
  enqueued again afterwards is a duplicate that returns the stored result without running.

The ledger in PostgreSQL must show exactly one effect per order and the right stock.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from arq.connections import RedisSettings, create_pool
from arq.jobs import Job

import jobfence
from tests.frameworks._support import (
    DSN,
    REDIS_URL,
    STOCK,
    Ledger,
    Workers,
    env,
    python,
    wait_until,
    workers,
)
from tests.servers import delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

REDIS = RedisSettings.from_dsn(REDIS_URL)
#: the distinct orders on product 1 and their quantities
ORDERS = {f"o-{i}": 1 + i % 5 for i in range(20)}
DUP_QTY, HELD_QTY, KILLED_QTY = 7, 4, 11
#: arq's job_timeout in the workers: a killed worker's job runs again 10 s after that
JOB_TIMEOUT = 5


def _worker_logs(log_dir: Path) -> str:
    """Everything the workers logged so far."""
    return "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("worker-*.log")))


def _start(pool: Workers, environ: dict[str, str]) -> Any:
    return pool.start([python(), "-m", "arq", "tests.frameworks._arq_app.WorkerSettings"], environ)


async def _enqueue(queue: str, jobs: list[tuple[str, str, tuple[Any, ...]]]) -> None:
    arq_redis = await create_pool(REDIS, default_queue_name=queue)
    try:
        for function, job_id, args in jobs:
            job = await arq_redis.enqueue_job(function, *args, _job_id=job_id)
            assert job is not None, f"arq refused the job {job_id}"
    finally:
        await arq_redis.aclose()


async def _results(queue: str, job_ids: list[str], timeout: float) -> dict[str, Any]:
    """Each job's result, waiting for it (a job that failed raises its exception here)."""
    arq_redis = await create_pool(REDIS, default_queue_name=queue)
    try:
        return {
            job_id: await Job(job_id, arq_redis, _queue_name=queue).result(
                timeout=timeout, poll_delay=0.1
            )
            for job_id in job_ids
        }
    finally:
        await arq_redis.aclose()


def test_arq_workers_apply_every_order_once_through_a_sigkill(tmp_path: Path) -> None:
    ledger = Ledger()
    ledger.create({1: STOCK, 2: STOCK})
    queue = f"jf-fw-arq-{uuid.uuid4().hex[:12]}"
    environ = {
        **env(ledger.schema),
        "JOBFENCE_ARQ_QUEUE": queue,
        "JOBFENCE_ARQ_JOB_TIMEOUT": str(JOB_TIMEOUT),
        "JOBFENCE_FW_STALL": "killed",
    }
    inbox = jobfence.Inbox(DSN, table=ledger.inbox_table)
    inbox.install()
    arq_keys = redis.Redis.from_url(REDIS_URL)
    killed_job, held_job = f"{queue}-killed", f"{queue}-held"
    dup_jobs = [f"{queue}-dup-{n}" for n in range(5)]
    order_jobs = {order: f"{queue}-{order}" for order in ORDERS}

    try:
        # the test holds the key of order "held": its job must wait in arq's retries
        held = inbox.claim("order:held", ttl=3, renew=True)  # held (renewed) until released
        assert held.state.value == "new"
        jobs: list[tuple[str, str, tuple[Any, ...]]] = [
            ("place_order", held_job, ("held", 1, HELD_QTY))
        ]
        for n, (order, qty) in enumerate(ORDERS.items()):
            jobs.append(("place_order", order_jobs[order], (order, 1, qty)))
            if n % 4 == 0:
                jobs.append(("place_order", dup_jobs[n // 4], ("dup", 1, DUP_QTY)))
        stalling = ("by_job", killed_job, ("killed", 2, KILLED_QTY))
        with workers(tmp_path) as pool:
            first = _start(pool, environ)
            asyncio.run(_enqueue(queue, jobs))
            wait_until("the first worker to apply orders", lambda: len(ledger.effects()) >= 3)
            # refused twice ("not now"), each time back to arq's retry with its try given back
            wait_until(
                "arq to run the held order's job again",
                lambda: _worker_logs(tmp_path).count(f"{held_job}:place_order retrying") >= 2,
                60,
            )
            assert int(arq_keys.get(f"arq:retry:{held_job}") or 0) <= 1  # no try used up
            held.release()  # the key is free: the next try of "held" applies it

            # the stalling job is in the middle of its run: kill the worker (well within
            # job_timeout, after which arq would cancel the job and fail it for good)
            asyncio.run(_enqueue(queue, [stalling]))
            wait_until("the stalling job to start", lambda: ledger.started("killed"), 60)
            pool.kill(first)
            assert ledger.effects().get("killed") is None  # it never got to its effect
            jobs.append(stalling)

            _start(pool, environ)
            everything = [job_id for _, job_id, _ in jobs]
            try:
                outcomes = asyncio.run(_results(queue, everything, timeout=60))
            except Exception as exc:  # pragma: no cover - a failure's diagnosis
                raise AssertionError(f"a job failed: {exc!r}\n{pool.logs()}") from exc

            # the killed job once more: arq takes a job id again once its result is gone
            # (keep_result passed); its run is a duplicate
            runs = ledger.started("killed")
            arq_keys.delete(f"arq:result:{killed_job}")
            asyncio.run(_enqueue(queue, [("by_job", killed_job, ("killed", 2, KILLED_QTY))]))
            duplicate = asyncio.run(_results(queue, [killed_job], timeout=60))[killed_job]
            logs = pool.logs()

        # exactly one effect per order, and the stock that follows
        expected = {**dict.fromkeys(ORDERS, 1), "dup": 1, "held": 1, "killed": 1}
        assert ledger.effects() == expected, logs
        assert ledger.stock(1) == STOCK - sum(ORDERS.values()) - DUP_QTY - HELD_QTY
        assert ledger.stock(2) == STOCK - KILLED_QTY

        # the 5 jobs of one order all return the one stored result of its only run
        dup_results = [outcomes[job_id] for job_id in dup_jobs]
        assert all(d == dup_results[0] for d in dup_results)
        (dup_pid,) = ledger.query("SELECT pid FROM {s}.effects WHERE order_id = 'dup'")[0]
        assert dup_results[0]["pid"] == dup_pid and dup_results[0]["key"] == "order:dup"
        assert [outcomes[order_jobs[o]]["order_id"] for o in ORDERS] == list(ORDERS)

        # the held order ran only once its key was free, in a later run of the same job, and
        # its refusals used up no try: it ran as its first try
        assert outcomes[held_job]["job_try"] == 1

        # the killed job: run twice (killed, then run again by arq), applied once, by the
        # second worker, under the key of its arq job id, taken over from the dead worker
        assert len(runs) == 2 and runs[0] != runs[1], logs
        (effect_pid,) = ledger.query("SELECT pid FROM {s}.effects WHERE order_id = 'killed'")[0]
        key = f"arq:{killed_job}"
        assert outcomes[killed_job]["pid"] == effect_pid == runs[1]
        assert outcomes[killed_job]["key"] == key
        assert outcomes[killed_job]["job_try"] >= 2
        record = inbox.claim(key)
        assert (record.state.value, record.attempt) == ("completed", 2)

        # the same job enqueued again is a duplicate: the stored result, no run
        assert duplicate == outcomes[killed_job]
        assert ledger.started("killed") == runs
    finally:
        try:
            inbox.close()
            arq_keys.close()
            delete_redis_keys(f"arq:*{queue}*")
            delete_redis_keys(f"{queue}*")
            delete_redis_keys(f"*{ledger.schema}*")
        finally:
            ledger.drop()
