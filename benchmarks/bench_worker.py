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

  (e) plain ``def`` handlers at the worker's default settings: ``jobfence.Worker`` on a
      ``jobfence.Queue`` (what ``jobfence worker`` runs for a ``def`` handler) and
      ``jobfence.AsyncWorker`` on an ``AsyncQueue``, a no-op and a ``guarded`` one (a blocking
      ``Inbox`` on the same store), against the hand-written loop (a) and, on Redis and
      RabbitMQ, (f) Dramatiq's worker at its default (8 threads) on the same broker, in the
      same process and the same interleaved rounds.

Each jobfence row's ratio is to its anchor: (b) / (a), (c) / (d), (e) / (a). Every case also
reports the CPU time (user + system, ``resource.getrusage`` of this process, all threads)
spent per message while consuming; a ``def`` handler's is compared with the ``async def``
one's on the same queue.

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
import resource
import statistics
import sys
import tempfile
import threading
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

Timing = tuple[float, float]  # seconds consuming, CPU seconds of the process meanwhile
Consume = Callable[[int], Awaitable[Timing]]  # publish n, consume them all -> timing


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: published to a worker's queue after its stop: wakes the stopping worker's idle receive,
#: which gives the message back unstarted (see :func:`_drain_worker`)
WAKE = {"wake": True}


async def _drain_worker(
    queue: jobfence.AsyncQueue, handler: Any, n: int, conc: int | None = None
) -> Timing:
    """Seconds until the worker processed all ``n`` messages (its shutdown after that is not
    counted, as the floors' is not); ``conc=None``: the worker's default concurrency.

    Once all ``n`` are processed the watcher stops the worker and publishes one more message
    (``WAKE``): a stopping worker waits for its receive in flight, which would otherwise
    wait out its idle wait (``RECEIVE_WAIT``, 1 s) on the empty queue; the message ends that
    wait and the stopping worker gives it back unstarted, and the queue is dropped after."""
    options: dict[str, Any] = {} if conc is None else {"concurrency": conc}
    worker = jobfence.AsyncWorker(queue, handler, handle_signals=False, **options)
    started, cpu = time.perf_counter(), _cpu()
    finished, cpu_used = started, 0.0

    async def watch() -> None:
        nonlocal finished, cpu_used
        while worker.stats.processed < n:
            await asyncio.sleep(0.001)
        finished, cpu_used = time.perf_counter(), _cpu() - cpu
        worker.stop()
        await queue.publish(WAKE)

    watcher = asyncio.ensure_future(watch())
    await worker.run()
    await watcher
    assert worker.stats.processed == n, worker.stats
    return finished - started, cpu_used


def _drain_sync_worker(queue: jobfence.Queue, handler: Any, n: int) -> Timing:
    """:func:`_drain_worker` for ``jobfence.Worker`` at its default settings, run in the
    calling thread; a watcher thread stops it once all ``n`` are processed (it looks every
    5 ms, so that it costs the worker little CPU), and wakes its idle receive with ``WAKE``."""
    worker = jobfence.Worker(queue, handler, handle_signals=False)
    started, cpu = time.perf_counter(), _cpu()
    finished, cpu_used = started, 0.0

    def watch() -> None:
        nonlocal finished, cpu_used
        while worker.stats.processed < n:
            time.sleep(0.005)
        finished, cpu_used = time.perf_counter(), _cpu() - cpu
        worker.stop()
        queue.publish(WAKE)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    worker.run()
    watcher.join()
    assert worker.stats.processed == n, worker.stats
    return finished - started, cpu_used


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

    def def_noop(message: Any) -> None:
        pass

    def sync_plain(n: int) -> Timing:
        queue = jobfence.Queue(url, "bench-" + uuid.uuid4().hex[:10])
        queue.publish_many([{"i": i} for i in range(n)])
        try:
            return _drain_sync_worker(queue, def_noop, n)
        finally:
            queue.drop()
            queue.close()

    def sync_guarded(n: int) -> Timing:
        queue = jobfence.Queue(url, "bench-" + uuid.uuid4().hex[:10])
        inbox = jobfence.Inbox(inbox_url, table="bench_inbox_" + uuid.uuid4().hex[:8])
        inbox.install()

        @jobfence.guarded(inbox=inbox)
        def handler(message: Any) -> None:
            pass

        queue.publish_many([{"i": i} for i in range(n)])
        try:
            return _drain_sync_worker(queue, handler, n)
        finally:
            queue.drop()
            queue.close()
            inbox.drop()
            inbox.close()

    async def def_plain(n: int) -> Timing:
        queue = jobfence.AsyncQueue(url, "bench-" + uuid.uuid4().hex[:10])
        await queue.publish_many([{"i": i} for i in range(n)])
        try:
            return await _drain_worker(queue, def_noop, n)
        finally:
            await queue.drop()
            await queue.close()

    async def in_thread(fn: Callable[[int], Timing], n: int) -> Timing:
        return await asyncio.to_thread(fn, n)

    return {
        ASYNC_NOOP: plain,
        ASYNC_GUARDED: guarded,
        SYNC_DEF: partial(in_thread, sync_plain),
        ASYNC_DEF: def_plain,
        SYNC_GUARDED_DEF: partial(in_thread, sync_guarded),
    }


ASYNC_NOOP = "jobfence AsyncWorker, no-op"
ASYNC_GUARDED = "jobfence AsyncWorker, guarded"
SYNC_DEF = "jobfence Worker, def no-op (defaults)"
ASYNC_DEF = "jobfence AsyncWorker, def no-op (defaults)"
SYNC_GUARDED_DEF = "jobfence Worker, guarded def (defaults)"
DEF_CASES = (SYNC_DEF, ASYNC_DEF)
DRAMATIQ = "Dramatiq worker, 8 threads (its default)"
FLOOR = "hand-written loop"
FLOOR_MARK = "hand-written loop + idempotency mark"


# -- hand-written loops ---------------------------------------------------------------------


def redis_floor(conc: int, dedupe: bool = False) -> Consume:
    import redis.asyncio as aredis

    async def run(n: int) -> Timing:
        client = aredis.Redis.from_url(REDIS_URL)
        key = "bench:stream:" + uuid.uuid4().hex
        await client.xgroup_create(key, "g", id="0", mkstream=True)
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd(key, {"body": f'{{"i": {i}}}'})
        await pipe.execute()
        done = 0
        started, cpu = time.perf_counter(), _cpu()

        async def consumer(name: str) -> None:
            nonlocal done
            while done < n:
                got = await client.xreadgroup("g", name, {key: ">"}, count=conc, block=50)
                for _stream, entries in got or []:
                    for entry_id, _fields in entries:
                        if dedupe:  # the hand-written idempotency mark: SET NX
                            mark = f"{key}:done:{entry_id.decode()}"
                            await client.set(mark, 1, nx=True, px=600_000)
                        await client.xack(key, "g", entry_id)
                        await client.xdel(key, entry_id)
                        done += 1

        await asyncio.gather(*(consumer(f"c{i}") for i in range(conc)))
        elapsed, cpu_used = time.perf_counter() - started, _cpu() - cpu
        await client.delete(key)
        await client.aclose()
        return elapsed, cpu_used

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
    async def run(n: int) -> Timing:
        table = "bench_q_" + uuid.uuid4().hex[:8]
        conns = [await connect() for _ in range(conc)]
        await setup(conns[0], table, n)
        done = 0
        started, cpu = time.perf_counter(), _cpu()

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
        elapsed, cpu_used = time.perf_counter() - started, _cpu() - cpu
        await execute(conns[0], drop_sql.format(t=table), ())
        await execute(conns[0], f"DROP TABLE IF EXISTS {table}_done", ())
        for c in conns:
            await c.close()
        return elapsed, cpu_used

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

    async def run(n: int) -> Timing:
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
        started, cpu = time.perf_counter(), _cpu()

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
        elapsed, cpu_used = time.perf_counter() - started, _cpu() - cpu
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        await conn.close()
        await marks.aclose()
        return elapsed, cpu_used

    return run


def dramatiq_case(broker_kind: str) -> Consume:
    """Dramatiq's worker at its defaults (8 threads; on RabbitMQ its own prefetch) draining
    ``n`` no-op messages from a fresh queue of the broker ``broker_kind`` (redis, rabbitmq),
    in this process; the same actor without retries, so every message runs once."""
    import dramatiq

    def consume(n: int) -> Timing:
        name = "bench_dq_" + uuid.uuid4().hex[:10]
        broker: Any
        if broker_kind == "redis":
            from dramatiq.brokers.redis import RedisBroker

            broker = RedisBroker(url=REDIS_URL, namespace=name)
        else:
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            broker = RabbitmqBroker(url=RABBITMQ_URL)
        done = 0
        lock = threading.Lock()
        finished = threading.Event()

        def noop(i: int) -> None:
            nonlocal done
            with lock:
                done += 1
                if done >= n:
                    finished.set()

        actor = dramatiq.actor(noop, broker=broker, actor_name=name, queue_name=name, max_retries=0)
        for i in range(n):
            actor.send(i)
        worker = dramatiq.Worker(broker)
        started, cpu = time.perf_counter(), _cpu()
        worker.start()
        finished.wait()
        elapsed, cpu_used = time.perf_counter() - started, _cpu() - cpu
        worker.stop()
        try:
            if broker_kind == "redis":
                broker.flush_all()
            else:
                for queue in (name, f"{name}.DQ", f"{name}.XQ"):
                    broker.channel.queue_delete(queue)
        finally:
            broker.close()
        return elapsed, cpu_used

    async def run(n: int) -> Timing:
        return await asyncio.to_thread(consume, n)

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

    case = jobfence_cases(url, inbox_url, conc, count_round_trips)[ASYNC_GUARDED]
    with hooked(count):
        await case(n)
    return {point: seen[point] / n for point in sorted(seen)}, trips / n


# -- main --------------------------------------------------------------------------------------


ANCHORS = {
    ASYNC_NOOP: FLOOR,
    ASYNC_GUARDED: FLOOR_MARK,
    SYNC_DEF: FLOOR,
    ASYNC_DEF: FLOOR,
    SYNC_GUARDED_DEF: SYNC_DEF,
}
"""Each jobfence case's anchor."""

#: the brokers Dramatiq has
DRAMATIQ_BROKERS = ("redis", "rabbitmq")


@dataclass
class Measured:
    """One queue backend's rates: messages per second and CPU seconds per message of each
    case in each round, and the backend calls per guarded message by hook point."""

    backend: str
    messages: int
    rates: dict[str, list[float]]
    cpu: dict[str, list[float]]
    trips: dict[str, float]
    #: the inbox's round trips per guarded message (batched claims and completions)
    inbox_trips: float

    def median(self, case: str) -> float:
        return statistics.median(self.rates[case])

    def cpu_us(self, case: str) -> float:
        """The median CPU time per message of ``case``, in microseconds."""
        return statistics.median(self.cpu[case]) * 1e6

    @property
    def extra_trips(self) -> float:
        """Round trips a guarded message costs on top of receive and ack."""
        return sum(v for p, v in self.trips.items() if p.startswith(("inbox.", "lock.")))

    def targets(self) -> list[tuple[str, bool, str]]:
        """The ``def`` handler targets: (text, met, figures)."""
        out = []
        for case in DEF_CASES:
            rate = self.median(case)
            ratio = rate / self.median(FLOOR)
            out.append(
                (
                    f"{self.backend}: {case} ≥ 0.50x {FLOOR}",
                    ratio >= 0.5,
                    f"{rate:.0f}/s, {ratio:.2f}x",
                )
            )
            if DRAMATIQ in self.rates:
                anchor = self.median(DRAMATIQ)
                out.append(
                    (
                        f"{self.backend}: {case} ≥ {DRAMATIQ}",
                        rate >= anchor,
                        f"{rate:.0f}/s against {anchor:.0f}/s, {rate / anchor:.2f}x",
                    )
                )
            cpu, base = self.cpu_us(case), self.cpu_us(ASYNC_NOOP)
            out.append(
                (
                    f"{self.backend}: {case} CPU per message ≤ 2x the async def no-op's",
                    cpu <= 2 * base,
                    f"{cpu:.0f} µs against {base:.0f} µs, {cpu / base:.2f}x",
                )
            )
        if DRAMATIQ in self.rates:
            rate, anchor = self.median(ASYNC_NOOP), self.median(DRAMATIQ)
            out.append(
                (
                    f"{self.backend}: {ASYNC_NOOP} ≥ {DRAMATIQ}",
                    rate >= anchor,
                    f"{rate:.0f}/s against {anchor:.0f}/s, {rate / anchor:.2f}x",
                )
            )
        ratio = self.median(SYNC_GUARDED_DEF) / self.median(SYNC_DEF)
        # what an idempotency mark costs a hand-written consumer on the same queue, for scale
        marked = self.median(FLOOR_MARK) / self.median(FLOOR)
        out.append(
            (
                f"{self.backend}: {SYNC_GUARDED_DEF} ≥ 0.70x {SYNC_DEF}",
                ratio >= 0.7,
                f"{ratio:.2f}x; the hand-written loop with its idempotency mark: "
                f"{marked:.2f}x the loop without",
            )
        )
        return out


async def measure(backend: str, n: int, rounds: int, conc: int, tmp: str) -> Measured:
    """Publish and consume ``n`` messages per case and round on ``backend`` (redis, postgres,
    sqlite, rabbitmq), after a warm-up of each case (none in a single-round smoke run); then
    count a guarded message's calls."""
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
        FLOOR: floor(),
        ASYNC_NOOP: ours[ASYNC_NOOP],
        SYNC_DEF: ours[SYNC_DEF],
        ASYNC_DEF: ours[ASYNC_DEF],
        SYNC_GUARDED_DEF: ours[SYNC_GUARDED_DEF],
        FLOOR_MARK: floor(dedupe=True),
        ASYNC_GUARDED: ours[ASYNC_GUARDED],
    }
    if backend in DRAMATIQ_BROKERS:
        cases[DRAMATIQ] = dramatiq_case(backend)
    for fn in cases.values() if rounds > 1 else ():  # warm-up: connections, tables, scripts
        await fn(min(n, 100))
    rates: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            seconds, cpu_seconds = await fn(n)
            rates[name].append(n / seconds)
            cpu[name].append(cpu_seconds / n)
    trips, inbox_trips = await count_trips(url, inbox_url, min(n, 500), conc)
    return Measured(backend, n, rates, cpu, trips, inbox_trips)


async def bench(backend: str, n: int, rounds: int, conc: int, tmp: str) -> None:
    m = await measure(backend, n, rounds, conc, tmp)
    print(f"\n{backend}: {n} messages, concurrency {conc}, {rounds} interleaved rounds")
    print(
        f"  {'':44} {'msg/s (median)':>14} {'each round':>20} {'/ its anchor':>13} "
        f"{'CPU µs/msg':>11}"
    )
    for name, values in m.rates.items():
        med = statistics.median(values)
        each = " ".join(f"{v:.0f}" for v in values)
        ratio = ""
        if name in ANCHORS:
            ratio = f"{med / m.median(ANCHORS[name]):12.2f}x"
        print(f"  {name:44} {med:14.0f} {each:>20} {ratio:>13} {m.cpu_us(name):11.0f}")
    print(
        "  backend calls per guarded message: "
        + ", ".join(f"{p} {v:.2f}" for p, v in m.trips.items())
    )
    print(f"  on top of receive and ack: {m.extra_trips:.2f} inbox calls per message")
    print(f"  of which round trips (concurrent calls batched): {m.inbox_trips:.2f} per message")
    for text, met, figures in m.targets():
        print(f"  {'MET' if met else 'NOT MET'}: {text} ({figures})")


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
