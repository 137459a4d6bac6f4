"""The Celery application ``test_celery.py`` runs real workers of (``celery -A
tests.frameworks._celery_app worker``), configured by environment variables the test sets:
``JOBFENCE_CELERY_BROKER`` (RabbitMQ), ``JOBFENCE_CELERY_BACKEND`` (the result backend),
``JOBFENCE_CELERY_QUEUE`` (a queue of this test run only), and the scenario's
``JOBFENCE_FW_DSN`` / ``JOBFENCE_FW_SCHEMA`` / ``JOBFENCE_FW_STALL`` (see ``_support.py``).

Two guarded tasks run the scenario's exactly-once body:

* ``apply_order``: keyed by the order (``key="order:{order_id}"``), so the same order sent as
  several tasks is applied once;
* ``apply_message``: a ``bind=True`` task without a key template, so its key is the Celery task
  id: a redelivery of the same message (its worker was killed) is the same key.

The timeouts are short so that a killed worker's lease and claim are free again in seconds.
"""

from __future__ import annotations

import os
import time
from typing import Any

import celery

import jobfence
from jobfence.integrations import celery as jfcelery
from tests.frameworks import _support

BROKER = os.environ["JOBFENCE_CELERY_BROKER"]
BACKEND = os.environ["JOBFENCE_CELERY_BACKEND"]
QUEUE = os.environ["JOBFENCE_CELERY_QUEUE"]
SCHEMA = os.environ["JOBFENCE_FW_SCHEMA"]
LOCKS_URL = os.environ.get("JOBFENCE_CELERY_LOCKS", _support.REDIS_URL)

#: lease and claim ttl: a killed worker's lease and claim are taken over this soon
TTL = 3.0
#: seconds Celery waits before it runs a task jobfence sent back again
RETRY_DELAY = 0.3

app = celery.Celery("jobfence_fw_celery", broker=BROKER, backend=BACKEND)
app.conf.update(
    task_default_queue=QUEUE,
    # the message is acknowledged after the task ran, and a task whose worker process died is
    # delivered again instead of acknowledged (and lost)
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,  # no pidbox queues left behind on the broker
    broker_connection_retry_on_startup=True,
    result_expires=600,
)

locks = jobfence.Locks(LOCKS_URL, namespace=SCHEMA)
inbox = jobfence.Inbox(os.environ["JOBFENCE_FW_DSN"], table=_support.Ledger(SCHEMA).inbox_table)


@app.task(name="jf_fw.apply_order", max_retries=None)
@jfcelery.guarded(
    locks=locks,
    inbox=inbox,
    lock="product:{product_id}",
    key="order:{order_id}",
    ttl=TTL,
    timeout=1,
    claim_ttl=TTL,
    retry_delay=RETRY_DELAY,
)
def apply_order(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    return _support.apply_order(inbox, order_id, product_id, qty)


@app.task(name="jf_fw.apply_message", bind=True, max_retries=None)
@jfcelery.guarded(
    locks=locks,
    inbox=inbox,
    lock="product:{product_id}",
    ttl=TTL,
    timeout=1,
    claim_ttl=TTL,
    retry_delay=RETRY_DELAY,
)
def apply_message(self: Any, order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    result = _support.apply_order(inbox, order_id, product_id, qty)
    return {**result, "key": jfcelery.job_key(), "task_id": self.request.id}


@app.task(name="jf_fw.limited", max_retries=None)
@jfcelery.guarded(locks=locks, limit=("tenant:{tenant}", 2), ttl=TTL, retry_delay=RETRY_DELAY)
def limited(tenant: str, n: int) -> list[float]:
    """A task of which at most 2 per tenant run at once: its run's start and end (wall
    clock; the test computes the overlap)."""
    started = time.time()
    time.sleep(0.4)  # the work
    return [started, time.time()]
