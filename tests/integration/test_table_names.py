"""The on-server table names are the ones jobfence has always used, now that every SQL file fills
its names with one quoting function: existing users' tables must still be found.

* PostgreSQL lock tables were double-quoted: the namespace's case is kept.
* The PostgreSQL inbox table was unquoted, so PostgreSQL folded it to lower case; a table made
  that way (e.g. by a migration tool from the shipped SQL) is the one the inbox uses.
* MySQL and SQLite tables have the same name quoted or not.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import psycopg
import pymysql
import pytest

import jobfence
from tests.servers import MYSQL_URL, POSTGRES_URL, mysql_params

pytestmark = pytest.mark.timeout(60)

INBOX_DDL = (
    "CREATE TABLE {t} (k text PRIMARY KEY, state text NOT NULL, owner text, "
    "attempt integer NOT NULL DEFAULT 1, fingerprint text, applied boolean NOT NULL DEFAULT "
    "false, result bytea, expires_at timestamptz NOT NULL)"
)


def _pg_tables(pattern: str) -> set[str]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (pattern,)
        ).fetchall()
    return {r[0] for r in rows}


def test_postgres_lock_tables_keep_the_namespaces_case() -> None:
    ns = "MixedNs_" + uuid.uuid4().hex[:8]
    locks = jobfence.Locks(POSTGRES_URL, namespace=ns)
    try:
        lease = locks.try_acquire("n", ttl=5)
        assert lease is not None and lease.release()
        found = _pg_tables(ns + "%")
        assert {f"{ns}_locks", f"{ns}_lock_tokens", f"{ns}_lock_queue", f"{ns}_schema"} <= found
    finally:
        locks.close()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            for suffix in ("locks", "lock_tokens", "lock_queue", "schema"):
                admin.execute(f'DROP TABLE IF EXISTS "{ns}_{suffix}"')


def test_postgres_inbox_table_is_the_unquoted_lower_case_name() -> None:
    table = "MixedInbox_" + uuid.uuid4().hex[:8]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(INBOX_DDL.format(t=table))  # unquoted: PostgreSQL folds it
    inbox = jobfence.Inbox(POSTGRES_URL, table=table)
    try:
        assert inbox.claim("k1").state is jobfence.ClaimState.NEW
        assert _pg_tables(table.lower()) == {table.lower()}
        assert not _pg_tables(table)  # no second, case-kept table
        with psycopg.connect(POSTGRES_URL) as conn:
            assert inbox.claim_in(conn, "k2") is True
            conn.commit()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            keys = admin.execute(f"SELECT k FROM {table} ORDER BY k").fetchall()
        assert keys == [("k1",), ("k2",)]
    finally:
        inbox.drop()
        inbox.close()


def test_mysql_and_sqlite_tables_are_found_by_their_unquoted_names(tmp_path: Path) -> None:
    ns = "MyNs_" + uuid.uuid4().hex[:8]
    table = "MyInbox_" + uuid.uuid4().hex[:8]
    locks = jobfence.Locks(MYSQL_URL, namespace=ns)
    inbox = jobfence.Inbox(MYSQL_URL, table=table)
    try:
        lease = locks.try_acquire("n", ttl=5)
        assert lease is not None
        assert inbox.claim("k").state is jobfence.ClaimState.NEW
        conn = pymysql.connect(**mysql_params())
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {ns}_locks")
                assert cur.fetchone() == (1,)
                cur.execute(f"SELECT k FROM {table}")
                assert cur.fetchall() == ((b"k",),)
        finally:
            conn.close()
        assert lease.release()
    finally:
        inbox.drop()
        inbox.close()
        locks.close()
        conn = pymysql.connect(**mysql_params())
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {ns}_locks, {ns}_schema")
        conn.close()
    path = tmp_path / "names.db"
    with jobfence.Locks(f"sqlite:///{path}", namespace=ns) as slocks:
        lease = slocks.try_acquire("n", ttl=5)
        assert lease is not None and lease.release()
    with jobfence.Inbox(f"sqlite:///{path}", table=table) as sinbox:
        assert sinbox.claim("k").state is jobfence.ClaimState.NEW
    db = sqlite3.connect(path)
    try:
        # the lease row went with the release on close; the token counter stays
        assert db.execute(f"SELECT count(*) FROM {ns}_lock_tokens").fetchone() == (1,)
        assert db.execute(f"SELECT k FROM {table}").fetchall() == [("k",)]
    finally:
        db.close()
