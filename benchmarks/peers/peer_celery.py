"""Celery's app for the worker comparison (broker from PEER_BROKER, queue PEER_QUEUE)."""

from __future__ import annotations

import os

import peer_common
from celery import Celery

app = Celery("peer", broker=os.environ.get("PEER_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=os.environ.get("PEER_QUEUE", "peer"),
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="peer.tick")
def tick() -> None:
    peer_common.tick()
