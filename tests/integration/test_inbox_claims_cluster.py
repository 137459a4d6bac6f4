"""``Inbox.claims()`` / ``claim_info()`` / ``forget()`` on a Redis Cluster given as the caller's
client: the records of one table lie in many hash slots, on every primary."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.cluster import key_slot

import jobfence
from jobfence import ClaimLost, ClaimState
from tests.integration._redis_cluster import RedisCluster

pytestmark = pytest.mark.timeout(120)

KEYS = [f"order:{n}" for n in range(40)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


def test_listing_reads_every_primary(cluster: RedisCluster) -> None:
    table = "cl_" + uuid.uuid4().hex[:8]
    slots = {key_slot(f"{table}:{key}".encode()) for key in KEYS}
    assert len(slots) > 10  # spread over the cluster
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        with jobfence.Inbox(client, table=table) as inbox:
            claims = {key: inbox.claim(key, ttl=60) for key in KEYS}
            for key in KEYS[:10]:
                claims[key].complete(key)
            listed = inbox.claims(limit=1000)
            assert [info.key for info in listed] == sorted(KEYS)
            done = inbox.claims(state=ClaimState.COMPLETED, limit=1000)
            assert [info.key for info in done] == sorted(KEYS[:10])
            assert [i.key for i in inbox.claims(prefix="order:3")] == [
                "order:3",
                *(f"order:{n}" for n in range(30, 40)),
            ]
            info = inbox.claim_info("order:39")
            assert info is not None and info.owner == claims["order:39"].owner
            assert info.claimed_at is not None and 0 < info.expires_in <= 60
            assert inbox.forget("order:39") and inbox.claim_info("order:39") is None
            with pytest.raises(ClaimLost):
                claims["order:39"].complete("lost")
            inbox.drop()
    finally:
        client.close()


def test_the_async_inbox_lists_a_cluster_too(cluster: RedisCluster) -> None:
    table = "cla_" + uuid.uuid4().hex[:8]

    async def main() -> list[str]:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        try:
            async with jobfence.AsyncInbox(client, table=table) as inbox:
                for key in KEYS:
                    await inbox.claim(key, ttl=60)
                listed = [info.key for info in await inbox.claims(limit=1000)]
                await inbox.drop()
                return listed
        finally:
            await client.aclose()

    assert asyncio.run(main()) == sorted(KEYS)


def test_concurrent_claims_and_completions_are_batched_per_hash_slot(cluster: RedisCluster) -> None:
    """The group commit on a cluster: one batch of keys in many slots goes as one script call
    per slot (a script may only touch keys of one slot), and each key gets its own answer."""
    table = "clb_" + uuid.uuid4().hex[:8]

    async def main() -> None:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        try:
            async with jobfence.AsyncInbox(client, table=table) as inbox:
                first = await inbox.claim(KEYS[0], ttl=60)
                claims = await asyncio.gather(*(inbox.claim(key, ttl=60) for key in KEYS))
                assert claims[0].state is ClaimState.IN_PROGRESS
                assert claims[0].owner == first.owner
                assert [c.state for c in claims[1:]] == [ClaimState.NEW] * (len(KEYS) - 1)
                await asyncio.gather(*(c.complete({"key": c.key}) for c in claims[1:]))
                await first.complete({"key": KEYS[0]})
                assert inbox._claims is not None and inbox._claims.flushes <= 3
                replays = await asyncio.gather(*(inbox.claim(key) for key in KEYS))
                assert [r.state for r in replays] == [ClaimState.COMPLETED] * len(KEYS)
                assert [r.result for r in replays] == [{"key": key} for key in KEYS]
                await inbox.drop()
        finally:
            await client.aclose()

    asyncio.run(main())
