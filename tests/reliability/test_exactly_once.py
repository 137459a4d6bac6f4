"""Exactly-once effects from at-least-once delivery, proven on real databases.

4 worker processes are each handed the same 500 messages, in a different order. Applying a
message is one transaction: ``inbox.claim_in(conn, message_id)`` plus
``UPDATE accounts SET balance = balance + amount``. Faults are injected at random *before*
the commit (the transaction rolls back; the worker retries) and *after* it ("commit outcome
unknown": the commit happened but the worker is told it failed, and retries). Whatever the
interleaving, every balance must end up equal to exactly one application of each message.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.integration._sqldrivers import MYSQL_DB, MYSQL_KW, PG_DSN, admin, query, unique
from tests.servers import MYSQL_URL, POSTGRES_URL

WORKERS = 4
MESSAGES = 500
ACCOUNTS = 10
FAULT_BEFORE = 0.15
FAULT_AFTER = 0.15
FORK = multiprocessing.get_context("fork")


class Injected(Exception):
    pass


def messages() -> list[tuple[str, int, int]]:
    rnd = random.Random(1234)
    return [(f"msg:{i}", i % ACCOUNTS, rnd.randint(1, 100)) for i in range(MESSAGES)]


def connect(dialect: str, sqlite_path: Path) -> Any:
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(PG_DSN)
    if dialect == "mysql":
        import pymysql

        return pymysql.connect(**MYSQL_KW, database=MYSQL_DB)
    return sqlite3.connect(sqlite_path, timeout=30)


def worker(dialect: str, url: str, table: str, sqlite_path: Path, seed: int, out: Any) -> None:
    stats = {"applied": 0, "skipped": 0, "before": 0, "after": 0, "errors": 0}
    try:
        rnd = random.Random(seed)
        batch = messages()
        rnd.shuffle(batch)
        inbox = jobfence.Inbox(url, table=table)
        conn = connect(dialect, sqlite_path)
        for key, account, amount in batch:
            while True:  # at-least-once: retry the message until it is acknowledged
                try:
                    applied = inbox.claim_in(conn, key)
                    if applied:
                        cur = conn.cursor()
                        cur.execute(
                            f"UPDATE {table}_acc SET balance = balance + "
                            + ("?" if dialect == "sqlite" else "%s")
                            + " WHERE id = "
                            + ("?" if dialect == "sqlite" else "%s"),
                            (amount, account),
                        )
                        cur.close()
                    if rnd.random() < FAULT_BEFORE:
                        stats["before"] += 1
                        raise Injected("failure before commit")
                    conn.commit()
                    stats["applied" if applied else "skipped"] += 1
                    if rnd.random() < FAULT_AFTER:
                        stats["after"] += 1
                        raise Injected("commit outcome unknown")  # committed, but we don't know
                    break
                except Injected:
                    conn.rollback()
                except Exception:  # deadlock, lock timeout, lost connection: retry the unit
                    stats["errors"] += 1
                    try:
                        conn.rollback()
                    except Exception:
                        conn = connect(dialect, sqlite_path)
        conn.close()
        inbox.close()
        out.put(stats)
    except BaseException as exc:
        out.put({"error": repr(exc)})
    finally:
        out.close()
        out.join_thread()
        os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_every_message_applied_exactly_once(dialect: str, tmp_path: Path) -> None:
    sqlite_path = tmp_path / "bank.db"
    url = {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}.get(dialect, f"sqlite:///{sqlite_path}")
    table = unique("jf_once")
    inbox = jobfence.Inbox(url, table=table)
    inbox.install()
    with admin(dialect, sqlite_path) as a:
        query(a, f"CREATE TABLE {table}_acc (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)")
        for account in range(ACCOUNTS):
            query(a, f"INSERT INTO {table}_acc (id, balance) VALUES (?, 0)", (account,))
    try:
        out = FORK.Queue()
        procs = [
            FORK.Process(target=worker, args=(dialect, url, table, sqlite_path, seed, out))
            for seed in range(WORKERS)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(10)
        failed = [r for r in results if "error" in r]
        assert not failed, failed

        expected = [0] * ACCOUNTS
        for _key, account, amount in messages():
            expected[account] += amount
        with admin(dialect, sqlite_path) as a:
            rows = query(a, f"SELECT id, balance FROM {table}_acc ORDER BY id")
            markers = query(a, f"SELECT COUNT(*) FROM {table} WHERE applied = ?", (True,))
        assert [int(b) for _i, b in rows] == expected
        assert int(markers[0][0]) == MESSAGES
        # the run really exercised both faults and the duplicates
        assert sum(r["applied"] for r in results) == MESSAGES
        assert sum(r["skipped"] for r in results) >= (WORKERS - 1) * MESSAGES
        assert sum(r["before"] for r in results) > 50
        assert sum(r["after"] for r in results) > 50
    finally:
        with admin(dialect, sqlite_path) as a:
            query(a, f"DROP TABLE IF EXISTS {table}_acc")
        inbox.drop()
        inbox.close()
