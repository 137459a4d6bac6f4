"""``jobfence.integrations.schedule_targets`` against real Celery (RabbitMQ), RQ, Dramatiq and
arq (Redis) workers, with the tasks of ``_targets_*.py`` (guarded without a key).

For each framework: two schedulers on one backend tick the same slot (one sends it); the slot
is then sent again by hand, as a process does that takes over the slot of one that died after
it sent it but before it recorded it; the next slot is sent once. The guarded body runs once
per slot, with the slot's time in its ``slot`` argument, and the framework id of each send is
the one derived from the slot key. RQ and arq refuse the re-send themselves while the first
job is stored; once it is gone, the re-send reaches the worker and the guard returns the
stored result without running the body.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import celery
import dramatiq
import kombu
import pytest
import redis
import rq
from arq.connections import RedisSettings, create_pool
from dramatiq.brokers.redis import RedisBroker
from rq.job import Job

import jobfence
from jobfence.integrations import schedule_targets
from tests.frameworks._support import AMQP_URL, Workers, env, python, wait_until, workers
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: one slot an hour: the test ticks the schedulers at chosen times
PERIOD = 3600
REGION = "eu"


class Scenario:
    """One test's namespace (queues, inbox tables, Redis lists) and what its worker saw."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.namespace = f"jf_tg_{uuid.uuid4().hex[:10]}"
        self.name = f"report-{self.namespace}"
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.environ = {**env(self.namespace), "JOBFENCE_TG_NAMESPACE": self.namespace}

    def received(self) -> list[str]:
        return [json.loads(x) for x in self.redis.lrange(f"{self.namespace}:received", 0, -1)]

    def runs(self) -> list[list[str]]:
        return [json.loads(x) for x in self.redis.lrange(f"{self.namespace}:runs", 0, -1)]

    def schedulers(self) -> tuple[jobfence.Scheduler, jobfence.Scheduler]:
        return (
            jobfence.Scheduler(REDIS_URL, namespace=self.namespace, pod="pod-a"),
            jobfence.Scheduler(REDIS_URL, namespace=self.namespace, pod="pod-b"),
        )

    def fire_twice(self, target: Callable[[jobfence.Slot], Any]) -> list[jobfence.Slot]:
        """Two schedulers tick slot 1 (one sends it), then one ticks slot 2. Returns the
        two slots."""
        base = int(datetime.now(timezone.utc).timestamp()) // PERIOD * PERIOD
        a, b = self.schedulers()
        with a, b:
            for sched in (a, b):
                sched.add(self.name, every=PERIOD, send=target)
            first = [*a.tick(now=base + 1), *b.tick(now=base + 1)]
            second = b.tick(now=base + PERIOD + 1)
        return self._slots(first, second)

    def _slots(self, first: list[Any], second: list[Any]) -> list[jobfence.Slot]:
        assert [(f.outcome, f.error) for f in first] == [("fired", None)], first
        assert [(f.outcome, f.error) for f in second] == [("fired", None)], second
        return [
            jobfence.Slot(self.name, f.slot_at, f.key, False)  # type: ignore[arg-type]
            for f in (*first, *second)
        ]

    def cleanup(self) -> None:
        self.redis.close()
        delete_redis_keys(f"*{self.namespace}*")


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    state = Scenario(tmp_path)
    try:
        yield state
    finally:
        state.cleanup()


def fire(
    scenario: Scenario, target: Callable[[jobfence.Slot], Any]
) -> tuple[list[jobfence.Slot], Any]:
    """The two slots, slot 1 sent again by hand; returns the slots and what the re-send
    returned."""
    slots = scenario.fire_twice(target)
    resent = target(slots[0])  # the same slot once more: the take-over of a dead sender
    return slots, resent


def assert_once_per_slot(scenario: Scenario, ids: list[str], slots: list[jobfence.Slot]) -> None:
    runs = scenario.runs()
    assert sorted(r[0] for r in runs) == sorted(ids), runs
    assert Counter(r[0] for r in runs) == Counter(ids)
    expected = {i: schedule_targets.slot_time(s) for i, s in zip(ids, slots, strict=True)}
    assert {r[0]: r[2] for r in runs} == expected
    assert all(r[1] == REGION for r in runs)


def stop(pool: Workers, proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pool.kill(proc)


def test_celery_target_runs_each_slot_once(scenario: Scenario) -> None:
    client = celery.Celery("jf_targets_client", broker=AMQP_URL)
    task = client.signature("jf_targets.report")
    target = schedule_targets.celery(
        task, REGION, slot_kwarg="slot", options={"queue": scenario.namespace}
    )
    try:
        slots, resent = fire(scenario, target)
        assert resent.id == slots[0].key  # the same task id as the first send
        with workers(scenario.tmp_path) as pool:
            worker = pool.start(
                [
                    *(python(), "-m", "celery", "-A", "tests.frameworks._targets_celery"),
                    *("worker", "-P", "solo", "-Q", scenario.namespace, "--loglevel=INFO"),
                    *("-n", f"{scenario.namespace}@%h", "--without-gossip", "--without-mingle"),
                ],
                scenario.environ,
            )
            wait_until(
                "the worker to take the 3 messages", lambda: len(scenario.received()) == 3, 60
            )
            wait_until("the 2 slots to run", lambda: len(scenario.runs()) == 2, 30)
            stop(pool, worker)
            logs = pool.logs()
        # the task id is the slot key; slot 1 reached the worker twice and ran once
        assert Counter(scenario.received()) == {slots[0].key: 2, slots[1].key: 1}, logs
        assert_once_per_slot(scenario, [s.key for s in slots], slots)
    finally:
        client.close()
        with kombu.Connection(AMQP_URL) as conn:
            conn.default_channel.queue_delete(scenario.namespace)
            conn.default_channel.exchange_delete(scenario.namespace)


def test_rq_target_runs_each_slot_once(scenario: Scenario) -> None:
    conn = redis.Redis.from_url(REDIS_URL)
    queue = rq.Queue(scenario.namespace, connection=conn)
    target = schedule_targets.rq(
        queue, "tests.frameworks._targets_rq.report", REGION, slot_kwarg="slot"
    )
    burst = [
        *(python(), "-m", "rq.cli", "worker", "--url", REDIS_URL, "--burst"),
        *("--name", f"{scenario.namespace}-{{n}}", scenario.namespace),
    ]
    try:
        slots, resent = fire(scenario, target)
        ids = [schedule_targets.rq_job_id(s.key) for s in slots]
        assert resent is None  # the job of slot 1 is stored: not enqueued again
        assert queue.job_ids == ids
        with workers(scenario.tmp_path) as pool:
            run = [a.format(n=1) for a in burst]
            assert pool.start(run, scenario.environ).wait(timeout=60) == 0, pool.logs()
            assert scenario.received() == ids
            # slot 1's job is gone (as after its result_ttl): the re-send reaches the worker,
            # and the guard finds its key completed
            Job.fetch(ids[0], connection=conn).delete()
            again = target(slots[0])
            assert again is not None and again.id == ids[0]
            run = [a.format(n=2) for a in burst]
            assert pool.start(run, scenario.environ).wait(timeout=60) == 0, pool.logs()
            assert again.get_status(refresh=True) == "finished"
            assert again.return_value() == {
                "id": ids[0],
                "region": REGION,
                "slot": schedule_targets.slot_time(slots[0]),
            }
        assert scenario.received() == [*ids, ids[0]]
        assert_once_per_slot(scenario, ids, slots)
    finally:
        conn.close()


def test_dramatiq_target_runs_each_slot_once(scenario: Scenario) -> None:
    broker = RedisBroker(url=REDIS_URL, namespace=scenario.namespace)

    @dramatiq.actor(broker=broker, actor_name="report", queue_name="jf_targets")
    def report(region: str, slot: str) -> None:  # pragma: no cover - the worker runs its own
        raise AssertionError("runs in the worker")

    target = schedule_targets.dramatiq(report, REGION, slot_kwarg="slot")
    try:
        slots, resent = fire(scenario, target)
        assert resent.message_id == slots[0].key
        with workers(scenario.tmp_path) as pool:
            worker = pool.start(
                [
                    *(python(), "-m", "dramatiq", "tests.frameworks._targets_dramatiq"),
                    *("--processes", "1", "--threads", "1"),
                ],
                scenario.environ,
            )
            wait_until(
                "the worker to take the 3 messages", lambda: len(scenario.received()) == 3, 60
            )
            wait_until("the 2 slots to run", lambda: len(scenario.runs()) == 2, 30)
            stop(pool, worker)
            logs = pool.logs()
        assert Counter(scenario.received()) == {slots[0].key: 2, slots[1].key: 1}, logs
        assert_once_per_slot(scenario, [s.key for s in slots], slots)
    finally:
        broker.close()


async def test_arq_target_runs_each_slot_once(scenario: Scenario) -> None:
    settings = RedisSettings.from_dsn(REDIS_URL)
    pool = await create_pool(settings, default_queue_name=scenario.namespace)
    target = schedule_targets.arq(pool, "report", REGION, slot_kwarg="slot")
    burst = [python(), "-m", "arq", "tests.frameworks._targets_arq.WorkerSettings", "--burst"]
    base = int(datetime.now(timezone.utc).timestamp()) // PERIOD * PERIOD
    try:
        a = jobfence.AsyncScheduler(REDIS_URL, namespace=scenario.namespace, pod="pod-a")
        b = jobfence.AsyncScheduler(REDIS_URL, namespace=scenario.namespace, pod="pod-b")
        async with a, b:
            for sched in (a, b):
                sched.add(scenario.name, every=PERIOD, send=target)
            first = [*await a.tick(now=base + 1), *await b.tick(now=base + 1)]
            second = await b.tick(now=base + PERIOD + 1)
        slots = scenario._slots(first, second)
        ids = [s.key for s in slots]
        assert await target(slots[0]) is None  # arq refuses the id: the job is queued
        with workers(scenario.tmp_path) as procs:
            assert procs.start(burst, scenario.environ).wait(timeout=60) == 0, procs.logs()
            assert sorted(scenario.received()) == sorted(ids)
            assert await target(slots[0]) is None  # ... and now its result is kept
            # the result gone (as after keep_result): the re-send is queued, and the guard
            # finds its key completed
            await pool.delete(f"arq:result:{ids[0]}")
            again = await target(slots[0])
            assert again is not None and again.job_id == ids[0]
            assert procs.start(burst, scenario.environ).wait(timeout=60) == 0, procs.logs()
            assert (await again.result(timeout=10)) == {
                "id": ids[0],
                "region": REGION,
                "slot": schedule_targets.slot_time(slots[0]),
            }
        assert Counter(scenario.received()) == {ids[0]: 2, ids[1]: 1}
        assert_once_per_slot(scenario, ids, slots)
    finally:
        await pool.aclose()
