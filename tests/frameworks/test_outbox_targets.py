"""The outbox's framework targets against real Celery (Redis broker), RQ, Dramatiq (Redis and
RabbitMQ) and arq workers, with the tasks of ``_outbox_*.py`` (guarded without a key).

For each framework: orders' jobs are added to a PostgreSQL outbox in committed transactions
(and one in a transaction that rolls back); a relay publishes them with the framework target;
the same rows are then sent again by hand, as a relay does that stalled past its lease and
wakes up. The framework's own worker runs the guarded task: each committed row runs exactly
once (one ledger row, written with the claim's marker), under the framework id = the row id;
the rolled-back row never runs. Celery and Dramatiq deliver the re-send, and the guard
recognises it; RQ and arq refuse the re-send themselves while the job (or its result) is
stored, and once it is gone the re-send reaches the worker and the guard returns the stored
result without running the body.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import jobfence
from jobfence.backends.base import OutboxRow
from jobfence.errors import BackendError
from jobfence.integrations import outbox_targets
from jobfence.integrations.outbox_targets import task_body
from tests.frameworks._support import Workers, python, wait_until, workers
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL, delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
ORDERS = (101, 102, 103)


class Scenario:
    """One test's PostgreSQL schema (received, ledger), outbox and inbox tables, and the
    environment of its worker."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.schema = f"jf_ob_{uuid.uuid4().hex[:10]}"
        self.environ = {
            **os.environ,
            "JOBFENCE_OB_SCHEMA": self.schema,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(f"CREATE TABLE {self.schema}.received (id serial, msg_id text)")
            conn.execute(
                f"CREATE TABLE {self.schema}.ledger (id serial, msg_id text, order_id int, "
                "headers text, pid int)"
            )
        self.outbox = jobfence.Outbox(POSTGRES_URL, table=f"{self.schema}_outbox")
        self.outbox.install()

    def add_orders(self, task: str, headers: bool = True) -> dict[int, str]:
        """Each order's job added in the order's committed transaction, plus one order whose
        transaction rolls back; returns order -> outbox row id (of the committed ones)."""
        ids = {}
        with psycopg.connect(POSTGRES_URL) as conn:
            for order in ORDERS:
                with conn.transaction():
                    ids[order] = self.outbox.add(
                        conn,
                        queue=task,
                        body=task_body(order_id=order),
                        headers={"trace": f"t{order}"} if headers else None,
                    )
            conn.execute("SELECT 1")  # a transaction that rolls back, with its job
            self.outbox.add(conn, queue=task, body=task_body(order_id=999))
            conn.rollback()
        return ids

    def published_rows(self) -> list[OutboxRow]:
        """The published rows as a relay claims them: what a stalled relay sends again."""
        entries = self.outbox.entries(state="published")
        return [
            OutboxRow(e.seq, e.id, e.queue, e.key, e.body, e.headers, e.attempts, e.created_at)
            for e in sorted(entries, key=lambda e: e.seq)
        ]

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            return conn.execute(sql.format(s=self.schema)).fetchall()

    def received(self) -> list[str]:
        return [r[0] for r in self.query("SELECT msg_id FROM {s}.received ORDER BY id")]

    def ledger(self) -> dict[str, tuple[int, Any]]:
        """msg id -> (order id, headers seen), one per ledger row (a second row would fail
        the comparison with the expected dict: asserted by :meth:`assert_once`)."""
        rows = self.query("SELECT msg_id, order_id, headers FROM {s}.ledger ORDER BY id")
        return {m: (o, json.loads(h)) for m, o, h in rows}

    def assert_once(self, ids: dict[int, str], headers: bool = True) -> None:
        rows = self.query("SELECT msg_id, order_id FROM {s}.ledger")
        assert Counter(m for m, _ in rows) == Counter(ids.values()), rows  # once each
        expected_headers = {o: ({"trace": f"t{o}"} if headers else {}) for o in ids}
        assert self.ledger() == {i: (o, expected_headers[o]) for o, i in ids.items()}
        assert 999 not in {o for _, o in rows}  # the rolled-back order's job never ran
        stats = self.outbox.stats()
        assert (stats.pending, stats.claimed, stats.published) == (0, 0, len(ids))

    def cleanup(self) -> None:
        try:
            self.outbox.drop()
        finally:
            self.outbox.close()
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
                conn.execute(f"DROP TABLE IF EXISTS {self.schema}_inbox")
            delete_redis_keys(f"*{self.schema}*")


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    state = Scenario(tmp_path)
    try:
        yield state
    finally:
        state.cleanup()


def relay_once(scenario: Scenario, target: Any, **options: Any) -> int:
    relay = jobfence.Relay(scenario.outbox, target, **options)
    try:
        return relay.run_once()
    finally:
        relay.close()


def stop(pool: Workers, proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pool.kill(proc)


def test_celery_target_runs_each_committed_row_once(scenario: Scenario) -> None:
    import celery

    # the relay's side: a client app that routes by default to the worker's queue
    client = celery.Celery("jf_outbox_client", broker=REDIS_URL)
    client.conf.update(task_default_queue=scenario.schema, task_ignore_result=True)
    try:
        ids = scenario.add_orders("jf_outbox.ship")
        assert relay_once(scenario, outbox_targets.celery(client)) == 3
        outbox_targets.celery(client).send(scenario.published_rows())  # the re-send
        with workers(scenario.tmp_path) as pool:
            worker = pool.start(
                [
                    *(python(), "-m", "celery", "-A", "tests.frameworks._outbox_celery"),
                    *("worker", "-P", "solo", "-Q", scenario.schema, "--loglevel=INFO"),
                    *("-n", f"{scenario.schema}@%h", "--without-gossip", "--without-mingle"),
                ],
                scenario.environ,
            )
            wait_until("the worker to take the 6 messages", lambda: len(scenario.received()) == 6)
            wait_until("the 3 orders to run", lambda: len(scenario.ledger()) == 3, 30)
            stop(pool, worker)
            logs = pool.logs()
        # the task id is the row id; each row reached the worker twice and ran once
        assert Counter(scenario.received()) == {i: 2 for i in ids.values()}, logs
        scenario.assert_once(ids)
    finally:
        client.close()


def test_rq_target_runs_each_committed_row_once(scenario: Scenario) -> None:
    conn = redis.Redis.from_url(REDIS_URL)
    target = outbox_targets.rq(conn, scenario.schema)
    burst = [
        *(python(), "-m", "rq.cli", "worker", "--url", REDIS_URL, "--burst"),
        *("--name", f"{scenario.schema}-{{n}}", scenario.schema),
    ]
    try:
        ids = scenario.add_orders("tests.frameworks._outbox_rq.ship")
        assert relay_once(scenario, target) == 3
        rows = scenario.published_rows()
        target.send(rows)  # the re-send: RQ still holds the jobs, not enqueued again
        from rq import Queue as RQQueue
        from rq.job import Job

        queue = RQQueue(scenario.schema, connection=conn)
        assert sorted(queue.job_ids) == sorted(ids.values())
        with workers(scenario.tmp_path) as pool:
            run = [a.format(n=1) for a in burst]
            assert pool.start(run, scenario.environ).wait(timeout=60) == 0, pool.logs()
            assert sorted(scenario.received()) == sorted(ids.values())
            # the jobs gone (as after their result_ttl): the re-send reaches the worker, and
            # the guard finds each key completed
            for job_id in ids.values():
                Job.fetch(job_id, connection=conn).delete()
            target.send(rows)
            run = [a.format(n=2) for a in burst]
            assert pool.start(run, scenario.environ).wait(timeout=60) == 0, pool.logs()
            for order, job_id in ids.items():
                job = Job.fetch(job_id, connection=conn)
                assert job.get_status(refresh=True) == "finished"
                assert job.return_value() == {"id": job_id, "order_id": order}
        assert Counter(scenario.received()) == {i: 2 for i in ids.values()}
        scenario.assert_once(ids)
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_dramatiq_target_runs_each_committed_row_once(scenario: Scenario, kind: str) -> None:
    environ = {**scenario.environ, "JOBFENCE_OB_BROKER": kind}
    queue = f"{scenario.schema}_q"
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker: Any = RabbitmqBroker(url=RABBITMQ_URL)
    else:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=REDIS_URL, namespace=scenario.schema)
    # the relay's process does not import the actor: the target is given its queue
    target = outbox_targets.dramatiq(broker, queue_name=queue)
    try:
        ids = scenario.add_orders("ship")
        assert relay_once(scenario, target) == 3
        target.send(scenario.published_rows())  # the re-send
        with workers(scenario.tmp_path) as pool:
            worker = pool.start(
                [
                    *(python(), "-m", "dramatiq", "tests.frameworks._outbox_dramatiq"),
                    *("--processes", "1", "--threads", "1"),
                ],
                environ,
            )
            wait_until("the worker to take the 6 messages", lambda: len(scenario.received()) == 6)
            wait_until("the 3 orders to run", lambda: len(scenario.ledger()) == 3, 30)
            stop(pool, worker)
            logs = pool.logs()
        assert Counter(scenario.received()) == {i: 2 for i in ids.values()}, logs
        scenario.assert_once(ids)
    finally:
        if kind == "rabbitmq":
            broker.channel.queue_delete(queue)
            for suffix in (".DQ", ".XQ"):
                broker.channel.queue_delete(queue + suffix)
        broker.close()


def test_arq_target_runs_each_committed_row_once(scenario: Scenario) -> None:
    from arq.connections import RedisSettings, create_pool

    settings = RedisSettings.from_dsn(REDIS_URL)
    burst = [python(), "-m", "arq", "tests.frameworks._outbox_arq.WorkerSettings", "--burst"]
    ids = scenario.add_orders("ship", headers=False)
    # a blocking Relay: the target makes its own pool on its own event loop
    assert relay_once(scenario, outbox_targets.arq(settings, queue_name=scenario.schema)) == 3
    rows = scenario.published_rows()

    async def resend() -> list[Any]:
        """The re-send from an event loop, on the caller's pool (AsyncRelay's way)."""
        pool = await create_pool(settings, default_queue_name=scenario.schema)
        try:
            await outbox_targets.arq(pool).send_async(rows)
            return [await pool.exists(f"arq:job:{i}") for i in ids.values()]
        finally:
            await pool.aclose()

    async def drop_results() -> None:
        pool = await create_pool(settings)
        try:
            await pool.delete(*(f"arq:result:{i}" for i in ids.values()))
        finally:
            await pool.aclose()

    assert asyncio.run(resend()) == [1, 1, 1]  # queued once: arq refused the ids
    with workers(scenario.tmp_path) as procs:
        assert procs.start(burst, scenario.environ).wait(timeout=60) == 0, procs.logs()
        assert sorted(scenario.received()) == sorted(ids.values())
        # the results gone (as after keep_result): the re-send is queued, and the guard
        # finds each key completed
        asyncio.run(drop_results())
        asyncio.run(resend())
        assert procs.start(burst, scenario.environ).wait(timeout=60) == 0, procs.logs()
    assert Counter(scenario.received()) == {i: 2 for i in ids.values()}
    scenario.assert_once(ids, headers=False)


async def test_an_async_relay_sends_with_a_blocking_framework_target(scenario: Scenario) -> None:
    from rq import Queue as RQQueue

    conn = redis.Redis.from_url(REDIS_URL)
    task = "tests.frameworks._outbox_rq.ship"
    ids = scenario.add_orders(task)
    outbox = jobfence.AsyncOutbox(POSTGRES_URL, table=scenario.outbox.table)
    relay = jobfence.AsyncRelay(outbox, outbox_targets.rq(conn, scenario.schema))
    try:
        assert await relay.run_once() == 3  # RQ's blocking calls, in a thread
    finally:
        await relay.close()
        await outbox.close()
    queue = RQQueue(scenario.schema, connection=conn)
    try:
        assert sorted(queue.job_ids) == sorted(ids.values())
        for order, job_id in ids.items():
            job = queue.fetch_job(job_id)
            assert job is not None
            assert (job.func_name, job.args, job.kwargs) == (task, (), {"order_id": order})
            assert job.meta["headers"] == {"trace": f"t{order}"}
    finally:
        conn.close()


def test_a_row_that_is_not_a_task_body_is_dead_alone(scenario: Scenario) -> None:
    conn = redis.Redis.from_url(REDIS_URL)
    task = "tests.frameworks._outbox_rq.ship"
    try:
        with psycopg.connect(POSTGRES_URL) as db, db.transaction():
            good = scenario.outbox.add(db, queue=task, body=task_body(order_id=1))
            bad = scenario.outbox.add(db, queue=task, body={"order_id": 2})
            also_good = scenario.outbox.add(db, queue=task, body=task_body(3))
        target = outbox_targets.rq(conn, scenario.schema)
        assert relay_once(scenario, target, max_attempts=1) == 2
        from rq import Queue as RQQueue

        assert sorted(RQQueue(scenario.schema, connection=conn).job_ids) == sorted(
            [good, also_good]
        )
        (dead,) = scenario.outbox.entries(state="dead")
        assert dead.id == bad and dead.attempts == 1
        assert dead.last_error is not None and "is not a task body" in dead.last_error
    finally:
        conn.close()


def test_a_celery_row_may_not_overwrite_celerys_own_headers() -> None:
    import celery

    app = celery.Celery("jf_headers", broker="redis://127.0.0.1:1/0")  # never reached
    row = OutboxRow(1, "r1", "t", None, b'{"args":[]}', {"id": "other", "trace": "x"}, 0, 0.0)
    with pytest.raises(jobfence.ConfigurationError, match=r"headers \['id'\]") as caught:
        outbox_targets.celery(app).send([row])
    assert caught.value.argument == "headers"
    with pytest.raises(jobfence.ConfigurationError, match="is not a task body"):
        outbox_targets.celery(app).send([OutboxRow(1, "r2", "t", None, b"[1]", {}, 0, 0.0)])


def test_a_broker_that_is_down_gives_the_rows_back_without_an_attempt(
    scenario: Scenario,
) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F")  # nothing listens
    ids = scenario.add_orders("ship")
    with pytest.raises(BackendError, match="the broker cannot be reached"):
        relay_once(scenario, outbox_targets.dramatiq(broker, queue_name="q"), max_attempts=1)
    entries = scenario.outbox.entries()
    assert sorted(e.id for e in entries) == sorted(ids.values())
    assert {(e.state, e.attempts) for e in entries} == {("pending", 0)}


def _down_target(kind: str) -> Any:
    """A framework target whose broker address has nothing listening (port 1)."""
    if kind.startswith("celery"):
        import celery

        broker = "redis://127.0.0.1:1/0" if kind == "celery-redis" else "amqp://g:g@127.0.0.1:1//"
        return outbox_targets.celery(celery.Celery("jf_down", broker=broker))
    if kind == "rq":
        return outbox_targets.rq(redis.Redis(port=1), "q")
    if kind == "dramatiq-redis":
        from dramatiq.brokers.redis import RedisBroker

        return outbox_targets.dramatiq(RedisBroker(url="redis://127.0.0.1:1/0"), queue_name="q")
    if kind == "dramatiq-rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return outbox_targets.dramatiq(
            RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F"), queue_name="q"
        )
    from arq.connections import RedisSettings

    return outbox_targets.arq(RedisSettings(port=1, conn_retries=0))


@pytest.mark.parametrize(
    ("kind", "raised"),
    [
        ("celery-redis", "OperationalError"),  # kombu
        ("celery-amqp", "OperationalError"),
        ("rq", "ConnectionError"),  # redis
        ("dramatiq-redis", "ConnectionError"),
        ("dramatiq-rabbitmq", "ConnectionClosed"),  # dramatiq, from pika's AMQPConnectionError
        ("arq", "ConnectionError"),
    ],
)
def test_each_frameworks_broker_down_error_is_a_transient_backend_error(
    kind: str, raised: str
) -> None:
    row = OutboxRow(1, uuid.uuid4().hex, "ship", None, b'{"args":[1]}', {}, 0, 0.0)
    target = _down_target(kind)
    try:
        with pytest.raises(BackendError, match="the broker cannot be reached") as caught:
            target.send([row])
    finally:
        target.close()
    cause = caught.value.__cause__
    assert cause is not None and type(cause).__name__ == raised
    assert jobfence.is_transient(cause)  # the framework's own error, as jobfence classifies it
    assert jobfence.is_transient(caught.value)
