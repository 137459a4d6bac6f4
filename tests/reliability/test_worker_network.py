"""The worker through a faulty link (a loopback proxy in front of the server): connections
reset mid-run and a stalled link. Receives, acks and renewals fail for a while; the worker
logs, carries on, and every message's effect happens exactly once (a guarded handler keyed on
the message id; redeliveries of messages whose ack was lost are duplicates)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import jobfence
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

pytestmark = pytest.mark.timeout(180)

SERVERS = {
    "redis": (REDIS_URL, 6379),
    "postgres": (POSTGRES_URL, 5432),
    "rabbitmq": (RABBITMQ_URL, 5672),
}


@pytest.mark.parametrize("server", sorted(SERVERS))
async def test_resets_and_a_stall_lose_no_message_and_repeat_no_effect(server: str) -> None:
    url, port = SERVERS[server]
    name = "net-" + uuid.uuid4().hex[:10]
    n = 150
    publisher = jobfence.AsyncQueue(url, name)
    await publisher.publish_many([{"i": i} for i in range(n)], ids=[f"m{i}" for i in range(n)])
    effects: list[str] = []
    inbox = jobfence.AsyncInbox(f"memory://{name}")

    @jobfence.guarded(inbox=inbox)
    async def handler(message: Any) -> None:
        await asyncio.sleep(0.005)
        effects.append(message.id)

    with FaultProxy(port) as proxy:
        queue = jobfence.AsyncQueue(proxy.url_for(url, port), name, visibility=2, timeout=1)
        worker = jobfence.AsyncWorker(queue, handler, concurrency=4, backoff=0.05)
        running = asyncio.ensure_future(worker.run())
        deadline = time.monotonic() + 120

        async def until(count: int) -> None:
            while len(set(effects)) < count:
                assert time.monotonic() < deadline, (len(set(effects)), worker.stats)
                assert not running.done(), running
                await asyncio.sleep(0.01)

        await until(30)
        proxy.reset()  # every connection dropped mid-run
        await until(60)
        proxy.stall()  # the link hangs past the client's timeout
        await asyncio.sleep(1.5)
        proxy.resume()
        await until(90)
        proxy.reset()
        await until(n)
        # drained: a message whose ack was lost comes back after its visibility and is
        # acked as a duplicate
        while True:
            counts = await publisher.stats()
            if counts.ready in (0, None) and counts.in_flight in (0, None):
                break
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.05)
        worker.stop()
        stats = await asyncio.wait_for(running, 60)
        await queue.close()
    assert sorted(effects) == sorted(f"m{i}" for i in range(n))  # each effect exactly once
    # (an ack whose reply was lost may still have been applied: processed counts only the
    # acks that were answered, so it may be below n)
    assert stats.received >= n and stats.in_flight == 0
    assert stats.dead_lettered == 0
    await publisher.drop()
    await publisher.close()
    await inbox.close()
