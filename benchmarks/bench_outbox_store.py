#!/usr/bin/env python3
"""Outbox storage: ``Outbox.add`` against a hand-written insert, and the relay's claim cycle.

For each SQL backend (PostgreSQL, MariaDB/MySQL, SQLite), in interleaved rounds (median and
p99 µs per operation):

  (a) a hand-written ``INSERT`` of one message row (id, queue, body) into a table of the same
      columns, then ``COMMIT``, on the same driver -- the anchor
  (b) ``Outbox.add(conn, ...)`` of one message, then ``COMMIT`` (PostgreSQL: the statement
      also notifies the relays)
  (c) ``Outbox.add_many`` of 10 messages, then ``COMMIT`` (µs per message)

and the relay's side: rows per second claimed and marked published by one relay
(``backend.claim(limit=100)`` then ``backend.published``), on a table of 5,000 pending rows,
half of them under 50 ordering keys.

Usage: ``python benchmarks/bench_outbox_store.py [--ops 300] [--rounds 5] [--only postgres,...]``
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

import _harness as h

import jobfence

PG_URL = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
MY_URL = os.environ.get("JOBFENCE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test")

BACKLOG = 5_000
BATCH = 100


def _connect(dialect: str, sqlite_path: str) -> Any:
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(PG_URL)
    if dialect == "mysql":
        import pymysql

        return pymysql.connect(host="127.0.0.1", user="root", database="test")
    return sqlite3.connect(sqlite_path)


def _baseline(dialect: str, conn: Any, table: str) -> Callable[[str], Any]:
    """A hand-written message insert into ``table`` (created here), committed."""
    cur = conn.cursor()
    if dialect == "postgresql":
        cur.execute(
            f"CREATE TABLE {table} (seq bigserial PRIMARY KEY, id text UNIQUE, q text, b bytea)"
        )
        sql = f"INSERT INTO {table} (id, q, b) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
    elif dialect == "mysql":
        cur.execute(
            f"CREATE TABLE {table} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id VARBINARY(255)"
            " UNIQUE, q VARCHAR(128), b LONGBLOB)"
        )
        sql = f"INSERT INTO {table} (id, q, b) VALUES (%s, %s, %s)"
    else:
        cur.execute(
            f"CREATE TABLE {table} (seq INTEGER PRIMARY KEY, id TEXT UNIQUE, q TEXT, b BLOB)"
        )
        sql = f"INSERT OR IGNORE INTO {table} (id, q, b) VALUES (?, ?, ?)"
    conn.commit()

    def insert(key: str) -> None:
        conn.cursor().execute(sql, (key, "orders", b'{"order_id":7}'))
        conn.commit()

    return insert


def _drop(conn: Any, table: str) -> None:
    conn.rollback()
    conn.cursor().execute(f"DROP TABLE IF EXISTS {table}")
    conn.commit()


def _relay_rate(outbox: jobfence.Outbox, conn: Any) -> float:
    """Rows per second one relay claims and marks published, from a backlog of BACKLOG."""
    keys = [f"k{n}" for n in range(50)]
    for start in range(0, BACKLOG, 500):
        for n in range(start, start + 500, 10):
            key = keys[n // 10 % 50] if n % 20 == 0 else None
            outbox.add_many(conn, queue="orders", bodies=list(range(10)), key=key)
        conn.commit()
    backend = outbox.backend
    relay = f"bench:{os.getpid()}:{uuid.uuid4().hex}"
    done = 0
    started = time.perf_counter()
    while True:
        rows = backend.claim(relay, BATCH, 30.0)
        if not rows:
            break
        done += backend.published(relay, [r.seq for r in rows], 600.0)
    elapsed = time.perf_counter() - started
    assert done == BACKLOG, done
    return done / elapsed


def run_backend(name: str, url: str, dialect: str, ops: int, rounds: int) -> list[tuple[str, ...]]:
    tmp = tempfile.mkdtemp(prefix="jf-bench-outbox-")
    sqlite_path = os.path.join(tmp, "bench.db")
    if dialect == "sqlite":
        url = f"sqlite:///{sqlite_path}"
    table = h.new_namespace()
    outbox = jobfence.Outbox(url, table=f"{table}_outbox")
    outbox.install()
    conn = _connect(dialect, sqlite_path)
    if dialect == "sqlite":
        conn.execute("PRAGMA journal_mode=WAL")
    try:
        baseline = _baseline(dialect, conn, f"{table}_plain")

        def add(key: str) -> None:
            outbox.add(conn, queue="orders", body={"order_id": 7}, id=key)
            conn.commit()

        def add_many(key: str) -> None:
            outbox.add_many(conn, queue="orders", bodies=[{"order_id": n} for n in range(10)])
            conn.commit()

        stats = h.interleave_stats(
            {
                "hand-written insert + commit": baseline,
                "Outbox.add + commit": add,
                "Outbox.add_many(10) + commit": add_many,
            },
            ops,
            rounds,
        )
        anchor = stats["hand-written insert + commit"].median
        rows = []
        for label, st in stats.items():
            per = 10 if "add_many" in label else 1
            rows.append(
                (
                    f"{name}: {label}" + (" (per message)" if per > 1 else ""),
                    f"{st.median / per:.0f}",
                    f"{st.p99 / per:.0f}",
                    f"{st.median / anchor / per:.2f}x",
                )
            )
        outbox.purge(0)
        for _ in range(2):  # drain what the timed adds left, then measure the relay
            backend = outbox.backend
            while rows_ := backend.claim("drain", 1000, 30.0):
                backend.published("drain", [r.seq for r in rows_], 0)
        rate = _relay_rate(outbox, conn)
        rows.append(
            (f"{name}: claim({BATCH}) + published, one relay", f"{rate:,.0f} rows/s", "", "")
        )
        _drop(conn, f"{table}_plain")
        return rows
    finally:
        outbox.drop()
        outbox.close()
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="postgres,mysql,sqlite")
    args = parser.parse_args()
    backends = {
        "postgres": (PG_URL, "postgresql"),
        "mysql": (MY_URL, "mysql"),
        "sqlite": ("", "sqlite"),
    }
    table: list[tuple[str, ...]] = []
    for name in args.only.split(","):
        url, dialect = backends[name]
        table += run_backend(name, url, dialect, args.ops, args.rounds)
    h.print_table("Outbox storage", ("case", "median µs", "p99 µs", "vs hand-written"), table)


if __name__ == "__main__":
    main()
