#!/usr/bin/env python3
"""SQLite locks: jobfence against a hand-written SQLite lock, in one run.

Uncontended acquire+release, interleaved rounds, median and p99 per pair (µs), one database
file in WAL mode with ``synchronous=FULL`` (jobfence's default, so every commit is durable):

  (a) hand-written lease row: ``INSERT OR IGNORE`` + owner-checked ``DELETE`` (two autocommit
      statements on ``sqlite3``; no expiry, no tokens) -- the baseline
  (b) jobfence ``Locks.try_acquire()`` + ``release()`` (renew=True, the default)
  (c) the same with ``renew=False``
  (d) jobfence ``AsyncLocks`` (renew=True), and (e) the hand-written pair (a) on aiosqlite

There is no contended section: SQLite is one file on one machine, and the lock benchmarks'
contended hand-off is measured on the servers (``bench_redis_locks.py``, ``bench_sql_locks.py``,
``bench_mysql_locks.py``).

Usage: ``python benchmarks/bench_sqlite_locks.py [--rounds 5] [--ops 300]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
from functools import partial
from typing import Any

import aiosqlite

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

import _harness as h

import jobfence

SYNCHRONOUS = "FULL"


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _hand_table(path: str, ns: str) -> str:
    table = f"{ns}_hand"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{table}" (name TEXT PRIMARY KEY, owner TEXT NOT NULL)'
    )
    conn.close()
    return table


def hand_written(url: str, ns: str) -> h.Runner:
    path = _path(url)
    table = _hand_table(path, ns)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    insert = f'INSERT OR IGNORE INTO "{table}" (name, owner) VALUES (?, ?)'
    delete = f'DELETE FROM "{table}" WHERE name = ? AND owner = ?'

    return h.owner_pairs(
        lambda owner: conn.execute(insert, ("hand", owner)).rowcount == 1,
        lambda owner: conn.execute(delete, ("hand", owner)).rowcount == 1,
        "hand-written lock",
    )


def jobfence_sync(url: str, ns: str, renew: bool) -> h.Runner:
    return h.jobfence_sync(jobfence.Locks(url, namespace=ns), f"jobfence-{renew}", renew)


def hand_written_async(url: str, ns: str, scope: h.AsyncScope) -> h.Runner:
    path = _path(url)
    table = _hand_table(path, ns)
    conn: Any = scope.run(aiosqlite.connect(path, isolation_level=None))
    scope.on_close(conn.close)
    scope.run(conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}"))
    insert = f'INSERT OR IGNORE INTO "{table}" (name, owner) VALUES (?, ?)'
    delete = f'DELETE FROM "{table}" WHERE name = ? AND owner = ?'

    async def execute(statement: str, owner: str) -> bool:
        cursor = await conn.execute(statement, ("hand-async", owner))
        return bool(cursor.rowcount == 1)

    return h.owner_pairs_async(
        partial(execute, insert), partial(execute, delete), "hand-written async lock", scope
    )


def variants(url: str, ns: str, scope: h.AsyncScope) -> list[h.Variant]:
    return [
        ("(a) hand-written INSERT OR IGNORE + DELETE", hand_written(url, ns)),
        ("(b) jobfence Locks, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(c) jobfence Locks, renew=False", jobfence_sync(url, ns, False)),
        ("(d) jobfence AsyncLocks, renew=True", h.jobfence_async(url, ns, scope)),
        ("(e) hand-written (a) on aiosqlite", hand_written_async(url, ns, scope)),
    ]


def cleanup(url: str, ns: str) -> None:
    """Nothing to drop: the database file lives in a temporary directory of the run."""


def temporary_url() -> tuple[str, str]:
    """A fresh database file's URL and its directory (remove it when done)."""
    tmp = tempfile.mkdtemp(prefix="jobfence-bench-")
    return f"sqlite:///{tmp}/locks.db", tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    url, tmp = temporary_url()
    print(
        f"SQLite {sqlite3.sqlite_version} (WAL, synchronous={SYNCHRONOUS}) in {tmp}; "
        f"{args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    try:
        rows = h.uncontended(
            partial(variants, url), partial(cleanup, url), args.rounds, args.ops, 20
        )
        h.print_uncontended(rows, ("(d)", "(e)"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
