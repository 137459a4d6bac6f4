"""What every peer's no-op task does: count itself on Redis, the first and the last stamp the
time. The same body for every system, so the harness can time the drain from the first task to
the last (the worker's start-up is not counted) whatever runs it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

REDIS_URL = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0")
KEY = os.environ.get("PEER_KEY", "peer:none")
N = int(os.environ.get("PEER_N", "0"))

_local = threading.local()
_async_clients: dict[int, Any] = {}


def _client() -> Any:
    client = getattr(_local, "client", None)
    if client is None:
        import redis

        client = _local.client = redis.Redis.from_url(REDIS_URL)
    return client


def tick() -> None:
    """The blocking task body."""
    _stamp(_client().incr(KEY), _client())


async def atick() -> None:
    """The asyncio task body (one redis.asyncio client per event loop)."""
    import asyncio

    import redis.asyncio as aredis

    loop = id(asyncio.get_running_loop())
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = aredis.Redis.from_url(REDIS_URL)
    n = await client.incr(KEY)
    if n == 1:
        await client.set(KEY + ":t0", repr(time.time()))
    if n == N:
        await client.set(KEY + ":t1", repr(time.time()))


def _stamp(n: int, client: Any) -> None:
    if n == 1:
        client.set(KEY + ":t0", repr(time.time()))
    if n == N:
        client.set(KEY + ":t1", repr(time.time()))
