#!/usr/bin/env python3
"""Inbox claims: jobfence against a hand-written idempotency insert, side by side in one run.

For each backend, in interleaved rounds (median of the rounds, µs per claim of a NEW key):

  (a) hand-written baseline on the same driver, autocommit, table ``(k PRIMARY KEY)``:
      PostgreSQL ``INSERT ... ON CONFLICT DO NOTHING``, MariaDB ``INSERT IGNORE``, SQLite
      ``INSERT OR IGNORE``, Redis ``SET k 1 NX PX``
  (b) jobfence ``Inbox.claim(key)`` (sync), and the duplicate path (claim of a held key)
  (c) ``Inbox.claim_in(conn, key)`` inside a caller transaction vs the same hand-written insert
      inside the same kind of transaction (begin, statement, commit)
  (d) Redis only: ``claim`` + ``complete`` of a new key and the claim of a completed key,
      beside AWS Lambda Powertools' ``idempotent_function`` on its Redis persistence layer
      (``RedisCachePersistenceLayer``, the ``bench`` extra) for a new and a completed key

Round trips per claim are counted, not assumed: PostgreSQL from libpq's protocol trace (one
``Sync`` per request/response exchange), MariaDB by counting the driver's commands, Redis by
counting the commands sent (and INFO commandstats' EVALSHA delta), SQLite (in-process, no
network) by the statements its trace callback sees.

Usage: ``python benchmarks/bench_inbox.py [--ops 400] [--rounds 5] [--only postgres,...]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

from _harness import Stats, inbox_cases, interleave_stats, report
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

import jobfence

# -- PostgreSQL ---------------------------------------------------------------------------


def measure_postgres(ops: int, rounds: int) -> Measured:
    import psycopg

    table = "bench_inbox_" + uuid.uuid4().hex[:8]
    inbox = jobfence.Inbox(POSTGRES_URL, table=table)
    inbox.install()
    raw = psycopg.connect(POSTGRES_URL, autocommit=True)
    raw.execute(f"CREATE TABLE {table}_raw (k text PRIMARY KEY)")
    txconn = psycopg.connect(POSTGRES_URL)
    held = uuid.uuid4().hex
    inbox.claim(held)

    def baseline(k: str) -> None:
        raw.execute(f"INSERT INTO {table}_raw (k) VALUES (%s) ON CONFLICT DO NOTHING", (k,))

    def baseline_tx(k: str) -> None:
        txconn.execute(f"INSERT INTO {table}_raw (k) VALUES (%s) ON CONFLICT DO NOTHING", (k,))
        txconn.commit()

    try:
        timings = interleave_stats(
            inbox_cases(
                inbox,
                held,
                ("hand-written INSERT ON CONFLICT DO NOTHING", baseline),
                (baseline_tx, txconn),
            ),
            ops,
            rounds,
        )
        trips = {
            "claim (NEW)": _pg_trips(inbox, lambda: inbox.claim(uuid.uuid4().hex)),
            "claim (duplicate)": _pg_trips(inbox, lambda: inbox.claim(held)),
        }
        return Measured(
            "PostgreSQL (psycopg, sync)",
            timings,
            "hand-written INSERT ON CONFLICT DO NOTHING",
            trips,
        )
    finally:
        txconn.close()
        raw.execute(f"DROP TABLE {table}_raw")
        raw.close()
        inbox.drop()
        inbox.close()


def _pg_trips(inbox: Any, op: Callable[[], Any], n: int = 50) -> float:
    op()
    conn = inbox.backend._pool._idle[-1]
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        for _ in range(n):
            op()
        conn.pgconn.untrace()
        trace.seek(0)
        syncs = sum(1 for line in trace if "\tF\t" in line and "Sync" in line)
    return syncs / n


# -- MariaDB ------------------------------------------------------------------------------


def measure_mysql(ops: int, rounds: int) -> Measured:
    import pymysql

    table = "bench_inbox_" + uuid.uuid4().hex[:8]
    inbox = jobfence.Inbox(MYSQL_URL, table=table)
    inbox.install()
    kw: dict[str, Any] = {"host": "127.0.0.1", "user": "root", "database": "test"}
    raw = pymysql.connect(**kw, autocommit=True)
    txconn = pymysql.connect(**kw)
    with raw.cursor() as cur:
        cur.execute(f"CREATE TABLE {table}_raw (k VARBINARY(1024) PRIMARY KEY)")
    held = uuid.uuid4().hex
    inbox.claim(held)

    def baseline(k: str) -> None:
        with raw.cursor() as cur:
            cur.execute(f"INSERT IGNORE INTO {table}_raw (k) VALUES (%s)", (k,))

    def baseline_tx(k: str) -> None:
        with txconn.cursor() as cur:
            cur.execute(f"INSERT IGNORE INTO {table}_raw (k) VALUES (%s)", (k,))
        txconn.commit()

    try:
        timings = interleave_stats(
            inbox_cases(
                inbox, held, ("hand-written INSERT IGNORE", baseline), (baseline_tx, txconn)
            ),
            ops,
            rounds,
        )
        trips = {
            "claim (NEW)": _mysql_trips(inbox, lambda: inbox.claim(uuid.uuid4().hex)),
            "claim (duplicate)": _mysql_trips(inbox, lambda: inbox.claim(held)),
            "claim_in (without commit)": _mysql_conn_trips(
                txconn, lambda: inbox.claim_in(txconn, uuid.uuid4().hex)
            ),
        }
        return Measured("MariaDB (PyMySQL)", timings, "hand-written INSERT IGNORE", trips)
    finally:
        txconn.rollback()
        txconn.close()
        with raw.cursor() as cur:
            cur.execute(f"DROP TABLE {table}_raw")
        raw.close()
        inbox.drop()
        inbox.close()


def _mysql_conn_trips(conn: Any, op: Callable[[], Any], n: int = 50) -> float:
    count = 0
    original = conn._execute_command

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal count
        count += 1
        return original(*args, **kw)

    conn._execute_command = counting
    try:
        for _ in range(n):
            op()
    finally:
        conn._execute_command = original
    return count / n


def _mysql_trips(inbox: Any, op: Callable[[], Any]) -> float:
    op()
    return _mysql_conn_trips(inbox.backend._pool._idle[-1], op)


# -- SQLite -------------------------------------------------------------------------------


def measure_sqlite(ops: int, rounds: int) -> Measured:
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "bench.db")
    inbox = jobfence.Inbox(f"sqlite:///{path}", table="bench_inbox")
    inbox.install()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("CREATE TABLE bench_raw (k TEXT PRIMARY KEY)")
    txconn = sqlite3.connect(path)
    held = uuid.uuid4().hex
    inbox.claim(held)

    def baseline(k: str) -> None:
        raw.execute("INSERT OR IGNORE INTO bench_raw (k) VALUES (?)", (k,))

    def baseline_tx(k: str) -> None:
        txconn.execute("INSERT OR IGNORE INTO bench_raw (k) VALUES (?)", (k,))
        txconn.commit()

    timings = interleave_stats(
        inbox_cases(
            inbox, held, ("hand-written INSERT OR IGNORE", baseline), (baseline_tx, txconn)
        ),
        ops,
        rounds,
    )
    inbox.claim(uuid.uuid4().hex)
    conn = inbox.backend._pool._idle[-1]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    inbox.claim(uuid.uuid4().hex)
    new = len(statements)
    statements.clear()
    inbox.claim(held)
    dup = len(statements)
    conn.set_trace_callback(None)
    raw.close()
    txconn.close()
    inbox.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return Measured(
        "SQLite (sqlite3, WAL)",
        timings,
        "hand-written INSERT OR IGNORE",
        {"claim (NEW), statements": new, "claim (duplicate), statements": dup},
    )


# -- Redis --------------------------------------------------------------------------------


def measure_redis(ops: int, rounds: int) -> Measured:
    import redis

    table = "bench_inbox_" + uuid.uuid4().hex[:8]
    inbox = jobfence.Inbox(REDIS_URL, table=table)
    raw = redis.Redis.from_url(REDIS_URL)
    held = uuid.uuid4().hex
    inbox.claim(held)

    def baseline(k: str) -> None:
        raw.set(f"{table}raw:{k}", 1, nx=True, px=300_000)

    def claim_complete(k: str) -> None:
        claim = inbox.claim(k)
        claim.complete({"ok": True})

    done = uuid.uuid4().hex
    claim_complete(done)
    cases = inbox_cases(inbox, held, ("hand-written SET NX PX", baseline))
    cases["Inbox.claim + complete (NEW)"] = claim_complete
    cases["Inbox.claim (duplicate, COMPLETED)"] = lambda k: inbox.claim(done)
    powertools_client = redis.Redis.from_url(REDIS_URL)
    try:
        cases.update(powertools_cases(powertools_client, table))
        timings = interleave_stats(cases, ops, rounds)
        sent = 0
        conn_cls = redis.connection.AbstractConnection
        original = conn_cls.send_packed_command

        def counting(self: Any, *args: Any, **kw: Any) -> Any:
            nonlocal sent
            sent += 1
            return original(self, *args, **kw)

        before = raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        conn_cls.send_packed_command = counting  # type: ignore[method-assign]
        try:
            for _ in range(100):
                inbox.claim(uuid.uuid4().hex)
        finally:
            conn_cls.send_packed_command = original  # type: ignore[method-assign]
        after = raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        return Measured(
            "Redis (redis-py, sync)",
            timings,
            "hand-written SET NX PX",
            {
                "claim (NEW), client sends": sent / 100,
                "claim, server EVALSHA delta": f"{(after - before) / 100:.2f} (shared server)",
            },
        )
    finally:
        inbox.drop()
        for pattern in (f"{table}raw:*", f"{table}pt#*"):
            for key in raw.scan_iter(match=pattern, count=1000):
                raw.delete(key)
        raw.close()
        powertools_client.close()
        inbox.close()


class _LambdaContext:
    """The fields of a Lambda context Powertools' idempotency reads outside Lambda."""

    function_name = "bench"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:eu-west-1:000000000000:function:bench"
    aws_request_id = "bench"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 300_000


def powertools_cases(client: Any, prefix: str) -> dict[str, Callable[[str], Any]]:
    """AWS Lambda Powertools idempotency (``idempotent_function``) on its Redis persistence
    layer, with the same redis-py client kind: a new key (Powertools reads nothing first: it
    writes the in-progress record with ``SET NX``, runs the function, writes the result) and
    a repeated completed key (it finds the record and returns the stored result)."""
    os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence import redis as layers

    with warnings.catch_warnings():  # announced to be renamed in Powertools 4
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = layers.RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(expires_after_seconds=300, lambda_context=_LambdaContext())

    @idempotent_function(
        data_keyword_argument="job",
        persistence_store=layer,
        config=config,
        key_prefix=f"{prefix}pt",
    )
    def job(job: dict[str, str]) -> dict[str, bool]:
        return {"ok": True}

    done = uuid.uuid4().hex
    job(job={"id": done})
    return {
        "Powertools idempotent_function (NEW)": lambda k: job(job={"id": k}),
        "Powertools idempotent_function (duplicate, COMPLETED)": lambda k: job(job={"id": done}),
    }


@dataclass
class Measured:
    """One backend's inbox timings (µs per call, median and p99) against the ``base`` case,
    and its round-trip counts."""

    backend: str
    timings: dict[str, Stats]
    base: str
    trips: dict[str, Any]


MEASURES: dict[str, Callable[[int, int], Measured]] = {
    "postgres": measure_postgres,
    "mysql": measure_mysql,
    "sqlite": measure_sqlite,
    "redis": measure_redis,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="postgres,mysql,sqlite,redis")
    args = parser.parse_args()
    for name in args.only.split(","):
        m = MEASURES[name](args.ops, args.rounds)
        report(m.backend, {k: v.median for k, v in m.timings.items()}, m.base, m.trips)


if __name__ == "__main__":
    main()
