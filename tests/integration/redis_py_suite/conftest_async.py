"""The fixtures redis-py's ``tests/test_asyncio/test_lock.py`` uses (``r``,
``create_redis``), on the disposable Redis server of ``JOBFENCE_REDIS_PY_URL``; copied as
``tests/test_asyncio/conftest.py`` by ``tests/integration/test_redis_py_lock_suite.py``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio
import redis.asyncio

import jobfence.compat.redis_py.asyncio

URL = os.environ["JOBFENCE_REDIS_PY_URL"]


@pytest_asyncio.fixture()
async def create_redis() -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    clients: list[Any] = []

    async def create(url: str | None = None, flushdb: bool = True, **kwargs: Any) -> Any:
        client = redis.asyncio.Redis.from_url(url or URL, **kwargs)
        clients.append((client, flushdb))
        return client

    yield create
    for client, flushdb in clients:
        await jobfence.compat.redis_py.asyncio.close_locks(client)
        if flushdb:
            await client.flushdb()
        await client.aclose()


@pytest_asyncio.fixture()
async def r(create_redis: Callable[..., Awaitable[Any]]) -> Any:
    return await create_redis()
