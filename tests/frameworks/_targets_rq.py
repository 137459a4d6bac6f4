"""The RQ job of ``test_schedule_targets.py`` (see ``_targets_apps``)."""

from __future__ import annotations

from typing import Any

from rq import get_current_job

import jobfence
from jobfence.integrations.rq import guarded
from tests.frameworks import _targets_apps as shared
from tests.servers import REDIS_URL

inbox = jobfence.Inbox(REDIS_URL, table=shared.TABLE)


@guarded(inbox=inbox, claim_ttl=5)
def _report(region: str, slot: str) -> dict[str, Any]:
    job = get_current_job()
    assert job is not None
    return shared.ran(job.id, region, slot)


def report(region: str, slot: str) -> Any:
    """What the test enqueues: records the job, then runs the guarded body."""
    job = get_current_job()
    assert job is not None
    shared.received(job.id)
    return _report(region, slot)
