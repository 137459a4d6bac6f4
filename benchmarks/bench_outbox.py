#!/usr/bin/env python3
"""The transactional outbox: jobfence against what users write by hand, side by side.

1. **add**: one caller transaction that inserts an order row and adds one outbox row, in
   interleaved rounds (median and p99 µs per transaction, each round's median for the
   spread): ``Outbox.add(conn, queue=..., body=...)`` against the same transaction with a
   hand-written bare ``INSERT`` into an equivalent outbox table (see ``bare_ddl``: the same
   columns, a bigint primary key that numbers the rows and a unique index on the message id,
   the indexes a hand-written outbox has; the user's side also makes the id and encodes the
   body as JSON). PostgreSQL on psycopg (sync and async), MariaDB on PyMySQL, SQLite on
   ``sqlite3`` (WAL, ``synchronous=FULL``).

2. **relay**: rows committed in PostgreSQL (and MariaDB, SQLite) published to a Redis Streams
   queue, by ``jobfence.Relay(outbox, queue)`` (defaults, one process) and by a hand-written
   relay loop in a process of its own: ``BEGIN; SELECT ... WHERE published_at IS NULL ORDER
   BY seq LIMIT 100 FOR UPDATE SKIP LOCKED; XADD`` each row (one pipeline, the same redis-py
   client kind) ``; UPDATE ... SET published_at; COMMIT``, sleeping ``HAND_SLEEP`` (10 ms)
   when a claim found nothing. For each relay, in interleaved rounds (one relay process per
   case and round, warmed up by a few rows first):

   * **latency**: a producer commits one row every ``GAP`` seconds while the relay runs; the
     latency of a row is from right after its ``COMMIT`` returned to when a consumer thread
     blocked in ``XREAD BLOCK`` on the stream received it (both clocks are the producer's
     process' ``perf_counter``); p50 and p95 per round;
   * **throughput**: ``N`` rows committed in one transaction while the relay waits; rows/s
     from that commit until the consumer has received the last of them; also the relay
     process' CPU time per row (user + system, from ``/proc``).

Usage: ``python benchmarks/bench_outbox.py [--ops 300] [--rounds 5] [--rows 10000]
[--only add,relay]``; ``python benchmarks/run.py --only outbox`` writes the section into
``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

from _harness import AsyncScope, Stats, Variant, laps, round_ratios, uncontended_stats
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL, mysql_params

import jobfence

HERE = os.path.dirname(os.path.abspath(__file__))
#: the queue (destination) name every outbox row of the benchmark names
QUEUE = "orders"
#: seconds the hand-written relay sleeps after a claim that found nothing
HAND_SLEEP = 0.010
#: rows per claim of the hand-written relay (jobfence's default batch is the same)
BATCH = 100
#: seconds between two producer commits in the latency phase
GAP = 0.005
#: rows committed one by one before a relay's measurement (connections, scripts, plans)
WARMUP_ROWS = 20

ADD_HAND = "hand-written INSERT in the transaction"
ADD_JF = "Outbox.add in the transaction"
ADD_HAND_ASYNC = "async: hand-written INSERT in the transaction"
ADD_JF_ASYNC = "async: AsyncOutbox.add in the transaction"
#: each case's anchor
ADD_ANCHORS = {ADD_JF: ADD_HAND, ADD_JF_ASYNC: ADD_HAND_ASYNC, ADD_HAND: "", ADD_HAND_ASYNC: ""}

RELAY_HAND = "hand-written relay loop"
RELAY_JF = "jobfence Relay (defaults)"


def _body(n: int) -> dict[str, Any]:
    return {"order_id": n, "customer": "c-42", "total": 1999}


def _encode(body: Any) -> bytes:
    """What a user's hand-written outbox stores: compact JSON, UTF-8."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


# -- the tables -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dialect:
    """One SQL server's statements for the orders table and the hand-written outbox."""

    name: str
    param: str  # the driver's placeholder
    orders_ddl: str
    bare_ddl: str
    relay_index: str

    def insert_order(self, orders: str) -> str:
        p = self.param
        return f"INSERT INTO {orders} (customer, total) VALUES ({p}, {p})"

    def insert_bare(self, bare: str) -> str:
        p = self.param
        return (
            f"INSERT INTO {bare} (id, queue, ordering_key, body, headers) "
            f"VALUES ({p}, {p}, {p}, {p}, {p})"
        )


#: the hand-written outbox tables: the columns of jobfence's table (same types), a primary key
#: numbering the rows and a unique index on the message id; the hand-written relay's table
#: also gets ``relay_index``, the index its claim reads (jobfence's table has one like it)
PG = Dialect(
    "postgres",
    "%s",
    "CREATE TABLE {t} (id bigserial PRIMARY KEY, customer text NOT NULL, total bigint NOT NULL)",
    """CREATE TABLE {t} (
        seq           bigserial PRIMARY KEY,
        id            text NOT NULL UNIQUE,
        queue         text NOT NULL,
        ordering_key  text,
        body          bytea NOT NULL,
        headers       text,
        created_at    timestamptz NOT NULL DEFAULT now(),
        available_at  timestamptz NOT NULL DEFAULT now(),
        attempts      integer NOT NULL DEFAULT 0,
        claimed_by    text,
        claimed_until timestamptz,
        published_at  timestamptz,
        dead          boolean NOT NULL DEFAULT false,
        last_error    text
    )""",
    "CREATE INDEX {t}_pending ON {t} (seq) WHERE published_at IS NULL",
)
MYSQL = Dialect(
    "mysql",
    "%s",
    "CREATE TABLE {t} (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL, "
    "total BIGINT NOT NULL) ENGINE=InnoDB",
    """CREATE TABLE {t} (
        seq           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id            VARBINARY(1024) NOT NULL,
        queue         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        ordering_key  VARBINARY(1024) NULL,
        body          LONGBLOB NOT NULL,
        headers       LONGTEXT NULL,
        created_at    DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        available_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        attempts      INT NOT NULL DEFAULT 0,
        claimed_by    VARCHAR(255) NULL,
        claimed_until DATETIME(6) NULL,
        published_at  DATETIME(6) NULL,
        dead          TINYINT(1) NOT NULL DEFAULT 0,
        last_error    LONGTEXT NULL,
        UNIQUE KEY id_idx (id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "CREATE INDEX {t}_pending ON {t} (published_at, seq)",
)
SQLITE = Dialect(
    "sqlite",
    "?",
    "CREATE TABLE {t} (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total INTEGER NOT NULL)",
    """CREATE TABLE {t} (
        seq           INTEGER PRIMARY KEY AUTOINCREMENT,
        id            TEXT NOT NULL UNIQUE,
        queue         TEXT NOT NULL,
        ordering_key  TEXT,
        body          BLOB NOT NULL,
        headers       TEXT,
        created_at    REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
        available_at  REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
        attempts      INTEGER NOT NULL DEFAULT 0,
        claimed_by    TEXT,
        claimed_until REAL,
        published_at  REAL,
        dead          INTEGER NOT NULL DEFAULT 0,
        last_error    TEXT
    )""",
    "CREATE INDEX {t}_pending ON {t} (seq) WHERE published_at IS NULL",
)
DIALECTS = {"postgres": PG, "mysql": MYSQL, "sqlite": SQLITE}

BARE_INDEXES = (
    "a primary key numbering the rows (`seq`, as jobfence's) and a unique index on the "
    "message id (jobfence's table also has a partial index of the rows to publish, which an "
    "`add` writes too, and two more that it does not)"
)
RELAY_INDEXES = (
    "the hand-written table also has the index its claim reads (PostgreSQL and SQLite "
    "`(seq) WHERE published_at IS NULL`, MariaDB `(published_at, seq)`), as jobfence's has"
)


def _names() -> tuple[str, str, str]:
    """Fresh table names: jobfence's outbox, the hand-written one, the orders."""
    tag = uuid.uuid4().hex[:8]
    return f"bench_outbox_{tag}", f"bench_bare_{tag}", f"bench_orders_{tag}"


# -- 1. add -----------------------------------------------------------------------------------
@dataclass
class AddMeasured:
    """One backend's add timings (µs per transaction)."""

    backend: str
    timings: dict[str, Stats]
    pairs: list[tuple[str, str]]  # (jobfence case, its anchor)
    trips: float = 0.0  # round trips (SQLite: statements) of one add on the caller's connection


def _sync_pair(
    conn: Any,
    execute: Callable[[str, tuple[Any, ...]], Any],
    commit: Callable[[], Any],
    outbox: Any,
    order_sql: str,
    bare_sql: str,
) -> list[Variant]:
    """The two sync variants on one connection: order + hand-written insert, order +
    ``outbox.add``; each op one transaction committed."""

    def hand(n: int) -> None:
        for i in laps(n):
            execute(order_sql, ("c-42", 1999))
            execute(bare_sql, (uuid.uuid4().hex, QUEUE, None, _encode(_body(i)), None))
            commit()

    def jf(n: int) -> None:
        for i in laps(n):
            execute(order_sql, ("c-42", 1999))
            outbox.add(conn, queue=QUEUE, body=_body(i))
            commit()

    return [(ADD_HAND, hand), (ADD_JF, jf)]


def measure_add_postgres(ops: int, rounds: int) -> AddMeasured:
    import psycopg

    table, bare, orders = _names()
    admin = psycopg.connect(POSTGRES_URL, autocommit=True)
    admin.execute(PG.orders_ddl.format(t=orders))
    admin.execute(PG.bare_ddl.format(t=bare))
    outbox = jobfence.Outbox(POSTGRES_URL, table=table)
    outbox.install()
    order_sql, bare_sql = PG.insert_order(orders), PG.insert_bare(bare)

    def build(ns: str, scope: AsyncScope) -> list[Variant]:
        conn = psycopg.connect(POSTGRES_URL)
        variants = _sync_pair(conn, conn.execute, conn.commit, outbox, order_sql, bare_sql)

        async def open_async() -> tuple[Any, Any]:
            aconn = await psycopg.AsyncConnection.connect(POSTGRES_URL)
            aoutbox = jobfence.AsyncOutbox(POSTGRES_URL, table=table)
            return aconn, aoutbox

        aconn, aoutbox = scope.run(open_async())
        scope.on_close(aconn.close)
        scope.on_close(aoutbox.close)

        async def hand(n: int) -> None:
            for i in laps(n):
                await aconn.execute(order_sql, ("c-42", 1999))
                await aconn.execute(
                    bare_sql, (uuid.uuid4().hex, QUEUE, None, _encode(_body(i)), None)
                )
                await aconn.commit()

        async def jf(n: int) -> None:
            for i in laps(n):
                await aconn.execute(order_sql, ("c-42", 1999))
                await aoutbox.add(aconn, queue=QUEUE, body=_body(i))
                await aconn.commit()

        variants += [(ADD_HAND_ASYNC, scope.runner(hand)), (ADD_JF_ASYNC, scope.runner(jf))]
        scope.on_close(_async_close_sync(conn))
        return variants

    try:
        stats = uncontended_stats(build, lambda ns: None, rounds, ops, max(20, ops // 10))
        conn = psycopg.connect(POSTGRES_URL)
        try:
            trips = _pg_trips(conn, lambda: outbox.add(conn, queue=QUEUE, body=_body(0)))
        finally:
            conn.close()
        return AddMeasured(
            "PostgreSQL (psycopg)",
            stats,
            [(ADD_JF, ADD_HAND), (ADD_JF_ASYNC, ADD_HAND_ASYNC)],
            trips,
        )
    finally:
        outbox.drop()
        outbox.close()
        admin.execute(f"DROP TABLE IF EXISTS {bare}, {orders}")
        admin.close()


def _async_close_sync(conn: Any) -> Callable[[], Any]:
    async def close() -> None:
        conn.close()

    return close


def _pg_trips(conn: Any, add: Callable[[], Any], n: int = 20) -> float:
    """Round trips of one ``add()`` on psycopg connection ``conn`` inside an open
    transaction, from libpq's protocol trace (one ``Sync`` per request/response exchange)."""
    for _ in range(6):  # the transaction is open, the statement prepared: not counted
        add()
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        for _ in range(n):
            add()
        conn.pgconn.untrace()
        trace.seek(0)
        syncs = sum(1 for line in trace if "\tF\t" in line and "Sync" in line)
    conn.rollback()
    return syncs / n


def _mysql_trips(conn: Any, add: Callable[[], Any], n: int = 20) -> float:
    """Commands PyMySQL sends for one ``add()`` (each one round trip)."""
    add()
    count = 0
    original = conn._execute_command

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal count
        count += 1
        return original(*args, **kw)

    conn._execute_command = counting
    try:
        for _ in range(n):
            add()
    finally:
        conn._execute_command = original
    conn.rollback()
    return count / n


def _sqlite_statements(conn: Any, add: Callable[[], Any], n: int = 20) -> float:
    """Statements ``sqlite3`` runs for one ``add()`` (its trace callback)."""
    add()  # the transaction is open: its BEGIN is not counted
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        for _ in range(n):
            add()
    finally:
        conn.set_trace_callback(None)
    conn.rollback()
    return len(seen) / n


def measure_add_mysql(ops: int, rounds: int) -> AddMeasured:
    import pymysql

    table, bare, orders = _names()
    admin = pymysql.connect(**mysql_params(), autocommit=True)
    with admin.cursor() as cur:
        cur.execute(MYSQL.orders_ddl.format(t=orders))
        cur.execute(MYSQL.bare_ddl.format(t=bare))
    outbox = jobfence.Outbox(MYSQL_URL, table=table)
    outbox.install()
    conn = pymysql.connect(**mysql_params())
    cur = conn.cursor()

    def build(ns: str, scope: AsyncScope) -> list[Variant]:
        return _sync_pair(
            conn,
            cur.execute,
            conn.commit,
            outbox,
            MYSQL.insert_order(orders),
            MYSQL.insert_bare(bare),
        )

    try:
        stats = uncontended_stats(build, lambda ns: None, rounds, ops, max(20, ops // 10))
        trips = _mysql_trips(conn, lambda: outbox.add(conn, queue=QUEUE, body=_body(0)))
        return AddMeasured("MariaDB (PyMySQL)", stats, [(ADD_JF, ADD_HAND)], trips)
    finally:
        cur.close()
        conn.close()
        outbox.drop()
        outbox.close()
        with admin.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS {bare}, {orders}")
        admin.close()


def measure_add_sqlite(ops: int, rounds: int) -> AddMeasured:
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "bench.db")
    table, bare, orders = _names()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(SQLITE.orders_ddl.format(t=orders))
    conn.execute(SQLITE.bare_ddl.format(t=bare))
    conn.commit()
    outbox = jobfence.Outbox(f"sqlite:///{path}", table=table)
    outbox.install()

    def build(ns: str, scope: AsyncScope) -> list[Variant]:
        return _sync_pair(
            conn,
            conn.execute,
            conn.commit,
            outbox,
            SQLITE.insert_order(orders),
            SQLITE.insert_bare(bare),
        )

    try:
        stats = uncontended_stats(build, lambda ns: None, rounds, ops, max(20, ops // 10))
        trips = _sqlite_statements(conn, lambda: outbox.add(conn, queue=QUEUE, body=_body(0)))
        return AddMeasured("SQLite (sqlite3, WAL)", stats, [(ADD_JF, ADD_HAND)], trips)
    finally:
        conn.close()
        outbox.close()
        shutil.rmtree(tmp, ignore_errors=True)


ADD_MEASURES: dict[str, Callable[[int, int], AddMeasured]] = {
    "postgres": measure_add_postgres,
    "mysql": measure_add_mysql,
    "sqlite": measure_add_sqlite,
}


# -- 2. relay ---------------------------------------------------------------------------------
@dataclass
class RelayRound:
    """One relay's figures in one round."""

    p50_ms: float
    p95_ms: float
    rate: float  # rows/s
    cpu_us: float  # the relay process' CPU per row while draining
    pickup_ms: float  # from the commit of the rows to drain to the first of them received


@dataclass
class RelayMeasured:
    """Both relays' rounds on one database (to one queue server)."""

    backend: str
    rounds: dict[str, list[RelayRound]]
    rows: int
    latency_rows: int

    def median(self, case: str, what: str) -> float:
        return statistics.median(getattr(r, what) for r in self.rounds[case])

    def spread(self, case: str, what: str) -> tuple[float, float]:
        values = [getattr(r, what) for r in self.rounds[case]]
        return min(values), max(values)

    def ratio(self, what: str) -> float:
        """jobfence's median over the hand-written relay's."""
        return self.median(RELAY_JF, what) / self.median(RELAY_HAND, what)

    def ratios(self, what: str) -> list[float]:
        """jobfence over the hand-written relay, round by round."""
        return [
            getattr(a, what) / getattr(b, what)
            for a, b in zip(self.rounds[RELAY_JF], self.rounds[RELAY_HAND], strict=True)
        ]


class Arrivals(threading.Thread):
    """A consumer blocked in ``XREAD BLOCK`` on one stream that records when each message
    (stream field ``i``, the message id) arrived (``perf_counter``)."""

    def __init__(self, stream: str) -> None:
        super().__init__(daemon=True)
        import redis

        self.client = redis.Redis.from_url(REDIS_URL)
        self.stream = stream
        self.seen: dict[str, float] = {}
        self.cond = threading.Condition()
        self._stopping = False

    def run(self) -> None:
        last = "0-0"
        while not self._stopping:
            reply = self.client.xread({self.stream: last}, count=1000, block=100)
            now = time.perf_counter()
            if not reply:
                continue
            with self.cond:
                for _, entries in reply:
                    for entry_id, fields in entries:
                        self.seen[fields[b"i"].decode()] = now
                        last = entry_id
                self.cond.notify_all()

    def wait_for(self, ids: Sequence[str], timeout: float) -> list[float]:
        """The arrival times of ``ids``, once all have arrived (RuntimeError after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(i in self.seen for i in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sum(i not in self.seen for i in ids)
                    raise RuntimeError(f"{missing} of {len(ids)} rows never reached the stream")
                self.cond.wait(left)
            return [self.seen[i] for i in ids]

    def stop(self) -> None:
        self._stopping = True
        self.join(5)
        self.client.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class RelaySetup:
    """What a relay round needs on one database: where the rows are and how to add them."""

    backend: str
    url: str  # jobfence's URL of the database
    dialect: Dialect
    connect: Callable[[], Any]  # a new driver connection (not autocommit)
    table: str
    bare: str
    orders: str
    namespace: str

    def hand_stream(self) -> str:
        return f"{self.namespace}:hand:{QUEUE}"


def _execute(conn: Any, sql: str, params: tuple[Any, ...] | None = None) -> None:
    cur = conn.cursor()
    try:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
    finally:
        cur.close()


def _executemany(conn: Any, sql: str, params: list[tuple[Any, ...]]) -> None:
    cur = conn.cursor()
    try:
        cur.executemany(sql, params)
    finally:
        cur.close()


def _spawn_relay(case: str, setup: RelaySetup) -> subprocess.Popen[str]:
    """A process for the relay of ``case``, parked: it imports what it needs and connects,
    then waits for a line on its stdin before it runs (so the start-up of every round's relay
    is paid at once, before anything is measured)."""
    config = {
        "case": case,
        "backend": setup.backend,
        "url": setup.url,
        "table": setup.table,
        "bare": setup.bare,
        "namespace": setup.namespace,
        "stream": setup.hand_stream(),
    }
    path = os.pathsep.join(
        p for p in (os.path.join(os.path.dirname(HERE), "src"), os.environ.get("PYTHONPATH")) if p
    )
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--relay-child", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then wait for the process to end (kill it after 30 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


@contextmanager
def _relay_process(case: str, proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The parked relay process ``proc`` of ``case`` running until the block ends."""
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{case} relay did not start: {line!r} (exit {proc.poll()})")
        yield proc
    finally:
        _stop(proc)


def _relay_round(
    case: str,
    setup: RelaySetup,
    outbox: Any,
    rows: int,
    latency_rows: int,
    parked: subprocess.Popen[str],
) -> RelayRound:
    """Start the relay of ``case`` (its ``parked`` process), warm it up, measure latency then
    throughput, stop it."""
    d = setup.dialect
    conn = setup.connect()
    order_sql = d.insert_order(setup.orders)
    bare_sql = d.insert_bare(setup.bare)
    jf = case == RELAY_JF
    stream = _jobfence_stream(setup) if jf else setup.hand_stream()
    consumer = Arrivals(stream)
    consumer.start()

    def commit_one(i: int) -> str:
        _execute(conn, order_sql, ("c-42", 1999))
        if jf:
            mid = str(outbox.add(conn, queue=QUEUE, body=_body(i)))
        else:
            mid = uuid.uuid4().hex
            _execute(conn, bare_sql, (mid, QUEUE, None, _encode(_body(i)), None))
        conn.commit()
        return mid

    try:
        with _relay_process(case, parked) as proc:
            warm = []
            for i in range(min(WARMUP_ROWS, latency_rows)):
                warm.append(commit_one(i))
                time.sleep(GAP)
            consumer.wait_for(warm, 30)
            # latency: one row committed every GAP seconds
            committed: dict[str, float] = {}
            for i in range(latency_rows):
                mid = commit_one(i)
                committed[mid] = time.perf_counter()
                time.sleep(GAP)
            ids = list(committed)
            arrived = consumer.wait_for(ids, 30)
            lat = sorted((a - committed[i]) * 1e3 for i, a in zip(ids, arrived, strict=True))
            # throughput: ``rows`` rows committed at once
            bodies = [_body(i) for i in range(rows)]
            if jf:  # add_many takes up to 10,000 rows per statement: 1,000 per statement
                ids = [
                    str(x)
                    for at in range(0, rows, 1000)
                    for x in outbox.add_many(conn, queue=QUEUE, bodies=bodies[at : at + 1000])
                ]
            else:
                ids = [uuid.uuid4().hex for _ in bodies]
                _executemany(
                    conn,
                    bare_sql,
                    [
                        (mid, QUEUE, None, _encode(b), None)
                        for mid, b in zip(ids, bodies, strict=True)
                    ],
                )
            cpu_before = _cpu_seconds(proc.pid)
            conn.commit()
            started = time.perf_counter()
            arrived = consumer.wait_for(ids, 300)
            cpu = _cpu_seconds(proc.pid) - cpu_before
    finally:
        consumer.stop()
        conn.close()
    first, last = min(arrived), max(arrived)
    # the drain rate: from the first rows received to the last (the rows that came with the
    # first are not counted); how long the relay took to notice the commit is ``pickup``
    after_first = sum(1 for a in arrived if a > first)
    return RelayRound(
        p50_ms=lat[len(lat) // 2],
        p95_ms=lat[min(len(lat) - 1, int(len(lat) * 0.95))],
        rate=after_first / (last - first) if last > first else float("nan"),
        cpu_us=cpu / rows * 1e6,
        pickup_ms=(first - started) * 1e3,
    )


def _jobfence_stream(setup: RelaySetup) -> str:
    queue = jobfence.Queue(REDIS_URL, QUEUE, namespace=setup.namespace)
    try:
        return str(queue.backend.keys[0])
    finally:
        queue.close()


def _reset(setup: RelaySetup) -> None:
    """Empty the tables and the streams between two relay runs (no relay is running)."""
    conn = setup.connect()
    try:
        for t in (setup.table, setup.bare, setup.orders):
            if setup.backend == "sqlite":
                _execute(conn, f"DELETE FROM {t}")
            else:  # a table as fresh as the other case's, without dead rows to skip
                _execute(conn, f"TRUNCATE TABLE {t}")
        conn.commit()
    finally:
        conn.close()
    from tests.servers import delete_redis_keys

    delete_redis_keys(f"{setup.namespace}*")


def measure_relay(
    backend: str, rows: int, latency_rows: int, rounds: int, tmp: str | None = None
) -> RelayMeasured:
    """Both relays on ``backend`` (postgres, mysql, sqlite) to Redis Streams, interleaved."""
    table, bare, orders = _names()
    ns = f"bench-outbox-{uuid.uuid4().hex[:8]}"
    d = DIALECTS[backend]
    cleanup: Callable[[], None]
    if backend == "postgres":
        import psycopg

        url = POSTGRES_URL

        def connect() -> Any:
            return psycopg.connect(POSTGRES_URL)

        label = "PostgreSQL (psycopg) → Redis Streams"
    elif backend == "mysql":
        import pymysql

        url = MYSQL_URL

        def connect() -> Any:
            return pymysql.connect(**mysql_params())

        label = "MariaDB (PyMySQL) → Redis Streams"
    else:
        own_tmp = tmp is None
        folder = tempfile.mkdtemp() if tmp is None else tmp
        path = os.path.join(folder, f"relay-{uuid.uuid4().hex[:8]}.db")
        url = f"sqlite:///{path}"

        def connect() -> Any:
            c = sqlite3.connect(path, timeout=30)
            c.execute("PRAGMA synchronous=FULL")
            return c

        first = sqlite3.connect(path)
        first.execute("PRAGMA journal_mode=WAL")
        first.close()
        label = "SQLite (sqlite3, WAL) → Redis Streams"
    conn = connect()
    _execute(conn, d.orders_ddl.format(t=orders))
    _execute(conn, d.bare_ddl.format(t=bare))
    _execute(conn, d.relay_index.format(t=bare))
    conn.commit()
    conn.close()
    outbox = jobfence.Outbox(url, table=table)
    outbox.install()
    setup = RelaySetup(backend, url, d, connect, table, bare, orders, ns)

    def cleanup() -> None:
        outbox.drop()
        outbox.close()
        c = connect()
        for t in (bare, orders):
            _execute(c, f"DROP TABLE IF EXISTS {t}")
        c.commit()
        c.close()
        from tests.servers import delete_redis_keys

        delete_redis_keys(f"{ns}*")
        if backend == "sqlite" and own_tmp:
            shutil.rmtree(folder, ignore_errors=True)

    results: dict[str, list[RelayRound]] = {RELAY_HAND: [], RELAY_JF: []}
    order = [RELAY_HAND, RELAY_JF]
    plan = [case for r in range(rounds) for case in order[r % 2 :] + order[: r % 2]]
    parked = [_spawn_relay(case, setup) for case in plan]
    try:
        for case, proc in zip(plan, parked, strict=True):
            _reset(setup)
            results[case].append(_relay_round(case, setup, outbox, rows, latency_rows, proc))
    finally:
        for proc in parked:
            _stop(proc)
        cleanup()
    return RelayMeasured(label, results, rows, latency_rows)


# -- the relay processes ------------------------------------------------------------------------
_CLAIM = {
    "postgres": (
        "SELECT seq, id, queue, body, headers FROM {t} WHERE published_at IS NULL "
        "ORDER BY seq LIMIT {n} FOR UPDATE SKIP LOCKED"
    ),
    "mysql": (
        "SELECT seq, id, queue, body, headers FROM {t} WHERE published_at IS NULL "
        "ORDER BY seq LIMIT {n} FOR UPDATE SKIP LOCKED"
    ),
    "sqlite": (
        "SELECT seq, id, queue, body, headers FROM {t} WHERE published_at IS NULL "
        "ORDER BY seq LIMIT {n}"
    ),
}
_MARK = {
    "postgres": "UPDATE {t} SET published_at = now() WHERE seq = ANY(%s)",
    "mysql": "UPDATE {t} SET published_at = CURRENT_TIMESTAMP(6) WHERE seq IN ({marks})",
    "sqlite": (
        "UPDATE {t} SET published_at = (julianday('now') - 2440587.5) * 86400.0 "
        "WHERE seq IN ({marks})"
    ),
}


def hand_relay(config: dict[str, Any], stopping: threading.Event) -> None:
    """The hand-written relay loop, until ``stopping`` is set (SIGTERM)."""
    import redis

    backend, table = config["backend"], config["bare"]
    r = redis.Redis.from_url(REDIS_URL)
    stream = config["stream"]
    claim = _CLAIM[backend].format(t=table, n=BATCH)
    if backend == "postgres":
        import psycopg

        conn: Any = psycopg.connect(POSTGRES_URL)
    elif backend == "mysql":
        import pymysql

        conn = pymysql.connect(**mysql_params())
    else:
        conn = sqlite3.connect(config["url"].removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
    timeline = os.environ.get("BENCH_OUTBOX_TIMELINE")
    points: list[tuple[float, float, str]] = []
    clock = time.perf_counter
    _wait_for_go()
    while not stopping.is_set():
        t0 = clock()
        cur = conn.cursor()
        if backend == "sqlite":
            cur.execute("BEGIN IMMEDIATE")
        cur.execute(claim)
        rows = cur.fetchall()
        t1 = clock()
        points.append((t0, t1, "claim"))
        if rows:
            pipe = r.pipeline(transaction=False)
            for _seq, mid, _queue, body, headers in rows:
                pipe.xadd(stream, {"i": mid, "b": bytes(body), "h": headers or "{}"})
            pipe.execute()
            t1, t0 = clock(), t1
            points.append((t0, t1, "publish"))
            seqs = [row[0] for row in rows]
            if backend == "postgres":
                cur.execute(_MARK[backend].format(t=table), (seqs,))
            else:
                marks = ", ".join([_placeholder(backend)] * len(seqs))
                cur.execute(_MARK[backend].format(t=table, marks=marks), seqs)
        if backend == "sqlite":
            cur.execute("COMMIT")
        else:
            conn.commit()
        cur.close()
        points.append((t1, clock(), "published" if rows else "commit"))
        if not rows:
            time.sleep(HAND_SLEEP)
    conn.close()
    r.close()
    if timeline:
        with open(timeline, "a") as f:
            f.write(json.dumps(points) + "\n")


def _wait_for_go() -> None:
    """Parked (imported, connected) until the parent writes a line: then say ``ready``."""
    sys.stdin.readline()
    print("ready", flush=True)


def _placeholder(backend: str) -> str:
    return "?" if backend == "sqlite" else "%s"


def jobfence_relay(config: dict[str, Any]) -> None:
    """``jobfence.Relay(outbox, queue)`` with its defaults, until SIGTERM."""
    outbox = jobfence.Outbox(config["url"], table=config["table"])
    queue = jobfence.Queue(REDIS_URL, QUEUE, namespace=config["namespace"])
    relay = jobfence.Relay(outbox, queue)
    timeline = os.environ.get("BENCH_OUTBOX_TIMELINE")  # a file: where the relay's time went
    points: list[tuple[float, float, str]] = []
    if timeline:  # (start, end, verb) of every call the relay makes to its backends

        def timed(obj: Any, name: str, label: str) -> None:
            fn = getattr(obj, name)

            def call(*args: Any, **kw: Any) -> Any:
                started = time.perf_counter()
                try:
                    return fn(*args, **kw)
                finally:
                    points.append((started, time.perf_counter(), label))

            setattr(obj, name, call)

        for verb in ("claim", "published", "wait", "extend", "purge", "release"):
            timed(relay.backend, verb, verb)
        timed(queue.backend, "publish", "publish")
    _wait_for_go()
    relay.run()
    queue.close()
    outbox.close()
    if timeline:
        with open(timeline, "a") as f:
            f.write(json.dumps(points) + "\n")


def relay_child(config: dict[str, Any]) -> None:
    if config["case"] == RELAY_JF:
        jobfence_relay(config)
        return
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    hand_relay(config, stopping)


# -- printing -----------------------------------------------------------------------------------
def print_add(m: AddMeasured) -> None:
    print(f"\n== add: {m.backend} ({m.trips:g} round trips per add)")
    for label, st in m.timings.items():
        anchor = ADD_ANCHORS.get(label, "")
        ratio = ""
        if anchor:
            per = round_ratios(st, m.timings[anchor])
            ratio = f"{st.median / m.timings[anchor].median:.2f}x"
            if per:
                ratio += f" ({min(per):.2f}-{max(per):.2f})"
        print(f"  {label:<48} {st.median:8.1f} µs  p99 {st.p99:8.1f}  {ratio}")


def print_relay(m: RelayMeasured) -> None:
    print(f"\n== relay: {m.backend} ({m.rows} rows drained, {m.latency_rows} rows for latency)")
    for case in (RELAY_HAND, RELAY_JF):
        lo, hi = m.spread(case, "rate")
        print(
            f"  {case:<28} {m.median(case, 'rate'):8.0f} rows/s ({lo:.0f}-{hi:.0f})  "
            f"p50 {m.median(case, 'p50_ms'):6.2f} ms  p95 {m.median(case, 'p95_ms'):6.2f} ms  "
            f"cpu {m.median(case, 'cpu_us'):6.0f} µs/row  "
            f"first rows after {m.median(case, 'pickup_ms'):5.0f} ms"
        )
    rates, p50s = m.ratios("rate"), m.ratios("p50_ms")
    print(
        f"  rate ratio {statistics.median(rates):.2f}x ({min(rates):.2f}-{max(rates):.2f}), "
        f"p50 ratio {statistics.median(p50s):.2f}x ({min(p50s):.2f}-{max(p50s):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--latency-rows", type=int, default=300)
    parser.add_argument("--only", default="add,relay")
    parser.add_argument("--backends", default="postgres,mysql,sqlite")
    parser.add_argument("--relay-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay_child is not None:
        relay_child(json.loads(args.relay_child))
        return
    parts = args.only.split(",")
    backends = args.backends.split(",")
    if "add" in parts:
        for backend in backends:
            print_add(ADD_MEASURES[backend](args.ops, args.rounds))
    if "relay" in parts:
        for backend in backends:
            print_relay(measure_relay(backend, args.rows, args.latency_rows, args.rounds))


if __name__ == "__main__":
    main()
