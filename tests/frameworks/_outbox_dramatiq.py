"""The Dramatiq actor of ``test_outbox_targets.py``: ``python -m dramatiq
tests.frameworks._outbox_dramatiq``, on Redis or RabbitMQ as ``JOBFENCE_OB_BROKER`` says
(``redis`` or ``rabbitmq``; see ``_outbox_apps``)."""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage, Middleware

import jobfence
from jobfence.integrations.dramatiq import JobfenceMiddleware, guarded
from tests.frameworks import _outbox_apps as shared
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

ACTOR = "ship"
QUEUE = f"{shared.SCHEMA}_q"

inbox = jobfence.Inbox(POSTGRES_URL, table=shared.INBOX_TABLE)


class Received(Middleware):  # type: ignore[misc]
    """Records every message the worker starts, duplicates included."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        shared.received(message.message_id)


def make_broker(kind: str) -> Any:
    """The test's broker of ``kind`` (the relay side makes its own with this too)."""
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=RABBITMQ_URL)
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(url=REDIS_URL, namespace=shared.SCHEMA)


broker = make_broker(os.environ.get("JOBFENCE_OB_BROKER", "redis"))
broker.add_middleware(Received())
broker.add_middleware(CurrentMessage())
broker.add_middleware(JobfenceMiddleware(clients=[inbox]))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, max_retries=3)
@guarded(inbox=inbox, claim_ttl=5)
def ship(order_id: int) -> None:
    message = CurrentMessage.get_current_message()
    shared.ran(inbox, message.message_id, order_id, message.options.get("headers"))
