"""A guarded call refused by a claim that a call of this same process holds (a duplicate
delivered while the first delivery runs in the same worker) asks again after about as long as
that call has run so far, at least half a second, not after the holder's expiry: the holder
renews its claim while it runs, so its expiry is only a bound. A claim held by another process
keeps the expiry as the hint. Real Redis and SQLite, sync and async guards."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence._core.inbox_support import LOCAL_RECHECK, held_here, local_retry_after
from jobfence.errors import ClaimInProgress
from tests.claims import held_elsewhere
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)

TTL = 60.0


@pytest.fixture(params=["redis", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'inbox.db'}"
        return
    yield REDIS_URL


@pytest.fixture
def inbox(url: str) -> Iterator[jobfence.Inbox]:
    table = "jf_local_" + uuid.uuid4().hex[:8]
    box = jobfence.Inbox(url, table=table)
    box.install()
    try:
        yield box
    finally:
        box.drop()
        box.close()
        if url.startswith("redis"):
            delete_redis_keys(f"*{table}*")


def _refusal(call: Any) -> ClaimInProgress:
    with pytest.raises(ClaimInProgress) as info:
        call()
    return info.value


def test_a_claim_of_this_process_is_asked_about_again_soon(inbox: jobfence.Inbox) -> None:
    @jobfence.guarded(inbox=inbox, key="order:{n}")
    def ship(n: int) -> int:
        return n

    before = time.monotonic()
    held = inbox.claim("order:1", ttl=TTL)  # a call of this process is shipping order 1
    refusal = _refusal(lambda: ship(1))
    elapsed = time.monotonic() - before
    assert refusal.retry_after is not None
    # max(half a second, how long the holder has run): far below its expiry (60 s)
    assert LOCAL_RECHECK <= refusal.retry_after <= max(LOCAL_RECHECK, elapsed)
    held.complete(1)
    assert ship(1) == 1  # a duplicate now: the stored result


def test_a_claim_of_another_process_keeps_its_expiry_as_the_hint(inbox: jobfence.Inbox) -> None:
    @jobfence.guarded(inbox=inbox, key="order:{n}")
    def ship(n: int) -> int:
        return n

    before = time.monotonic()
    held = held_elsewhere(inbox.claim("order:2", ttl=TTL))
    refusal = _refusal(lambda: ship(2))
    elapsed = time.monotonic() - before
    assert refusal.retry_after is not None
    assert TTL - elapsed - 2 <= refusal.retry_after <= TTL + 1  # server and local clocks
    held.release()


def test_an_async_guard_sees_a_claim_of_this_process(url: str) -> None:
    async def main() -> float | None:
        table = "jf_local_" + uuid.uuid4().hex[:8]
        box = jobfence.AsyncInbox(url, table=table)
        await box.install()
        try:

            @jobfence.guarded(inbox=box, key="order:{n}")
            async def ship(n: int) -> int:
                return n

            held = await box.claim("order:3", ttl=TTL)
            try:
                with pytest.raises(ClaimInProgress) as info:
                    await ship(3)
            finally:
                await held.release()
            return info.value.retry_after
        finally:
            await box.drop()
            await box.close()
            if url.startswith("redis"):
                delete_redis_keys(f"*{table}*")

    retry_after = asyncio.run(main())
    assert retry_after is not None and retry_after < TTL / 2


def test_the_wait_grows_with_how_long_the_holder_has_run(inbox: jobfence.Inbox) -> None:
    held = inbox.claim("order:4", ttl=TTL)
    owner = held._mine
    started = held._started
    assert started is not None
    assert local_retry_after(owner, started + 0.1) == LOCAL_RECHECK
    assert local_retry_after(owner, started + 7.0) == pytest.approx(7.0)
    held.complete(4)  # finished: no longer held here
    assert local_retry_after(owner, started + 7.0) is None
    assert local_retry_after("someone-else", started) is None
    assert local_retry_after(None, started) is None


def test_a_forked_child_holds_none_of_its_parents_claims(inbox: jobfence.Inbox) -> None:
    """A child forked while a call of the parent holds a claim: the call runs in the parent,
    so a call of the child refused by that claim waits for its expiry."""
    held = inbox.claim("order:5", ttl=TTL)
    assert held_here(held._mine) is held
    pid = os.fork()
    if pid == 0:  # the child: only look, then leave without running any clean-up
        os._exit(0 if held_here(held._mine) is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert held_here(held._mine) is held  # the parent still holds it
    held.release()
