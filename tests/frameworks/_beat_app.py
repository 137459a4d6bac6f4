"""The Celery application ``test_celery_beat.py`` runs ``celery beat`` processes and a worker
of, configured by environment variables the test sets: ``JOBFENCE_BEAT_QUEUE`` (a queue of
this test run only) and ``JOBFENCE_BEAT_NAMESPACE`` (the jobfence inbox table of the slot
records and of the task's claims, and the prefix of the Redis lists below).

The broker is the test Redis. One beat entry, ``jf-beat-tick``, sends the task ``jf_beat.tick``
every second. The task is guarded with ``jobfence.integrations.celery.guarded`` without a key,
so its idempotency key is the Celery task id. Two Redis lists record what the worker saw:

* ``<namespace>:received`` -- every message the worker started (task id, time), duplicates
  included (Celery's ``task_prerun`` signal, outside the guard);
* ``<namespace>:runs`` -- every run of the task's body (task id, time), inside the guard.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import celery
import redis
from celery import current_task
from celery.signals import task_prerun

import jobfence
from jobfence.integrations import celery as jfcelery
from tests.servers import REDIS_URL

QUEUE = os.environ["JOBFENCE_BEAT_QUEUE"]
NAMESPACE = os.environ["JOBFENCE_BEAT_NAMESPACE"]
ENTRY = "jf-beat-tick"

app = celery.Celery("jf_beat", broker=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_enable_remote_control=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    beat_schedule={ENTRY: {"task": "jf_beat.tick", "schedule": 1.0}},
    beat_max_loop_interval=1,
    # read by jobfence.integrations.celery_beat.Scheduler (ignored by the other schedulers):
    # a beat killed while it sends a slot is replaced 2 s after its last renewal
    jobfence_url=REDIS_URL,
    jobfence_namespace=NAMESPACE,
    jobfence_lease=2.0,
)

_redis = redis.Redis.from_url(REDIS_URL)
inbox = jobfence.Inbox(REDIS_URL, table=f"{NAMESPACE}_tasks")


@task_prerun.connect
def _received(task_id: str | None = None, **_: Any) -> None:
    _redis.rpush(f"{NAMESPACE}:received", json.dumps([task_id, time.time()]))


@app.task(name="jf_beat.tick")
@jfcelery.guarded(inbox=inbox, claim_ttl=5)
def tick() -> None:
    _redis.rpush(f"{NAMESPACE}:runs", json.dumps([current_task.request.id, time.time()]))
