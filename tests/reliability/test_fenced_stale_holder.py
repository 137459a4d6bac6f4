"""A paused ex-holder cannot corrupt data: its fenced write is rejected.

Issue scenario: a holder process is paused (SIGSTOP) past its TTL, a second process takes the
lease and writes; the first is resumed (SIGCONT) and tries to write with its old token: its
transaction is rejected by ``fence`` and the data shows only the new holder's write. Also the
same scenario driven in-process with ``renew=False``.

Per dialect, the locks live in the same database as the data (``jobfence.Locks`` with a
``postgresql://``, ``mysql://`` or ``sqlite:///`` URL), each test in its own namespace and
tables, dropped afterwards.

Why the paused holder parks its renewal thread before the parent stops it: a SIGSTOP that
lands while a process is inside a write transaction leaves that transaction's locks held for
as long as the process is stopped (for SQLite, the whole-file write lock), so the stop would
randomly block the second holder too. The holder therefore parks its renewal thread at the
``lock.renew`` hook (before any I/O) and only then reports "ready"; the parent SIGSTOPs it at
that clean point. From then on nothing renews the lease, so it expires after its TTL while the
holder is stopped, exactly as with a GC pause or a frozen VM.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.fencing import install
from jobfence.testing import set_hook
from tests.servers import MYSQL_URL, POSTGRES_URL

pytestmark = pytest.mark.slow

RESOURCE = "inventory:42"
TIMEOUT = 20.0


# -- per-dialect plumbing (used in the parent and in the spawned holders) ---------------------


def lock_url(dialect: str, sqlite_path: str) -> str:
    return {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}.get(dialect, f"sqlite:///{sqlite_path}")


def connect(dialect: str, sqlite_path: str) -> Any:
    """A plain application connection (transactions begin implicitly, commit explicitly)."""
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(POSTGRES_URL)
    if dialect == "mysql":
        from urllib.parse import urlsplit

        import pymysql

        u = urlsplit(MYSQL_URL)
        return pymysql.connect(
            host=u.hostname,
            port=u.port or 3306,
            user=u.username,
            password=u.password or "",
            database=u.path.lstrip("/"),
        )
    return sqlite3.connect(sqlite_path, timeout=TIMEOUT)


def fenced_write(conn: Any, token: int, value: str, fence_table: str, data_table: str) -> str:
    """The holder's unit of work: fence, then the business write, then commit.

    Returns ``"committed"`` or ``"stale:<newest>"`` (the transaction is rolled back).
    """
    try:
        jobfence.fence(conn, RESOURCE, token, table=fence_table)
        cur = conn.cursor()
        ph = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        cur.execute(
            f"UPDATE {data_table} SET val = {ph}, token = {ph} WHERE id = 1", (value, token)
        )
        cur.close()
        conn.commit()
        return "committed"
    except jobfence.StaleToken as exc:
        conn.rollback()
        assert (exc.resource, exc.token) == (RESOURCE, token)
        return f"stale:{exc.newest}"


def paused_holder(
    dialect: str, sqlite_path: str, ns: str, tables: tuple[str, str], pipe: Connection
) -> None:
    """Holder 1 (spawned): acquire with renewal, report, get stopped, then write with its token."""
    import threading

    park = threading.Event()
    parked = threading.Event()
    go = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and park.is_set():
            parked.set()
            go.wait(TIMEOUT)  # renewal thread parked before any I/O

    set_hook(hook)
    locks = jobfence.Locks(lock_url(dialect, sqlite_path), namespace=ns)
    conn = connect(dialect, sqlite_path)
    try:
        lease = locks.try_acquire(RESOURCE, ttl=1.0)  # renew=True (default)
        assert lease is not None
        lease.check()  # it holds the lease: everything after this believes so
        pipe.send(("acquired", lease.token))
        park.set()
        assert parked.wait(TIMEOUT)
        pipe.send(("ready", None))  # the parent SIGSTOPs us now, at this clean point
        assert recv(pipe, "go") is None
        go.set()
        # resumed: the work goes on with the token it was holding
        pipe.send(("result", fenced_write(conn, lease.token, "first", *tables)))
        pipe.send(("lost", lease.lost or not lease.release()))
    except BaseException as exc:  # report anything unexpected to the parent
        pipe.send(("error", repr(exc)))
    finally:
        conn.close()
        locks.close()


def second_holder(
    dialect: str, sqlite_path: str, ns: str, tables: tuple[str, str], pipe: Connection
) -> None:
    """Holder 2 (spawned): wait for the lease (it frees when holder 1's TTL runs out), write."""
    locks = jobfence.Locks(lock_url(dialect, sqlite_path), namespace=ns)
    conn = connect(dialect, sqlite_path)
    try:
        with locks.acquire(RESOURCE, ttl=10, timeout=TIMEOUT) as lease:
            pipe.send(("acquired", lease.token))
            pipe.send(("result", fenced_write(conn, lease.token, "second", *tables)))
    except BaseException as exc:
        pipe.send(("error", repr(exc)))
    finally:
        conn.close()
        locks.close()


def recv(pipe: Connection, kind: str) -> Any:
    assert pipe.poll(TIMEOUT), f"no {kind!r} message in {TIMEOUT} s"
    got, value = pipe.recv()
    assert got == kind, (got, value)
    return value


# -- fixtures -------------------------------------------------------------------------------


def run(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    cur = conn.cursor()
    cur.execute(sql)
    rows = list(cur.fetchall()) if cur.description else []
    cur.close()
    conn.commit()
    return rows


@pytest.fixture(params=["postgresql", "mysql", "sqlite"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    dialect: str = request.param
    sqlite_path = str(tmp_path / "app.db")
    ns = f"jfsh{uuid.uuid4().hex[:10]}"
    fence_table, data_table = f"{ns}_fences", f"{ns}_data"
    conn = connect(dialect, sqlite_path)
    install(conn, table=fence_table)
    run(conn, f"CREATE TABLE {data_table} (id INTEGER PRIMARY KEY, val VARCHAR(20), token BIGINT)")
    run(conn, f"INSERT INTO {data_table} (id, val, token) VALUES (1, 'initial', 0)")
    env = {
        "dialect": dialect,
        "sqlite_path": sqlite_path,
        "ns": ns,
        "tables": (fence_table, data_table),
        "conn": conn,
    }
    try:
        yield env
    finally:
        conn.rollback()
        if dialect == "postgresql":
            names = run(conn, f"SELECT tablename FROM pg_tables WHERE tablename LIKE '{ns}%'")
        elif dialect == "mysql":
            names = run(
                conn,
                "SELECT table_name FROM information_schema.tables "
                f"WHERE table_schema = DATABASE() AND table_name LIKE '{ns}%'",
            )
        else:
            names = []
        for (name,) in names:
            run(conn, f"DROP TABLE IF EXISTS {name}")
        conn.close()


def final_state(env: dict[str, Any]) -> tuple[str, int, int]:
    conn = env["conn"]
    fence_table, data_table = env["tables"]
    ((val, token),) = run(conn, f"SELECT val, token FROM {data_table} WHERE id = 1")
    ((fenced,),) = run(conn, f"SELECT token FROM {fence_table}")
    return val, int(token), int(fenced)


# -- the scenarios --------------------------------------------------------------------------


def test_sigstopped_holder_is_fenced_off(setup: dict[str, Any]) -> None:
    env = setup
    ctx = mp.get_context("spawn")
    args = (env["dialect"], env["sqlite_path"], env["ns"], env["tables"])
    p1_end, c1_end = ctx.Pipe()
    p2_end, c2_end = ctx.Pipe()
    first = ctx.Process(target=paused_holder, args=(*args, c1_end), daemon=True)
    second = ctx.Process(target=second_holder, args=(*args, c2_end), daemon=True)
    first.start()
    stopped = False
    try:
        token1 = recv(p1_end, "acquired")
        recv(p1_end, "ready")
        os.kill(first.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        stopped = True

        second.start()  # its acquire waits until holder 1's TTL has run out
        token2 = recv(p2_end, "acquired")
        assert token2 > token1
        assert recv(p2_end, "result") == "committed"
        second.join(TIMEOUT)

        os.kill(first.pid, signal.SIGCONT)  # type: ignore[arg-type]
        stopped = False
        p1_end.send(("go", None))
        assert recv(p1_end, "result") == f"stale:{token2}"  # rejected by fence
        assert recv(p1_end, "lost") is True  # and it learns it lost the lease
        first.join(TIMEOUT)
        assert first.exitcode == 0 and second.exitcode == 0
    finally:
        if stopped:
            os.kill(first.pid, signal.SIGCONT)  # type: ignore[arg-type]
        for p in (first, second):
            if p.is_alive():
                p.kill()
                p.join(5)

    # only the second holder's write is in the data; the fence record is its token
    assert final_state(env) == ("second", token2, token2)


def test_expired_non_renewing_lease_is_fenced_off_in_process(setup: dict[str, Any]) -> None:
    env = setup
    url = lock_url(env["dialect"], env["sqlite_path"])
    fence_table, data_table = env["tables"]
    with jobfence.Locks(url, namespace=env["ns"]) as locks:
        lease1 = locks.try_acquire(RESOURCE, ttl=0.5, renew=False)
        assert lease1 is not None
        work1 = connect(env["dialect"], env["sqlite_path"])
        work2 = connect(env["dialect"], env["sqlite_path"])
        try:
            # nothing renews lease1: the second acquire waits until its TTL runs out
            with locks.acquire(RESOURCE, ttl=10, timeout=TIMEOUT) as lease2:
                assert lease2.token > lease1.token
                assert fenced_write(work2, lease2.token, "second", fence_table, data_table) == (
                    "committed"
                )
                # holder 1 carries on as if it still held the lease
                result = fenced_write(work1, lease1.token, "first", fence_table, data_table)
                assert result == f"stale:{lease2.token}"
                with pytest.raises(jobfence.LockLost):
                    lease1.check()
        finally:
            work1.close()
            work2.close()
    assert final_state(env) == ("second", lease2.token, lease2.token)
