"""arq's worker settings for the worker comparison (its defaults: 10 jobs at once)."""

from __future__ import annotations

import os
from typing import Any

import peer_common
from arq.connections import RedisSettings


async def tick(ctx: dict[str, Any]) -> None:
    await peer_common.atick()


class WorkerSettings:
    functions = [tick]
    redis_settings = RedisSettings.from_dsn(
        os.environ.get("PEER_BROKER", "redis://127.0.0.1:6379/0")
    )
    queue_name = os.environ.get("PEER_QUEUE", "peer")
    keep_result = 0
    burst = True
