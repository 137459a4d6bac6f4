"""Run one test body against the sync and the async API (the queue suite).

Its tests are written once, as ``async def``; the ``sync`` flavour runs every call of the sync
``Queue``/``Message`` in a worker thread (``asyncio.to_thread``), so both twins are exercised
by exactly the same assertions. (The lock and inbox suites are generated as plain sync code
instead: ``tools/conformance_twins.py``.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import jobfence


class MessageW:
    """An AsyncMessage or Message behind one awaitable interface."""

    def __init__(self, message: Any, sync: bool) -> None:
        self.message = message
        self.sync = sync

    def __getattr__(self, item: str) -> Any:
        return getattr(self.message, item)

    async def _do(self, name: str, *args: Any, **kw: Any) -> Any:
        fn = getattr(self.message, name)
        if self.sync:
            return await asyncio.to_thread(lambda: fn(*args, **kw))
        return await fn(*args, **kw)

    async def ack(self) -> None:
        await self._do("ack")

    async def nack(self, delay: float = 0.0, error: Any = None) -> bool:
        return bool(await self._do("nack", delay, error))

    async def defer(self, delay: float = 0.0) -> bool:
        return bool(await self._do("defer", delay))

    async def dead_letter(self, error: Any = None) -> bool:
        return bool(await self._do("dead_letter", error))

    async def extend(self, visibility: float | None = None) -> None:
        await self._do("extend", visibility)


class QueueW:
    """A Queue or AsyncQueue behind one awaitable interface."""

    def __init__(self, url: str, name: str, sync: bool, **options: Any) -> None:
        self.sync = sync
        cls = jobfence.Queue if sync else jobfence.AsyncQueue
        self.queue: Any = cls(url, name, **options)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.queue, item)

    async def _do(self, name: str, *args: Any, **kw: Any) -> Any:
        fn = getattr(self.queue, name)
        if self.sync:
            return await asyncio.to_thread(lambda: fn(*args, **kw))
        return await fn(*args, **kw)

    async def publish(self, body: Any, **kw: Any) -> str:
        return str(await self._do("publish", body, **kw))

    async def publish_many(self, bodies: Any, **kw: Any) -> list[str]:
        return list(await self._do("publish_many", bodies, **kw))

    async def receive(self, max_messages: int = 1, **kw: Any) -> list[MessageW]:
        got = await self._do("receive", max_messages, **kw)
        return [MessageW(m, self.sync) for m in got]

    async def stats(self) -> Any:
        return await self._do("stats")

    async def dead_letters(self, limit: int = 100) -> Any:
        return await self._do("dead_letters", limit)

    async def requeue_dead(self, ids: Any = None) -> int:
        return int(await self._do("requeue_dead", ids))

    async def purge(self) -> int:
        return int(await self._do("purge"))

    async def claims(self, **kw: Any) -> list[jobfence.ClaimInfo]:
        return list(await self._do("claims", **kw))

    async def claim_info(self, key: str) -> jobfence.ClaimInfo | None:
        info: jobfence.ClaimInfo | None = await self._do("claim_info", key)
        return info

    async def forget(self, key: str) -> bool:
        return bool(await self._do("forget", key))

    async def drop(self) -> None:
        await self._do("drop")

    async def close(self) -> None:
        await self._do("close")
