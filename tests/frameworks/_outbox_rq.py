"""The RQ job of ``test_outbox_targets.py``: the relay enqueues
``tests.frameworks._outbox_rq.ship`` (see ``_outbox_apps``)."""

from __future__ import annotations

from typing import Any

from rq import get_current_job

import jobfence
from jobfence.integrations.rq import guarded
from tests.frameworks import _outbox_apps as shared
from tests.servers import POSTGRES_URL

inbox = jobfence.Inbox(POSTGRES_URL, table=shared.INBOX_TABLE)


@guarded(inbox=inbox, claim_ttl=5)
def _ship(order_id: int, headers: Any) -> dict[str, Any]:
    job = get_current_job()
    assert job is not None
    return shared.ran(inbox, job.id, order_id, headers)


def ship(order_id: int) -> Any:
    """What the relay enqueues: records the job, then runs the guarded body."""
    job = get_current_job()
    assert job is not None
    shared.received(job.id)
    return _ship(order_id, job.meta.get("headers"))
