"""``limit=("tenant:{tenant}", 2)`` on real Celery (prefork, 4 processes, RabbitMQ), arq (one
worker running up to 10 jobs at once) and RQ (4 ``rq worker`` processes) workers: 8 tasks of
one tenant all run, never more than 2 at once (the others are refused "not now" and sent back
to the framework's retry), and a second tenant's tasks run beside them."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import celery
import kombu
import pytest
import redis
import rq

from tests.frameworks._support import AMQP_URL, REDIS_URL, Ledger, env, python, workers
from tests.frameworks.test_arq import _enqueue, _results
from tests.frameworks.test_rq import start_worker
from tests.servers import delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _most_at_once(spans: list[list[float]]) -> int:
    """The largest number of the runs ``[start, end]`` that overlapped."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def _check(runs: dict[str, list[list[float]]]) -> None:
    assert len(runs["a"]) == 8 and len(runs["b"]) == 2
    assert _most_at_once(runs["a"]) == 2, runs["a"]  # the limit, and it was used
    assert _most_at_once(runs["a"] + runs["b"]) >= 3  # the other tenant was not held back


def test_celery_tasks_over_the_limit_wait_their_turn(tmp_path: Path) -> None:
    ledger = Ledger()  # a schema of its own: the lock namespace of the workers
    queue = f"jf-fw-celery-lim-{uuid.uuid4().hex[:12]}"
    environ = {
        **env(ledger.schema),
        "JOBFENCE_CELERY_BROKER": AMQP_URL,
        "JOBFENCE_CELERY_BACKEND": REDIS_URL,
        "JOBFENCE_CELERY_QUEUE": queue,
    }
    client = celery.Celery("jf_fw_celery_client", broker=AMQP_URL, backend=REDIS_URL)
    try:
        with workers(tmp_path) as pool:
            pool.start(
                [
                    *(python(), "-m", "celery", "-A", "tests.frameworks._celery_app", "worker"),
                    *("-P", "prefork", "-c", "4", "-Q", queue, "-n", f"lim-{queue}@%h"),
                    *("--loglevel=INFO", "--without-gossip", "--without-mingle"),
                    "--without-heartbeat",
                ],
                environ,
            )
            sent = {
                tenant: [
                    client.send_task("jf_fw.limited", args=(tenant, n), queue=queue)
                    for n in range(count)
                ]
                for tenant, count in (("a", 8), ("b", 2))
            }
            try:
                runs = {t: [r.get(timeout=90) for r in results] for t, results in sent.items()}
            except Exception as exc:  # pragma: no cover - a failure's diagnosis
                raise AssertionError(f"a task failed: {exc!r}\n{pool.logs()}") from exc
        _check(runs)
        for results in sent.values():
            for result in results:
                result.forget()
    finally:
        client.close()
        with kombu.Connection(AMQP_URL) as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)
        delete_redis_keys(f"*{ledger.schema}*")


def test_arq_jobs_over_the_limit_wait_their_turn(tmp_path: Path) -> None:
    ledger = Ledger()  # a schema name of its own: the lock namespace of the worker
    queue = f"jf-fw-arq-lim-{uuid.uuid4().hex[:12]}"
    environ = {**env(ledger.schema), "JOBFENCE_ARQ_QUEUE": queue}
    jobs: list[tuple[str, str, tuple[Any, ...]]] = [
        ("limited", f"{queue}-{tenant}-{n}", (tenant, n))
        for tenant, count in (("a", 8), ("b", 2))
        for n in range(count)
    ]
    try:
        with workers(tmp_path) as pool:
            pool.start([python(), "-m", "arq", "tests.frameworks._arq_app.WorkerSettings"], environ)
            asyncio.run(_enqueue(queue, jobs))
            try:
                results = asyncio.run(_results(queue, [job_id for _, job_id, _ in jobs], 90))
            except Exception as exc:  # pragma: no cover - a failure's diagnosis
                raise AssertionError(f"a job failed: {exc!r}\n{pool.logs()}") from exc
        runs: dict[str, list[list[float]]] = {"a": [], "b": []}
        for _, job_id, (tenant, _n) in jobs:
            runs[tenant].append(results[job_id])
        _check(runs)
    finally:
        delete_redis_keys(f"arq:*{queue}*")
        delete_redis_keys(f"{queue}*")
        delete_redis_keys(f"*{ledger.schema}*")


def test_rq_jobs_over_the_limit_wait_their_turn(tmp_path: Path) -> None:
    ledger = Ledger()  # a schema name of its own: the lock namespace of the workers
    name = f"jf-rq-lim-{uuid.uuid4().hex[:12]}"
    conn = redis.Redis.from_url(REDIS_URL)
    queue = rq.Queue(name, connection=conn)
    environ = {**env(ledger.schema), "JOBFENCE_RQ_REDIS": REDIS_URL}
    try:
        with workers(tmp_path) as pool:
            for n in range(4):  # one moves the retries back into the queue
                start_worker(pool, queue, environ, scheduler=n == 0)
            jobs = {
                tenant: [
                    queue.enqueue("tests.frameworks._rq_app.limited", tenant, n)
                    for n in range(count)
                ]
                for tenant, count in (("a", 8), ("b", 2))
            }
            deadline = time.monotonic() + 100
            every = [job for js in jobs.values() for job in js]
            while not all(job.get_status(refresh=True) == "finished" for job in every):
                failed = [job for job in every if job.get_status() == "failed"]
                assert not failed, (failed[0].latest_result(), pool.logs())
                assert time.monotonic() < deadline, pool.logs()
                time.sleep(0.1)
            runs = {t: [job.return_value() for job in js] for t, js in jobs.items()}
        _check(runs)
    finally:
        members = [m for m in conn.smembers("rq:workers") if name.encode() in m]
        if members:
            conn.srem("rq:workers", *members)
        conn.close()
        delete_redis_keys(f"rq:*{name}*")
        delete_redis_keys(f"*{ledger.schema}*")
