#!/usr/bin/env python3
"""Publishing: messages per second into each broker, with the publish guarantee.

Every case publishes small JSON bodies (``{"i": n}``) to a fresh queue and returns only once
the broker has each message: RabbitMQ's publisher confirm (quorum queue, persistent), a
committed row (PostgreSQL, SQLite ``synchronous=full`` in WAL mode), a Redis reply. Cases per
broker, run in interleaved rounds (every case once per round, the order rotated each round),
each publishing ``ops`` messages per round:

* **hand-written floor**, one message per call and 100 per call, on the driver jobfence uses:
  redis-py ``XADD`` (a pipeline of 100), pika with publisher confirms (100 published, then
  their confirms awaited together), psycopg ``INSERT`` on an autocommit connection
  (``executemany`` of 100 in one transaction), sqlite3 ``INSERT`` + commit (``executemany``
  of 100 in one transaction), into a table with jobfence's columns and index;
* **Celery** ``apply_async`` (Redis; RabbitMQ over py-amqp, where Celery does not wait for a
  confirm unless ``confirm_publish`` is set: both rows are given; PostgreSQL and SQLite through
  kombu's SQLAlchemy transport, Celery's broker on a database, its default settings, in tables
  of its own dropped afterwards) and **Dramatiq** ``send`` (Redis, RabbitMQ without confirms,
  its default);
* jobfence ``Queue.publish`` in a loop, ``Queue.publish_many`` of 100, and the same on
  ``AsyncQueue`` (one event loop, one call at a time).

A rate is messages per second of wall time; CPU is this process's CPU time per message (the
broker's work is not in it). Usage: ``python benchmarks/bench_publish.py [--ops N]
[--rounds N] [--only redis,rabbitmq,postgres,sqlite]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

import jobfence

BATCH = 100
BROKERS = ("redis", "rabbitmq", "postgres", "sqlite")

FLOOR = "hand-written, 1 per call"
FLOOR_MANY = f"hand-written, {BATCH} per call"
CELERY = "Celery apply_async"
CELERY_CONFIRM = "Celery apply_async, confirm_publish"
#: how a target against :data:`CELERY_CONFIRM` is worded
CONFIRM_TARGET = "Celery with confirm_publish (the same guarantee)"
DRAMATIQ = "Dramatiq send"
JF = "Queue.publish"
JF_MANY = f"Queue.publish_many({BATCH})"
AJF = "AsyncQueue.publish"
AJF_MANY = f"AsyncQueue.publish_many({BATCH})"

#: each jobfence case, and the floor it is held to (>= 0.5x)
FLOOR_OF = {JF: FLOOR, AJF: FLOOR, JF_MANY: FLOOR_MANY, AJF_MANY: FLOOR_MANY}
#: each jobfence case held to Celery's (>= 1.0x)
CELERY_CASES = (JF, AJF, JF_MANY, AJF_MANY)
FLOOR_SHARE = 0.5

Runner = Callable[[int], None]


@dataclass
class PublishMeasure:
    """Messages per second of each case in each round, and CPU µs per message."""

    broker: str
    rates: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    floor_note: str = ""

    def median(self, case: str) -> float:
        return statistics.median(self.rates[case])

    def cpu_median(self, case: str) -> float:
        return statistics.median(self.cpu[case])

    def round_ratios(self, case: str, anchor: str) -> list[float]:
        return [a / b for a, b in zip(self.rates[case], self.rates[anchor], strict=True) if b]

    def ratio(self, case: str, anchor: str) -> float:
        return self.median(case) / self.median(anchor)


def _bodies(n: int) -> list[dict[str, int]]:
    return [{"i": i} for i in range(n)]


def _batches(n: int) -> list[int]:
    sizes = [BATCH] * (n // BATCH)
    if n % BATCH:
        sizes.append(n % BATCH)
    return sizes


def _on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """Run ``coro`` on ``loop``, which runs in a thread of its own for the whole measure: an
    async client's connection keeps answering heartbeats while the other cases run."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


# -- jobfence -------------------------------------------------------------------------------------
def _jobfence_cases(
    url: str, name: str, loop: asyncio.AbstractEventLoop, closers: list[Callable[[], None]]
) -> dict[str, Runner]:
    queue = jobfence.Queue(url, name)
    aqueue = jobfence.AsyncQueue(url, name)
    closers.append(lambda: (queue.purge(), queue.close()))
    closers.append(lambda: _on(loop, aqueue.close()))

    def publish(n: int) -> None:
        for body in _bodies(n):
            queue.publish(body)

    def publish_many(n: int) -> None:
        for size in _batches(n):
            queue.publish_many(_bodies(size))

    async def apublish(n: int) -> None:
        for body in _bodies(n):
            await aqueue.publish(body)

    async def apublish_many(n: int) -> None:
        for size in _batches(n):
            await aqueue.publish_many(_bodies(size))

    return {
        JF: publish,
        JF_MANY: publish_many,
        AJF: lambda n: _on(loop, apublish(n)),
        AJF_MANY: lambda n: _on(loop, apublish_many(n)),
    }


def _purge_jobfence(url: str, name: str) -> Callable[[], None]:
    def purge() -> None:
        with jobfence.Queue(url, name) as q:
            q.purge()

    return purge


# -- Celery and Dramatiq --------------------------------------------------------------------------
def _celery_case(
    broker_url: str, queue: str, closers: list[Callable[[], None]], **conf: Any
) -> Runner:
    from celery import Celery

    app = Celery("bench_publish", broker=broker_url)
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        **conf,
    )

    @app.task(name="bench_publish.noop")
    def noop(i: int) -> None:  # never run: only published
        return None

    def run(n: int) -> None:
        for i in range(n):
            noop.apply_async((i,))

    def close() -> None:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)
        app.close()

    closers.append(close)
    return run


def _celery_sql_case(
    engine_url: str, schema: str | None, closers: list[Callable[[], None]]
) -> Runner:
    """Celery on kombu's SQLAlchemy transport (``sqla+<engine url>``) with its default tables;
    on PostgreSQL in a schema of this run's (kombu's index names are not per table), dropped
    at the end."""
    import sqlalchemy

    if schema is not None:
        engine = sqlalchemy.create_engine(engine_url)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
        engine.dispose()
        engine_url += f"?options=-csearch_path%3D{schema}"

        def drop() -> None:
            engine = sqlalchemy.create_engine(engine_url)
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            engine.dispose()

        closers.insert(0, drop)  # closers run last-first: the drop after Celery's own close
    return _celery_case("sqla+" + engine_url, "celery", closers)


def _dramatiq_case(broker: Any, queue: str, closers: list[Callable[[], None]]) -> Runner:
    import dramatiq

    def noop(i: int) -> None:  # never run: only published
        return None

    actor = dramatiq.actor(noop, actor_name=f"noop_{queue}", queue_name=queue, broker=broker)

    def run(n: int) -> None:
        for i in range(n):
            actor.send(i)

    def close() -> None:
        broker.flush(queue)
        broker.close()

    closers.append(close)
    return run


# -- hand-written floors --------------------------------------------------------------------------
def _redis_floor(name: str, closers: list[Callable[[], None]]) -> dict[str, Runner]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    stream = f"bench:publish:{name}"

    def one(n: int) -> None:
        for i in range(n):
            client.xadd(stream, {"i": uuid.uuid4().hex, "b": f'{{"i": {i}}}', "h": "{}"})

    def many(n: int) -> None:
        for size in _batches(n):
            pipe = client.pipeline(transaction=False)
            for i in range(size):
                pipe.xadd(stream, {"i": uuid.uuid4().hex, "b": f'{{"i": {i}}}', "h": "{}"})
            pipe.execute()

    closers.append(lambda: (client.delete(stream), client.close()))
    return {FLOOR: one, FLOOR_MANY: many}


class _PikaConfirms:
    """pika's BlockingConnection with publisher confirms counted by a callback, so that a
    batch is published at once and its confirms awaited together."""

    def __init__(self, queue: str) -> None:
        import pika

        self.pika = pika
        self.queue = queue
        self.connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        self.channel = self.connection.channel()
        self.channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        self.unconfirmed: set[int] = set()
        self.nacked = 0
        self.seq = 0
        selected: list[bool] = []
        self.channel._impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _f: selected.append(True)
        )
        self.connection._flush_output(lambda: bool(selected))

    def _on_confirm(self, frame: Any) -> None:
        tag = frame.method.delivery_tag
        done = {s for s in self.unconfirmed if s <= tag} if frame.method.multiple else {tag}
        self.unconfirmed -= done
        if frame.method.NAME == "Basic.Nack":
            self.nacked += len(done)

    def publish(self, bodies: list[bytes]) -> None:
        impl = self.channel._impl
        for body in bodies:
            props = self.pika.BasicProperties(message_id=uuid.uuid4().hex, delivery_mode=2)
            impl.basic_publish("", self.queue, body, props, mandatory=True)
            self.seq += 1
            self.unconfirmed.add(self.seq)
        # process_data_events(t) would sleep out t: pika's own wait returns at the confirm
        self.connection._flush_output(lambda: not self.unconfirmed)
        if self.nacked:
            raise RuntimeError("nacked")

    def close(self) -> None:
        self.channel.queue_delete(self.queue)
        self.connection.close()


def _rabbit_floor(name: str, closers: list[Callable[[], None]]) -> dict[str, Runner]:
    floor = _PikaConfirms(f"bench-publish-floor-{name}")

    def one(n: int) -> None:
        for i in range(n):
            floor.publish([f'{{"i": {i}}}'.encode()])

    def many(n: int) -> None:
        for size in _batches(n):
            floor.publish([f'{{"i": {i}}}'.encode() for i in range(size)])

    closers.append(floor.close)
    return {FLOOR: one, FLOOR_MANY: many}


_PG_TABLE = """
CREATE TABLE {t} (
    seq bigserial PRIMARY KEY, queue text NOT NULL, id text NOT NULL, body bytea NOT NULL,
    headers text, state text NOT NULL DEFAULT 'ready', delivery integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL, consumer text, receipt uuid,
    published_at timestamptz NOT NULL, last_error text, dead_at timestamptz
);
CREATE INDEX {t}_next ON {t} (queue, state, visible_at, seq)
"""
_PG_INSERT = (
    "INSERT INTO {t} (queue, id, body, headers, visible_at, published_at) "
    "VALUES (%s, %s, %s, NULL, clock_timestamp(), clock_timestamp())"
)


def _postgres_floor(name: str, closers: list[Callable[[], None]]) -> dict[str, Runner]:
    import psycopg

    table = f"bench_publish_{name.replace('-', '_')}"
    conn = psycopg.connect(POSTGRES_URL, autocommit=True)
    for statement in _PG_TABLE.format(t=table).split(";"):
        conn.execute(statement)
    insert = _PG_INSERT.format(t=table)

    def one(n: int) -> None:
        for i in range(n):
            conn.execute(insert, ("q", uuid.uuid4().hex, f'{{"i": {i}}}'.encode()))

    def many(n: int) -> None:
        for size in _batches(n):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    insert,
                    [("q", uuid.uuid4().hex, f'{{"i": {i}}}'.encode()) for i in range(size)],
                )

    def close() -> None:
        conn.execute(f"DROP TABLE {table}")
        conn.close()

    closers.append(close)
    return {FLOOR: one, FLOOR_MANY: many}


_SQLITE_TABLE = """
CREATE TABLE IF NOT EXISTS floor (
    seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL,
    headers TEXT NOT NULL, state TEXT NOT NULL, delivery INTEGER NOT NULL,
    visible_at REAL NOT NULL, consumer TEXT, receipt TEXT, published_at REAL NOT NULL,
    last_error TEXT, dead_at REAL
);
CREATE INDEX IF NOT EXISTS floor_due ON floor (queue, state, visible_at)
"""
_SQLITE_INSERT = (
    "INSERT INTO floor (queue, id, body, headers, state, delivery, visible_at, published_at) "
    "VALUES (?, ?, ?, '{}', 'ready', 0, ?, ?)"
)


def _sqlite_floor(path: str, closers: list[Callable[[], None]]) -> dict[str, Runner]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(_SQLITE_TABLE)

    def row(i: int) -> tuple[Any, ...]:
        now = time.time()
        return ("q", uuid.uuid4().hex, f'{{"i": {i}}}'.encode(), now, now)

    def one(n: int) -> None:
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_SQLITE_INSERT, row(i))
            conn.execute("COMMIT")

    def many(n: int) -> None:
        for size in _batches(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_SQLITE_INSERT, [row(i) for i in range(size)])
            conn.execute("COMMIT")

    closers.append(conn.close)
    return {FLOOR: one, FLOOR_MANY: many}


# -- one broker -----------------------------------------------------------------------------------
def _cases(
    broker: str, tmp: str, loop: asyncio.AbstractEventLoop, closers: list[Callable[[], None]]
) -> dict[str, Runner]:
    name = f"bp-{uuid.uuid4().hex[:10]}"
    cases: dict[str, Runner] = {}
    if broker == "redis":
        cases.update(_redis_floor(name, closers))
        cases[CELERY] = _celery_case(REDIS_URL, f"celery-{name}", closers)
        from dramatiq.brokers.redis import RedisBroker

        db = RedisBroker(url=REDIS_URL, namespace=f"dramatiq-{name}")
        cases[DRAMATIQ] = _dramatiq_case(db, f"dq_{name.replace('-', '_')}", closers)
        url = f"{REDIS_URL}?namespace=bench-{name}"
    elif broker == "rabbitmq":
        cases.update(_rabbit_floor(name, closers))
        amqp = RABBITMQ_URL.replace("amqp://", "pyamqp://", 1)
        cases[CELERY] = _celery_case(amqp, f"celery-{name}", closers)
        cases[CELERY_CONFIRM] = _celery_case(
            amqp,
            f"celery-c-{name}",
            closers,
            broker_transport_options={"confirm_publish": True},
        )
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        rb = RabbitmqBroker(url=RABBITMQ_URL)
        cases[DRAMATIQ] = _dramatiq_case(rb, f"dq_{name.replace('-', '_')}", closers)
        url = RABBITMQ_URL
    elif broker == "postgres":
        cases.update(_postgres_floor(name, closers))
        engine = POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1)
        cases[CELERY] = _celery_sql_case(engine, f"celery_{name.replace('-', '_')}", closers)
        url = f"{POSTGRES_URL}?table=bench_publish_jf"
    elif broker == "sqlite":
        cases.update(_sqlite_floor(os.path.join(tmp, "floor.db"), closers))
        engine = f"sqlite:///{os.path.join(tmp, 'celery.db')}"
        cases[CELERY] = _celery_sql_case(engine, None, closers)
        url = f"sqlite:///{os.path.join(tmp, 'jobfence.db')}"
    else:
        raise ValueError(f"unknown broker {broker!r}")
    cases.update(_jobfence_cases(url, name, loop, closers))
    return cases


def measure(broker: str, ops: int, rounds: int) -> PublishMeasure:
    """Interleaved rounds of every case of ``broker``, ``ops`` messages per case per round."""
    m = PublishMeasure(broker)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-publish-loop", daemon=True)
    thread.start()
    closers: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cases = _cases(broker, tmp, loop, closers)
            for run in cases.values():  # warm-up: connections, declarations, tables, scripts
                run(min(ops, BATCH))
            items = list(cases.items())
            for label, _ in items:
                m.rates[label] = []
                m.cpu[label] = []
            for r in range(rounds):
                shift = r % len(items)
                for label, run in items[shift:] + items[:shift]:
                    wall, cpu = time.perf_counter(), time.process_time()
                    run(ops)
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    m.rates[label].append(ops / wall)
                    m.cpu[label].append(cpu / ops * 1e6)
        finally:
            for close in reversed(closers):
                try:
                    close()
                except Exception as exc:  # cleanup of a benchmark: report, go on
                    print(f"cleanup failed: {exc!r}", file=sys.stderr)
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
    return m


def targets(m: PublishMeasure) -> list[tuple[str, bool, str]]:
    """``(text, met, figures)`` of each target of ``m``."""
    out = []
    for case, floor in FLOOR_OF.items():
        ratio = m.ratio(case, floor)
        per = m.round_ratios(case, floor)
        out.append(
            (
                f"{m.broker}: {case} ≥ {FLOOR_SHARE:.2f}x the {floor}",
                ratio >= FLOOR_SHARE,
                f"{ratio:.2f}x; per round {min(per):.2f}x-{max(per):.2f}x",
            )
        )
    # Celery's default, and on RabbitMQ also Celery with the guarantee jobfence keeps (a
    # publish returns once the broker confirmed it)
    for anchor, name in ((CELERY, CELERY), (CELERY_CONFIRM, CONFIRM_TARGET)):
        if anchor not in m.rates:
            continue
        for case in CELERY_CASES:
            ratio = m.ratio(case, anchor)
            per = m.round_ratios(case, anchor)
            out.append(
                (
                    f"{m.broker}: {case} ≥ {name}",
                    ratio >= 1.0,
                    f"{m.median(case):.0f} vs {m.median(anchor):.0f} msg/s, {ratio:.2f}x; "
                    f"per round {min(per):.2f}x-{max(per):.2f}x",
                )
            )
    return out


def table(m: PublishMeasure) -> list[tuple[str, ...]]:
    """Rows ``case | msg/s median | slowest-fastest round | CPU µs/msg | x floor | x Celery``."""
    rows = []
    for case in m.rates:
        floor = FLOOR_OF.get(case)
        rows.append(
            (
                f"{m.broker}: {case}",
                f"{m.median(case):.0f}",
                f"{min(m.rates[case]):.0f}-{max(m.rates[case]):.0f}",
                f"{m.cpu_median(case):.0f}",
                f"{m.ratio(case, floor):.2f}x" if floor else "-",
                f"{m.ratio(case, CELERY):.2f}x" if CELERY in m.rates else "-",
            )
        )
    return rows


HEADER = (
    "case",
    "msg/s median",
    "msg/s per round (min-max)",
    "CPU µs/msg",
    "x floor",
    "x Celery",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000, help="messages per case per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(BROKERS))
    args = parser.parse_args()
    for broker in [b.strip() for b in args.only.split(",") if b.strip()]:
        m = measure(broker, args.ops, args.rounds)
        print(f"\n== {broker}")
        print(" | ".join(HEADER))
        for row in table(m):
            print(" | ".join(row))
        for text, met, figures in targets(m):
            print(f"{'MET' if met else 'NOT MET'}: {text} ({figures})")


if __name__ == "__main__":
    main()
