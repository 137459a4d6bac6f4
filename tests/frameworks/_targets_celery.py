"""The Celery task of ``test_schedule_targets.py`` (RabbitMQ broker; see ``_targets_apps``)."""

from __future__ import annotations

from typing import Any

import celery
from celery import current_task
from celery.signals import task_prerun

import jobfence
from jobfence.integrations import celery as jfcelery
from tests.frameworks import _targets_apps as shared
from tests.frameworks._support import AMQP_URL
from tests.servers import REDIS_URL

app = celery.Celery("jf_targets", broker=AMQP_URL)
app.conf.update(
    task_default_queue=shared.NAMESPACE,
    task_ignore_result=True,
    worker_enable_remote_control=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
inbox = jobfence.Inbox(REDIS_URL, table=shared.TABLE)


@task_prerun.connect
def _received(task_id: str | None = None, **_: Any) -> None:
    shared.received(task_id)


@app.task(name="jf_targets.report")
@jfcelery.guarded(inbox=inbox, claim_ttl=5)
def report(region: str, slot: str) -> dict[str, Any]:
    return shared.ran(current_task.request.id, region, slot)
