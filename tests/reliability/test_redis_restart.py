"""The Redis lock backend when its server dies, restarts empty, or is not there at all.

Every test runs its own disposable redis-server (no persistence), never the shared one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis

import jobfence
from tests.reliability._redis_server import RedisServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def test_tokens_keep_increasing_after_a_restart_that_lost_the_data(server: RedisServer) -> None:
    with jobfence.Locks(server.url, namespace="rs") as locks:
        before = []
        for _ in range(3):
            lease = locks.try_acquire("job", ttl=10)
            assert lease is not None
            before.append(lease.token)
            assert lease.release()
        assert before == sorted(before)

        server.restart()
        probe = redis.Redis.from_url(server.url)
        assert probe.dbsize() == 0  # the counter is gone, and so are the loaded scripts
        probe.close()

        # the same client reconnects, reloads its scripts (NOSCRIPT) and reseeds the counter
        lease = locks.try_acquire("job", ttl=10)
        assert lease is not None
        assert lease.token > before[-1]
        assert lease.release()


async def test_async_tokens_keep_increasing_after_a_restart(server: RedisServer) -> None:
    async with jobfence.AsyncLocks(server.url, namespace="rs") as locks:
        lease = await locks.try_acquire("job", ttl=10)
        assert lease is not None
        first = lease.token
        await lease.release()
        server.restart()
        lease = await locks.try_acquire("job", ttl=10)
        assert lease is not None and lease.token > first
        await lease.release()


def test_lease_is_marked_lost_when_the_server_dies(server: RedisServer) -> None:
    ttl = 1.0
    with jobfence.Locks(server.url, namespace="rs") as locks:
        lease = locks.try_acquire("job", ttl=ttl)  # renew=True by default
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        killed = time.monotonic()
        server.kill()
        assert lost.wait(ttl * 3), "on_lost was not called"
        # noticed once the last renewal's ttl ran out, not long after
        assert time.monotonic() - killed < ttl * 3
        assert lease.lost
        with pytest.raises(jobfence.LockLost):
            lease.check()
        with pytest.raises(jobfence.LockLost):
            lease.extend()


def test_lease_is_marked_lost_when_the_server_restarts_empty(server: RedisServer) -> None:
    with jobfence.Locks(server.url, namespace="rs") as locks:
        lease = locks.try_acquire("job", ttl=0.6)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        server.restart()  # the lease key is gone: the next renewal finds it missing
        assert lost.wait(3), "on_lost was not called"
        with pytest.raises(jobfence.LockLost) as info:
            lease.check()
        assert "gone" in str(info.value) or "ttl ran out" in str(info.value)
        # meanwhile someone else may take the name, with a larger token
        other = locks.try_acquire("job", ttl=5)
        assert other is not None and other.token > lease.token
        other.release()


async def test_async_lease_is_marked_lost_when_the_server_dies(server: RedisServer) -> None:
    async with jobfence.AsyncLocks(server.url, namespace="rs") as locks:
        lease = await locks.try_acquire("job", ttl=0.6)
        assert lease is not None
        lost = asyncio.Event()
        lease.on_lost(lambda _lease: lost.set())
        server.kill()
        await asyncio.wait_for(lost.wait(), 3)
        with pytest.raises(jobfence.LockLost):
            lease.check()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_unreachable_server_is_a_backend_error_without_the_password(flavour: str) -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    if flavour == "sync":
        locks = jobfence.Locks(url, namespace="rs")
        with pytest.raises(jobfence.BackendError) as info:
            locks.try_acquire("job")
        locks.close()
    else:
        alocks = jobfence.AsyncLocks(url, namespace="rs")
        with pytest.raises(jobfence.BackendError) as info:
            await alocks.try_acquire("job")
        await alocks.close()
    assert time.monotonic() - started < 5  # one quick retry, not a long backoff
    err = info.value
    assert isinstance(err.__cause__, redis.ConnectionError)
    assert err.backend == "redis" and err.operation == "lock.acquire"
    assert "secret" not in str(err) and "secret" not in repr(err)
    assert "***" in str(err)
    assert "secret" not in str(err.__cause__)
    assert "127.0.0.1" in str(err)


def test_tokens_keep_increasing_after_a_restart_from_an_older_snapshot(
    server: RedisServer,
) -> None:
    """A restart (or failover) that restores an OLDER counter must not reissue tokens."""
    import redis

    locks = jobfence.Locks(server.url, namespace="snap")
    try:
        first = locks.try_acquire("inventory:7", ttl=30, renew=False)
        assert first is not None and first.release()
        client = redis.Redis.from_url(server.url)
        client.save()  # the snapshot holds the counter as it is now
        client.close()
        later = []
        for _ in range(5):
            lease = locks.try_acquire("inventory:7", ttl=30, renew=False)
            assert lease is not None and lease.release()
            later.append(lease.token)
        server.restart()  # SIGKILL + start: loads the older snapshot
        client = redis.Redis.from_url(server.url)
        restored = int(client.get("snap:lock:{inventory:7}:tok") or 0)
        client.close()
        assert restored == first.token < later[-1]  # the counter really went back
        after = locks.try_acquire("inventory:7", ttl=30, renew=False)
        assert after is not None
        assert after.token > later[-1], (first.token, later, after.token)
    finally:
        locks.close()
