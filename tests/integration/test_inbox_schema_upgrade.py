"""An inbox table of schema version 1 (no ``claimed_at`` column) keeps working after upgrading
jobfence, on PostgreSQL, MySQL/MariaDB and SQLite.

Each test creates the version-1 table as jobfence 0.1 did (its DDL copied below from the
``schema`` section of that version's ``inbox.sql``) with records in it, then upgrades it the
three ways a deployment does: ``install()`` on the inbox's own connection, ``install(conn)``
on the caller's, or nothing at all (the first claim finds the column missing, installs and
retries). The old records are listed with ``claimed_at`` None; new claims record it.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence import ClaimState
from tests.servers import MYSQL_URL, POSTGRES_URL, mysql_params

pytestmark = pytest.mark.timeout(60)

#: the version-1 tables, per server, with ``{t}`` for the table name
V1_DDL = {
    "postgres": [
        """CREATE TABLE {t} (
            k           text PRIMARY KEY,
            state       text NOT NULL,
            owner       text,
            attempt     integer NOT NULL DEFAULT 1,
            fingerprint text,
            applied     boolean NOT NULL DEFAULT false,
            result      bytea,
            expires_at  timestamptz NOT NULL)""",
        "CREATE INDEX {t}_expires ON {t} (expires_at)",
        """CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
            table_name text PRIMARY KEY, version integer NOT NULL)""",
        "INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{t}', 1)",
    ],
    "mysql": [
        """CREATE TABLE {t} (
            k           VARBINARY(1024) NOT NULL PRIMARY KEY,
            state       VARCHAR(16) NOT NULL,
            owner       VARCHAR(255) NULL,
            attempt     INT NOT NULL DEFAULT 1,
            fingerprint VARBINARY(1024) NULL,
            applied     TINYINT(1) NOT NULL DEFAULT 0,
            result      LONGBLOB NULL,
            expires_at  DATETIME(6) NOT NULL,
            KEY expires_idx (expires_at)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
        """CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
            table_name VARCHAR(64) NOT NULL PRIMARY KEY, version INT NOT NULL) ENGINE=InnoDB""",
        "INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{t}', 1)",
    ],
    "sqlite": [
        """CREATE TABLE {t} (
            k           TEXT PRIMARY KEY,
            state       TEXT NOT NULL,
            owner       TEXT,
            attempt     INTEGER NOT NULL DEFAULT 1,
            fingerprint TEXT,
            applied     INTEGER NOT NULL DEFAULT 0,
            result      BLOB,
            expires_at  REAL NOT NULL)""",
        "CREATE INDEX {t}_expires ON {t} (expires_at)",
        """CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
            table_name TEXT PRIMARY KEY, version INTEGER NOT NULL)""",
        "INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{t}', 1)",
    ],
}

#: two records written by version 1: one in progress for an hour, one completed a day ago
#: (its retention ended: purge() may delete it)
V1_ROWS = {
    "postgres": [
        "INSERT INTO {t} (k, state, owner, attempt, expires_at) VALUES "
        "('old:held', 'in_progress', 'host:1:abc', 3, now() + interval '1 hour')",
        "INSERT INTO {t} (k, state, attempt, result, expires_at) VALUES "
        "('old:done', 'completed', 1, '\\x31'::bytea, now() - interval '1 day')",
    ],
    "mysql": [
        "INSERT INTO {t} (k, state, owner, attempt, expires_at) VALUES "
        "('old:held', 'in_progress', 'host:1:abc', 3, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        "INSERT INTO {t} (k, state, attempt, result, expires_at) VALUES "
        "('old:done', 'completed', 1, '1', UTC_TIMESTAMP(6) - INTERVAL 1 DAY)",
    ],
    "sqlite": [
        "INSERT INTO {t} (k, state, owner, attempt, expires_at) VALUES "
        "('old:held', 'in_progress', 'host:1:abc', 3, "
        "(julianday('now') - 2440587.5) * 86400.0 + 3600)",
        "INSERT INTO {t} (k, state, attempt, result, expires_at) VALUES "
        "('old:done', 'completed', 1, X'31', (julianday('now') - 2440587.5) * 86400.0 - 86400)",
    ],
}


class Server:
    """One SQL server: its URL for jobfence and a connection of the test's own."""

    def __init__(self, kind: str, url: str, connect: Callable[[], Any]) -> None:
        self.kind = kind
        self.url = url
        self.connect = connect

    def run(self, statements: list[str], table: str) -> None:
        conn = self.connect()
        try:
            cur = conn.cursor()
            for statement in statements:
                cur.execute(statement.replace("{t}", table))
            conn.commit()
        finally:
            conn.close()

    def query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def placeholder(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"


@pytest.fixture(params=["postgres", "mysql", "sqlite"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    if request.param == "postgres":
        return Server("postgres", POSTGRES_URL, lambda: psycopg.connect(POSTGRES_URL))
    if request.param == "mysql":
        return Server("mysql", MYSQL_URL, lambda: pymysql.connect(**mysql_params()))
    path = tmp_path / "v1.db"
    return Server("sqlite", f"sqlite:///{path}", lambda: sqlite3.connect(path))


@pytest.fixture
def v1_table(server: Server) -> Iterator[str]:
    table = "upg_" + uuid.uuid4().hex[:12]
    server.run(V1_DDL[server.kind] + V1_ROWS[server.kind], table)
    yield table
    inbox = jobfence.Inbox(server.url, table=table)
    try:
        inbox.drop()
    finally:
        inbox.close()


def _columns(server: Server, table: str) -> set[str]:
    if server.kind == "sqlite":
        rows = server.query(f"SELECT name FROM pragma_table_info('{table}')", ())
    else:
        rows = server.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = "
            + server.placeholder()
            + (" AND table_schema = DATABASE()" if server.kind == "mysql" else ""),
            (table,),
        )
    return {str(row[0]).lower() for row in rows}


def _version(server: Server, table: str) -> int:
    sql = "SELECT version FROM jobfence_inbox_schema WHERE table_name = " + server.placeholder()
    return int(server.query(sql, (table,))[0][0])


def _check_upgraded(server: Server, table: str, inbox: jobfence.Inbox) -> None:
    assert "claimed_at" in _columns(server, table)
    assert _version(server, table) == 2
    (held,) = inbox.claims(state="in_progress", prefix="old:")
    assert held.key == "old:held" and held.owner == "host:1:abc" and held.attempt == 3
    assert held.claimed_at is None and held.age is None
    assert 3000 < held.expires_in <= 3600 and not held.stuck
    done = inbox.claim_info("old:done")
    assert done is not None and done.state is ClaimState.COMPLETED
    assert done.claimed_at is None and done.expires_in < -80000
    # new claims record when they were claimed
    fresh = inbox.claim("new:1", ttl=60)
    assert fresh.state is ClaimState.NEW
    info = inbox.claim_info("new:1")
    assert info is not None and info.claimed_at is not None and info.age is not None
    assert -5 < info.age < 30
    # the version-1 record past its retention is what purge() deletes
    assert inbox.purge() == 1
    assert inbox.claim_info("old:done") is None
    assert [i.key for i in inbox.claims()] == ["new:1", "old:held"]


def test_install_upgrades_a_version_1_table(server: Server, v1_table: str) -> None:
    with jobfence.Inbox(server.url, table=v1_table) as inbox:
        assert "claimed_at" not in _columns(server, v1_table)
        inbox.install()
        inbox.install()  # idempotent on a version-2 table
        _check_upgraded(server, v1_table, inbox)


def test_the_first_claim_upgrades_a_version_1_table_by_itself(
    server: Server, v1_table: str
) -> None:
    with jobfence.Inbox(server.url, table=v1_table) as inbox:
        claim = inbox.claim("first", ttl=60)  # finds claimed_at missing, installs, retries
        assert claim.state is ClaimState.NEW
        info = inbox.claim_info("first")
        assert info is not None and info.claimed_at is not None
        inbox.forget("first")
        _check_upgraded(server, v1_table, inbox)


def test_install_on_the_callers_connection_upgrades_a_version_1_table(
    server: Server, v1_table: str
) -> None:
    with jobfence.Inbox(server.url, table=v1_table) as inbox:
        conn = server.connect()
        try:
            inbox.install(conn)
            conn.commit()
        finally:
            conn.close()
        _check_upgraded(server, v1_table, inbox)
