"""The fixtures redis-py's ``tests/test_lock.py`` uses, on a disposable Redis server, with
redis-py's ``Lock`` replaced by ``jobfence.compat.redis_py.Lock``.

Copied as ``tests/conftest.py`` next to redis-py's test file (downloaded at test time, never
committed) by ``tests/integration/test_redis_py_lock_suite.py``; the server's URL comes in
``JOBFENCE_REDIS_PY_URL``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis.asyncio.lock
import redis.lock

import jobfence.compat.redis_py
import jobfence.compat.redis_py.asyncio

# the test modules import ``Lock`` from these modules after this file is loaded
redis.lock.Lock = jobfence.compat.redis_py.Lock  # type: ignore[misc]
redis.asyncio.lock.Lock = jobfence.compat.redis_py.asyncio.Lock  # type: ignore[misc]

URL = os.environ["JOBFENCE_REDIS_PY_URL"]


def _get_client(
    cls: Any,
    request: Any,
    single_connection_client: bool = True,
    flushdb: bool = True,
    from_url: str | None = None,
    **kwargs: Any,
) -> Any:
    """redis-py's ``_get_client``: a client of ``cls`` on the test server, flushed and closed (with
    the jobfence client kept for it) when the test ends."""
    client = cls.from_url(from_url or URL, **kwargs)

    def teardown() -> None:
        jobfence.compat.redis_py.close_locks(client)
        if flushdb:
            client.flushdb()
        client.close()

    request.addfinalizer(teardown)
    return client


@pytest.fixture()
def r(request: Any) -> Any:
    return _get_client(redis.Redis, request)
