"""``sim.attach(conn)`` under hostile use, on real PostgreSQL, MariaDB and SQLite: a
process crashed at its last statement, a schedule that ended before ``attach`` was called,
a crashed process parked inside a ``sqlite3`` statement. Each test checks the server's side
too (its sessions and locks) or that the schedule ends at all."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence.testing import InjectedFault, Simulation, explore, faults, get_clock
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


def _sessions_left(app: str, within: float = 10.0) -> list[tuple[str, int]]:
    """:func:`_sessions`, once the server has ended the sessions of the test's closed
    connections, or after ``within`` seconds: a backend ends a short while after its client
    closed the socket (it notices at its next read), so an empty list is waited for; a
    connection left open keeps its session and the list stays non-empty."""
    deadline = time.monotonic() + within
    left = _sessions(app)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)  # no event tells when the server process has exited
        left = _sessions(app)
    return left


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
    assert _sessions_left(app) == [], "its server session (and its row lock) outlived the schedule"
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


# -- a task waiting for a row lock of a process that crashes or pauses -----------------------
def _bounded(run: Any, seconds: float = 120.0) -> Any:
    """``run()`` in a thread of its own: its result, or a failed test if it hangs."""
    out: list[Any] = []
    done = threading.Event()

    def body() -> None:
        try:
            out.append(run())
        finally:
            done.set()

    threading.Thread(target=body, daemon=True).start()
    assert done.wait(seconds), "the exploration never ended"
    return out[0]


def _row_lock_race(dsn: str, kind: str, expected: int) -> Any:
    """Two tasks add 1 to the same row, each in a transaction: the first one's commit is
    where the fault hits, the other's UPDATE waits for its row lock meanwhile."""

    async def scenario(sim: Simulation) -> None:
        sim.block_timeout = 0.2
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("UPDATE accounts SET balance = 0")
        conns: list[Any] = []
        if kind == "async":
            for _ in range(2):
                conns.append(sim.attach(await psycopg.AsyncConnection.connect(dsn)))

            async def job(conn: Any) -> None:
                async with conn.transaction():
                    await conn.execute("UPDATE accounts SET balance = balance + 1")

            for conn in conns:
                sim.spawn(job, conn)
        else:
            for _ in range(2):
                conns.append(sim.attach(psycopg.connect(dsn)))

            def sync_job(conn: Any) -> None:
                with conn.transaction():
                    conn.execute("UPDATE accounts SET balance = balance + 1")

            for conn in conns:
                sim.spawn(sync_job, conn)
        await sim.join()
        with psycopg.connect(dsn) as check:
            row = check.execute("SELECT balance FROM accounts").fetchone()
        sim.check(row == (expected,), f"balance {row}")
        for conn in conns:
            if kind == "async":
                await conn.close()
            else:
                conn.close()

    return scenario


@pytest.mark.parametrize("kind", ["async", "thread"])
def test_a_crash_holding_a_row_lock_frees_it_for_a_statement_waiting_already(
    pg: tuple[str, str], kind: str
) -> None:
    """The other task's UPDATE passed its point (and waits for the row) before the holder
    crashed at its commit: the crashed process's connection must close at the crash, not at
    the next statement's point, which never comes (the UPDATE waited forever)."""
    dsn, app = pg
    scenario = _row_lock_race(dsn, kind, expected=1)
    report = _bounded(
        lambda: explore(scenario, schedules=4, faults=[faults.crash("db.commit", nth=1)])
    )
    assert report.ok, report
    assert _sessions_left(app) == []


@pytest.mark.parametrize("kind", ["async", "thread"])
def test_a_statement_waiting_for_a_paused_holder_lets_virtual_time_pass(
    pg: tuple[str, str], kind: str
) -> None:
    """The holder pauses 300 virtual seconds at its commit, the other task's UPDATE waits
    for its row lock: the waiting statement's socket must stop counting as I/O once it
    stalled, else each turn of the loop waits block_timeout real seconds and the pause
    takes minutes of wall time (a schedule that never seems to end)."""
    dsn, app = pg
    scenario = _row_lock_race(dsn, kind, expected=2)
    report = _bounded(
        lambda: explore(scenario, schedules=2, faults=[faults.pause_past_ttl("db.commit")]),
        seconds=90,
    )
    assert report.ok, report
    assert _sessions_left(app) == []


# -- a SQLAlchemy engine and one of its connections, both attached ---------------------------
@pytest.mark.parametrize("first", ["engine", "connection"])
def test_an_engine_and_its_connection_attached_make_one_point_per_statement(
    tmp_path: Path, first: str
) -> None:
    """Each attachment wrapped the dialect's commit once more: one commit was two
    ``db.commit`` points (two decisions, two hits a fault counts)."""
    sa = pytest.importorskip("sqlalchemy")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sa.db'}")
    with engine.begin() as setup:
        setup.execute(sa.text("CREATE TABLE t (id INTEGER)"))
    hits: list[dict[str, int]] = []

    async def scenario(sim: Simulation) -> None:
        if first == "engine":
            assert sim.attach(engine) is engine
            conn = engine.connect()
            assert sim.attach(conn) is conn
        else:
            conn = engine.connect()
            assert sim.attach(conn) is conn
            assert sim.attach(engine) is engine

        def job() -> None:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
            conn.commit()

        sim.spawn(job)
        await sim.join()
        hits.append(dict(sim.hits))
        conn.close()

    report = explore(scenario, schedules=1, faults=[faults.transient("db.commit", nth=2)])
    assert report.ok, report
    assert hits == [{"db.write": 1, "db.commit": 1}]
    with engine.connect() as check:
        assert check.execute(sa.text("SELECT count(*) FROM t")).scalar() == 1
    engine.dispose()


def test_a_connection_opened_before_its_engine_was_attached_commits_at_a_point(
    tmp_path: Path,
) -> None:
    """The engine's commit found its connection among those opened while attached only: a
    connection the scenario opened first committed with no ``db.commit`` point (no decision
    there, and a fault aimed at it never hit)."""
    sa = pytest.importorskip("sqlalchemy")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sa.db'}")
    with engine.begin() as setup:
        setup.execute(sa.text("CREATE TABLE t (id INTEGER)"))
    errors: list[BaseException | None] = []
    hits: list[dict[str, int]] = []

    async def scenario(sim: Simulation) -> None:
        conn = engine.connect()  # before the engine is attached
        sim.attach(engine)

        def job() -> None:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
            conn.commit()

        task = sim.spawn(job)
        await sim.join()
        errors.append(task.error)
        hits.append(dict(sim.hits))
        conn.close()

    report = explore(scenario, schedules=1, faults=[faults.transient("db.commit")])
    assert report.ok, report
    assert isinstance(errors[0], InjectedFault), errors  # the fault hit the commit
    assert hits == [{"db.write": 1, "db.commit": 1}]
    engine.dispose()


# -- a schedule that ends while a task is mid-transaction ------------------------------------
@pytest.mark.parametrize("kind", ["async", "thread"])
def test_a_task_stopped_mid_transaction_by_a_failed_check_leaves_no_open_transaction(
    pg: tuple[str, str], kind: str
) -> None:
    """A check fails while another task holds a row lock in an open transaction: the
    schedule ends there, and the stopped task never commits nor rolls back. Its connection
    (async: restored, left idle in transaction) kept the row locked after ``explore``, so
    the next schedule's setup waited for it."""
    dsn, app = pg
    kept: list[Any] = []

    async def scenario(sim: Simulation) -> None:
        if kind == "async":
            aconn = sim.attach(await psycopg.AsyncConnection.connect(dsn))
            kept.append(aconn)

            async def holder() -> None:
                await aconn.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
                await sim.sleep(10)
                await aconn.commit()

            sim.spawn(holder)
        else:
            conn = sim.attach(psycopg.connect(dsn))
            kept.append(conn)

            def sync_holder() -> None:
                conn.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
                get_clock().sleep(10)
                conn.commit()

            sim.spawn(sync_holder)

        async def checker() -> None:
            await sim.sleep(1)
            sim.check(False, "stop here")

        sim.spawn(checker)
        await sim.join()

    report = explore(scenario, schedules=1)
    assert [(f.check, f.message) for f in report.failures] == [("check", "stop here")]
    assert kept[0].closed
    assert _sessions_left(app) == [], "the stopped task's transaction outlived the schedule"
    with psycopg.connect(dsn) as check:
        check.execute("SET lock_timeout = '2s'")
        check.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        assert check.execute("SELECT balance FROM accounts").fetchone() == (1,)
