"""The arq worker of ``test_outbox_targets.py``: ``python -m arq
tests.frameworks._outbox_arq.WorkerSettings --burst`` (see ``_outbox_apps``)."""

from __future__ import annotations

from typing import Any

from arq.connections import RedisSettings
from arq.worker import func

import jobfence
from jobfence.integrations import arq as jfarq
from tests.frameworks import _outbox_apps as shared
from tests.servers import POSTGRES_URL, REDIS_URL

inbox = jobfence.AsyncInbox(POSTGRES_URL, table=shared.INBOX_TABLE)


@jfarq.guarded(inbox=inbox, claim_ttl=5)
async def _ship(ctx: dict[str, Any], order_id: int) -> dict[str, Any]:
    return await shared.ran_async(inbox, ctx["job_id"], order_id)


async def ship(ctx: dict[str, Any], order_id: int) -> Any:
    """The job: records it, then runs the guarded body."""
    shared.received(ctx["job_id"])
    return await _ship(ctx, order_id)


async def shutdown(ctx: dict[str, Any]) -> None:
    await inbox.close()


class WorkerSettings:
    redis_settings = RedisSettings.from_dsn(REDIS_URL)
    queue_name = shared.SCHEMA
    functions = [func(ship, name="ship")]
    keep_result = 600
    poll_delay = 0.05
    on_shutdown = shutdown
