"""The arq worker of ``test_schedule_targets.py``: ``python -m arq
tests.frameworks._targets_arq.WorkerSettings --burst`` (see ``_targets_apps``)."""

from __future__ import annotations

from typing import Any

from arq.connections import RedisSettings
from arq.worker import func

import jobfence
from jobfence.integrations import arq as jfarq
from tests.frameworks import _targets_apps as shared
from tests.servers import REDIS_URL

inbox = jobfence.AsyncInbox(REDIS_URL, table=shared.TABLE)


@jfarq.guarded(inbox=inbox, claim_ttl=5)
async def _report(ctx: dict[str, Any], region: str, slot: str) -> dict[str, Any]:
    return shared.ran(ctx["job_id"], region, slot)


async def report(ctx: dict[str, Any], region: str, slot: str) -> Any:
    """The job: records it, then runs the guarded body."""
    shared.received(ctx["job_id"])
    return await _report(ctx, region, slot)


async def shutdown(ctx: dict[str, Any]) -> None:
    await inbox.close()


class WorkerSettings:
    redis_settings = RedisSettings.from_dsn(REDIS_URL)
    queue_name = shared.NAMESPACE
    functions = [func(report, name="report")]
    keep_result = 600
    poll_delay = 0.05
    on_shutdown = shutdown
