"""Worker for the mutual-exclusion conformance test (runs in a spawned process or a thread)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jobfence


def _critical(counter: Path) -> int:
    value = int(counter.read_text() or "0")
    time.sleep(0.002)  # widen the race window: read, pause, write
    counter.write_text(str(value + 1))
    return value


def run(
    url: str,
    namespace: str,
    name: str,
    counter: str,
    iterations: int,
    flavour: str,
    start: Any,
    results: Any,
) -> None:
    path = Path(counter)
    start.wait()
    holds: list[tuple[int, int]] = []
    if flavour == "sync":
        with jobfence.Locks(url, namespace=namespace) as locks:
            for _ in range(iterations):
                with locks.acquire(name, ttl=10, timeout=60) as lease:
                    holds.append((_critical(path), lease.token))
    else:

        async def main() -> None:
            async with jobfence.AsyncLocks(url, namespace=namespace) as locks:
                for _ in range(iterations):
                    async with locks.acquire(name, ttl=10, timeout=60) as lease:
                        holds.append((_critical(path), lease.token))

        asyncio.run(main())
    results.put(holds)
