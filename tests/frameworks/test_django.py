"""jobfence in a real Django project (tests/frameworks/django_project), on PostgreSQL, SQLite
and MariaDB/MySQL.

Each test runs ``manage.py`` in a subprocess against a database of its own (PostgreSQL and
MySQL: a fresh ``jf_dj_<random>`` database, dropped afterwards; SQLite: a file in a temp dir):
``migrate`` creates jobfence's tables, ``jf_check`` runs jobfence on Django's connection inside
``transaction.atomic()`` and prints what happened, ``migrate jobfence zero`` drops the tables.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from tests.frameworks._support import DSN, ROOT

PROJECT = Path(__file__).resolve().parent / "django_project"


class Project:
    """``manage.py`` of the test project on one database."""

    def __init__(self, vendor: str, name: str, **extra: str) -> None:
        self.env = {
            **os.environ,
            "JF_DJ_VENDOR": vendor,
            "JF_DJ_NAME": name,
            "PYTHONPATH": os.pathsep.join([str(PROJECT), str(ROOT / "src")]),
            **extra,
        }

    def manage(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"manage.py {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout

    def check(self, what: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.manage("jf_check", what).strip().splitlines()[-1])
        return out


@pytest.fixture
def pg_database() -> Iterator[str]:
    name = f"jf_dj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def mysql_database() -> Iterator[str]:
    name = f"jf_dj_{uuid.uuid4().hex[:12]}"
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        yield name
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
    finally:
        conn.close()


def mysql_tables(name: str) -> set[str]:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=name)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


def pg_tables(name: str) -> set[str]:
    dsn = DSN.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


def assert_scenario(out: dict[str, Any]) -> None:
    # claim_in inside atomic(): a duplicate is refused, a rolled-back claim can be made again
    assert out["first"] is True
    assert out["duplicate"] is False
    assert out["claimed_before_error"] is True
    assert out["claimed_after_rollback"] is True
    assert out["stock_after_claims"] == 100 - 1 - 2  # the rolled-back -10 is gone too
    # fence: the stale token is refused and its write rolled back
    assert out["stale_token"] == {"token": 6, "newest": 7}
    assert out["stock_after_fence"] == 50
    # versioned_update: the second writer of version 1 gets StaleVersion (a conflict)
    assert out["new_version"] == 2
    assert out["stale_version"] == {"expected": 1, "conflict": True}
    assert out["after_versioned"] == [40, 2]
    # retry_unit: attempt 1 hit a lock conflict raised through Django; attempt 2 applied once
    assert out["unit_result"] is True
    assert out["unit_attempts"] == 2
    [error] = out["unit_errors"]
    assert error["conflict"] is True and error["transient"] is False
    assert out["unit_again"] is False
    assert out["stock_after_unit"] == 35
    # guarded + claim_in(connection) without a key: one effect, the result replayed
    assert out["guarded_first"] == {"applied": True}
    assert out["guarded_second"] == {"applied": True}
    assert out["guarded_calls"] == 1
    assert out["stock_after_guarded"] == 32
    assert out["guarded_record"] == ["completed", True]
    assert "sync_to_async" in out["async_refused"]


def assert_broken_atomic_never_retried(broken: dict[str, Any]) -> None:
    assert broken["type"] == "django.db.transaction.TransactionManagementError"
    assert broken["cause_conflict"] is True  # caused by a conflict ...
    assert broken["conflict"] is False and broken["transient"] is False  # ... yet never retried


def test_postgres_migrate_scenario_and_unmigrate(pg_database: str) -> None:
    project = Project("postgresql", pg_database)
    project.manage("migrate", "--verbosity", "0")
    tables = pg_tables(pg_database)
    assert {"jobfence_inbox", "jobfence_fences", "jobfence_inbox_schema"} <= tables

    out = project.check("scenario")
    assert out["vendor"] == "postgresql"
    assert_scenario(out)

    project.manage("migrate", "jobfence", "zero", "--verbosity", "0")
    tables = pg_tables(pg_database)
    assert not {"jobfence_inbox", "jobfence_fences", "jobfence_inbox_schema"} & tables
    assert "shop_product" in tables  # only jobfence's tables went


def test_sqlite_migrate_with_custom_table_names(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    project = Project(
        "sqlite", str(db), JF_DJ_INBOX_TABLE="shop_inbox", JF_DJ_FENCE_TABLE="shop_fences"
    )
    project.manage("migrate", "--verbosity", "0")
    tables = sqlite_tables(db)
    assert {"shop_inbox", "shop_fences", "jobfence_inbox_schema"} <= tables
    assert not {"jobfence_inbox", "jobfence_fences"} & tables

    out = project.check("scenario")
    assert out["vendor"] == "sqlite"
    assert_scenario(out)

    project.manage("migrate", "jobfence", "zero", "--verbosity", "0")
    tables = sqlite_tables(db)
    assert not {"shop_inbox", "shop_fences", "jobfence_inbox_schema"} & tables
    assert "shop_product" in tables


def test_mysql_migrate_scenario_errors_and_unmigrate(mysql_database: str) -> None:
    # PyMySQL installed as MySQLdb (see jfproject/settings.py)
    project = Project("mysql", mysql_database)
    project.manage("migrate", "--verbosity", "0")
    assert {"jobfence_inbox", "jobfence_fences"} <= mysql_tables(mysql_database)

    out = project.check("scenario")
    assert out["vendor"] == "mysql"
    assert_scenario(out)

    out = project.check("conflicts")
    blocked = out["blocked_write"]  # 1205 lock wait timeout
    assert blocked["type"] == "django.db.utils.OperationalError"
    assert blocked["conflict"] is True and blocked["transient"] is False
    assert out["integrity"]["conflict"] is False and out["integrity"]["transient"] is False
    assert_broken_atomic_never_retried(out["broken_atomic"])

    project.manage("migrate", "jobfence", "zero", "--verbosity", "0")
    tables = mysql_tables(mysql_database)
    assert not {"jobfence_inbox", "jobfence_fences", "jobfence_inbox_schema"} & tables
    assert "shop_product" in tables


def test_postgres_errors_raised_through_django(pg_database: str) -> None:
    project = Project("postgresql", pg_database)
    project.manage("migrate", "--verbosity", "0")
    out = project.check("conflicts")
    for name in ("blocked_write", "nowait", "serialization"):
        assert out[name]["type"].startswith("django.db.utils."), out[name]
        assert out[name]["conflict"] is True and out[name]["transient"] is False, out[name]
    assert out["serialization"]["cause"] == "SerializationFailure"
    assert out["nowait"]["cause"] == "LockNotAvailable"
    assert out["integrity"]["conflict"] is False and out["integrity"]["transient"] is False
    assert_broken_atomic_never_retried(out["broken_atomic"])
    # a terminated connection is transient, and close_broken_connections lets the retry
    # reconnect
    [error] = out["terminated_errors"]
    assert error["transient"] is True and error["conflict"] is False
    assert out["terminated_attempts"] == 2
    assert out["terminated_result"] == 1


def test_sqlite_database_is_locked_through_django(tmp_path: Path) -> None:
    project = Project("sqlite", str(tmp_path / "shop.db"))
    project.manage("migrate", "--verbosity", "0")
    out = project.check("conflicts")
    blocked = out["blocked_write"]
    assert blocked["type"] == "django.db.utils.OperationalError"
    assert blocked["cause"] == "OperationalError"
    assert blocked["conflict"] is True and blocked["transient"] is False
    assert out["integrity"]["conflict"] is False and out["integrity"]["transient"] is False
    assert_broken_atomic_never_retried(out["broken_atomic"])
