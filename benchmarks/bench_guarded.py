#!/usr/bin/env python3
"""A guarded job end to end: ``@jobfence.guarded`` (lock + claim + complete) per backend.

For each backend, in interleaved rounds, median and p99 µs per call of a no-op job function
with a fresh idempotency key each call:

  (a) hand-written, on the same driver, autocommit: take a lease row/key (``INSERT ... ON
      CONFLICT DO NOTHING`` / ``INSERT IGNORE`` / ``INSERT OR IGNORE`` / ``SET NX PX``), insert
      the idempotency mark the same way, store the result on the mark (``UPDATE`` / ``SET
      XX``), delete the lease owner-checked (``DELETE ... AND owner`` / compare-and-delete
      script): four round trips, no expiry handling, no fencing tokens, no renewal -- the
      anchor
  (b) ``@jobfence.guarded(locks=Locks(url), inbox=Inbox(url), lock="job", key="{key}")``: the
      lease, the claim, the function, the stored result, the release

Usage: ``python benchmarks/bench_guarded.py [--ops 300] [--rounds 5]
[--only redis,postgres,mysql,sqlite]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

from _harness import Stats, interleave_stats
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

import jobfence

ANCHOR = "hand-written lease + mark + result + release"
GUARDED = "jobfence guarded (lock + claim + complete)"

DELETE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass
class Measured:
    """One backend's timings (µs per guarded call) and what was measured on it."""

    backend: str
    timings: dict[str, Stats]


def _sql_anchor(
    execute: Callable[[str, tuple[Any, ...]], int], table: str, insert_ignore: str, mark: str
) -> Callable[[str], None]:
    """The four hand-written statements; ``execute`` returns the affected row count."""
    lock_sql = insert_ignore.format(t=f"{table}_lock", cols="(name, owner)", vals="(%s, %s)")
    mark_sql = insert_ignore.format(t=f"{table}_mark", cols="(k, result)", vals="(%s, NULL)")
    done_sql = f"UPDATE {table}_mark SET result = %s WHERE k = %s"
    free_sql = f"DELETE FROM {table}_lock WHERE name = %s AND owner = %s"

    def run(key: str) -> None:
        owner = uuid.uuid4().hex
        if execute(lock_sql, ("job", owner)) != 1:
            raise RuntimeError("hand-written lease not taken")
        if execute(mark_sql, (key,)) != 1:
            raise RuntimeError("hand-written mark not inserted")
        execute(done_sql, (mark, key))
        if execute(free_sql, ("job", owner)) != 1:
            raise RuntimeError("hand-written lease not released")

    return run


def _guarded(url: str, table: str) -> tuple[Callable[[str], Any], Callable[[], None]]:
    locks = jobfence.Locks(url, namespace=table)
    inbox = jobfence.Inbox(url, table=table)
    inbox.install()

    @jobfence.guarded(locks=locks, inbox=inbox, lock="job", key="{key}")
    def job(key: str) -> dict[str, bool]:
        return {"ok": True}

    def close() -> None:
        inbox.drop()
        inbox.close()
        locks.close()

    return job, close


def measure_redis(ops: int, rounds: int) -> Measured:
    import redis

    table = "bench_guarded_" + uuid.uuid4().hex[:8]
    r = redis.Redis.from_url(REDIS_URL)
    delete = r.register_script(DELETE_IF_OWNER)

    def anchor(key: str) -> None:
        owner = uuid.uuid4().hex
        lock = f"{table}:hand:lock"
        if not r.set(lock, owner, nx=True, px=30_000):
            raise RuntimeError("hand-written lease not taken")
        if not r.set(f"{table}:hand:{key}", "", nx=True, px=300_000):
            raise RuntimeError("hand-written mark not inserted")
        r.set(f"{table}:hand:{key}", '{"ok": true}', xx=True, px=300_000)
        if not delete(keys=[lock], args=[owner]):
            raise RuntimeError("hand-written lease not released")

    job, close = _guarded(REDIS_URL, table)
    try:
        timings = interleave_stats({ANCHOR: anchor, GUARDED: job}, ops, rounds)
    finally:
        close()
        for key in r.scan_iter(match=f"{table}*", count=1000):
            r.delete(key)
        r.close()
    return Measured("Redis", timings)


def measure_postgres(ops: int, rounds: int) -> Measured:
    import psycopg

    table = "bench_guarded_" + uuid.uuid4().hex[:8]
    raw = psycopg.connect(POSTGRES_URL, autocommit=True)
    raw.execute(f"CREATE TABLE {table}_lock (name text PRIMARY KEY, owner text NOT NULL)")
    raw.execute(f"CREATE TABLE {table}_mark (k text PRIMARY KEY, result text)")
    anchor = _sql_anchor(
        lambda sql, params: raw.execute(sql, params).rowcount,
        table,
        "INSERT INTO {t} {cols} VALUES {vals} ON CONFLICT DO NOTHING",
        '{"ok": true}',
    )
    job, close = _guarded(POSTGRES_URL, table)
    try:
        timings = interleave_stats({ANCHOR: anchor, GUARDED: job}, ops, rounds)
    finally:
        close()
        raw.execute(f"DROP TABLE {table}_lock, {table}_mark")
        raw.close()
    return Measured("PostgreSQL", timings)


def measure_mysql(ops: int, rounds: int) -> Measured:
    import pymysql

    table = "bench_guarded_" + uuid.uuid4().hex[:8]
    raw = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
    cur = raw.cursor()
    cur.execute(f"CREATE TABLE {table}_lock (name VARCHAR(255) PRIMARY KEY, owner VARCHAR(64))")
    cur.execute(f"CREATE TABLE {table}_mark (k VARCHAR(255) PRIMARY KEY, result TEXT)")
    anchor = _sql_anchor(
        lambda sql, params: int(cur.execute(sql, params)),
        table,
        "INSERT IGNORE INTO {t} {cols} VALUES {vals}",
        '{"ok": true}',
    )
    job, close = _guarded(MYSQL_URL, table)
    try:
        timings = interleave_stats({ANCHOR: anchor, GUARDED: job}, ops, rounds)
    finally:
        close()
        cur.execute(f"DROP TABLE {table}_lock, {table}_mark")
        raw.close()
    return Measured("MariaDB", timings)


def measure_sqlite(ops: int, rounds: int) -> Measured:
    tmp = tempfile.mkdtemp(prefix="jobfence-bench-")
    path = os.path.join(tmp, "guarded.db")
    table = "bench_guarded"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")  # jobfence's default
    raw.execute(f"CREATE TABLE {table}_lock (name TEXT PRIMARY KEY, owner TEXT NOT NULL)")
    raw.execute(f"CREATE TABLE {table}_mark (k TEXT PRIMARY KEY, result TEXT)")
    anchor = _sql_anchor(
        lambda sql, params: raw.execute(sql.replace("%s", "?"), params).rowcount,
        table,
        "INSERT OR IGNORE INTO {t} {cols} VALUES {vals}",
        '{"ok": true}',
    )
    job, close = _guarded(f"sqlite:///{path}", table)
    try:
        timings = interleave_stats({ANCHOR: anchor, GUARDED: job}, ops, rounds)
    finally:
        close()
        raw.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return Measured("SQLite", timings)


MEASURES: dict[str, Callable[[int, int], Measured]] = {
    "redis": measure_redis,
    "postgres": measure_postgres,
    "mysql": measure_mysql,
    "sqlite": measure_sqlite,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(MEASURES))
    args = parser.parse_args()
    for name in args.only.split(","):
        m = MEASURES[name.strip()](args.ops, args.rounds)
        base = m.timings[ANCHOR].median
        print(f"\n== {m.backend}")
        for case, st in m.timings.items():
            print(
                f"  {case:<46} {st.median:8.1f} µs  p99 {st.p99:8.1f} µs  {st.median / base:.2f}x"
            )


if __name__ == "__main__":
    main()
