#!/usr/bin/env python3
"""MySQL/MariaDB locks: jobfence against hand-written SQL locks, in one run.

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written lease row: ``INSERT IGNORE`` + owner-checked ``DELETE`` (two autocommit
      statements, like jobfence's two; no expiry, no tokens) -- the baseline
  (b) ``GET_LOCK(name, 0)`` + ``RELEASE_LOCK(name)`` (session lock: nothing is written, no
      commit; no ttl, no tokens -- a lower bound, not a like-for-like comparison)
  (c) jobfence ``Locks.try_acquire()`` + ``release()`` (renew=True, the default)
  (d) the same with ``renew=False``
  (e) jobfence ``AsyncLocks`` (renew=True), and (f) the hand-written pair (a) on aiomysql

Contended hand-off: N processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
quarter). jobfence (default, with its "next in line" waiter) against jobfence with
``next_in_line=0`` (plain polling) and ``GET_LOCK(name, 30)`` (the server's own wait queue).

Usage: ``python benchmarks/bench_mysql_locks.py [--url mysql://root@127.0.0.1:3306/test]
[--rounds 5] [--ops 300] [--seconds 3] [--workers 4]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiomysql
import pymysql

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness, also in workers

import _harness as h

import jobfence


def _params(url: str) -> dict[str, Any]:
    u = urlsplit(url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
        "autocommit": True,
        "charset": "utf8mb4",
    }


def _db(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _connect(url: str) -> Any:
    return pymysql.connect(database=_db(url), **_params(url))


def _hand_table(url: str, ns: str) -> str:
    table = f"{ns}_hand"
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{table}` (name VARCHAR(255) PRIMARY KEY, "
            "owner VARCHAR(64) NOT NULL) ENGINE=InnoDB"
        )
    conn.close()
    return table


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> h.Runner:
    table = _hand_table(url, ns)
    cur = _connect(url).cursor()
    insert = f"INSERT IGNORE INTO `{table}` (name, owner) VALUES (%s, %s)"
    delete = f"DELETE FROM `{table}` WHERE name = %s AND owner = %s"

    return h.owner_pairs(
        lambda owner: cur.execute(insert, ("hand", owner)) == 1,
        lambda owner: cur.execute(delete, ("hand", owner)) == 1,
        "hand-written lock",
    )


def get_lock(url: str, ns: str) -> h.Runner:
    cur = _connect(url).cursor()
    name = f"{ns}:get_lock"

    def run(n: int) -> None:
        for _ in h.laps(n):
            cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
            if cur.fetchone()[0] != 1:
                raise RuntimeError("GET_LOCK not acquired")
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
            if cur.fetchone()[0] != 1:
                raise RuntimeError("RELEASE_LOCK failed")

    return run


def jobfence_sync(url: str, ns: str, renew: bool) -> h.Runner:
    return h.jobfence_sync(jobfence.Locks(url, namespace=ns), f"jobfence-{renew}", renew)


async def _cursor(conn: Any) -> Any:
    return await conn.cursor()


def hand_written_async(url: str, ns: str, scope: h.AsyncScope) -> h.Runner:
    table = _hand_table(url, ns)
    conn = scope.run(aiomysql.connect(db=_db(url), **_params(url)))
    scope.on_close(conn.ensure_closed)
    insert = f"INSERT IGNORE INTO `{table}` (name, owner) VALUES (%s, %s)"
    delete = f"DELETE FROM `{table}` WHERE name = %s AND owner = %s"
    cur = scope.run(_cursor(conn))  # closed with the connection

    async def execute(statement: str, owner: str) -> bool:
        return bool(await cur.execute(statement, ("hand-async", owner)) == 1)

    return h.owner_pairs_async(
        partial(execute, insert), partial(execute, delete), "hand-written async lock", scope
    )


def variants(url: str, ns: str, scope: h.AsyncScope) -> list[h.Variant]:
    return [
        ("(a) hand-written INSERT IGNORE + DELETE", hand_written(url, ns)),
        ("(b) GET_LOCK + RELEASE_LOCK (no write)", get_lock(url, ns)),
        ("(c) jobfence Locks, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence AsyncLocks, renew=True", h.jobfence_async(url, ns, scope)),
        ("(f) hand-written (a) on aiomysql", hand_written_async(url, ns, scope)),
    ]


# -- contended hand-off -----------------------------------------------------------------------
@contextmanager
def _get_lock(cur: Any, name: str) -> Iterator[None]:
    cur.execute("SELECT GET_LOCK(%s, 30)", (name,))
    if cur.fetchone()[0] != 1:
        raise RuntimeError("GET_LOCK timed out")
    yield
    cur.execute("SELECT RELEASE_LOCK(%s)", (name,))


def _worker(kind: str, url: str, ns: str, seconds: float, gate: h.Gate) -> None:
    if kind.startswith("jobfence"):
        options = {"next_in_line": 0} if kind == "jobfence-polling" else {}
        locks = jobfence.Locks(url, namespace=ns, **options)
        locks.backend.install()
        count = gate.hand_off(lambda: locks.acquire("contended", ttl=10, timeout=30), seconds)
        locks.close()
    else:
        cur = _connect(url).cursor()
        count = gate.hand_off(lambda: _get_lock(cur, f"{ns}:contended"), seconds)
    gate.report(count)


def _cleanup(url: str, ns: str) -> None:
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s",
            (ns + "%",),
        )
        for (table,) in cur.fetchall():
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
    conn.close()


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    args = h.parse_args(__doc__, "MYSQL_URL", "mysql://root@127.0.0.1:3306/test", rounds=5, ops=300)
    conn = _connect(args.url)
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
        version, flush = cur.fetchone()
    conn.close()
    print(
        f"{version} at {jobfence._core.url.mask_url(args.url)} "
        f"(innodb_flush_log_at_trx_commit={flush}); PyMySQL {pymysql.__version__}, "
        f"aiomysql {aiomysql.__version__}; {os.cpu_count()} CPUs; "
        f"{args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    h.run_lock_benchmarks(
        args,
        variants,
        _cleanup,
        _worker,
        [
            ("jobfence", "jobfence Locks.acquire (next in line)"),
            ("jobfence-polling", "jobfence Locks.acquire, next_in_line=0"),
            ("get_lock", "GET_LOCK(name, 30) (server queue, no ttl)"),
        ],
        warmup=max(20, args.ops // 10),
        async_pair=("(e)", "(f)"),
    )


if __name__ == "__main__":
    main()
