"""``sim.attach(conn)`` under hostile use, on real PostgreSQL, MariaDB and SQLite: a
process crashed at its last statement, a schedule that ended before ``attach`` was called,
a crashed process parked inside a ``sqlite3`` statement. Each test checks the server's side
too (its sessions and locks) or that the schedule ends at all."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence.testing import Simulation, explore, faults, get_clock
from tests.servers import POSTGRES_URL, mysql_params


@pytest.fixture
def pg() -> Iterator[tuple[str, str]]:
    """(a DSN whose search_path is a schema of the test's own, a unique application_name
    its connections carry, to find them in pg_stat_activity)."""
    uid = uuid.uuid4().hex[:10]
    schema = f"jfatk_{uid}"
    app = f"jfatk_{uid}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as a:
        a.execute(f"CREATE SCHEMA {schema}")
        a.execute(f"CREATE TABLE {schema}.accounts (id int PRIMARY KEY, balance int NOT NULL)")
        a.execute(f"INSERT INTO {schema}.accounts VALUES (1, 0)")
    dsn = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}&application_name={app}"
    yield dsn, app
    with psycopg.connect(POSTGRES_URL, autocommit=True) as a:
        a.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        )
        a.execute(f"DROP SCHEMA {schema} CASCADE")


def _sessions(app: str) -> list[tuple[str, int]]:
    """(state, locks held) of every server session of the test's own connections."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as a:
        rows = a.execute(
            "SELECT s.state, (SELECT count(*) FROM pg_locks l WHERE l.pid = s.pid AND l.granted"
            " AND l.locktype IN ('relation', 'transactionid', 'tuple'))"
            " FROM pg_stat_activity s WHERE s.application_name = %s",
            (app,),
        ).fetchall()
    return [(state, int(n)) for state, n in rows]


# -- a process crashed at its last statement -----------------------------------------------
@pytest.mark.parametrize("point", ["db.write", "db.commit"])
def test_a_connection_whose_process_crashed_last_is_closed_at_the_schedules_end(
    pg: tuple[str, str], point: str
) -> None:
    """The crash is the schedule's last statement: no later statement closes the crashed
    process's connection, so the schedule's end must, or the server keeps its transaction
    open with the row locked (a process that died has no session left)."""
    dsn, app = pg
    kept: list[Any] = []

    async def scenario(sim: Simulation) -> None:
        conn = sim.attach(psycopg.connect(dsn))
        kept.append(conn)

        def job() -> None:
            conn.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
            conn.execute("UPDATE accounts SET balance = 6 WHERE id = 1")
            conn.commit()

        sim.spawn(job)
        await sim.join()

    nth = 2 if point == "db.write" else 1
    report = explore(scenario, schedules=1, faults=[faults.crash(point, nth=nth)])
    assert report.ok, report
    assert kept[0].closed, "the crashed process's connection was left open"
    assert _sessions(app) == [], "its server session (and its row lock) outlived the schedule"
    with psycopg.connect(dsn) as check:
        assert check.execute("SELECT balance FROM accounts").fetchone() == (0,)


def test_a_mysql_connection_whose_process_crashed_last_is_closed() -> None:
    table = f"jfatk_{uuid.uuid4().hex[:10]}"
    admin = pymysql.connect(**mysql_params(), autocommit=True)
    admin.cursor().execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int NOT NULL)")
    admin.cursor().execute(f"INSERT INTO {table} VALUES (1, 0)")
    kept: list[Any] = []

    async def scenario(sim: Simulation) -> None:
        conn = sim.attach(pymysql.connect(**mysql_params()))
        kept.append(conn)

        def job() -> None:
            conn.begin()
            conn.cursor().execute(f"UPDATE {table} SET n = 5 WHERE id = 1")
            conn.commit()

        sim.spawn(job)
        await sim.join()

    try:
        report = explore(scenario, schedules=1, faults=[faults.crash("db.commit")])
        assert report.ok, report
        assert not kept[0].open, "the crashed process's connection was left open"
        cur = admin.cursor()
        cur.execute("SET SESSION innodb_lock_wait_timeout = 2")
        cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 1")  # no lock left behind
        cur.execute(f"SELECT n FROM {table}")
        assert cur.fetchall() == ((1,),)
    finally:
        for conn in kept:
            if conn.open:
                conn.close()
        admin.cursor().execute(f"DROP TABLE {table}")
        admin.close()


# -- attach once the schedule is over --------------------------------------------------------
def test_attach_after_the_schedule_ended_is_refused_and_changes_nothing(
    pg: tuple[str, str],
) -> None:
    """A ``sim`` kept past its schedule: attaching to it would instrument the connection for
    good (nothing ends that schedule again), and every later scenario would be told the
    connection is attached to a schedule still running."""
    sims: list[Simulation] = []

    async def keep(sim: Simulation) -> None:
        sims.append(sim)

    assert explore(keep, schedules=1).ok
    dsn, _ = pg
    with psycopg.connect(dsn) as conn:
        with pytest.raises(jobfence.ConfigurationError, match="schedule"):
            sims[0].attach(conn)
        assert type(conn) is psycopg.Connection
        assert getattr(conn, "_jobfence_attached", None) is None

        async def scenario(sim: Simulation) -> None:
            sim.attach(conn)

            def job() -> None:
                conn.execute("SELECT 1")
                conn.commit()

            sim.spawn(job)
            await sim.join()
            sim.check(sim.hits == {"db.read": 1, "db.commit": 1}, f"hits {sim.hits}")

        report = explore(scenario, schedules=1)
        assert report.ok, report


# -- sqlite3: a crashed process parked inside a statement ------------------------------------
@pytest.mark.parametrize("point", ["db.write", "db.commit"])
def test_sqlite3_a_crashed_process_inside_a_statement_does_not_hang_the_schedule(
    tmp_path: Path, point: str
) -> None:
    """The crash stops the thread inside sqlite3's trace callback, in the middle of its
    statement: closing that connection from another task's statement waited forever for the
    statement to end (a hang; from its own thread, a segmentation fault)."""
    path = str(tmp_path / "attack.db")
    setup = sqlite3.connect(path)
    setup.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    setup.execute("INSERT INTO t VALUES (1, 0), (2, 0)")
    setup.commit()
    setup.close()
    seen: list[Any] = []
    done = threading.Event()

    async def scenario(sim: Simulation) -> None:
        one = sim.attach(sqlite3.connect(path, check_same_thread=False, timeout=0.2))
        two = sim.attach(sqlite3.connect(path, check_same_thread=False, timeout=0.2))

        def crashed() -> None:
            one.execute("UPDATE t SET v = v + 1 WHERE id = 1")
            one.commit()

        def later() -> None:
            get_clock().sleep(1)
            seen.append(two.execute("SELECT v FROM t WHERE id = 2").fetchall())

        sim.spawn(crashed)
        task = sim.spawn(later)
        await sim.join()
        sim.check(task.error is None, f"{task.error!r}")
        two.close()

    def run() -> None:
        seen.append(explore(scenario, schedules=1, faults=[faults.crash(point)]))
        done.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert done.wait(60), "the schedule never ended"
    report = seen[-1]
    assert report.ok, report
    assert seen[0] == [(0,)]
    check = sqlite3.connect(path)
    assert check.execute("SELECT v FROM t WHERE id = 1").fetchall() == [(0,)]
    check.close()
