"""is_conflict / is_transient / is_commit_outcome_unknown on REAL errors from the real servers.

Every error below is provoked for real: a PostgreSQL and a MariaDB deadlock (two threads, two
rows, opposite order, synchronised with a Barrier), serialization failures, a lock-wait timeout,
sessions killed by the server, SQLite busy, Redis against a closed port. Then the same through
asyncpg, aiomysql, aiosqlite, redis.asyncio and SQLAlchemy (sync and async), and retry_unit
recovering from a real deadlock.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiomysql
import aiosqlite
import asyncpg
import psycopg
import pymysql
import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.retry
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.ext.asyncio import create_async_engine

import jobfence
from jobfence import BackendError, is_commit_outcome_unknown, is_conflict, is_transient
from tests.servers import POSTGRES_URL, REDIS_URL, mysql_params


def assert_conflict(exc: BaseException) -> None:
    assert is_conflict(exc), repr(exc)
    assert not is_transient(exc), repr(exc)
    assert not is_commit_outcome_unknown(exc), repr(exc)


def assert_transient(exc: BaseException) -> None:
    assert is_transient(exc), repr(exc)
    assert not is_conflict(exc), repr(exc)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def aiomysql_params() -> dict[str, Any]:
    params = mysql_params()
    params["db"] = params.pop("database")
    return params


def run_opposite_order(worker: Any) -> list[BaseException]:
    """Run worker(first, second, barrier) in two threads with rows (1, 2) and (2, 1)."""
    barrier = threading.Barrier(2, timeout=20)
    errors: list[BaseException] = []

    def target(first: int, second: int) -> None:
        try:
            worker(first, second, barrier)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=order) for order in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


# ------------------------------------------------------------------------------ PostgreSQL


@pytest.fixture
def pg_table() -> Iterator[str]:
    name = f"jf_cls_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute(f"INSERT INTO {name} VALUES (1, 0), (2, 0)")
    try:
        yield name
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


def pg_terminate(pid: int) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        # the timeout argument makes it wait until the backend has really exited
        row = admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()
        assert row == (True,)


def test_psycopg_real_deadlock_is_a_conflict(pg_table: str) -> None:
    def worker(first: int, second: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute("SET deadlock_timeout = '50ms'")
            with conn.transaction():
                conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = %s", (first,))
                barrier.wait()
                conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = %s", (second,))

    errors = run_opposite_order(worker)
    assert len(errors) == 1, errors
    assert isinstance(errors[0], psycopg.errors.DeadlockDetected)
    assert errors[0].sqlstate == "40P01"
    assert_conflict(errors[0])


def test_psycopg_real_serialization_failure_is_a_conflict(pg_table: str) -> None:
    with (
        psycopg.connect(POSTGRES_URL, autocommit=True) as a,
        psycopg.connect(POSTGRES_URL, autocommit=True) as b,
    ):
        a.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        b.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        a.execute(f"SELECT v FROM {pg_table} WHERE id = 1").fetchone()
        b.execute(f"SELECT v FROM {pg_table} WHERE id = 1").fetchone()
        a.execute(f"UPDATE {pg_table} SET v = 5 WHERE id = 1")
        a.execute("COMMIT")
        with pytest.raises(psycopg.errors.SerializationFailure) as info:
            b.execute(f"UPDATE {pg_table} SET v = 7 WHERE id = 1")
        b.execute("ROLLBACK")
    assert info.value.sqlstate == "40001"
    assert_conflict(info.value)


def test_psycopg_serialization_failure_at_commit_is_a_conflict_not_unknown(
    pg_table: str,
) -> None:
    # write skew: each reads both rows and writes one; SSI aborts the second COMMIT
    with psycopg.connect(POSTGRES_URL) as a, psycopg.connect(POSTGRES_URL) as b:
        for c in (a, b):
            c.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        a.execute(f"SELECT sum(v) FROM {pg_table}").fetchone()
        b.execute(f"SELECT sum(v) FROM {pg_table}").fetchone()
        a.execute(f"UPDATE {pg_table} SET v = 1 WHERE id = 1")
        b.execute(f"UPDATE {pg_table} SET v = 1 WHERE id = 2")
        a.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as info:
            b.commit()
    assert_conflict(info.value)  # raised by COMMIT, yet the outcome is known: rolled back


def test_psycopg_lock_not_available_is_a_conflict(pg_table: str) -> None:
    with (
        psycopg.connect(POSTGRES_URL) as a,
        psycopg.connect(POSTGRES_URL) as b,
    ):
        a.execute(f"SELECT v FROM {pg_table} WHERE id = 1 FOR UPDATE")
        with pytest.raises(psycopg.errors.LockNotAvailable) as info:
            b.execute(f"SELECT v FROM {pg_table} WHERE id = 1 FOR UPDATE NOWAIT")
    assert_conflict(info.value)


def test_psycopg_terminated_session_is_transient_and_not_commit_unknown() -> None:
    conn = psycopg.connect(POSTGRES_URL, autocommit=True)
    try:
        pg_terminate(conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1")
    finally:
        conn.close()
    assert_transient(info.value)
    assert not is_commit_outcome_unknown(info.value)  # died in a SELECT, not in a COMMIT


def test_psycopg_connection_lost_at_commit_is_commit_outcome_unknown(pg_table: str) -> None:
    conn = psycopg.connect(POSTGRES_URL)
    try:
        conn.execute(f"UPDATE {pg_table} SET v = 9 WHERE id = 1")
        pg_terminate(conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.commit()
    finally:
        conn.close()
    assert_transient(info.value)
    assert is_commit_outcome_unknown(info.value)


def test_psycopg_connection_lost_leaving_a_transaction_block_is_commit_unknown(
    pg_table: str,
) -> None:
    conn = psycopg.connect(POSTGRES_URL, autocommit=True)
    try:
        with pytest.raises(psycopg.OperationalError) as info, conn.transaction():
            conn.execute(f"UPDATE {pg_table} SET v = 9 WHERE id = 1")
            pg_terminate(conn.info.backend_pid)
    finally:
        conn.close()
    assert_transient(info.value)
    assert is_commit_outcome_unknown(info.value)


def test_psycopg_statement_timeout_is_transient() -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '50ms'")
        with pytest.raises(psycopg.errors.QueryCanceled) as info:
            conn.execute("SELECT pg_sleep(5)")
    assert info.value.sqlstate == "57014"
    assert_transient(info.value)


def test_psycopg_connection_refused_is_transient() -> None:
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{closed_port()}/test", connect_timeout=5)
    assert_transient(info.value)


def test_psycopg_syntax_error_is_neither() -> None:
    with (
        psycopg.connect(POSTGRES_URL, autocommit=True) as conn,
        pytest.raises(psycopg.errors.SyntaxError) as info,
    ):
        conn.execute("SELEC 1")
    assert not is_conflict(info.value) and not is_transient(info.value)


def test_backend_error_is_classified_by_its_cause(pg_table: str) -> None:
    with psycopg.connect(POSTGRES_URL) as a, psycopg.connect(POSTGRES_URL) as b:
        a.execute(f"SELECT 1 FROM {pg_table} WHERE id = 1 FOR UPDATE")
        try:
            b.execute(f"SELECT 1 FROM {pg_table} WHERE id = 1 FOR UPDATE NOWAIT")
        except psycopg.Error as exc:
            wrapped = BackendError("fence.check failed", backend="postgresql")
            wrapped.__cause__ = exc
    assert is_conflict(wrapped) and not is_transient(wrapped)


# ---------------------------------------------------------------------------------- asyncpg


async def test_asyncpg_real_serialization_failure_is_a_conflict(pg_table: str) -> None:
    a = await asyncpg.connect(POSTGRES_URL)
    b = await asyncpg.connect(POSTGRES_URL)
    try:
        ta = a.transaction(isolation="serializable")
        tb = b.transaction(isolation="serializable")
        await ta.start()
        await tb.start()
        await a.fetchval(f"SELECT v FROM {pg_table} WHERE id = 1")
        await b.fetchval(f"SELECT v FROM {pg_table} WHERE id = 1")
        await a.execute(f"UPDATE {pg_table} SET v = 5 WHERE id = 1")
        await ta.commit()
        with pytest.raises(asyncpg.exceptions.SerializationError) as info:
            await b.execute(f"UPDATE {pg_table} SET v = 7 WHERE id = 1")
        await tb.rollback()
    finally:
        await a.close()
        await b.close()
    assert info.value.sqlstate == "40001"
    assert_conflict(info.value)


async def test_asyncpg_real_deadlock_is_a_conflict(pg_table: str) -> None:
    held = [asyncio.Event(), asyncio.Event()]

    async def worker(i: int, first: int, second: int) -> BaseException | None:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute("SET deadlock_timeout = '50ms'")
            async with conn.transaction():
                await conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = $1", first)
                held[i].set()
                await held[1 - i].wait()
                await conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = $1", second)
        except Exception as exc:
            return exc
        finally:
            await conn.close()
        return None

    results = await asyncio.wait_for(asyncio.gather(worker(0, 1, 2), worker(1, 2, 1)), 30)
    errors = [r for r in results if r is not None]
    assert len(errors) == 1 and isinstance(errors[0], asyncpg.exceptions.DeadlockDetectedError)
    assert_conflict(errors[0])


async def test_asyncpg_terminated_session_is_transient(pg_table: str) -> None:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await asyncio.to_thread(pg_terminate, conn.get_server_pid())
        with pytest.raises(Exception) as info:
            await conn.fetchval("SELECT 1")
    finally:
        conn.terminate()
    assert_transient(info.value)
    assert not is_commit_outcome_unknown(info.value)


async def test_asyncpg_connection_lost_at_commit_is_commit_outcome_unknown(
    pg_table: str,
) -> None:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        tr = conn.transaction()
        await tr.start()
        await conn.execute(f"UPDATE {pg_table} SET v = 3 WHERE id = 1")
        # terminate WITHOUT yielding to the event loop: asyncpg has not seen the socket close
        # yet, so it sends COMMIT and loses the connection while the COMMIT is in flight
        pg_terminate(conn.get_server_pid())
        with pytest.raises(asyncpg.exceptions.ConnectionDoesNotExistError) as info:
            await tr.commit()
    finally:
        conn.terminate()
    assert_transient(info.value)
    assert is_commit_outcome_unknown(info.value)


async def test_asyncpg_commit_on_a_connection_known_closed_is_not_unknown(
    pg_table: str,
) -> None:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        tr = conn.transaction()
        await tr.start()
        await conn.execute(f"UPDATE {pg_table} SET v = 3 WHERE id = 1")
        await asyncio.to_thread(pg_terminate, conn.get_server_pid())  # the loop sees the close
        with pytest.raises(asyncpg.exceptions.InterfaceError) as info:
            await tr.commit()
    finally:
        conn.terminate()
    # asyncpg refused before sending COMMIT: the transaction certainly did not commit
    assert_transient(info.value)
    assert not is_commit_outcome_unknown(info.value)


async def test_asyncpg_connection_refused_is_transient() -> None:
    with pytest.raises(OSError) as info:
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{closed_port()}/test")
    assert_transient(info.value)


# ---------------------------------------------------------------------------- MariaDB


@pytest.fixture
def my_table() -> Iterator[str]:
    name = f"jf_cls_{uuid.uuid4().hex[:10]}"
    conn = pymysql.connect(**mysql_params(), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {name} VALUES (1, 0), (2, 0)")
        yield name
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
        conn.close()


def test_pymysql_real_deadlock_is_a_conflict(my_table: str) -> None:
    def worker(first: int, second: int, barrier: threading.Barrier) -> None:
        conn = pymysql.connect(**mysql_params())
        try:
            with conn.cursor() as cur:
                conn.begin()
                cur.execute(f"UPDATE {my_table} SET v = v + 1 WHERE id = %s", (first,))
                barrier.wait()
                cur.execute(f"UPDATE {my_table} SET v = v + 1 WHERE id = %s", (second,))
                conn.commit()
        except Exception:
            conn.rollback()
            raise
        finally:
            conn.close()

    errors = run_opposite_order(worker)
    assert len(errors) == 1, errors
    assert isinstance(errors[0], pymysql.err.OperationalError)
    assert errors[0].args[0] == 1213
    assert_conflict(errors[0])


def test_pymysql_real_lock_wait_timeout_is_a_conflict(my_table: str) -> None:
    holder = pymysql.connect(**mysql_params())
    waiter = pymysql.connect(**mysql_params())
    try:
        holder.begin()
        holder.cursor().execute(f"UPDATE {my_table} SET v = 1 WHERE id = 1")
        cur = waiter.cursor()
        cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
        waiter.begin()
        with pytest.raises(pymysql.err.OperationalError) as info:
            cur.execute(f"UPDATE {my_table} SET v = 2 WHERE id = 1")
        waiter.rollback()
        holder.rollback()
    finally:
        holder.close()
        waiter.close()
    assert info.value.args[0] == 1205
    assert_conflict(info.value)


def test_pymysql_killed_session_is_transient(my_table: str) -> None:
    victim = pymysql.connect(**mysql_params())
    admin = pymysql.connect(**mysql_params(), autocommit=True)
    try:
        admin.cursor().execute(f"KILL {victim.thread_id()}")
        with pytest.raises(pymysql.err.MySQLError) as info:
            victim.cursor().execute("SELECT 1")
    finally:
        admin.close()
    assert info.value.args[0] in (2006, 2013, 1927), info.value
    assert_transient(info.value)
    assert not is_commit_outcome_unknown(info.value)


def test_pymysql_killed_during_commit_is_commit_outcome_unknown(my_table: str) -> None:
    victim = pymysql.connect(**mysql_params())
    admin = pymysql.connect(**mysql_params(), autocommit=True)
    try:
        victim.begin()
        victim.cursor().execute(f"UPDATE {my_table} SET v = 4 WHERE id = 1")
        admin.cursor().execute(f"KILL {victim.thread_id()}")
        with pytest.raises(pymysql.err.MySQLError) as info:
            victim.commit()
    finally:
        admin.close()
    assert_transient(info.value)
    assert is_commit_outcome_unknown(info.value)


def test_pymysql_connection_refused_is_transient() -> None:
    params = {**mysql_params(), "port": closed_port(), "connect_timeout": 5}
    with pytest.raises(pymysql.err.OperationalError) as info:
        pymysql.connect(**params)
    assert info.value.args[0] == 2003
    assert_transient(info.value)


async def test_aiomysql_real_deadlock_is_a_conflict(my_table: str) -> None:
    held = [asyncio.Event(), asyncio.Event()]

    async def worker(i: int, first: int, second: int) -> BaseException | None:
        conn = await aiomysql.connect(**aiomysql_params())
        try:
            await conn.begin()
            async with conn.cursor() as cur:
                await cur.execute(f"UPDATE {my_table} SET v = v + 1 WHERE id = %s", (first,))
                held[i].set()
                await held[1 - i].wait()
                await cur.execute(f"UPDATE {my_table} SET v = v + 1 WHERE id = %s", (second,))
            await conn.commit()
        except Exception as exc:
            await conn.rollback()
            return exc
        finally:
            conn.close()
        return None

    results = await asyncio.wait_for(asyncio.gather(worker(0, 1, 2), worker(1, 2, 1)), 30)
    errors = [r for r in results if r is not None]
    assert len(errors) == 1 and errors[0].args[0] == 1213, errors
    assert_conflict(errors[0])


async def test_aiomysql_killed_session_is_transient(my_table: str) -> None:
    params = aiomysql_params()
    victim = await aiomysql.connect(**params)
    admin = await aiomysql.connect(**params, autocommit=True)
    try:
        async with admin.cursor() as cur:
            await cur.execute(f"KILL {victim.thread_id()}")
        with pytest.raises(pymysql.err.MySQLError) as info:
            async with victim.cursor() as cur:
                await cur.execute("SELECT 1")
    finally:
        admin.close()
        victim.close()
    assert_transient(info.value)


# ---------------------------------------------------------------------------------- SQLite


def test_sqlite_busy_is_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("CREATE TABLE t (v INT)")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as info:
            other.execute("BEGIN IMMEDIATE")
        holder.execute("ROLLBACK")
    finally:
        holder.close()
        other.close()
    assert "database is locked" in str(info.value)
    assert_conflict(info.value)


def test_sqlite_syntax_error_is_neither() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as info:
        conn.execute("SELEC 1")
    conn.close()
    assert not is_conflict(info.value) and not is_transient(info.value)


async def test_aiosqlite_busy_is_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    async with (
        aiosqlite.connect(path, isolation_level=None) as holder,
        aiosqlite.connect(path, isolation_level=None, timeout=0) as other,
    ):
        await holder.execute("CREATE TABLE t (v INT)")
        await holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as info:
            await other.execute("BEGIN IMMEDIATE")
        await holder.execute("ROLLBACK")
    assert_conflict(info.value)


# ----------------------------------------------------------------------------------- Redis


def test_redis_connection_refused_is_transient() -> None:
    client = redis.Redis(
        host="127.0.0.1", port=closed_port(), retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    )
    with pytest.raises(redis.ConnectionError) as info:
        client.ping()
    client.close()
    assert_transient(info.value)


def test_redis_socket_timeout_is_transient() -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=0.05)
    key = f"jf_cls:{uuid.uuid4().hex}"
    with pytest.raises(redis.TimeoutError) as info:
        client.blpop([key], timeout=5)  # the server would answer after 5 s; we wait 50 ms
    client.close()
    assert_transient(info.value)


def test_redis_watch_error_is_a_conflict() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    rival = redis.Redis.from_url(REDIS_URL)
    key = f"jf_cls:{uuid.uuid4().hex}"
    try:
        client.set(key, 10)
        with client.pipeline() as pipe:
            pipe.watch(key)
            stock = int(pipe.get(key) or 0)
            rival.set(key, 7)  # another writer changes the watched key
            pipe.multi()
            pipe.set(key, stock - 5)
            with pytest.raises(redis.WatchError) as info:
                pipe.execute()
        assert client.get(key) == b"7"
    finally:
        client.delete(key)
        client.close()
        rival.close()
    assert_conflict(info.value)


def test_redis_authentication_error_is_neither() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        user = f"jf_nobody_{uuid.uuid4().hex[:6]}"
        with pytest.raises(redis.AuthenticationError) as info:
            client.execute_command("AUTH", user, "wrong-password")
    finally:
        client.close()
    assert not is_transient(info.value) and not is_conflict(info.value)


async def test_redis_asyncio_connection_refused_is_transient() -> None:
    client = redis.asyncio.Redis(
        host="127.0.0.1",
        port=closed_port(),
        retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    with pytest.raises(redis.ConnectionError) as info:
        await client.ping()
    await client.aclose()
    assert_transient(info.value)


# ------------------------------------------------------------------------------- SQLAlchemy


@pytest.fixture
def sa_engine() -> Iterator[sa.Engine]:
    engine = sa.create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        yield engine
    finally:
        engine.dispose()


def test_sqlalchemy_stale_data_error_is_a_conflict(sa_engine: sa.Engine) -> None:
    name = f"jf_cls_{uuid.uuid4().hex[:10]}"

    class Base(orm.DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = name
        id: orm.Mapped[int] = orm.mapped_column(primary_key=True)
        stock: orm.Mapped[int]
        version: orm.Mapped[int] = orm.mapped_column(nullable=False)
        __mapper_args__ = {"version_id_col": version}

    Base.metadata.create_all(sa_engine)
    try:
        with orm.Session(sa_engine) as s:
            s.add(Item(id=1, stock=10))
            s.commit()
        with orm.Session(sa_engine) as s1, orm.Session(sa_engine) as s2:
            a, b = s1.get(Item, 1), s2.get(Item, 1)
            assert a is not None and b is not None
            a.stock = 5
            s1.commit()
            b.stock = 7
            with pytest.raises(orm.exc.StaleDataError) as info:
                s2.commit()
    finally:
        Base.metadata.drop_all(sa_engine)
    assert_conflict(info.value)


def test_sqlalchemy_dbapi_error_is_classified_through_orig(
    sa_engine: sa.Engine, pg_table: str
) -> None:
    with sa_engine.connect() as a, sa_engine.connect() as b:
        for c in (a, b):
            c.execute(sa.text("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"))
            c.execute(sa.text(f"SELECT v FROM {pg_table} WHERE id = 1"))
        a.execute(sa.text(f"UPDATE {pg_table} SET v = 5 WHERE id = 1"))
        a.commit()
        with pytest.raises(sa.exc.OperationalError) as info:
            b.execute(sa.text(f"UPDATE {pg_table} SET v = 7 WHERE id = 1"))
        b.rollback()
    assert isinstance(info.value.orig, psycopg.errors.SerializationFailure)
    assert_conflict(info.value)


def test_sqlalchemy_invalidated_connection_is_transient_and_commit_unknown(
    sa_engine: sa.Engine, pg_table: str
) -> None:
    with sa_engine.connect() as conn:
        conn.execute(sa.text(f"UPDATE {pg_table} SET v = 8 WHERE id = 1"))
        pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        pg_terminate(pid)
        with pytest.raises(sa.exc.DBAPIError) as info:
            conn.commit()
    assert info.value.connection_invalidated
    assert_transient(info.value)
    assert is_commit_outcome_unknown(info.value)


def test_statement_retry_inside_a_failed_transaction_is_never_retryable(
    sa_engine: sa.Engine,
) -> None:
    # the "retry the statement inside the same transaction" mistake, two ways it surfaces
    with orm.Session(sa_engine) as s:
        s.execute(sa.text("SET LOCAL statement_timeout = '20ms'"))
        with pytest.raises(sa.exc.OperationalError) as first:
            s.execute(sa.text("SELECT pg_sleep(5)"))
        assert is_transient(first.value)
        with pytest.raises(sa.exc.InternalError) as aborted:
            s.execute(sa.text("SELECT pg_sleep(5)"))  # the naive statement-level retry
    assert isinstance(aborted.value.orig, psycopg.errors.InFailedSqlTransaction)
    assert not is_transient(aborted.value) and not is_conflict(aborted.value)

    with sa_engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        pg_terminate(conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
        with pytest.raises(sa.exc.DBAPIError) as lost:
            conn.execute(sa.text("SELECT 2"))
        assert is_transient(lost.value)
        with pytest.raises(sa.exc.PendingRollbackError) as pending:
            conn.execute(sa.text("SELECT 2"))  # retrying on the invalidated transaction
    assert not is_transient(pending.value) and not is_conflict(pending.value)


@pytest.fixture
async def async_sa_engine() -> AsyncIterator[Any]:
    engine = create_async_engine(POSTGRES_URL.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_sqlalchemy_asyncpg_serialization_failure_is_a_conflict(
    async_sa_engine: Any, pg_table: str
) -> None:
    async with async_sa_engine.connect() as a, async_sa_engine.connect() as b:
        for c in (a, b):
            await c.execute(sa.text("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"))
            await c.execute(sa.text(f"SELECT v FROM {pg_table} WHERE id = 1"))
        await a.execute(sa.text(f"UPDATE {pg_table} SET v = 5 WHERE id = 1"))
        await a.commit()
        with pytest.raises(sa.exc.DBAPIError) as info:
            await b.execute(sa.text(f"UPDATE {pg_table} SET v = 7 WHERE id = 1"))
        await b.rollback()
    assert_conflict(info.value)


# ------------------------------------------------------- retry_unit over real failures


def test_retry_unit_recovers_both_sides_of_a_real_deadlock(pg_table: str) -> None:
    attempts: list[int] = []

    @jobfence.retry_unit(attempts=5, backoff=0.01)
    def move(first: int, second: int, barrier: threading.Barrier) -> None:
        first_attempt = first not in attempts
        attempts.append(first)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute("SET deadlock_timeout = '50ms'")
            with conn.transaction():
                conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = %s", (first,))
                if first_attempt:
                    barrier.wait()  # both hold their first row: a real deadlock follows
                conn.execute(f"UPDATE {pg_table} SET v = v + 1 WHERE id = %s", (second,))

    errors = run_opposite_order(move)
    assert errors == []
    assert sorted(attempts) in ([1, 1, 2], [1, 2, 2])  # the deadlock victim ran twice
    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute(f"SELECT id, v FROM {pg_table} ORDER BY id").fetchall()
    assert rows == [(1, 2), (2, 2)]  # both units applied exactly once


def test_retry_unit_refuses_a_statement_retry_in_the_callers_transaction(
    pg_table: str,
) -> None:
    calls = 0

    @jobfence.retry_unit
    def update_nowait(conn: psycopg.Connection[Any]) -> None:
        nonlocal calls
        calls += 1
        conn.execute(f"SELECT 1 FROM {pg_table} WHERE id = 1 FOR UPDATE NOWAIT")

    with psycopg.connect(POSTGRES_URL) as holder, psycopg.connect(POSTGRES_URL) as conn:
        holder.execute(f"SELECT 1 FROM {pg_table} WHERE id = 1 FOR UPDATE")
        conn.execute(f"UPDATE {pg_table} SET v = 1 WHERE id = 2")  # caller's transaction
        with pytest.raises(jobfence.ConfigurationError, match="inside a transaction") as info:
            update_nowait(conn)
        assert conn.info.transaction_status.name == "INERROR"
        conn.rollback()
    assert calls == 1
    assert isinstance(info.value.__cause__, psycopg.errors.LockNotAvailable)
