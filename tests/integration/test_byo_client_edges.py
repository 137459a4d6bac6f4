"""Clients of the caller's own at their edges: a pool that lends a single connection, and
redis-py clients that come and go under the redis-py ``Lock`` (on the real servers)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import psycopg_pool
import pytest
import sqlalchemy

import jobfence
from tests.servers import POSTGRES_URL

_PG = POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def pg_prefix() -> Iterator[str]:
    prefix = "byoe_" + uuid.uuid4().hex[:10]
    yield prefix
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        for table in ("locks", "lock_tokens", "lock_queue", "schema", "queue"):
            admin.execute(f'DROP TABLE IF EXISTS "{prefix}_{table}"')


# -- a pool of one connection: the LISTEN connection must not take it ---------------------------
def _wait_and_hand_over(locks: jobfence.Locks) -> None:
    """A waiting acquire, then a waiter that gets the lock once its holder releases it."""
    with locks.acquire("job", ttl=10, timeout=5) as lease:
        first = lease.token
    holder = locks.acquire("job", ttl=10, timeout=5)
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(locks.acquire("job", ttl=10, timeout=10).token)
    )
    waiter.start()
    holder.release()
    waiter.join(15)
    assert got and got[0] > holder.token > first


def test_a_waiting_acquire_works_on_a_psycopg_pool_of_one_connection(pg_prefix: str) -> None:
    with (
        psycopg_pool.ConnectionPool(POSTGRES_URL, min_size=1, max_size=1, timeout=3) as pool,
        jobfence.Locks(pool, namespace=pg_prefix) as locks,
    ):
        _wait_and_hand_over(locks)
        with pool.connection(timeout=3) as conn:  # jobfence keeps none of it
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_waiting_acquire_works_on_an_engine_of_one_connection(pg_prefix: str) -> None:
    engine = sqlalchemy.create_engine(_PG, pool_size=1, max_overflow=0, pool_timeout=3)
    try:
        with jobfence.Locks(engine, namespace=pg_prefix) as locks:
            _wait_and_hand_over(locks)
    finally:
        engine.dispose()


async def test_a_waiting_async_acquire_works_on_a_psycopg_pool_of_one_connection(
    pg_prefix: str,
) -> None:
    async with (
        psycopg_pool.AsyncConnectionPool(POSTGRES_URL, min_size=1, max_size=1, timeout=3) as pool,
        jobfence.AsyncLocks(pool, namespace=pg_prefix) as locks,
    ):
        async with locks.acquire("job", ttl=10, timeout=5) as lease:
            assert lease.token > 0
        async with locks.acquire("job", ttl=10, timeout=5):
            pass


def test_a_waiting_receive_works_on_a_psycopg_pool_of_one_connection(pg_prefix: str) -> None:
    with psycopg_pool.ConnectionPool(POSTGRES_URL, min_size=1, max_size=1, timeout=3) as pool:
        queue = jobfence.Queue(pool, "emails", table=pg_prefix + "_queue")
        try:
            assert queue.receive(wait=0.5) == []
            queue.publish({"n": 1})
            messages = queue.receive(wait=5)
            assert [m.body for m in messages] == [{"n": 1}]
            messages[0].ack()
        finally:
            queue.drop()
            queue.close()
