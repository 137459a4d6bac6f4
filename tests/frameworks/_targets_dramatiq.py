"""The Dramatiq actor of ``test_schedule_targets.py``: ``python -m dramatiq
tests.frameworks._targets_dramatiq`` (Redis broker in the test's namespace; see
``_targets_apps``)."""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

import jobfence
from jobfence.integrations.dramatiq import JobfenceMiddleware, guarded
from tests.frameworks import _targets_apps as shared
from tests.servers import REDIS_URL

QUEUE = "jf_targets"

inbox = jobfence.Inbox(REDIS_URL, table=shared.TABLE)


class Received(Middleware):  # type: ignore[misc]
    """Records every message the worker starts, duplicates included."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        shared.received(message.message_id)


broker = RedisBroker(url=REDIS_URL, namespace=shared.NAMESPACE)
broker.add_middleware(Received())
broker.add_middleware(JobfenceMiddleware(clients=[inbox]))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="report", queue_name=QUEUE, max_retries=3)
@guarded(inbox=inbox, claim_ttl=5)
def report(region: str, slot: str) -> dict[str, Any]:
    message = jobfence.guard.current_claim().key.removeprefix("dramatiq:")
    return shared.ran(message, region, slot)
