#!/usr/bin/env python3
"""A guarded task on each framework's own worker: Celery, RQ, Dramatiq, arq, on Redis.

For each framework, the same no-op task in variants, in interleaved rounds (the order rotated
each round); per round and variant, ``N`` tasks are enqueued on a fresh queue (untimed), then
the framework's own worker, in this process, drains it. The time per task is that from the
start of the first task's body to the end of the last one's, divided by ``N - 1``: a worker's
steady throughput, end to end (fetch, run, ack, result), without the worker's start-up.

  (a) unguarded: the task as it is -- the anchor
  (b) jobfence guard: the framework integration as its how-to page sets it up (``locks`` and
      ``inbox`` on the same Redis, ``lock="item:{n}"``, the default key: the framework's job
      id; Dramatiq with ``JobfenceMiddleware``)
  (c) celery-once (Celery only): ``base=QueueOnce`` -- its lock is taken when the task is
      enqueued (untimed here) and deleted after the task ran
  (d) AWS Lambda Powertools idempotency: ``idempotent_function`` on its Redis persistence
      layer around the task's body, keyed by the task's arguments

Every variant of a framework runs on the same worker settings: concurrency 1 (Celery's
``solo`` pool, RQ's ``SimpleWorker``, one Dramatiq worker thread, arq's ``max_jobs=1``). The
frameworks' defaults (a process per core for Celery, a fork per job for RQ) would measure the
scheduling of processes on a shared 2-core machine; one task at a time exposes the guard's
round trips fully, the least favourable case for it. Celery runs with ``acks_late`` (as its
how-to page sets it up), arq with ``poll_delay=1 ms`` (its default 0.5 s pause between polls
would dominate a drained queue), Dramatiq without its Prometheus middleware.

Usage: ``python benchmarks/bench_frameworks.py [--tasks 300] [--rounds 5]
[--only celery,rq,dramatiq,arq]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

from _harness import Stats
from tests.servers import REDIS_URL

import jobfence

if __name__ == "__main__":  # RQ imports its jobs by module path: one module, not two copies
    sys.modules.setdefault("bench_frameworks", sys.modules[__name__])

UNGUARDED = "(a) unguarded"
JOBFENCE = "(b) jobfence guard"
CELERY_ONCE = "(c) celery-once QueueOnce"
POWERTOOLS = "(d) Powertools idempotent_function (Redis)"
#: how long one round may take before the benchmark gives up on it (a task lost or failing)
ROUND_TIMEOUT = 30.0


@dataclass
class Measured:
    """One framework's seconds per task (per round) by variant."""

    framework: str
    timings: dict[str, Stats]


class Drain:
    """Counts the task bodies of one round: the first body's start and the last one's end."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.first: float | None = None
        self.last = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.total:
                self.last = time.perf_counter()
                self.done.set()

    def per_task(self) -> float:
        if not self.done.wait(ROUND_TIMEOUT):
            raise RuntimeError(f"only {self.count} of {self.total} tasks ran")
        assert self.first is not None
        return (self.last - self.first) / max(1, self.total - 1)


#: the round being drained (the task bodies report to it)
_drain = Drain(0)


def _body(n: int, tag: str) -> dict[str, int]:
    """The no-op task body every variant runs."""
    drain = _drain
    drain.start()
    drain.end()
    return {"n": n}


def _new_round(total: int) -> Drain:
    global _drain
    _drain = Drain(total)
    return _drain


def _stats(per_round: list[float]) -> Stats:
    return Stats.of(per_round, [[x] for x in per_round])


def _interleaved(
    variants: dict[str, Callable[[int], float]], tasks: int, rounds: int
) -> dict[str, Stats]:
    """``variants[name](tasks)`` gives seconds per task of one round; a warm-up round each,
    then ``rounds`` rounds, the order rotated each round."""
    for run in variants.values():
        run(min(tasks, 20))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    items = list(variants.items())
    for i in range(rounds):
        shift = i % len(items)
        for name, run in items[shift:] + items[:shift]:
            samples[name].append(run(tasks))
    return {name: _stats(values) for name, values in samples.items()}


class _Clients:
    """The jobfence clients of one framework's run, on their own namespace of the Redis."""

    def __init__(self, prefix: str) -> None:
        self.ns = f"{prefix}_{uuid.uuid4().hex[:8]}"

    def sync(self) -> tuple[jobfence.Locks, jobfence.Inbox]:
        locks = jobfence.Locks(REDIS_URL, namespace=self.ns)
        inbox = jobfence.Inbox(REDIS_URL, table=self.ns)
        inbox.install()
        return locks, inbox

    def cleanup(self) -> None:
        import redis

        r = redis.Redis.from_url(REDIS_URL)
        try:
            for key in r.scan_iter(match=f"*{self.ns}*", count=1000):
                r.delete(key)
        finally:
            r.close()


class _LambdaContext:
    """The fields of a Lambda context Powertools' idempotency reads outside Lambda."""

    function_name = "bench"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:eu-west-1:000000000000:function:bench"
    aws_request_id = "bench"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 300_000


def _powertools(prefix: str) -> tuple[Callable[[int, str], Any], Callable[[], None]]:
    """The task body wrapped in Powertools' ``idempotent_function`` on its Redis layer
    (its own redis-py client), keyed by the task's arguments; and its closer."""
    import redis

    os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence import redis as layers

    client = redis.Redis.from_url(REDIS_URL)
    with warnings.catch_warnings():  # announced to be renamed in Powertools 4
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = layers.RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(expires_after_seconds=300, lambda_context=_LambdaContext())

    @idempotent_function(
        data_keyword_argument="job", persistence_store=layer, config=config, key_prefix=prefix
    )
    def idempotent(job: dict[str, Any]) -> dict[str, int]:
        return _body(job["n"], job["tag"])

    def task(n: int, tag: str) -> Any:
        return idempotent(job={"n": n, "tag": tag})

    return task, client.close


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The frameworks' workers log every task at INFO: keep this run's output to the rows."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(level)


# -- Celery ---------------------------------------------------------------------------------------
def measure_celery(tasks: int, rounds: int) -> Measured:
    import celery
    from celery.contrib.testing.worker import start_worker
    from celery_once import QueueOnce

    from jobfence.integrations import celery as jfcelery

    clients = _Clients("bench_fw_celery")
    locks, inbox = clients.sync()
    app = celery.Celery("bench_frameworks", broker=REDIS_URL, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": REDIS_URL, "default_timeout": 3600},
        },
    )
    pt_task, pt_close = _powertools(f"{clients.ns}pt")

    @app.task(name=f"{clients.ns}.plain")
    def plain(n: int, tag: str) -> Any:
        return _body(n, tag)

    @app.task(name=f"{clients.ns}.jobfence", max_retries=None)
    @jfcelery.guarded(locks=locks, inbox=inbox, lock="item:{n}", retry_delay=5)
    def guarded(n: int, tag: str) -> Any:
        return _body(n, tag)

    @app.task(name=f"{clients.ns}.once", base=QueueOnce)
    def once(n: int, tag: str) -> Any:
        return _body(n, tag)

    @app.task(name=f"{clients.ns}.powertools")
    def powertools(n: int, tag: str) -> Any:
        return pt_task(n, tag)

    def variant(task: Any) -> Callable[[int], float]:
        def run(total: int) -> float:
            queue = f"{clients.ns}.q.{uuid.uuid4().hex[:8]}"
            drain = _new_round(total)
            tag = uuid.uuid4().hex
            for n in range(total):
                task.apply_async((n, tag), queue=queue)
            with start_worker(
                app,
                pool="solo",
                concurrency=1,
                perform_ping_check=False,
                loglevel="WARNING",
                queues=[queue],
            ):
                seconds = drain.per_task()
            return seconds

        return run

    try:
        with _quiet():
            timings = _interleaved(
                {
                    UNGUARDED: variant(plain),
                    JOBFENCE: variant(guarded),
                    CELERY_ONCE: variant(once),
                    POWERTOOLS: variant(powertools),
                },
                tasks,
                rounds,
            )
    finally:
        inbox.close()
        locks.close()
        pt_close()
        with contextlib.suppress(Exception):
            app.connection_for_write().default_channel.client.close()
        clients.cleanup()
        _cleanup_prefix(f"{clients.ns}.q.")
        _cleanup_prefix("qo_")  # celery-once's locks of this run's tasks
    return Measured("Celery", timings)


def _cleanup_prefix(prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        for key in r.scan_iter(match=f"*{prefix}*", count=1000):
            r.delete(key)
    finally:
        r.close()


# -- RQ -------------------------------------------------------------------------------------------
#: the RQ variants of the running measurement (RQ imports a job's function by its module path)
_RQ_TASKS: dict[str, Callable[..., Any]] = {}


def rq_job(variant: str, n: int, tag: str) -> Any:
    """The job RQ runs: the variant's function of the running measurement."""
    return _RQ_TASKS[variant](n, tag)


def measure_rq(tasks: int, rounds: int) -> Measured:
    import redis
    from rq import Queue, SimpleWorker

    from jobfence.integrations.rq import guarded as rq_guarded

    clients = _Clients("bench_fw_rq")
    locks, inbox = clients.sync()
    connection = redis.Redis.from_url(REDIS_URL)
    pt_task, pt_close = _powertools(f"{clients.ns}pt")

    @rq_guarded(locks=locks, inbox=inbox, lock="item:{n}", retry_delay=5)
    def guarded(n: int, tag: str) -> Any:
        return _body(n, tag)

    _RQ_TASKS.update({"plain": _body, "jobfence": guarded, "powertools": pt_task})

    def variant(name: str) -> Callable[[int], float]:
        def run(total: int) -> float:
            queue = Queue(f"{clients.ns}_{uuid.uuid4().hex[:8]}", connection=connection)
            drain = _new_round(total)
            tag = uuid.uuid4().hex
            for n in range(total):
                queue.enqueue("bench_frameworks.rq_job", name, n, tag)
            worker = SimpleWorker([queue], connection=connection)
            worker.work(burst=True, logging_level="WARNING")
            seconds = drain.per_task()
            queue.delete(delete_jobs=True)
            return seconds

        return run

    try:
        with _quiet():
            timings = _interleaved(
                {
                    UNGUARDED: variant("plain"),
                    JOBFENCE: variant("jobfence"),
                    POWERTOOLS: variant("powertools"),
                },
                tasks,
                rounds,
            )
    finally:
        _RQ_TASKS.clear()
        inbox.close()
        locks.close()
        pt_close()
        connection.close()
        clients.cleanup()
    return Measured("RQ", timings)


# -- Dramatiq -------------------------------------------------------------------------------------
def measure_dramatiq(tasks: int, rounds: int) -> Measured:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import default_middleware

    from jobfence.integrations.dramatiq import JobfenceMiddleware
    from jobfence.integrations.dramatiq import guarded as dq_guarded

    clients = _Clients("bench_fw_dramatiq")
    locks, inbox = clients.sync()
    broker = RedisBroker(
        url=REDIS_URL,
        namespace=clients.ns,
        middleware=[m() for m in default_middleware],
    )
    broker.add_middleware(JobfenceMiddleware())
    pt_task, pt_close = _powertools(f"{clients.ns}pt")

    # Dramatiq logs a warning for each value an actor returns without a Results middleware
    def plain(n: int, tag: str) -> None:
        _body(n, tag)

    @dq_guarded(locks=locks, inbox=inbox, lock="item:{n}", retry_delay=5)
    def guarded(n: int, tag: str) -> None:
        _body(n, tag)

    def powertools(n: int, tag: str) -> None:
        pt_task(n, tag)

    def variant(name: str, fn: Callable[..., Any]) -> Callable[[int], float]:
        queue = f"q_{name}"
        actor = dramatiq.actor(fn, broker=broker, actor_name=name, queue_name=queue)

        def run(total: int) -> float:
            drain = _new_round(total)
            tag = uuid.uuid4().hex
            for n in range(total):
                actor.send(n, tag)
            worker = dramatiq.Worker(broker, queues={queue}, worker_threads=1)
            worker.start()
            try:
                return drain.per_task()
            finally:
                worker.stop()
                # each Worker adds its own middleware to the broker: drop it with the worker
                broker.middleware[:] = [
                    m for m in broker.middleware if getattr(m, "worker", None) is not worker
                ]

        return run

    try:
        with _quiet():
            timings = _interleaved(
                {
                    UNGUARDED: variant("plain", plain),
                    JOBFENCE: variant("jobfence", guarded),
                    POWERTOOLS: variant("powertools", powertools),
                },
                tasks,
                rounds,
            )
    finally:
        broker.close()
        inbox.close()
        locks.close()
        pt_close()
        clients.cleanup()
    return Measured("Dramatiq", timings)


# -- arq ------------------------------------------------------------------------------------------
def measure_arq(tasks: int, rounds: int) -> Measured:
    return asyncio.run(_measure_arq(tasks, rounds))


async def _measure_arq(tasks: int, rounds: int) -> Measured:
    from arq.connections import RedisSettings, create_pool
    from arq.worker import Worker, func

    from jobfence.integrations import arq as jfarq

    clients = _Clients("bench_fw_arq")
    locks = jobfence.AsyncLocks(REDIS_URL, namespace=clients.ns)
    inbox = jobfence.AsyncInbox(REDIS_URL, table=clients.ns)
    await inbox.install()
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    pt_task, pt_close = _powertools(f"{clients.ns}pt")

    async def plain(ctx: Any, n: int, tag: str) -> Any:
        return _body(n, tag)

    @jfarq.guarded(locks=locks, inbox=inbox, lock="item:{n}", retry_delay=5)
    async def guarded(ctx: Any, n: int, tag: str) -> Any:
        return _body(n, tag)

    async def powertools(ctx: Any, n: int, tag: str) -> Any:
        return pt_task(n, tag)

    def variant(name: str, fn: Callable[..., Any]) -> Callable[[int], Any]:
        async def run(total: int) -> float:
            queue = f"{clients.ns}:{uuid.uuid4().hex[:8]}"
            drain = _new_round(total)
            tag = uuid.uuid4().hex
            for n in range(total):
                await pool.enqueue_job(name, n, tag, _queue_name=queue)
            worker = Worker(
                functions=[func(fn, name=name)],
                redis_pool=pool,
                queue_name=queue,
                burst=True,
                max_jobs=1,
                poll_delay=0.001,
                handle_signals=False,
            )
            await worker.main()
            seconds = drain.per_task()
            await pool.delete(queue)
            return seconds

        return run

    variants = {
        UNGUARDED: variant("plain", plain),
        JOBFENCE: variant("jobfence", guarded),
        POWERTOOLS: variant("powertools", powertools),
    }
    try:
        with _quiet():
            for run in variants.values():
                await run(min(tasks, 20))
            samples: dict[str, list[float]] = {name: [] for name in variants}
            items = list(variants.items())
            for i in range(rounds):
                shift = i % len(items)
                for name, run in items[shift:] + items[:shift]:
                    samples[name].append(await run(tasks))
    finally:
        await inbox.close()
        await locks.close()
        pt_close()
        await pool.aclose()
        clients.cleanup()
    return Measured("arq", {name: _stats(values) for name, values in samples.items()})


MEASURES: dict[str, Callable[[int, int], Measured]] = {
    "celery": measure_celery,
    "rq": measure_rq,
    "dramatiq": measure_dramatiq,
    "arq": measure_arq,
}


def round_ratios(case: Stats, anchor: Stats) -> list[float]:
    return [a / b for a, b in zip(case.rounds, anchor.rounds, strict=False) if b > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(MEASURES))
    args = parser.parse_args()
    for name in args.only.split(","):
        m = MEASURES[name.strip()](args.tasks, args.rounds)
        base = m.timings[UNGUARDED]
        print(f"\n== {m.framework}")
        for case, st in m.timings.items():
            per = round_ratios(st, base)
            spread = f"({min(per):.2f}-{max(per):.2f})" if per else ""
            print(
                f"  {case:<44} {st.median:8.1f} µs/task  "
                f"{st.median / base.median:.2f}x {spread}  "
                f"rounds {min(st.rounds):.0f}-{max(st.rounds):.0f} µs"
            )
        guard = m.timings[JOBFENCE].median / base.median
        print(f"  {'MET' if guard <= 1.15 else 'NOT MET'}: jobfence guard ≤ 1.15x ({guard:.2f}x)")
        for alt in (CELERY_ONCE, POWERTOOLS):
            if alt in m.timings:
                ahead = m.timings[JOBFENCE].median < m.timings[alt].median
                print(f"  {'MET' if ahead else 'NOT MET'}: jobfence guard ahead of {alt}")


if __name__ == "__main__":
    main()
