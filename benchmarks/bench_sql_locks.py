#!/usr/bin/env python3
"""PostgreSQL locks: jobfence (both modes) against hand-written SQL locks, in one run.

(MySQL/MariaDB has its own script: ``benchmarks/bench_mysql_locks.py``.)

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written lease row: ``INSERT ... ON CONFLICT DO NOTHING`` + owner-checked ``DELETE``
      (two autocommit statements, like jobfence's two; no expiry, no tokens) -- the baseline
  (b) ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` (session lock: nothing is written, no
      commit; no ttl, no tokens -- a lower bound, not a like-for-like comparison)
  (c) jobfence ``Locks.try_acquire()`` + ``release()``, mode=lease (default), renew=True
  (d) the same with ``renew=False``
  (e) jobfence mode=session (advisory lock + token bump in one statement, checked unlock)
  (f) jobfence ``AsyncLocks``, mode=lease, and (g) the hand-written pair (a) on psycopg async

Contended hand-off: N processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
share). jobfence lease mode (LISTEN/NOTIFY wake-ups; and ``notify=false``, plain polling),
jobfence session mode (the server's FIFO lock queue) and a hand-written blocking
``pg_advisory_lock``.

Usage: ``python benchmarks/bench_sql_locks.py [--url postgresql://postgres@127.0.0.1/test]
[--rounds 5] [--ops 300] [--seconds 3] [--workers 4]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness, also in workers

import _harness as h

import jobfence
from jobfence._core.url import mask_url
from jobfence.backends.postgres.locks_async import advisory_key


def _with(url: str, **options: str) -> str:
    return url + ("&" if "?" in url else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def _hand_table(url: str, ns: str) -> str:
    table = f"{ns}_hand"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{table}" (name text PRIMARY KEY, owner text NOT NULL)'
        )
    return table


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> h.Runner:
    table = _hand_table(url, ns)
    conn = psycopg.connect(url, autocommit=True)
    insert = f'INSERT INTO "{table}" (name, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING'
    delete = f'DELETE FROM "{table}" WHERE name = %s AND owner = %s'

    return h.owner_pairs(
        lambda owner: conn.execute(insert, ("hand", owner)).rowcount == 1,
        lambda owner: conn.execute(delete, ("hand", owner)).rowcount == 1,
        "hand-written lock",
    )


def advisory(url: str, ns: str) -> h.Runner:
    conn = psycopg.connect(url, autocommit=True)
    key = advisory_key(ns, "advisory")

    def run(n: int) -> None:
        for _ in h.laps(n):
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if not row or not row[0]:
                raise RuntimeError("advisory lock not acquired")
            row = conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()
            if not row or not row[0]:
                raise RuntimeError("advisory lock not released")

    return run


def jobfence_sync(url: str, ns: str, renew: bool, mode: str = "lease") -> h.Runner:
    locks = jobfence.Locks(_with(url, mode=mode), namespace=ns)
    return h.jobfence_sync(locks, f"jobfence-{mode}-{renew}", renew)


def hand_written_async(url: str, ns: str, scope: h.AsyncScope) -> h.Runner:
    table = _hand_table(url, ns)
    conn: psycopg.AsyncConnection[Any] = scope.run(
        psycopg.AsyncConnection.connect(url, autocommit=True)
    )
    insert = f'INSERT INTO "{table}" (name, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING'
    delete = f'DELETE FROM "{table}" WHERE name = %s AND owner = %s'

    async def execute(statement: str, owner: str) -> bool:
        return (await conn.execute(statement, ("hand-async", owner))).rowcount == 1

    return h.owner_pairs_async(
        partial(execute, insert), partial(execute, delete), "hand-written async lock", scope
    )


def variants(url: str, ns: str, scope: h.AsyncScope) -> list[h.Variant]:
    return [
        ("(a) hand-written INSERT ON CONFLICT + DELETE", hand_written(url, ns)),
        ("(b) pg_try_advisory_lock + unlock (no write)", advisory(url, ns)),
        ("(c) jobfence Locks lease, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks lease, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence Locks session, renew=True", jobfence_sync(url, ns, True, "session")),
        ("(f) jobfence AsyncLocks lease, renew=True", h.jobfence_async(url, ns, scope)),
        ("(g) hand-written (a) on psycopg async", hand_written_async(url, ns, scope)),
    ]


# -- contended hand-off -----------------------------------------------------------------------
JOBFENCE_OPTIONS = {
    "jobfence-lease": {"mode": "lease"},
    "jobfence-poll": {"mode": "lease", "notify": "false"},
    "jobfence-session": {"mode": "session"},
}


@contextmanager
def _advisory_lock(conn: psycopg.Connection[Any], key: int) -> Iterator[None]:
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    yield
    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _worker(kind: str, url: str, ns: str, seconds: float, gate: h.Gate) -> None:
    if kind.startswith("jobfence"):
        locks = jobfence.Locks(_with(url, **JOBFENCE_OPTIONS[kind]), namespace=ns)
        locks.backend.install()
        count = gate.hand_off(lambda: locks.acquire("contended", ttl=10, timeout=30), seconds)
        locks.close()
    else:
        conn = psycopg.connect(url, autocommit=True)
        key = advisory_key(ns, "contended")
        count = gate.hand_off(lambda: _advisory_lock(conn, key), seconds)
        conn.close()
    gate.report(count)


def _cleanup(url: str, ns: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (ns + "%",),
        ).fetchall()
        for (table,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    args = h.parse_args(
        __doc__, "POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test", rounds=5, ops=300
    )
    with psycopg.connect(args.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
            "current_setting('fsync')"
        ).fetchone()
    assert row is not None
    version, sync_commit, fsync = row
    print(
        f"PostgreSQL {version} at {mask_url(args.url)} (synchronous_commit={sync_commit}, "
        f"fsync={fsync}); psycopg {psycopg.__version__}; {os.cpu_count()} CPUs; "
        f"{args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    h.run_lock_benchmarks(
        args,
        variants,
        _cleanup,
        _worker,
        [
            ("jobfence-lease", "jobfence lease mode (LISTEN/NOTIFY)"),
            ("jobfence-poll", "jobfence lease mode, notify=false (polling)"),
            ("jobfence-session", "jobfence session mode (server FIFO queue)"),
            ("advisory", "hand-written pg_advisory_lock (server queue)"),
        ],
        warmup=max(20, args.ops // 10),
        async_pair=("(f)", "(g)"),
    )


if __name__ == "__main__":
    main()
