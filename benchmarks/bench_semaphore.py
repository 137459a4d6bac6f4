#!/usr/bin/env python3
"""A concurrency limit of 3 (``Locks.try_acquire(name, limit=3)`` + ``release``) on Redis and
PostgreSQL against hand-written floors, as ratios.

One name per case, one client, acquire + release in a loop (uncontended: slot 0 is free each
time), in interleaved rounds; the table gives the median and p99 µs per cycle and the ratio
to the floor on the same server.

* Redis floor: the shape DistributedLock and Redisson use, a sorted set of holders scored by
  their deadline: one ``EVALSHA`` of ``ZREMRANGEBYSCORE`` (drop expired holders) + ``ZCARD``
  + ``ZADD`` + ``PEXPIRE`` to acquire, a ``ZREM`` to release (no fencing token, no queue).
* PostgreSQL floor: a row per slot, ``UPDATE ... WHERE (name, slot) = (SELECT ... FOR UPDATE
  SKIP LOCKED LIMIT 1) RETURNING slot`` to acquire (a free or expired slot), an owner-checked
  ``UPDATE`` to release, each one autocommitted statement (no token, no queue).
* jobfence, ``renew=False`` like the floors (a renewed lease only adds the renewer's
  bookkeeping): one grant request on slot 0 and one release, each one round trip; the plain
  lock cycle (``limit=1``) beside it, and on Redis the backend's two verbs on slot 0 alone
  (the lock scripts without the client around them): where the time goes.

Usage: ``python benchmarks/bench_semaphore.py [--redis URL] [--postgres URL] [--rounds 11]
[--ops 300]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

import _harness as h
import psycopg
import redis

import jobfence
from jobfence.limits import slot_name

REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
LIMIT = 3
REDIS_FLOOR = "Redis: floor (ZSET script + ZREM)"
REDIS_JF = "Redis: jobfence limit=3"
REDIS_PLAIN = "Redis: jobfence plain lock"
REDIS_VERBS = "Redis: the backend's verbs on slot 0"
PG_FLOOR = "PostgreSQL: floor (slot rows, SKIP LOCKED)"
PG_JF = "PostgreSQL: jobfence limit=3"
PG_PLAIN = "PostgreSQL: jobfence plain lock"
#: each case and the floor it is compared with
ANCHORS = {
    REDIS_FLOOR: "",
    REDIS_JF: REDIS_FLOOR,
    REDIS_PLAIN: REDIS_FLOOR,
    REDIS_VERBS: REDIS_FLOOR,
    PG_FLOOR: "",
    PG_JF: PG_FLOOR,
    PG_PLAIN: PG_FLOOR,
}

_ACQUIRE_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


def _redis_floor(client: redis.Redis, key: str) -> Callable[[str], Any]:
    acquire = client.register_script(_ACQUIRE_LUA)
    ttl_ms = int(h.TTL * 1000)

    def cycle(_: str) -> None:
        owner = uuid.uuid4().hex
        if acquire(keys=[key], args=[int(time.time() * 1000), ttl_ms, LIMIT, owner]) != 1:
            raise RuntimeError("floor acquire failed")
        if client.zrem(key, owner) != 1:
            raise RuntimeError("floor release failed")

    return cycle


_PG_ACQUIRE = """
UPDATE {t} SET owner = %(owner)s, expires_at = now() + make_interval(secs => %(ttl)s)
WHERE (name, slot) = (
    SELECT name, slot FROM {t}
    WHERE name = %(name)s AND (owner IS NULL OR expires_at < now())
    ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING slot
"""
_PG_RELEASE = "UPDATE {t} SET owner = NULL WHERE name = %s AND slot = %s AND owner = %s"


def _pg_floor(conn: psycopg.Connection[Any], table: str, name: str) -> Callable[[str], Any]:
    conn.execute(
        f"CREATE TABLE {table} (name text, slot int, owner text, expires_at timestamptz, "
        "PRIMARY KEY (name, slot))"
    )
    for slot in range(LIMIT):
        conn.execute(f"INSERT INTO {table} VALUES (%s, %s, NULL, NULL)", (name, slot))
    acquire, release = _PG_ACQUIRE.format(t=table), _PG_RELEASE.format(t=table)

    def cycle(_: str) -> None:
        owner = uuid.uuid4().hex
        row = conn.execute(acquire, {"owner": owner, "ttl": h.TTL, "name": name}).fetchone()
        if row is None:
            raise RuntimeError("floor acquire failed")
        if conn.execute(release, (name, row[0], owner)).rowcount != 1:
            raise RuntimeError("floor release failed")

    return cycle


def _jobfence(locks: jobfence.Locks, name: str, limit: int) -> Callable[[str], Any]:
    def cycle(_: str) -> None:
        lease = locks.try_acquire(name, ttl=h.TTL, renew=False, limit=limit)
        if lease is None or not lease.release():
            raise RuntimeError("jobfence cycle failed")

    return cycle


def _verbs(locks: jobfence.Locks, name: str) -> Callable[[str], Any]:
    """The backend's acquire and release of slot 0 alone, without the client around them
    (owner id, lease, renewer, I/O hook): where the time of a cycle goes."""
    backend, slot = locks.backend, slot_name(name, 0)

    def cycle(_: str) -> None:
        owner = uuid.uuid4().hex
        if backend.acquire(slot, owner, h.TTL) is None or not backend.release(slot, owner):
            raise RuntimeError("backend cycle failed")

    return cycle


def measure(
    rounds: int, ops: int, *, redis_url: str = REDIS, postgres: str = POSTGRES
) -> dict[str, h.Stats]:
    """The six cases, interleaved, ``rounds`` rounds of ``ops`` cycles each."""
    ns = h.new_namespace()
    table = f"bench_sem_{ns}"
    client = redis.Redis.from_url(redis_url)
    conn = psycopg.connect(postgres, autocommit=True)
    locks = {
        "Redis": jobfence.Locks(redis_url, namespace=ns),
        "PostgreSQL": jobfence.Locks(postgres, namespace=ns),
    }
    try:
        cases: dict[str, Callable[[str], Any]] = {
            REDIS_FLOOR: _redis_floor(client, f"{ns}:floor"),
            REDIS_JF: _jobfence(locks["Redis"], "sem", LIMIT),
            REDIS_PLAIN: _jobfence(locks["Redis"], "plain", 1),
            REDIS_VERBS: _verbs(locks["Redis"], "verbs"),
            PG_FLOOR: _pg_floor(conn, table, "sem"),
            PG_JF: _jobfence(locks["PostgreSQL"], "sem", LIMIT),
            PG_PLAIN: _jobfence(locks["PostgreSQL"], "plain", 1),
        }
        return h.interleave_stats(cases, ops, rounds)
    finally:
        for client_ in locks.values():
            client_.close()
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (ns + "%",),
        ).fetchall():
            conn.execute(f'DROP TABLE IF EXISTS "{row[0]}"')
        conn.close()
        for key in client.scan_iter(f"{ns}*"):
            client.delete(key)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--redis", default=REDIS)
    parser.add_argument("--postgres", default=POSTGRES)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    stats = measure(args.rounds, args.ops, redis_url=args.redis, postgres=args.postgres)
    print(f"{args.rounds} interleaved rounds of {args.ops} cycles per case")
    print(f"{'case':44} {'median µs':>10} {'p99 µs':>10} {'x floor':>8}")
    for label, st in stats.items():
        anchor = ANCHORS.get(label)
        ratio = f"{st.median / stats[anchor].median:.2f}x" if anchor else "1.00x"
        print(f"{label:44} {st.median:10.1f} {st.p99:10.1f} {ratio:>8}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
