"""Addresses of the real services the test suite talks to (override with environment variables)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

REDIS_URL = os.environ.get("JOBFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "JOBFENCE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("JOBFENCE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
RABBITMQ_URL = os.environ.get("JOBFENCE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def mysql_params() -> dict[str, Any]:
    """PyMySQL keyword arguments for MYSQL_URL (aiomysql spells ``database`` as ``db``)."""
    u = urlsplit(MYSQL_URL)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
        "database": u.path.lstrip("/") or "test",
    }


def delete_redis_keys(pattern: str, url: str = REDIS_URL) -> None:
    """Delete every key matching ``pattern`` (a test's namespace) with SCAN, never KEYS."""
    import redis

    client = redis.Redis.from_url(url.split("?", 1)[0])
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
