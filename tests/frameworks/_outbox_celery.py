"""The Celery task of ``test_outbox_targets.py`` (Redis broker; see ``_outbox_apps``)."""

from __future__ import annotations

from typing import Any

import celery
from celery import current_task
from celery.signals import task_prerun

import jobfence
from jobfence.integrations import celery as jfcelery
from tests.frameworks import _outbox_apps as shared
from tests.servers import POSTGRES_URL, REDIS_URL

TASK = "jf_outbox.ship"

app = celery.Celery("jf_outbox", broker=REDIS_URL)
app.conf.update(
    task_default_queue=shared.SCHEMA,
    task_ignore_result=True,
    worker_enable_remote_control=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
inbox = jobfence.Inbox(POSTGRES_URL, table=shared.INBOX_TABLE)


@task_prerun.connect
def _received(task_id: str | None = None, **_: Any) -> None:
    shared.received(task_id)


@app.task(name=TASK)
@jfcelery.guarded(inbox=inbox, claim_ttl=5)
def ship(order_id: int) -> dict[str, Any]:
    request = current_task.request
    return shared.ran(inbox, request.id, order_id, {"trace": getattr(request, "trace", None)})
