#!/usr/bin/env python3
"""The worker: messages per second against a hand-written consumer loop, in one run.

For each queue backend, in interleaved rounds (median of the rounds), ``--messages`` messages
are published, then consumed until the queue is empty; the rate counts only the consuming:

  (a) a hand-written consumer loop on the same server, with the driver directly and the usual
      at-least-once shape: receive a batch, run the handler, ack each message after it
      (Redis ``XREADGROUP`` + ``XACK``/``XDEL``; PostgreSQL and SQLite ``UPDATE ... SKIP
      LOCKED`` lease + ``DELETE`` per message; RabbitMQ ``aio-pika`` with prefetch and manual
      acks), ``--concurrency`` consumers at once;
  (b) ``jobfence.AsyncWorker`` with a no-op handler, the same concurrency;
  (c) ``jobfence.AsyncWorker`` with a ``guarded(inbox=...)`` handler (the inbox on the same
      server; RabbitMQ's on Redis), keyed on the message id, against (d) the hand-written
      loop with the usual hand-written idempotency mark per message (``INSERT ... ON CONFLICT
      DO NOTHING`` / ``INSERT OR IGNORE`` / ``SET NX``, one round trip; the check-then-mark
      that the inbox replaces, so a cheaper anchor than what the inbox guarantees).

Each jobfence row's ratio is to its anchor: (b) / (a), (c) / (d).

Round trips that a guarded message costs on top of receive and ack are counted, not assumed:
the I/O hook (``jobfence.testing``) sees every backend call, and each backend call here is one
round trip (a Lua script, one statement); renewal ticks are reported apart.

Usage: ``python benchmarks/bench_worker.py [--messages 2000] [--rounds 3] [--concurrency 8]
[--only redis,postgres,sqlite,rabbitmq]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

import jobfence
from jobfence.testing import hooked

Consume = Callable[[int], Awaitable[float]]  # publish n, consume them all -> seconds


async def _drain_worker(queue: jobfence.AsyncQueue, handler: Any, n: int, conc: int) -> float:
    """Seconds until the worker processed all ``n`` messages (its shutdown after that -- up
    to one idle receive's wait -- is not counted, as the floors' is not)."""
    worker = jobfence.AsyncWorker(queue, handler, concurrency=conc, handle_signals=False)
    started = time.perf_counter()
    finished = started

    async def watch() -> None:
        nonlocal finished
        while worker.stats.processed < n:
            await asyncio.sleep(0.001)
        finished = time.perf_counter()
        worker.stop()

    watcher = asyncio.ensure_future(watch())
    await worker.run()
    await watcher
    assert worker.stats.processed == n, worker.stats
    return finished - started


def jobfence_cases(
    url: str, inbox_url: str, conc: int, on_inbox: Callable[[Any], None] | None = None
) -> dict[str, Consume]:
    """The jobfence cases; ``on_inbox(inbox)`` sees the guarded case's inbox before it runs."""

    async def noop(message: Any) -> None:
        pass

    async def plain(n: int) -> float:
        queue = jobfence.AsyncQueue(url, "bench-" + uuid.uuid4().hex[:10])
        await queue.publish_many([{"i": i} for i in range(n)])
        try:
            return await _drain_worker(queue, noop, n, conc)
        finally:
            await queue.drop()
            await queue.close()

    async def guarded(n: int) -> float:
        queue = jobfence.AsyncQueue(url, "bench-" + uuid.uuid4().hex[:10])
        table = "bench_inbox_" + uuid.uuid4().hex[:8]
        inbox = jobfence.AsyncInbox(inbox_url, table=table)
        await inbox.install()
        if on_inbox is not None:
            on_inbox(inbox)

        @jobfence.guarded(inbox=inbox)
        async def handler(message: Any) -> None:
            pass

        await queue.publish_many([{"i": i} for i in range(n)])
        try:
            return await _drain_worker(queue, handler, n, conc)
        finally:
            await queue.drop()
            await queue.close()
            await inbox.drop()
            await inbox.close()

    return {"jobfence AsyncWorker, no-op": plain, "jobfence AsyncWorker, guarded": guarded}


# -- hand-written loops ---------------------------------------------------------------------


def redis_floor(conc: int, dedupe: bool = False) -> Consume:
    import redis.asyncio as aredis

    async def run(n: int) -> float:
        client = aredis.Redis.from_url(REDIS_URL)
        key = "bench:stream:" + uuid.uuid4().hex
        await client.xgroup_create(key, "g", id="0", mkstream=True)
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd(key, {"body": f'{{"i": {i}}}'})
        await pipe.execute()
        done = 0
        started = time.perf_counter()

        async def consumer(name: str) -> None:
            nonlocal done
            while done < n:
                got = await client.xreadgroup("g", name, {key: ">"}, count=conc, block=50)
                for _stream, entries in got or []:
                    for entry_id, _fields in entries:
                        if dedupe:  # the hand-written idempotency mark: SET NX
                            await client.set(f"{key}:done:{entry_id}", 1, nx=True, px=600_000)
                        await client.xack(key, "g", entry_id)
                        await client.xdel(key, entry_id)
                        done += 1

        await asyncio.gather(*(consumer(f"c{i}") for i in range(conc)))
        elapsed = time.perf_counter() - started
        await client.delete(key)
        await client.aclose()
        return elapsed

    return run


def _sql_lease_loop(
    connect: Callable[[], Awaitable[Any]],
    setup: Callable[[Any, str, int], Awaitable[None]],
    receive_sql: str,
    ack_sql: str,
    drop_sql: str,
    conc: int,
    execute: Callable[[Any, str, tuple[Any, ...]], Awaitable[list[Any]]],
    dedupe_sql: str | None = None,
) -> Consume:
    async def run(n: int) -> float:
        table = "bench_q_" + uuid.uuid4().hex[:8]
        conns = [await connect() for _ in range(conc)]
        await setup(conns[0], table, n)
        done = 0
        started = time.perf_counter()

        async def consumer(conn: Any) -> None:
            nonlocal done
            idle = 0
            while done < n:
                token = uuid.uuid4().hex
                rows = await execute(conn, receive_sql.format(t=table), (token,))
                if not rows:
                    idle += 1
                    await asyncio.sleep(0.001 * min(idle, 10))
                    continue
                idle = 0
                for (row_id,) in rows:
                    if dedupe_sql is not None:  # the hand-written idempotency mark
                        await execute(conn, dedupe_sql.format(t=table), (str(row_id),))
                    await execute(conn, ack_sql.format(t=table), (row_id, token))
                    done += 1

        await asyncio.gather(*(consumer(c) for c in conns))
        elapsed = time.perf_counter() - started
        await execute(conns[0], drop_sql.format(t=table), ())
        await execute(conns[0], f"DROP TABLE IF EXISTS {table}_done", ())
        for c in conns:
            await c.close()
        return elapsed

    return run


def postgres_floor(conc: int, dedupe: bool = False) -> Consume:
    import psycopg

    async def connect() -> Any:
        return await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)

    async def execute(conn: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
        cur = await conn.execute(sql.replace("?", "%s"), params)
        return list(await cur.fetchall()) if cur.description else []

    async def setup(conn: Any, table: str, n: int) -> None:
        await conn.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, body jsonb, "
            "visible_at timestamptz NOT NULL DEFAULT now(), token text)"
        )
        await conn.execute(
            f"INSERT INTO {table} (body) SELECT jsonb_build_object('i', g) "
            "FROM generate_series(1, %s) g",
            (n,),
        )
        await conn.execute(f"CREATE TABLE {table}_done (k text PRIMARY KEY)")

    receive = (
        "UPDATE {t} SET visible_at = now() + interval '30 seconds', token = ? WHERE id IN "
        "(SELECT id FROM {t} WHERE visible_at <= now() ORDER BY id LIMIT "
        + str(conc)
        + " FOR UPDATE SKIP LOCKED) RETURNING id"
    )
    ack = "DELETE FROM {t} WHERE id = ? AND token = ?"
    mark = "INSERT INTO {t}_done (k) VALUES (?) ON CONFLICT DO NOTHING" if dedupe else None
    return _sql_lease_loop(connect, setup, receive, ack, "DROP TABLE {t}", conc, execute, mark)


_NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # unix seconds in SQLite 3.40


def sqlite_floor(conc: int, path: str, dedupe: bool = False) -> Consume:
    import aiosqlite

    async def connect() -> Any:
        conn = await aiosqlite.connect(path, isolation_level=None, timeout=30)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=FULL")  # what jobfence's SQLite queue uses
        return conn

    async def execute(conn: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
        cur = await conn.execute(sql, params)
        rows = await cur.fetchall()
        await cur.close()
        return list(rows)

    async def setup(conn: Any, table: str, n: int) -> None:
        await conn.execute(
            f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, body TEXT, "
            "visible_at REAL NOT NULL DEFAULT 0, token TEXT)"
        )
        await conn.executemany(
            f"INSERT INTO {table} (body) VALUES (?)", [(f'{{"i": {i}}}',) for i in range(n)]
        )
        await conn.execute(f"CREATE TABLE {table}_done (k TEXT PRIMARY KEY)")

    receive = (
        "UPDATE {t} SET visible_at = " + _NOW + " + 30, token = ? WHERE id IN "
        "(SELECT id FROM {t} WHERE visible_at <= "
        + _NOW
        + " ORDER BY id LIMIT "
        + str(conc)
        + ") RETURNING id"
    )
    ack = "DELETE FROM {t} WHERE id = ? AND token = ?"
    mark = "INSERT OR IGNORE INTO {t}_done (k) VALUES (?)" if dedupe else None
    return _sql_lease_loop(connect, setup, receive, ack, "DROP TABLE {t}", conc, execute, mark)


def rabbitmq_floor(conc: int, dedupe: bool = False) -> Consume:
    import aio_pika
    import redis.asyncio as aredis

    async def run(n: int) -> float:
        conn = await aio_pika.connect_robust(RABBITMQ_URL)
        channel = await conn.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=conc)
        name = "bench-floor-" + uuid.uuid4().hex[:10]
        queue = await channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        for i in range(n):
            await channel.default_exchange.publish(
                aio_pika.Message(f'{{"i": {i}}}'.encode(), message_id=str(i)), routing_key=name
            )
        done = 0
        finished = asyncio.Event()
        started = time.perf_counter()

        marks = aredis.Redis.from_url(REDIS_URL)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal done
            if dedupe:  # the hand-written idempotency mark, on Redis like the guarded inbox
                await marks.set(f"{name}:done:{message.message_id}", 1, nx=True, px=600_000)
            await message.ack()
            done += 1
            if done >= n:
                finished.set()

        tag = await queue.consume(on_message)
        await finished.wait()
        elapsed = time.perf_counter() - started
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        await conn.close()
        await marks.aclose()
        return elapsed

    return run


# -- round trips -----------------------------------------------------------------------------


async def count_trips(
    url: str, inbox_url: str, n: int, conc: int
) -> tuple[dict[str, float], float]:
    """For a guarded no-op handler: backend calls per message by hook point (one per claim
    and per completion), and the inbox's round trips per message, counted at its backend
    (the claims and completions of handlers running together go in one round trip each)."""
    seen: collections.Counter[str] = collections.Counter()
    trips = 0

    def count(point: str, **info: Any) -> None:
        seen[point] += 1

    def count_round_trips(inbox: Any) -> None:
        backend = inbox.backend
        for verb in ("claim", "claim_many", "complete", "complete_many"):
            real = getattr(backend, verb)

            async def counted(*args: Any, _real: Any = real) -> Any:
                nonlocal trips
                trips += 1
                return await _real(*args)

            setattr(backend, verb, counted)

    case = jobfence_cases(url, inbox_url, conc, count_round_trips)["jobfence AsyncWorker, guarded"]
    with hooked(count):
        await case(n)
    return {point: seen[point] / n for point in sorted(seen)}, trips / n


# -- main --------------------------------------------------------------------------------------


ANCHORS = {
    "jobfence AsyncWorker, no-op": "hand-written loop",
    "jobfence AsyncWorker, guarded": "hand-written loop + idempotency mark",
}
"""Each jobfence case's anchor."""


@dataclass
class Measured:
    """One queue backend's rates: messages per second of each case in each round, and the
    backend calls per guarded message by hook point."""

    backend: str
    messages: int
    rates: dict[str, list[float]]
    trips: dict[str, float]
    #: the inbox's round trips per guarded message (batched claims and completions)
    inbox_trips: float

    def median(self, case: str) -> float:
        return statistics.median(self.rates[case])

    @property
    def extra_trips(self) -> float:
        """Round trips a guarded message costs on top of receive and ack."""
        return sum(v for p, v in self.trips.items() if p.startswith(("inbox.", "lock.")))


async def measure(backend: str, n: int, rounds: int, conc: int, tmp: str) -> Measured:
    """Publish and consume ``n`` messages per case and round on ``backend`` (redis, postgres,
    sqlite, rabbitmq), after a warm-up of each case; then count a guarded message's calls."""
    urls = {
        "redis": (REDIS_URL, REDIS_URL, partial(redis_floor, conc)),
        "postgres": (POSTGRES_URL, POSTGRES_URL, partial(postgres_floor, conc)),
        "sqlite": (
            f"sqlite:///{tmp}/q.db",
            f"sqlite:///{tmp}/q.db",
            partial(sqlite_floor, conc, f"{tmp}/floor.db"),
        ),
        "rabbitmq": (RABBITMQ_URL, REDIS_URL, partial(rabbitmq_floor, conc)),
    }
    url, inbox_url, floor = urls[backend]
    ours = jobfence_cases(url, inbox_url, conc)
    cases: dict[str, Consume] = {
        "hand-written loop": floor(),
        "jobfence AsyncWorker, no-op": ours["jobfence AsyncWorker, no-op"],
        "hand-written loop + idempotency mark": floor(dedupe=True),
        "jobfence AsyncWorker, guarded": ours["jobfence AsyncWorker, guarded"],
    }
    for fn in cases.values():  # warm-up: connections, tables, scripts
        await fn(min(n, 100))
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            rates[name].append(n / await fn(n))
    trips, inbox_trips = await count_trips(url, inbox_url, min(n, 500), conc)
    return Measured(backend, n, rates, trips, inbox_trips)


async def bench(backend: str, n: int, rounds: int, conc: int, tmp: str) -> None:
    m = await measure(backend, n, rounds, conc, tmp)
    print(f"\n{backend}: {n} messages, concurrency {conc}, {rounds} interleaved rounds")
    print(f"  {'':38} {'msg/s (median)':>14} {'each round':>24} {'/ its anchor':>13}")
    for name, values in m.rates.items():
        med = statistics.median(values)
        each = " ".join(f"{v:.0f}" for v in values)
        ratio = ""
        if name in ANCHORS:
            ratio = f"{med / m.median(ANCHORS[name]):12.2f}x"
        print(f"  {name:38} {med:14.0f} {each:>24} {ratio:>13}")
    print(
        "  backend calls per guarded message: "
        + ", ".join(f"{p} {v:.2f}" for p, v in m.trips.items())
    )
    print(f"  on top of receive and ack: {m.extra_trips:.2f} inbox calls per message")
    print(f"  of which round trips (concurrent calls batched): {m.inbox_trips:.2f} per message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--only", default="redis,postgres,sqlite,rabbitmq")
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, jobfence {jobfence.__version__}, {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.only.split(","):
            asyncio.run(bench(backend.strip(), args.messages, args.rounds, args.concurrency, tmp))


if __name__ == "__main__":
    main()
