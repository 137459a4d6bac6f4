"""The arq worker that ``test_arq.py`` runs:
``python -m arq tests.frameworks._arq_app.WorkerSettings``.

Configured by environment variables (set by the test): the scenario's schema and database
(``JOBFENCE_FW_SCHEMA``, ``JOBFENCE_FW_DSN``, see ``_support.env``), the arq queue
(``JOBFENCE_ARQ_QUEUE``) and ``JOBFENCE_ARQ_JOB_TIMEOUT``. Two guarded tasks run the scenario's
exactly-once body, :func:`apply_order_async`: ``place_order`` keyed by the order id (the same
order enqueued as several jobs is one effect), ``place_order_by_job`` with no key, so its key
is the arq job id (a run of the same job again is a duplicate).

The timeouts are short so that a killed worker's job runs again within seconds: arq runs a
job again once its in-progress key expires, ``job_timeout + 10`` s after the job started; by
then the killed run's lease (``ttl``) and claim (``claim_ttl``) have expired, so the new run
takes them over.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from arq.connections import RedisSettings
from arq.worker import func

import jobfence
from jobfence.integrations import arq as jfarq
from tests.frameworks._support import REDIS_URL, apply_order_async

SCHEMA = os.environ["JOBFENCE_FW_SCHEMA"]
DSN = os.environ["JOBFENCE_FW_DSN"]
QUEUE = os.environ["JOBFENCE_ARQ_QUEUE"]
JOB_TIMEOUT = float(os.environ.get("JOBFENCE_ARQ_JOB_TIMEOUT", "6"))

locks = jobfence.AsyncLocks(REDIS_URL, namespace=SCHEMA)
inbox = jobfence.AsyncInbox(DSN, table=f"{SCHEMA}_inbox")

GUARD: dict[str, Any] = {
    "locks": locks,
    "inbox": inbox,
    "lock": "product:{product_id}",
    "ttl": 2,  # a killed worker's lease is free 2 s after its last renewal
    "timeout": 1,  # well below job_timeout: a lock wait ends as LockTimeout -> arq.Retry
    "claim_ttl": 3,  # a killed worker's claim is taken over 3 s after its last renewal
    "retry_delay": 0.2,
}


async def _apply(ctx: dict[str, Any], order_id: str, product_id: int, qty: int) -> Any:
    result = await apply_order_async(inbox, order_id, product_id, qty)
    return {**result, "key": jobfence.guard.current_claim().key, "job_try": ctx["job_try"]}


@jfarq.guarded(key="order:{order_id}", **GUARD)
async def place_order(ctx: dict[str, Any], order_id: str, product_id: int, qty: int) -> Any:
    return await _apply(ctx, order_id, product_id, qty)


@jfarq.guarded(**GUARD)  # no key: "arq:<job id>"
async def place_order_by_job(ctx: dict[str, Any], order_id: str, product_id: int, qty: int) -> Any:
    return await _apply(ctx, order_id, product_id, qty)


@jfarq.guarded(locks=locks, limit=("tenant:{tenant}", 2), ttl=2, retry_delay=0.2)
async def limited(ctx: dict[str, Any], tenant: str, n: int) -> list[float]:
    """A job of which at most 2 per tenant run at once: its run's start and end (wall clock;
    the test computes the overlap)."""
    started = time.time()
    await asyncio.sleep(0.4)  # the work
    return [started, time.time()]


async def shutdown(ctx: dict[str, Any]) -> None:
    await locks.close()
    await inbox.close()


class WorkerSettings:
    redis_settings = RedisSettings.from_dsn(REDIS_URL)
    queue_name = QUEUE
    functions = [
        func(place_order, name="place_order"),
        func(place_order_by_job, name="by_job"),
        func(limited, name="limited"),
    ]
    job_timeout = JOB_TIMEOUT
    max_tries = 50  # LockTimeout / ClaimInProgress retries and a killed run each count as a try
    max_jobs = 10
    poll_delay = 0.05
    keep_result = 600
    on_shutdown = shutdown
