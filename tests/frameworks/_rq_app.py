"""The RQ jobs that ``test_rq.py`` runs real ``rq worker`` processes of.

Configured by environment variables (set by the test): ``JOBFENCE_FW_DSN`` and
``JOBFENCE_FW_SCHEMA`` (the ledger, whose inbox table the clients use),
``JOBFENCE_RQ_REDIS`` (the lock backend) and ``JOBFENCE_FW_STALL`` (read by the task body).

* ``place_order`` / ``place_order_async``: the order id is the key (``key="order:{order_id}"``),
  so every job of one order is a duplicate of the first; a lease per product;
* ``place_order_by_job``: no ``key``: the key is RQ's job id, so only a second run of the
  same job (a retry, a requeue) is a duplicate. Its claim lives 9 s after the last renewal.

``FastAbandonWorker`` is ``rq.Worker`` with a short execution heartbeat: RQ adds 60 s to it,
so a killed worker's job would be found abandoned only a minute later, too long for a test.
"""

from __future__ import annotations

import os
import time
from typing import Any

import rq

import jobfence
from jobfence.integrations.rq import guarded_job
from tests.frameworks._support import apply_order, apply_order_async

DSN = os.environ["JOBFENCE_FW_DSN"]
SCHEMA = os.environ["JOBFENCE_FW_SCHEMA"]
REDIS = os.environ["JOBFENCE_RQ_REDIS"]
TABLE = f"{SCHEMA}_inbox"

inbox = jobfence.Inbox(DSN, table=TABLE)
locks = jobfence.Locks(REDIS, namespace=SCHEMA)
async_inbox = jobfence.AsyncInbox(DSN, table=TABLE)
async_locks = jobfence.AsyncLocks(REDIS, namespace=SCHEMA)

#: short leases and claims (a killed worker's are free again soon), quick retries
FAST = {"ttl": 2, "timeout": 5, "claim_ttl": 2, "retry_delay": 1}


@guarded_job(locks=locks, inbox=inbox, lock="product:{product_id}", key="order:{order_id}", **FAST)
def place_order(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    return apply_order(inbox, order_id, product_id, qty)


@guarded_job(
    locks=async_locks,
    inbox=async_inbox,
    lock="product:{product_id}",
    key="order:{order_id}",
    **FAST,
)
async def place_order_async(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    return await apply_order_async(async_inbox, order_id, product_id, qty)


#: its claim outlives the 5 s RQ takes to find a killed worker's job abandoned, so the retry
#: first finds the dead worker's claim in progress and goes back to RQ's retry until it expires
@guarded_job(inbox=inbox, claim_ttl=9, retry_delay=1)
def place_order_by_job(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    return apply_order(inbox, order_id, product_id, qty)


@guarded_job(locks=locks, limit=("tenant:{tenant}", 2), ttl=2, retry_delay=1)
def limited(tenant: str, n: int) -> list[float]:
    """A job of which at most 2 per tenant run at once: its run's start and end (wall clock;
    the test computes the overlap)."""
    started = time.time()
    # the work: long enough that the other tenant's jobs, enqueued behind six refused ones,
    # start while two of this tenant's still run, even on a loaded machine (RQ takes its
    # refused jobs one by one, each with its own bookkeeping round trips)
    time.sleep(1.0)
    return [started, time.time()]


class FastAbandonWorker(rq.Worker):
    """An execution whose heartbeat stopped is abandoned after 5 s, not RQ's 60 s + more."""

    def get_heartbeat_ttl(self, job: Any, working_time: float = 0.0) -> int:
        return int(self.job_monitoring_interval) + 4
