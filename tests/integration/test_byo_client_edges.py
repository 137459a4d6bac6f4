"""Clients of the caller's own at their edges: a pool that lends a single connection,
redis-py clients that come and go under the redis-py ``Lock``, and a redis-py style lock
name on Redis Cluster (on the real servers and a disposable cluster)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

import psycopg
import psycopg_pool
import pytest
import redis
import redis.asyncio
import redis.cluster
import sqlalchemy
from redis.crc import key_slot

import jobfence
from jobfence.compat.redis_py import Lock as RedisPyLock
from jobfence.compat.redis_py import close_locks
from jobfence.compat.redis_py.asyncio import Lock as AsyncRedisPyLock
from tests.integration._redis_cluster import RedisCluster
from tests.servers import POSTGRES_URL, REDIS_URL, delete_redis_keys

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


# -- redis-py clients that come and go: the jobfence client kept for each goes with them --------
@pytest.fixture
def prefix() -> Iterator[str]:
    value = "byoe-" + uuid.uuid4().hex[:10]
    yield value
    delete_redis_keys(value + "*")


def _all_freed(refs: list[weakref.ref[object]], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if all(ref() is None for ref in refs):
            return True
        time.sleep(0.05)  # the jobfence client of each is closed in the background
    return False


def test_a_redis_client_dropped_after_its_locks_is_freed(prefix: str) -> None:
    def use_and_drop() -> weakref.ref[object]:
        client = redis.Redis.from_url(REDIS_URL)
        lock = RedisPyLock(client, prefix + ":a", timeout=5)
        assert lock.acquire()
        lock.release()
        with client.lock(prefix + ":b", lock_class=RedisPyLock) as held:  # no timeout: renewed
            assert held.owned()
        client.close()
        return weakref.ref(client)

    refs = [use_and_drop() for _ in range(3)]
    assert _all_freed(refs), "a redis-py client used by Lock objects was kept after them"


def test_many_locks_on_one_client_share_one_jobfence_client(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        locks = [RedisPyLock(client, f"{prefix}:{i}", timeout=5) for i in range(20)]
        assert len({id(lock._locks) for lock in locks}) == 1
        assert all(lock.acquire(blocking=False) for lock in locks)
        for lock in locks:
            lock.release()
        del lock
        shared = weakref.ref(locks[0]._locks)
        del locks
        # the last Lock gone, its jobfence client is closed and let go
        assert _all_freed([shared])
        again = RedisPyLock(client, prefix + ":0", timeout=5)
        assert again.acquire(blocking=False)  # a new jobfence client for the next Lock
        again.release()
    finally:
        client.close()


async def test_an_asyncio_redis_client_dropped_after_its_locks_is_freed(prefix: str) -> None:
    async def use_and_drop() -> weakref.ref[object]:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        lock = AsyncRedisPyLock(client, prefix + ":a")
        assert await lock.acquire()
        await lock.release()
        await client.aclose()
        return weakref.ref(client)

    refs = [await use_and_drop() for _ in range(3)]
    deadline = asyncio.get_running_loop().time() + 10
    while not all(ref() is None for ref in refs):
        assert asyncio.get_running_loop().time() < deadline, "a redis-py client was kept"
        gc.collect()
        await asyncio.sleep(0.05)  # the jobfence client of each is closed on this loop


def test_a_lock_with_a_timeout_left_to_expire_outlives_its_lock_object(prefix: str) -> None:
    # redis-py's "hold it for a minute" idiom: acquire, never release, let the key expire
    client = redis.Redis.from_url(REDIS_URL)
    try:
        lock = RedisPyLock(client, prefix + ":cooldown", timeout=30)
        assert lock.acquire()
        shared = weakref.ref(lock._locks)
        del lock
        assert _all_freed([shared])  # its jobfence client closed ...
        assert client.get(prefix + ":cooldown") is not None  # ... without releasing it
        assert (
            RedisPyLock(client, prefix + ":cooldown", timeout=30).acquire(blocking=False) is False
        )
    finally:
        client.close()


# -- Redis Cluster: a redis-py style name without a hash tag ---------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


def test_a_name_without_a_hash_tag_is_refused_even_when_two_of_its_keys_share_a_slot(
    cluster: RedisCluster,
) -> None:
    # no hash tag, yet "<name>" and "<name>:q" happen to hash to one slot: the other keys of
    # the name do not, so a script on them would be refused by the cluster
    name = "order-42939"
    assert key_slot(name.encode()) == key_slot((name + ":q").encode())
    assert key_slot(name.encode()) != key_slot((name + ":tok").encode())
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        for refused in (name, "{}" + name, name + "}{"):  # an empty tag is no tag
            with pytest.raises(jobfence.ConfigurationError, match="hash tag") as err:
                client.lock(refused, lock_class=RedisPyLock).acquire(blocking=False)
            assert err.value.argument == "name"
        tagged = client.lock("}{" + name + "}:x", timeout=10, lock_class=RedisPyLock)
        assert tagged.acquire(blocking=False)  # the tag is what the first "{" opens
        tagged.release()
        close_locks(client)
    finally:
        client.close()
