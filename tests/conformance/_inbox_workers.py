"""Worker processes of the inbox conformance suite (forked: they inherit the test's imports)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import jobfence


def _exit(out: Any, code: int) -> None:
    """Flush the queue's feeder thread, then leave without running the parent's atexit."""
    out.close()
    out.join_thread()
    os._exit(code)


def claim_worker(url: str, table: str, key: str, sync: bool, barrier: Any, out: Any) -> None:
    """Child process: wait for every sibling, claim ``key`` once, report what it saw."""

    async def run_async() -> tuple[str, str | None, int]:
        inbox = jobfence.AsyncInbox(url, table=table)
        try:
            await inbox.install()  # connect and create up front, so the claims start together
            barrier.wait(timeout=30)
            claim = await inbox.claim(key, ttl=60)
            return claim.state.value, claim.owner, claim.attempt
        finally:
            await inbox.close()

    try:
        if sync:
            inbox = jobfence.Inbox(url, table=table)
            inbox.install()
            barrier.wait(timeout=30)
            claim = inbox.claim(key, ttl=60)
            out.put((claim.state.value, claim.owner, claim.attempt))
            inbox.close()
        else:
            out.put(asyncio.run(run_async()))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put(("error", repr(exc), 0))
    finally:
        _exit(out, 0)


def claim_and_hang(url: str, table: str, key: str, ttl: float, sync: bool, out: Any) -> None:
    """Child process: claim ``key`` with ``ttl``, report, then 'work' until killed."""
    try:
        if sync:
            claim: Any = jobfence.Inbox(url, table=table).claim(key, ttl=ttl)
        else:

            async def go() -> Any:
                return await jobfence.AsyncInbox(url, table=table).claim(key, ttl=ttl)

            claim = asyncio.run(go())
        out.put((claim.state.value, claim.owner, claim.attempt))
    except BaseException as exc:
        out.put(("error", repr(exc), 0))
        _exit(out, 1)
    out.close()
    out.join_thread()  # the report is sent before we hang
    signal.pause()  # mid-work: the parent kills us with SIGKILL
    os._exit(0)
