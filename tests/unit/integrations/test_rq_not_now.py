"""RQ: a "not now" refusal (a claim another worker holds) goes back to RQ's retry after the
claim's expiry WITHOUT using up ``max_retries``; a transient failure still does. An
in-process ``SimpleWorker`` on the real Redis (tests/frameworks/test_rq.py runs real worker
processes)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis
import rq
from rq.job import Job

import jobfence
from jobfence.integrations.rq import guarded
from tests.claims import held_elsewhere
from tests.rq_quiet import QuietWorker
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)

INBOX = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
RUNS: list[int] = []


@guarded(inbox=INBOX, key="order:{order_id}", max_retries=1, retry_delay=60)
def ship(order_id: int) -> int:
    RUNS.append(order_id)
    return order_id


@pytest.fixture
def queue() -> Iterator[rq.Queue]:
    name = f"jf-rq-notnow-{uuid.uuid4().hex[:10]}"
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        yield rq.Queue(name, connection=conn)
    finally:
        members = [m for m in conn.smembers("rq:workers") if name.encode() in m]
        if members:
            conn.srem("rq:workers", *members)
        conn.close()
        delete_redis_keys(f"rq:*{name}*")


def _run_once(queue: rq.Queue, job: Job) -> None:
    """One run of ``job`` by an in-process worker; a job RQ scheduled for a retry is taken
    out of the scheduled registry and enqueued again first (no scheduler runs here)."""
    if job.get_status(refresh=True) == "scheduled":
        queue.scheduled_job_registry.remove(job)
        queue.enqueue_job(job)
    QuietWorker([queue], connection=queue.connection).work(burst=True)


def test_refusals_are_retried_without_using_up_max_retries(queue: rq.Queue) -> None:
    held = held_elsewhere(INBOX.claim("order:7", ttl=20))  # another worker ships order 7
    job = queue.enqueue(ship, 7, job_id=f"{queue.name}-7")
    for _ in range(3):  # refused three times: more than max_retries (1)
        info = INBOX.claim_info("order:7")
        assert info is not None and info.expires_in is not None
        left = info.expires_in  # what is left of the other worker's claim, read just before
        before = datetime.now(timezone.utc)
        _run_once(queue, job)
        assert job.get_status(refresh=True) == "scheduled", job.latest_result()
        assert not job.number_of_retries  # not counted
        scheduled = queue.scheduled_job_registry.get_scheduled_time(job)
        # after the claim's expiry (what was left of its 20 s, plus jitter), not the
        # retry_delay (60 s); a slow run (a loaded machine) shortens what is left, so the
        # bound is read from the claim, not assumed
        assert left - 2 <= (scheduled - before).total_seconds() <= left * 1.1 + 2
    assert RUNS == []
    held.release()
    _run_once(queue, job)
    assert job.get_status(refresh=True) == "finished"
    assert job.return_value() == 7 and RUNS == [7]
