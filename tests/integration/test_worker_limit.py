"""A worker whose handler is ``guarded(limit=...)``: a message over its tenant's limit is
deferred ("not now") and comes back after a holder's lease, never counted as a failure,
never dead-lettered; at most ``limit`` handlers of one tenant run at once. Real Redis (queue
and locks)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import jobfence
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(90)

MESSAGES = 6
LIMIT = 2


def test_messages_over_a_tenants_limit_are_deferred_not_failed() -> None:
    namespace = f"jf-wlimit-{uuid.uuid4().hex[:10]}"

    async def main() -> tuple[jobfence.WorkerStats, int, list[str]]:
        inside: dict[str, int] = {}
        most = 0
        done: list[str] = []
        all_done = asyncio.Event()
        async with jobfence.AsyncLocks(REDIS_URL, namespace=namespace) as locks:
            queue = jobfence.AsyncQueue(REDIS_URL, namespace)
            try:
                await queue.install()

                @jobfence.guarded(
                    locks=locks, limit=("tenant:{message.body[tenant]}", LIMIT), ttl=2
                )
                async def handle(message: jobfence.AsyncMessage) -> None:
                    nonlocal most
                    tenant = message.body["tenant"]
                    inside[tenant] = inside.get(tenant, 0) + 1
                    most = max(most, inside[tenant])
                    await asyncio.sleep(0.3)  # the work: long enough for the others to arrive
                    inside[tenant] -= 1
                    done.append(message.body["n"])
                    if len(done) == MESSAGES:
                        all_done.set()

                for n in range(MESSAGES):
                    await queue.publish({"tenant": "acme", "n": str(n)})
                worker = jobfence.AsyncWorker(
                    queue, handle, concurrency=MESSAGES, handle_signals=False
                )
                running = asyncio.ensure_future(worker.run())
                await asyncio.wait_for(all_done.wait(), 60)
                worker.stop()
                stats = await running
                assert await locks.holders("tenant:") == []  # every lease given back
                return stats, most, done
            finally:
                await queue.drop()
                await queue.close()

    try:
        stats, most, done = asyncio.run(main())
    finally:
        delete_redis_keys(f"{namespace}*")
    assert most == LIMIT  # never more than the limit at once, and the limit was reached
    assert sorted(done) == [str(n) for n in range(MESSAGES)]  # each ran once
    assert stats.deferred >= MESSAGES - LIMIT  # those over the limit were "not now"
    assert stats.retried == 0 and stats.dead_lettered == 0  # never a failure
