"""``Outbox.add`` beyond the conformance suite: on Django's connection (a subprocess per vendor,
Django's settings being process-wide), through the I/O hook, in telemetry, and an outbox
used across ``fork()``."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from jobfence import BackendError, ConfigurationError
from jobfence._core.hooks import set_hook
from tests.servers import MYSQL_URL, POSTGRES_URL
from tests.unit.test_telemetry import Otel, otel

__all__ = ["otel"]

ROOT = Path(__file__).resolve().parents[2]

_DJANGO_SCRIPT = r"""
import json, os, sys
import django
from django.conf import settings

vendor, name, table = sys.argv[1], sys.argv[2], sys.argv[3]
if vendor == "postgresql":
    db = {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": "postgres",
          "HOST": "127.0.0.1", "PORT": "5432"}
elif vendor == "mysql":
    import pymysql
    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()
    db = {"ENGINE": "django.db.backends.mysql", "NAME": name, "USER": "root",
          "HOST": "127.0.0.1", "PORT": "3306"}
else:
    db = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
settings.configure(DATABASES={"default": db}, USE_TZ=True)
django.setup()
from django.db import connection, transaction

import jobfence

url = {"postgresql": "postgresql://postgres@127.0.0.1:5432/" + name,
       "mysql": "mysql://root@127.0.0.1:3306/" + name,
       "sqlite": "sqlite:///" + name}[vendor]
outbox = jobfence.Outbox(url, table=table)
with transaction.atomic():
    outbox.install(connection)
with transaction.atomic():
    kept = outbox.add(connection, queue="orders", body={"via": "django"}, key="k")
try:
    with transaction.atomic():
        outbox.add(connection, queue="orders", body={"via": "rolled back"}, id="gone")
        raise RuntimeError("roll back")
except RuntimeError:
    pass
rows = outbox.backend.claim("relay", 10, 30.0)
print(json.dumps({"kept": kept, "claimed": [[r.id, json.loads(r.body), r.key] for r in rows]}))
outbox.drop()
outbox.close()
"""


@pytest.mark.parametrize("vendor", ["postgresql", "mysql", "sqlite"])
def test_add_on_a_django_connection_commits_and_rolls_back_with_atomic(
    vendor: str, tmp_path: Path
) -> None:
    name = {
        "postgresql": POSTGRES_URL.rsplit("/", 1)[1],
        "mysql": MYSQL_URL.rsplit("/", 1)[1],
        "sqlite": str(tmp_path / "django.db"),
    }[vendor]
    table = f"t{uuid.uuid4().hex[:12]}_outbox"
    done = subprocess.run(
        [sys.executable, "-c", _DJANGO_SCRIPT, vendor, name, table],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["claimed"] == [[out["kept"], {"via": "django"}, "k"]]


@pytest.fixture
def sqlite_outbox(tmp_path: Path) -> Iterator[tuple[jobfence.Outbox, sqlite3.Connection]]:
    path = tmp_path / "outbox.db"
    outbox = jobfence.Outbox(f"sqlite:///{path}")
    outbox.install()
    conn = sqlite3.connect(path)
    try:
        yield outbox, conn
    finally:
        conn.close()
        outbox.close()


def test_add_calls_the_hook_at_outbox_add_and_wraps_what_it_raises(
    sqlite_outbox: tuple[jobfence.Outbox, sqlite3.Connection],
) -> None:
    outbox, conn = sqlite_outbox
    seen: list[tuple[str, dict[str, Any]]] = []

    def hook(point: str, **info: Any) -> None:
        seen.append((point, info))
        if point == "outbox.add" and info["queue"] == "broken":
            raise ConnectionResetError("injected")
        if point == "outbox.manage" and info["operation"] == "purge":
            raise TimeoutError("injected")

    set_hook(hook)
    try:
        ids = outbox.add_many(conn, queue="orders", bodies=[1, 2], ids=["a", "b"])
        with pytest.raises(BackendError) as info:
            outbox.add(conn, queue="broken", body=3)
        outbox.stats()
        with pytest.raises(BackendError) as purged:
            outbox.purge()
    finally:
        set_hook(None)
    assert ("outbox.manage", {"operation": "stats", "backend": "sqlite"}) in seen
    assert purged.value.operation == "outbox.purge"
    conn.commit()
    assert ("outbox.add", {"queue": "orders", "ids": ids, "backend": "sqlite"}) in seen
    assert info.value.operation == "outbox.add"
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert [e.id for e in outbox.entries()] == ["a", "b"]  # the faulted add wrote nothing


def test_add_counts_rows_in_telemetry(
    otel: Otel, sqlite_outbox: tuple[jobfence.Outbox, sqlite3.Connection]
) -> None:
    outbox, conn = sqlite_outbox
    outbox.add_many(conn, queue="orders", bodies=[1, 2, 3])
    outbox.add(conn, queue="emails", body=4)
    conn.commit()
    points = otel.points("jobfence.outbox.added")
    assert points[frozenset({("backend", "sqlite"), ("queue", "orders")})].value == 3
    assert points[frozenset({("backend", "sqlite"), ("queue", "emails")})].value == 1


def test_a_postgres_table_name_too_long_for_its_indexes_is_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        jobfence.Outbox(POSTGRES_URL, table="t" * 54)
    assert info.value.argument == "table"
    jobfence.Outbox(POSTGRES_URL, table="t" * 53).close()


def _child_stats(outbox: jobfence.Outbox, queue: Any) -> None:
    try:
        stats = outbox.stats()
        queue.put(("ok", stats.pending))
    except BaseException as exc:  # reported to the parent, which asserts
        queue.put(("error", repr(exc)))


def test_an_outbox_used_in_a_forked_child_opens_its_own_connections() -> None:
    table = f"t{uuid.uuid4().hex[:12]}_outbox"
    outbox = jobfence.Outbox(POSTGRES_URL, table=table)
    try:
        outbox.install()
        with psycopg.connect(POSTGRES_URL) as conn:
            outbox.add(conn, queue="orders", body=1)
        assert outbox.stats().pending == 1  # the parent's pool holds a connection now
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_child_stats, args=(outbox, results))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert results.get(timeout=10) == ("ok", 1)
        # the parent's connections were left alone by the child
        assert outbox.stats().pending == 1
        assert len(outbox.backend.claim("relay", 10, 30.0)) == 1
    finally:
        outbox.drop()
        outbox.close()


def test_the_url_defaults_as_for_queue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBFENCE_URL", raising=False)
    outbox = jobfence.Outbox()
    assert outbox.url == "sqlite:///jobfence.db" and outbox.backend.kind == "sqlite"
    outbox.close()
    monkeypatch.setenv("JOBFENCE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    outbox = jobfence.Outbox()
    try:
        outbox.install()
        assert (tmp_path / "env.db").exists()
    finally:
        outbox.close()


def test_a_callers_pool_or_engine_serves_the_outbox(tmp_path: Path) -> None:
    import psycopg_pool
    import sqlalchemy as sa

    table = f"t{uuid.uuid4().hex[:12]}_outbox"
    with psycopg_pool.ConnectionPool(POSTGRES_URL, min_size=1, max_size=4, open=True) as pool:
        outbox = jobfence.Outbox(pool, table=table)
        try:
            outbox.install()
            with psycopg.connect(POSTGRES_URL) as conn:
                added = outbox.add(conn, queue="orders", body=1)
            assert [r.id for r in outbox.backend.claim("relay", 10, 30.0)] == [added]
        finally:
            outbox.drop()
            outbox.close()
        assert not pool.closed  # the caller's pool is left open
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'engine.db'}")
    outbox = jobfence.Outbox(engine)
    try:
        outbox.install()
        with engine.begin() as conn:
            added = outbox.add(conn, queue="orders", body=2)
        assert [r.id for r in outbox.backend.claim("relay", 10, 30.0)] == [added]
    finally:
        outbox.close()
        engine.dispose()


class _Transaction:
    """A transaction of its own (the protocol of ``jobfence._core.transaction``), recording
    what ``AsyncOutbox.add`` asks of it."""

    dialect = "simulated"
    in_transaction = True

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    async def outbox_add(self, table: str, row: dict[str, Any]) -> None:
        self.rows.append((table, row))


class _Table:
    def __init__(self) -> None:
        self.tx = _Transaction()

    def __jobfence_transaction__(self) -> _Transaction:
        return self.tx


async def test_async_add_hands_its_rows_to_an_object_that_is_a_transaction(
    tmp_path: Path,
) -> None:
    # the outbox's own database is never opened: the rows go to the transaction
    outbox = jobfence.AsyncOutbox(f"sqlite:///{tmp_path / 'own.db'}", table="sim_outbox")
    db = _Table()
    seen: list[tuple[str, dict[str, Any]]] = []
    set_hook(lambda point, **info: seen.append((point, info)))
    try:
        one = await outbox.add(db, queue="orders", body={"n": 1}, key="k", headers={"h": "v"})
        two = await outbox.add_many(db, queue="emails", bodies=["x"], ids=["id-x"], delay=2.5)
    finally:
        set_hook(None)
        await outbox.close()
    assert db.tx.rows == [
        (
            "sim_outbox",
            {
                "id": one,
                "queue": "orders",
                "key": "k",
                "body": b'{"n":1}',
                "headers": {"h": "v"},
                "delay": 0.0,
            },
        ),
        (
            "sim_outbox",
            {
                "id": "id-x",
                "queue": "emails",
                "key": None,
                "body": b'"x"',
                "headers": {},
                "delay": 2.5,
            },
        ),
    ]
    assert two == ["id-x"]
    assert ("outbox.add", {"queue": "orders", "ids": [one], "backend": "simulated"}) in seen
    assert not (tmp_path / "own.db").exists()
    other = jobfence.AsyncOutbox(f"sqlite:///{tmp_path / 'own.db'}")
    try:
        with pytest.raises(ConfigurationError) as info:
            await other.add(db, queue="", body=1)
        assert info.value.argument == "queue"
    finally:
        await other.close()
