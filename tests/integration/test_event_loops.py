"""One async client for the process, one event loop per job: ``asyncio.run`` once per task
(Celery's and RQ's way to run a coroutine), with an ``AsyncLocks``, ``AsyncInbox`` or
``AsyncQueue`` made once at import. Each job must work on its own loop, though the client's
pooled connections were opened on a loop that is closed by then; and the client must close
from yet another loop.

Every backend of each part, on the real servers."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import ClaimState
from tests.conformance.specs import (
    INBOX,
    LOCKS,
    QUEUE,
    Spec,
    inbox_table,
    new_namespace,
    spec_params,
)

JOBS = 3


def _run_jobs(job: Any) -> list[Any]:
    """``job(n)`` under ``asyncio.run``, once per job, as a task runner would."""
    return [asyncio.run(job(n)) for n in range(JOBS)]


@pytest.mark.parametrize("spec", spec_params(LOCKS))
def test_async_locks_serve_one_event_loop_after_another(spec: Spec, tmp_path: Path) -> None:
    url, namespace = spec.make_url(tmp_path), new_namespace()
    locks = jobfence.AsyncLocks(url, namespace=namespace)
    try:

        async def job(n: int) -> tuple[bool, bool]:
            async with await locks.acquire(f"job:{n}", ttl=10) as lease:
                busy = await locks.try_acquire(f"job:{n}", ttl=10)
                held = await locks.holder(f"job:{n}")
                assert held is not None and held.token == lease.token
            return busy is None, await locks.holder(f"job:{n}") is None

        assert _run_jobs(job) == [(True, True)] * JOBS
    finally:
        asyncio.run(locks.close())
        spec.cleanup(url, namespace)


@pytest.mark.parametrize("spec", spec_params(INBOX))
def test_an_async_inbox_serves_one_event_loop_after_another(spec: Spec, tmp_path: Path) -> None:
    url, namespace = spec.make_url(tmp_path), new_namespace()
    inbox = jobfence.AsyncInbox(url, table=inbox_table(namespace))
    try:

        async def job(n: int) -> list[Any]:
            claims = await asyncio.gather(*(inbox.claim(f"job:{n}:{i}") for i in range(4)))
            await asyncio.gather(*(c.complete({"n": n, "i": i}) for i, c in enumerate(claims)))
            replay = await inbox.claim(f"job:{n}:3")
            assert replay.state is ClaimState.COMPLETED
            return [c.state for c in claims] + [replay.result]

        assert _run_jobs(job) == [
            [ClaimState.COMPLETED] * 4 + [{"n": n, "i": 3}] for n in range(JOBS)
        ]

        async def drop() -> None:
            await inbox.drop()
            await inbox.close()

        asyncio.run(drop())
    finally:
        spec.cleanup(url, namespace)


# aio-pika leaves callbacks of the closed loops' connection behind; they are collected (below)
# with an "exception ignored", which is aio-pika's and says nothing of the test
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("spec", spec_params(QUEUE))
def test_an_async_queue_serves_one_event_loop_after_another(spec: Spec, tmp_path: Path) -> None:
    url, name = spec.make_url(tmp_path), new_namespace()
    queue = jobfence.AsyncQueue(url, name)
    try:

        async def job(n: int) -> Any:
            await queue.publish({"n": n})
            got = await queue.receive(1, wait=5)
            assert len(got) == 1
            await got[0].ack()
            return got[0].body

        with warnings.catch_warnings():
            # aio-pika's callbacks of a closed loop's connection are collected with a warning
            warnings.simplefilter("ignore", ResourceWarning)
            assert _run_jobs(job) == [{"n": n} for n in range(JOBS)]

        async def drop() -> None:
            await queue.drop()
            await queue.close()

        asyncio.run(drop())
        gc.collect()  # here, where the warning filter above applies
    finally:
        spec.cleanup(url, name)
