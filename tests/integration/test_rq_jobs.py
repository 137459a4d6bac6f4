"""``jobfence.integrations.rq.guarded_job`` run by a real RQ worker on the test Redis.

A ``SimpleWorker`` in burst mode runs the jobs in this process (RQ's own dequeue, execution,
retry and failure handling; it imports the job functions of this module by name). Each test
has its own queue name, and every job id starts with it, so its keys are found and deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest
import redis
import rq
from rq.results import Result

import jobfence
from jobfence.errors import ClaimInProgress, ConfigurationError
from jobfence.integrations.rq import guarded_job
from tests.claims import held_elsewhere
from tests.rq_quiet import QuietWorker
from tests.servers import REDIS_URL, delete_redis_keys

DSN = "postgresql://postgres@127.0.0.1:5432/test"
HERE = __name__

#: every run of a job body in this process: (job name, arguments)
ran: list[tuple[str, Any]] = []

INBOX = jobfence.Inbox(f"memory://rq-jobs-{uuid.uuid4().hex}")


@guarded_job(inbox=INBOX)
def by_job_id(n: int) -> dict[str, int]:
    ran.append(("by_job_id", n))
    return {"double": n * 2, "run": len(ran)}


@guarded_job(inbox=INBOX, key="order:{order_id}", fingerprint=True)
def place_order(order_id: str, qty: int) -> dict[str, Any]:
    ran.append(("place_order", (order_id, qty)))
    return {"order": order_id, "qty": qty, "run": len(ran)}


@guarded_job(inbox=INBOX, key="flaky:{name}")
def flaky(name: str) -> str:
    ran.append(("flaky", name))
    if len([r for r in ran if r == ("flaky", name)]) == 1:
        raise RuntimeError("the job's own error, first run only")
    return "second run"


#: set per test by the fixtures that make their clients (RQ imports them by name)
blocked_order: Any = None
locked_order: Any = None
async_order: Any = None


def _blocked_order(order_id: str) -> str:
    ran.append(("blocked_order", order_id))
    return "ran"


def _locked_order(order_id: str, product_id: int) -> str:
    ran.append(("locked_order", order_id))
    return f"applied {order_id}"


async def _async_order(order_id: str, qty: int) -> dict[str, Any]:
    ran.append(("async_order", order_id))
    return {"order": order_id, "qty": qty}


@pytest.fixture(autouse=True)
def _runs() -> Iterator[None]:
    ran.clear()
    yield
    ran.clear()


@pytest.fixture
def queue() -> Iterator[rq.Queue]:
    name = f"jf-rq-{uuid.uuid4().hex[:12]}"
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        yield rq.Queue(name, connection=conn)
    finally:
        conn.close()
        delete_redis_keys(f"rq:*{name}*")


def enqueue(queue: rq.Queue, fn: Any, *args: Any, **options: Any) -> rq.job.Job:
    job_id = options.pop("job_id", None) or f"{queue.name}-{uuid.uuid4().hex[:8]}"
    return queue.enqueue(fn, *args, job_id=job_id, **options)


def work(queue: rq.Queue, *, with_scheduler: bool = False) -> None:
    """A real RQ worker, in this process, until the queue is empty."""
    worker = QuietWorker(
        [queue], connection=queue.connection, name=f"{queue.name}-{uuid.uuid4().hex[:6]}"
    )
    worker.work(burst=True, with_scheduler=with_scheduler, logging_level="WARNING")


def test_without_a_key_the_job_id_is_the_key_so_running_the_job_again_is_a_duplicate(queue):
    job = enqueue(queue, by_job_id, 21)
    work(queue)
    assert job.get_status(refresh=True) == "finished"
    first = job.return_value(refresh=True)
    assert first == {"double": 42, "run": 1}
    stored = INBOX.claim(f"rq:{job.id}")  # the key the job used: RQ's job id
    assert (stored.state.value, stored.result) == ("completed", first)

    again = enqueue(queue, by_job_id, 21, job_id=job.id)  # the same job once more
    work(queue)
    assert again.get_status(refresh=True) == "finished"
    assert again.return_value(refresh=True) == first  # the stored result
    assert ran == [("by_job_id", 21)]  # the body ran once

    other = enqueue(queue, by_job_id, 21)  # another job: another key
    work(queue)
    assert other.return_value(refresh=True) == {"double": 42, "run": 2}


def test_one_order_enqueued_five_times_runs_once_and_each_job_returns_its_result(queue):
    jobs = [enqueue(queue, place_order, "o-5", 3) for _ in range(5)]
    work(queue)
    results = [j.return_value(refresh=True) for j in jobs]
    assert results == [{"order": "o-5", "qty": 3, "run": 1}] * 5
    assert ran == [("place_order", ("o-5", 3))]


@pytest.fixture
def blocked(queue) -> Iterator[Any]:
    """``blocked_order`` retried at once, at most 3 times; its key held by another worker."""
    global blocked_order
    blocked_order = guarded_job(
        inbox=INBOX, key="blocked:{order_id}", retry_delay=0, max_retries=3
    )(_blocked_order)
    held = held_elsewhere(INBOX.claim(f"blocked:{queue.name}", ttl=60))
    assert held.state.value == "new"
    try:
        yield held
    finally:
        held.release()
        blocked_order = None


def test_a_claim_in_progress_is_scheduled_after_the_holders_expiry_without_using_a_retry(
    queue, blocked
):
    before = datetime.now(timezone.utc).replace(microsecond=0)  # RQ keeps whole seconds
    job = enqueue(queue, f"{HERE}.blocked_order", queue.name)
    work(queue)
    job.refresh()
    assert ran == []  # never ran while another worker held the claim
    # "not now": scheduled for when the holder's claim (ttl 60) expires, not retried at once
    # (retry_delay=0) until max_retries=3 ran out and the job failed
    assert job.get_status() == "scheduled"
    assert not job.number_of_retries  # the refusal used up none of the 3 retries
    at = queue.scheduled_job_registry.get_scheduled_time(job)
    assert 50 <= (at - before).total_seconds() < 60 + 15
    assert [r.type for r in job.results()] == [Result.Type.RETRIED]


@pytest.fixture
def locks() -> Iterator[jobfence.Locks]:
    client = jobfence.Locks(f"memory://rq-locks-{uuid.uuid4().hex}")
    try:
        yield client
    finally:
        client.close()


def test_a_lock_timeout_is_scheduled_after_the_holders_expiry_and_then_runs(queue, locks):
    global locked_order
    locked_order = guarded_job(
        locks=locks,
        inbox=INBOX,
        lock="inventory:{product_id}",
        key="locked:{order_id}",
        timeout=0,
        retry_delay=1.5,  # rq.Retry wants whole seconds: 2
    )(_locked_order)
    order = f"{queue.name}-o"
    try:
        lease = locks.try_acquire("inventory:1", ttl=3)  # renewed while held
        assert lease is not None
        before = datetime.now(timezone.utc).replace(microsecond=0)  # RQ keeps whole seconds
        job = enqueue(queue, f"{HERE}.locked_order", order, 1)
        work(queue)
        assert job.get_status(refresh=True) == "scheduled"
        assert ran == []
        assert not job.number_of_retries  # "not now" uses up no retry
        at = queue.scheduled_job_registry.get_scheduled_time(job)
        # after the holder's lease expiry (at most 3 s, plus jitter), not retry_delay
        assert 1 <= (at - before).total_seconds() < 4 + 10  # slack for a slow machine
        assert job.latest_result().type == Result.Type.RETRIED
        lease.release()

        while datetime.now(timezone.utc) <= at:  # the scheduler moves due jobs only
            time.sleep(0.05)
        work(queue, with_scheduler=True)
        assert job.get_status(refresh=True) == "finished"
        assert job.return_value(refresh=True) == f"applied {order}"
        assert ran == [("locked_order", order)]
    finally:
        locked_order = None


def test_a_fingerprint_mismatch_fails_the_job_without_rqs_exception_retries(queue):
    ok = enqueue(queue, place_order, "o-fp", 5, retry=rq.Retry(max=3))
    bad = enqueue(queue, place_order, "o-fp", 6, retry=rq.Retry(max=3))
    work(queue)
    assert ok.get_status(refresh=True) == "finished"
    bad.refresh()
    assert bad.get_status() == "failed"
    assert bad.retries_left == 0  # the 3 exception retries were dropped: no retry ran
    latest = bad.latest_result()
    assert latest.type == Result.Type.FAILED
    assert "FingerprintMismatch" in (latest.exc_string or "")
    assert ran == [("place_order", ("o-fp", 5))]


def test_the_jobs_own_exception_goes_to_rqs_own_retry(queue):
    job = enqueue(queue, flaky, queue.name, retry=rq.Retry(max=2))
    work(queue)
    job.refresh()
    assert job.get_status() == "finished"
    assert job.return_value() == "second run"
    assert job.retries_left == 1
    # the first run's claim was released when it raised, so the retry could run it
    assert ran == [("flaky", queue.name), ("flaky", queue.name)]


@pytest.fixture
def pg_table() -> Iterator[str]:
    table = f"jf_rq_{uuid.uuid4().hex[:12]}"
    try:
        yield table
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def test_async_jobs_each_in_its_own_event_loop_share_one_async_inbox(queue, pg_table):
    """RQ runs an ``async def`` job with ``asyncio.run``: a new event loop per job, while the
    ``AsyncInbox`` (and its PostgreSQL connections) is made once, at import."""
    global async_order
    inbox = jobfence.AsyncInbox(DSN, table=pg_table)
    async_order = guarded_job(inbox=inbox)(_async_order)
    try:
        first = enqueue(queue, f"{HERE}.async_order", "a-1", 2)
        second = enqueue(queue, f"{HERE}.async_order", "a-2", 3)
        work(queue)
        assert first.return_value(refresh=True) == {"order": "a-1", "qty": 2}
        assert second.return_value(refresh=True) == {"order": "a-2", "qty": 3}
        again = enqueue(queue, f"{HERE}.async_order", "a-1", 2, job_id=first.id)
        work(queue)
        assert again.get_status(refresh=True) == "finished"
        assert again.return_value(refresh=True) == {"order": "a-1", "qty": 2}
        assert ran == [("async_order", "a-1"), ("async_order", "a-2")]
        with psycopg.connect(DSN, autocommit=True) as conn:
            keys = conn.execute(f"SELECT k FROM {pg_table} ORDER BY k").fetchall()
        assert sorted(k for (k,) in keys) == sorted([f"rq:{first.id}", f"rq:{second.id}"])
    finally:
        async_order = None
        import asyncio

        asyncio.run(inbox.close())


def test_outside_an_rq_job_it_is_a_guarded_function():
    with pytest.raises(ConfigurationError) as info:
        by_job_id(1)  # no job id to default the key to
    assert info.value.argument == "key"
    assert place_order("o-direct", 1) == {"order": "o-direct", "qty": 1, "run": 1}
    held = INBOX.claim("blocked:direct", ttl=60)
    task = guarded_job(inbox=INBOX, key="blocked:{order_id}")(_blocked_order)
    try:
        with pytest.raises(ClaimInProgress):  # no RQ job to retry: raised as it is
            task("direct")
    finally:
        held.release()


def test_retry_policy_reruns_the_whole_job_in_process():
    # guarded's retry=RetryPolicy(...) is one of the options guarded passes on, as in the
    # other integrations (RQ's own retry is the job's return value, not this argument)
    calls: list[str] = []

    def once_busy(order_id: str) -> str:
        calls.append(order_id)
        if len(calls) == 1:
            raise TimeoutError("busy")
        return f"applied {order_id}"

    policy = jobfence.RetryPolicy(attempts=2, backoff=0, retry_on=(TimeoutError,))
    task = guarded_job(inbox=INBOX, key="policy:{order_id}", retry=policy)(once_busy)
    assert task("p-1") == "applied p-1"
    assert calls == ["p-1", "p-1"]


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"max_retries": 0}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_retries": "3"}, "max_retries"),
        ({"retry_delay": -1}, "retry_delay"),
        ({"key": "order:{nope}"}, "key"),
        ({"lock": "x:{order_id}"}, "locks"),
    ],
)
def test_bad_options_name_the_argument(options, argument):
    with pytest.raises(ConfigurationError) as info:
        guarded_job(inbox=INBOX, **options)(_blocked_order)
    assert info.value.argument == argument
