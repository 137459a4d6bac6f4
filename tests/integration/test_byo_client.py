"""Clients of the caller's own in place of a URL: every client kind with every part its
backend provides, on the real servers; the sync/async pairing; ownership (a client passed in
is never closed, and its connections go back as they were); what jobfence refuses.

Servers: the shared Redis (an ACL user of its own, keys limited to the test's prefix), a
disposable Redis with a Sentinel, a disposable three-node Redis Cluster, PostgreSQL, MariaDB
and SQLite files.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import sqlalchemy
from pymysql.constants import CLIENT
from redis.crc import key_slot
from redis.credentials import UsernamePasswordCredentialProvider
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobfence
from jobfence import ConfigurationError
from jobfence._core.url import parse_url
from jobfence.backends.redis.locks import RedisLockBackend
from jobfence.compat.redis_py import Lock as RedisPyLock
from jobfence.compat.redis_py import close_locks
from tests.integration._redis_cluster import RedisCluster
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL, delete_redis_keys, mysql_params

MYSQL_FLAGS = {"client_flag": CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS}
_PG = POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1)
_MY = MYSQL_URL.replace("mysql://", "mysql+pymysql://", 1)
_MY_ASYNC = MYSQL_URL.replace("mysql://", "mysql+aiomysql://", 1)


def _prefix() -> str:
    return "byo_" + uuid.uuid4().hex[:10]


# -- what every client must do, per part ---------------------------------------------------
def use_locks(locks: jobfence.Locks) -> None:
    with locks.acquire("job", ttl=10) as lease:
        first = lease.token
        assert locks.try_acquire("job") is None  # held: nobody else gets it
    with locks.acquire("job", ttl=10) as lease:
        assert lease.token > first  # fencing tokens strictly increase


async def ause_locks(locks: jobfence.AsyncLocks) -> None:
    async with locks.acquire("job", ttl=10) as lease:
        first = lease.token
        assert await locks.try_acquire("job") is None
    async with locks.acquire("job", ttl=10) as lease:
        assert lease.token > first


def use_inbox(inbox: jobfence.Inbox) -> None:
    key = uuid.uuid4().hex
    claim = inbox.claim(key)
    assert claim.owned
    claim.complete({"n": 1})
    again = inbox.claim(key)
    assert not again.owned and again.result == {"n": 1}


async def ause_inbox(inbox: jobfence.AsyncInbox) -> None:
    key = uuid.uuid4().hex
    claim = await inbox.claim(key)
    assert claim.owned
    await claim.complete({"n": 1})
    again = await inbox.claim(key)
    assert not again.owned and again.result == {"n": 1}


def use_queue(queue: jobfence.Queue) -> None:
    queue.publish({"n": 1})
    messages = queue.receive(wait=5)
    assert [m.body for m in messages] == [{"n": 1}]
    messages[0].ack()
    assert queue.receive() == []


async def ause_queue(queue: jobfence.AsyncQueue) -> None:
    await queue.publish({"n": 1})
    messages = await queue.receive(wait=5)
    assert [m.body for m in messages] == [{"n": 1}]
    await messages[0].ack()
    assert await queue.receive() == []


def use_all(client: Any, prefix: str, *, queue: bool = True, **lock_options: Any) -> None:
    with jobfence.Locks(client, namespace=prefix, **lock_options) as locks:
        assert "caller's" in repr(locks)
        use_locks(locks)
    inbox = jobfence.Inbox(client, table=prefix + "_inbox")
    try:
        use_inbox(inbox)
    finally:
        inbox.drop()
        inbox.close()
    if queue:
        q = jobfence.Queue(client, "q-" + prefix, **_queue_options(client, prefix))
        try:
            use_queue(q)
        finally:
            q.drop()
            q.close()


async def ause_all(client: Any, prefix: str, *, queue: bool = True, **lock_options: Any) -> None:
    async with jobfence.AsyncLocks(client, namespace=prefix, **lock_options) as locks:
        await ause_locks(locks)
    inbox = jobfence.AsyncInbox(client, table=prefix + "_inbox")
    try:
        await ause_inbox(inbox)
    finally:
        await inbox.drop()
        await inbox.close()
    if queue:
        q = jobfence.AsyncQueue(client, "q-" + prefix, **_queue_options(client, prefix))
        try:
            await ause_queue(q)
        finally:
            await q.drop()
            await q.close()


def _queue_options(client: Any, prefix: str) -> dict[str, Any]:
    if type(client).__module__.startswith("redis"):
        return {"namespace": prefix}
    return {"table": prefix + "_queue"}


# -- Redis ------------------------------------------------------------------------------------
@pytest.fixture
def prefix() -> Iterator[str]:
    value = _prefix()
    yield value
    delete_redis_keys(value + "*")


def test_redis_client_serves_every_part_and_stays_open(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, single_connection_client=True)
    try:
        use_all(client, prefix)
        # a single-connection client that jobfence had closed would have dropped it
        assert client.connection is not None
        assert client.ping()
    finally:
        client.close()


async def test_asyncio_redis_client_serves_every_part_and_stays_open(prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(REDIS_URL, single_connection_client=True)
    try:
        await ause_all(client, prefix)
        assert client.connection is not None
        assert await client.ping()
    finally:
        await client.aclose()


@pytest.fixture
def acl_user() -> Iterator[tuple[str, str, str]]:
    """A Redis ACL user that may touch only the keys of its own prefix."""
    prefix = _prefix()
    user, password = prefix + "_user", uuid.uuid4().hex
    admin = redis.Redis.from_url(REDIS_URL)
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=["+" + password],
        keys=[prefix + "*"],
        channels=["*"],
        commands=["+@all"],
    )
    try:
        yield user, password, prefix
    finally:
        admin.acl_deluser(user)
        admin.close()
        delete_redis_keys(prefix + "*")


def test_redis_client_with_a_credential_provider_and_an_acl_user(
    acl_user: tuple[str, str, str],
) -> None:
    user, password, prefix = acl_user
    url = REDIS_URL.split("?", 1)[0]
    client = redis.Redis.from_url(
        url, credential_provider=UsernamePasswordCredentialProvider(user, password)
    )
    try:
        assert client.acl_whoami() in (user, user.encode())
        use_all(client, prefix)  # every key jobfence touched is within the user's prefix
    finally:
        client.close()


async def test_asyncio_redis_client_with_an_acl_user(acl_user: tuple[str, str, str]) -> None:
    user, password, prefix = acl_user
    url = REDIS_URL.split("?", 1)[0]
    client = redis.asyncio.Redis.from_url(
        url, credential_provider=UsernamePasswordCredentialProvider(user, password)
    )
    try:
        await ause_all(client, prefix)
    finally:
        await client.aclose()


def test_a_lock_client_may_decode_replies_but_the_inbox_and_queue_may_not(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with jobfence.Locks(client, namespace=prefix) as locks:
            use_locks(locks)
        with pytest.raises(ConfigurationError, match="decode_responses") as err:
            jobfence.Inbox(client)
        assert err.value.argument == "url"
        with pytest.raises(ConfigurationError, match="decode_responses"):
            jobfence.Queue(client, "q")
    finally:
        client.close()


def test_connection_options_are_refused_with_a_client() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with pytest.raises(ConfigurationError, match="set it on that client") as err:
            jobfence.Locks(client, timeout=3)
        assert err.value.argument == "timeout"
        with pytest.raises(ConfigurationError) as err:
            jobfence.Inbox(client, max_connections=3)
        assert err.value.argument == "max_connections"
    finally:
        client.close()


# -- Redis Sentinel -----------------------------------------------------------------------------
@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[int]:
    """A disposable Redis server and one Sentinel monitoring it (as ``mymaster``); yields
    the Sentinel's port."""
    import subprocess
    import time

    from tests.reliability._redis_server import RedisServer, free_port

    with RedisServer() as master:
        port = free_port()
        config = tmp_path / "sentinel.conf"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
        )
        proc = subprocess.Popen(
            ["redis-server", str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            probe = redis.Redis(port=port, socket_timeout=1)
            deadline = time.monotonic() + 10
            while True:
                try:
                    if probe.sentinel_get_master_addr_by_name("mymaster"):
                        break
                except redis.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "the sentinel did not start"
                time.sleep(0.02)
            probe.close()
            yield port
        finally:
            proc.kill()
            proc.wait(10)


def test_sentinel_master_client_serves_every_part(sentinel: int) -> None:
    from redis.sentinel import Sentinel

    master = Sentinel([("127.0.0.1", sentinel)], socket_timeout=1).master_for(
        "mymaster", socket_timeout=5
    )
    try:
        use_all(master, _prefix())
    finally:
        master.close()


# -- Redis Cluster ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


def _names_in_many_slots(count: int) -> list[str]:
    names = [f"name-{i}" for i in range(count)]
    assert len({key_slot(f"ns:lock:{{{n}}}".encode()) for n in names}) > 1
    return names


def test_redis_cluster_client_serves_every_part(cluster: RedisCluster) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        prefix = _prefix()
        use_all(client, prefix)
        with jobfence.Locks(client, namespace=prefix) as locks:
            # renewal of many names in one call: one script call per hash slot
            leases = [locks.acquire(name, ttl=10) for name in _names_in_many_slots(12)]
            items = [(lease.name, lease.owner, 10.0) for lease in leases]
            assert locks.backend.renew(items) == [True] * len(items)
            assert locks.backend.renew([(n, "someone-else", 10.0) for n, _, _ in items]) == [
                False
            ] * len(items)
            for lease in leases:
                assert lease.release()
    finally:
        client.close()


async def test_asyncio_redis_cluster_client_serves_every_part(cluster: RedisCluster) -> None:
    client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        prefix = _prefix()
        await ause_all(client, prefix)
        inbox = jobfence.AsyncInbox(client, table=prefix + "_inbox")
        try:
            claims = [await inbox.claim(f"key-{i}") for i in range(12)]
            items = [(c.key, c.owner, 30.0) for c in claims]
            assert await inbox.backend.renew(items) == [True] * len(items)
        finally:
            await inbox.drop()
            await inbox.close()
    finally:
        await client.aclose()


@pytest.mark.parametrize("name", ["plain", "with {braces}", "{tag}x", "a}b", "ü:1"])
def test_every_key_of_a_lock_name_shares_one_hash_slot(name: str) -> None:
    """The keys a lock script derives from the lease key (``:tok``, ``:q``, ``:qd``, ``:qf``,
    ``:w:<owner>``, ``:rel``) lie in the lease key's slot: Redis Cluster runs a script only
    on the keys of one slot."""
    backend = RedisLockBackend(parse_url(REDIS_URL), namespace="ns")
    try:
        key = backend.lock_key(name)
        slots = {
            key_slot((key + s).encode()) for s in ("", ":tok", ":q", ":qd", ":qf", ":w:o", ":rel")
        }
        assert len(slots) == 1
    finally:
        backend.close()


def test_cluster_takes_namespaces_and_names_with_braces(cluster: RedisCluster) -> None:
    """Braces in a namespace or a name are percent-encoded in the key, so the hash tag is the
    encoded name and every key of the lock shares its slot (a lock script runs)."""
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        with jobfence.Locks(client, namespace=_prefix() + "a{}") as locks:
            for name in ("}starts-with-a-brace", "{tag}x", "plain"):
                lease = locks.try_acquire(name, ttl=10)
                assert lease is not None
                assert locks.try_acquire(name, ttl=10) is None
                assert lease.release() is True
        with jobfence.Queue(client, "q", namespace=_prefix() + "{x}") as queue:
            queue.publish("body")
            assert [m.body for m in queue.receive(max_messages=5)] == ["body"]
            queue.drop()
        # redis-py style locks name their key as given: on a cluster the name needs a tag
        with pytest.raises(ConfigurationError, match="hash tag"):
            client.lock("plain-name", lock_class=RedisPyLock).acquire(blocking=False)
        lock = client.lock("{" + _prefix() + "}:job", timeout=10, lock_class=RedisPyLock)
        assert lock.acquire(blocking=False)
        assert lock.fencing_token is not None
        lock.release()
        close_locks(client)
    finally:
        client.close()


# -- flavour pairing and bad clients -------------------------------------------------------------
async def test_a_blocking_client_is_refused_by_the_async_classes_and_vice_versa() -> None:
    sync_client = redis.Redis.from_url(REDIS_URL)
    async_client = redis.asyncio.Redis.from_url(REDIS_URL)
    engine = create_async_engine(_PG)
    try:
        for cls in (jobfence.AsyncLocks, jobfence.AsyncInbox):
            with pytest.raises(ConfigurationError, match="needs an asyncio client") as err:
                cls(sync_client)
            assert err.value.argument == "url"
        with pytest.raises(ConfigurationError, match="pass it to AsyncQueue"):
            jobfence.Queue(async_client, "q")
        with pytest.raises(ConfigurationError, match="pass it to AsyncLocks"):
            jobfence.Locks(engine)
        pool = psycopg_pool.ConnectionPool(POSTGRES_URL, open=False)
        with pytest.raises(ConfigurationError, match="pass it to Inbox"):
            jobfence.AsyncInbox(pool)
    finally:
        sync_client.close()
        await async_client.aclose()
        await engine.dispose()


def test_objects_that_are_no_client_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="non-empty URL string, or a client") as err:
        jobfence.Locks(42)  # type: ignore[arg-type]
    assert err.value.argument == "url"
    with pytest.raises(ConfigurationError, match="in-memory"):
        jobfence.Locks(sqlalchemy.create_engine("sqlite://"))
    with pytest.raises(ConfigurationError, match="has no queue part"):
        jobfence.Queue(sqlalchemy.create_engine(_MY), "q")


def test_a_factory_must_return_a_psycopg_connection(tmp_path: Path) -> None:
    with (
        jobfence.Locks(lambda: sqlite3.connect(tmp_path / "x.db")) as locks,
        pytest.raises(ConfigurationError, match="psycopg"),
    ):
        locks.try_acquire("job")


# -- PostgreSQL ---------------------------------------------------------------------------------
@pytest.fixture
def pg_prefix() -> Iterator[str]:
    prefix = _prefix()
    yield prefix
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        for table in ("locks", "lock_tokens", "lock_queue", "schema", "inbox", "queue"):
            admin.execute(f'DROP TABLE IF EXISTS "{prefix}_{table}"')


def test_psycopg_pool_serves_every_part_and_gets_its_connections_back(pg_prefix: str) -> None:
    with psycopg_pool.ConnectionPool(POSTGRES_URL, min_size=1, max_size=4) as pool:
        use_all(pool, pg_prefix)
        with jobfence.Locks(pool, namespace=pg_prefix, mode="session") as locks:
            use_locks(locks)
        assert not pool.closed
        with pool.connection() as conn:  # as the caller configured it: not autocommit
            assert conn.autocommit is False
        _until(lambda: pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"])


async def test_async_psycopg_pool_serves_every_part(pg_prefix: str) -> None:
    async with psycopg_pool.AsyncConnectionPool(POSTGRES_URL, min_size=1, max_size=4) as pool:
        await ause_all(pool, pg_prefix)
        async with jobfence.AsyncLocks(pool, namespace=pg_prefix, mode="session") as locks:
            await ause_locks(locks)
        assert not pool.closed
        async with pool.connection() as conn:
            assert conn.autocommit is False


def test_connection_factory_serves_every_part(pg_prefix: str) -> None:
    opened: list[psycopg.Connection[Any]] = []

    def factory() -> psycopg.Connection[Any]:
        opened.append(psycopg.connect(POSTGRES_URL))
        return opened[-1]

    use_all(factory, pg_prefix)
    assert opened and all(conn.closed for conn in opened)  # a factory's connections are ours


async def test_async_connection_factory_serves_every_part(pg_prefix: str) -> None:
    async def factory() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(POSTGRES_URL)

    await ause_all(factory, pg_prefix)


def test_sqlalchemy_engine_on_postgresql(pg_prefix: str) -> None:
    engine = sqlalchemy.create_engine(_PG, pool_size=3)
    try:
        use_all(engine, pg_prefix)
        with jobfence.Locks(engine, namespace=pg_prefix, mode="session") as locks:
            use_locks(locks)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            assert conn.connection.driver_connection.autocommit is False
        _until(lambda: engine.pool.checkedout() == 0)  # type: ignore[attr-defined]
    finally:
        engine.dispose()


async def test_async_sqlalchemy_engine_on_postgresql(pg_prefix: str) -> None:
    engine = create_async_engine(_PG)
    try:
        await ause_all(engine, pg_prefix)
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            assert raw.driver_connection.autocommit is False
    finally:
        await engine.dispose()


# -- MySQL / MariaDB ----------------------------------------------------------------------------
@pytest.fixture
def my_prefix() -> Iterator[str]:
    import pymysql

    prefix = _prefix()
    yield prefix
    conn = pymysql.connect(**mysql_params(), autocommit=True)
    try:
        with conn.cursor() as cur:
            for table in ("locks", "lock_tokens", "schema", "inbox"):
                cur.execute(f"DROP TABLE IF EXISTS `{prefix}_{table}`")
    finally:
        conn.close()


def test_sqlalchemy_engine_on_mysql(my_prefix: str) -> None:
    engine = sqlalchemy.create_engine(_MY, connect_args=MYSQL_FLAGS)
    try:
        use_all(engine, my_prefix, queue=False)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            assert conn.connection.driver_connection.get_autocommit() is False
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        engine.dispose()


async def test_async_sqlalchemy_engine_on_mysql(my_prefix: str) -> None:
    engine = create_async_engine(_MY_ASYNC, connect_args=MYSQL_FLAGS)
    try:
        await ause_all(engine, my_prefix, queue=False)
    finally:
        await engine.dispose()


def test_mysql_inbox_refuses_an_engine_without_the_client_flags(my_prefix: str) -> None:
    engine = sqlalchemy.create_engine(_MY)
    inbox = jobfence.Inbox(engine, table=my_prefix + "_inbox")
    try:
        with pytest.raises(ConfigurationError, match="MULTI_STATEMENTS"):
            inbox.claim("k")
    finally:
        inbox.close()
        engine.dispose()


# -- SQLite ---------------------------------------------------------------------------------------
def test_sqlalchemy_engine_on_sqlite(tmp_path: Path) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    try:
        use_all(engine, _prefix())
        with jobfence.Locks(engine) as locks:
            assert locks.backend.path == str(tmp_path / "app.db")  # the engine's file
    finally:
        engine.dispose()


async def test_async_sqlalchemy_engine_on_sqlite(tmp_path: Path) -> None:
    engine: AsyncEngine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    try:
        await ause_all(engine, _prefix())
    finally:
        await engine.dispose()


# -- redis-py compatible Lock over a caller's client ---------------------------------------------
@pytest.fixture
async def aredis() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    yield client
    await jobfence.compat.redis_py.asyncio.close_locks(client)
    await client.aclose()


async def test_asyncio_redis_py_lock_hands_over_in_arrival_order(
    aredis: redis.asyncio.Redis, prefix: str
) -> None:
    from jobfence.compat.redis_py.asyncio import Lock

    name = prefix + ":lock"
    holder = aredis.lock(name, timeout=10, lock_class=Lock)
    assert await holder.acquire(blocking=False)
    order: list[int] = []

    async def wait(i: int) -> None:
        lock = aredis.lock(name, timeout=10, blocking_timeout=10, lock_class=Lock)
        assert await lock.acquire()
        order.append(i)
        await lock.release()

    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(wait(i)))
        await _auntil(lambda i=i: _queued(aredis, name, i + 1))
    first = holder.fencing_token
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert first is not None


def test_redis_py_locks_and_jobfence_locks_exclude_each_other(prefix: str) -> None:
    """During a rolling move, old workers (redis-py's Lock) and new ones (jobfence's) lock
    the same key: neither takes a lock the other holds."""
    import redis.lock

    client = redis.Redis.from_url(REDIS_URL)
    try:
        name = prefix + ":shared"
        theirs = client.lock(name, lock_class=redis.lock.Lock)  # never expires
        assert theirs.acquire(blocking=False)
        ours = client.lock(name, timeout=10, sleep=0.05, lock_class=RedisPyLock)
        assert not ours.acquire(blocking_timeout=0.5)  # waits, in vain
        theirs.release()
        assert ours.acquire(blocking=False)
        assert not client.lock(name, lock_class=redis.lock.Lock).acquire(blocking=False)
        ours.release()
        close_locks(client)
    finally:
        client.close()


async def _queued(client: Any, name: str, count: int) -> bool:
    return int(await client.zcard(name + ":q")) >= count


def _until(predicate: Any, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


async def _auntil(predicate: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
