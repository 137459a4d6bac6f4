"""Many workers starting at once all run ``install(conn)``: none of them may fail.

``CREATE TABLE IF NOT EXISTS`` alone is not safe on PostgreSQL against a concurrent CREATE
(the loser fails on ``pg_type``'s unique index), so jobfence's PostgreSQL install scripts take
an advisory lock first, inside one ``DO`` statement. Run on a fresh table each time, with the
callers' connections both in a transaction and in autocommit.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pymysql
import pytest

import jobfence
from jobfence import fencing
from tests.servers import MYSQL_URL, POSTGRES_URL, mysql_params

pytestmark = pytest.mark.timeout(60)

WORKERS = 6


def _postgres(autocommit: bool) -> Any:
    return psycopg.connect(POSTGRES_URL, autocommit=autocommit)


def _mysql(autocommit: bool) -> Any:
    return pymysql.connect(**mysql_params(), autocommit=autocommit)


def _race(connect: Callable[[], Any], install: Callable[[Any], None]) -> list[BaseException]:
    """Every worker installs at the same instant on its own connection, then commits."""
    conns = [connect() for _ in range(WORKERS)]
    start = threading.Barrier(WORKERS)
    errors: list[BaseException] = []

    def run(conn: Any) -> None:
        start.wait()
        try:
            install(conn)
            conn.commit()
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(conn,)) for conn in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for conn in conns:
        conn.close()
    return errors


@pytest.mark.parametrize("autocommit", [False, True], ids=["in-transaction", "autocommit"])
@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_concurrent_inbox_installs_all_succeed(dialect: str, autocommit: bool) -> None:
    table = "inst_" + uuid.uuid4().hex[:10]
    url = POSTGRES_URL if dialect == "postgresql" else MYSQL_URL
    connect = _postgres if dialect == "postgresql" else _mysql
    inbox = jobfence.Inbox(url, table=table)
    try:
        for _ in range(3):  # a fresh table each round: the race is on the first CREATE
            assert _race(lambda: connect(autocommit), inbox.install) == []
            with connect(True) as conn:  # the table really is there and usable
                assert inbox.claim_in(conn, "k") is True
                conn.commit()
            inbox.drop()
    finally:
        inbox.close()


@pytest.mark.parametrize("autocommit", [False, True], ids=["in-transaction", "autocommit"])
@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_concurrent_fence_installs_all_succeed(dialect: str, autocommit: bool) -> None:
    table = "fen_" + uuid.uuid4().hex[:10]
    connect = _postgres if dialect == "postgresql" else _mysql
    try:
        for _ in range(3):
            errors = _race(lambda: connect(autocommit), lambda c: fencing.install(c, table=table))
            assert errors == []
            with connect(False) as conn:
                jobfence.fence(conn, "r", 5, table=table)
                with pytest.raises(jobfence.StaleToken):
                    jobfence.fence(conn, "r", 4, table=table)
                conn.rollback()
                conn.cursor().execute(f"DROP TABLE {table}")
                conn.commit()
    finally:
        with connect(True) as conn:
            conn.cursor().execute(f"DROP TABLE IF EXISTS {table}")
