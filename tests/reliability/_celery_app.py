"""The Celery application that ``test_celery_prefork.py`` runs a prefork worker of.

Like an application that follows the README, it makes a module-level ``Locks`` and ``Inbox``
and touches them at import, in the worker's main process, before the pool forks its children:
``inbox.install()`` and a ``try_acquire`` of the lease ``parent`` (held, and renewed, by the
main process for as long as it runs). Every task then runs a ``guarded`` job with those very
clients in a child. Configured by environment variables (set by the test).
"""

from __future__ import annotations

import os
import time
from typing import Any

import celery

import jobfence

URL = os.environ["JOBFENCE_CELERY_URL"]
NAMESPACE = os.environ["JOBFENCE_CELERY_NAMESPACE"]
BROKER = os.environ["JOBFENCE_CELERY_BROKER"]
QUEUE = os.environ["JOBFENCE_CELERY_QUEUE"]
TASK = "jobfence_fork_test.work"

app = celery.Celery("jobfence_fork_test", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)

locks = jobfence.Locks(URL, namespace=NAMESPACE)
inbox = jobfence.Inbox(URL, table=f"{NAMESPACE}_inbox")
inbox.install()
PARENT = locks.try_acquire("parent", ttl=2)
if PARENT is None:
    raise RuntimeError("the lease 'parent' is not free")


@jobfence.guarded(
    locks=locks,
    inbox=inbox,
    lock="slot:{slot}",
    key="task:{n}",
    ttl=2,
    timeout=30,
    claim_ttl=2,
)
def process(n: int, slot: int) -> dict[str, Any]:
    claim = jobfence.guard.current_claim()
    lease = jobfence.current_lease()
    assert claim is not None and claim.renews and lease is not None and lease.held
    time.sleep(0.05)
    return {"n": n, "pid": os.getpid(), "token": lease.token}


@app.task(name=TASK)
def work(n: int, slot: int) -> dict[str, Any]:
    return process(n, slot)
