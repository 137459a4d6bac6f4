"""``AsyncLocks.close()`` racing with the client's own leases and waiters (found in review):
a release during close must not leave the lease held, and a waiter whose hand-off arrives
as the client closes must not end up with a lease close() already gave back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield f"memory://{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'locks.db'}"
    else:
        yield REDIS_URL


@pytest.fixture
def ns() -> Iterator[str]:
    namespace = "cr" + uuid.uuid4().hex[:10]
    yield namespace
    delete_redis_keys(f"{namespace}:*")


async def test_a_release_during_close_still_frees_the_lease(url: str, ns: str) -> None:
    locks = jobfence.AsyncLocks(url, namespace=ns)
    other = jobfence.AsyncLocks(url, namespace=ns)
    try:
        blocker = await other.try_acquire("busy", ttl=30)
        lease = await locks.try_acquire("x", ttl=30)
        assert blocker is not None and lease is not None
        waiter = asyncio.ensure_future(locks.acquire("busy", ttl=30, timeout=10))
        await asyncio.sleep(0.2)  # the waiter is queued: close() will have work to await
        closing = asyncio.ensure_future(locks.close())
        await asyncio.sleep(0)  # close() has begun
        assert await lease.release() is False  # close() gives it back
        await closing
        with pytest.raises(jobfence.JobfenceError):
            await waiter
        again = await other.try_acquire("x", ttl=30)  # free, not held for 30 s
        assert again is not None and again.token > lease.token
        await again.release()
        await blocker.release()
    finally:
        await locks.close()
        await other.close()


async def test_a_hand_off_arriving_as_the_client_closes_is_given_back(url: str, ns: str) -> None:
    locks = jobfence.AsyncLocks(url, namespace=ns, poll_interval=0.05)
    other = jobfence.AsyncLocks(url, namespace=ns)
    try:
        holder = await other.try_acquire("busy", ttl=30)
        assert holder is not None
        gate = asyncio.Event()
        handed = asyncio.Event()
        backend = locks.backend

        def slow(original: Any) -> Any:
            async def slow_reply(*args: Any, **kwargs: Any) -> Any:
                token = await original(*args, **kwargs)
                if token is not None and not handed.is_set():  # the first token's reply is
                    handed.set()  # "in flight" while close() runs
                    await gate.wait()
                return token

            return slow_reply

        await asyncio.sleep(0)
        backend.wait = slow(backend.wait)  # type: ignore[method-assign]
        original_acquire = backend.acquire

        async def acquire(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("wait") is None:
                return await original_acquire(*args, **kwargs)
            return await slow(original_acquire)(*args, **kwargs)

        backend.acquire = acquire  # type: ignore[method-assign]
        waiter = asyncio.ensure_future(locks.acquire("busy", ttl=30, timeout=10))
        await asyncio.sleep(0.2)  # queued behind the holder
        await holder.release()  # hand-off (or a free lease) for the waiter
        await asyncio.wait_for(handed.wait(), 10)
        await locks.close()
        gate.set()
        try:
            lease = await waiter
        except jobfence.JobfenceError:
            pass  # refused: its client is closed
        else:
            assert not lease.held  # never a lease that looks held after close gave it back
            with pytest.raises(jobfence.LockLost):
                lease.check()
        third = await other.try_acquire("busy", ttl=30)
        assert third is not None  # nobody else holds it
        await third.release()
    finally:
        await locks.close()
        await other.close()
