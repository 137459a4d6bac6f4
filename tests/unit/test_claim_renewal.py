"""Renewed claims on the memory backend: the inbox's renewer, its hook point, and what the
holder -- a plain claim or a ``guarded`` function -- is told when a claim is lost."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence import ClaimLost, ClaimState
from jobfence._core.url import parse_url
from jobfence.backends.memory.inbox import MemoryInboxBackend
from jobfence.guard import current_claim, guarded
from jobfence.testing import hooked


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    client = jobfence.Inbox(_url())
    yield client
    client.close()


def _wait_until(predicate: Any, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_renewer_announces_each_batch_at_inbox_renew(inbox: jobfence.Inbox) -> None:
    seen: list[tuple[str, Any]] = []
    batch = threading.Event()

    def hook(point: str, **info: Any) -> None:
        seen.append((point, info))
        if point == "inbox.renew":
            batch.set()

    with hooked(hook):
        claims = [inbox.claim(f"k{i}", ttl=0.3, renew=True) for i in range(3)]
        assert batch.wait(5)
        for claim in claims:
            claim.complete(None)
    renewals = [info for point, info in seen if point == "inbox.renew"]
    assert renewals and set(renewals[0]) == {"keys"}
    assert set().union(*(set(info["keys"]) for info in renewals)) <= {"k0", "k1", "k2"}
    assert any(len(info["keys"]) == 3 for info in renewals)  # one call for all three
    assert not [point for point, _ in seen if point == "lock.renew"]


def test_a_failing_renewal_is_retried_and_the_claim_lost_only_at_its_deadline(
    inbox: jobfence.Inbox,
) -> None:
    def hook(point: str, **info: Any) -> None:
        if point == "inbox.renew":
            raise ConnectionResetError("injected: the backend is unreachable")

    with hooked(hook):
        started = time.monotonic()
        claim = inbox.claim("k", ttl=0.6, renew=True)
        lost = threading.Event()
        claim.on_lost(lambda _c: lost.set())
        assert lost.wait(5)
        assert time.monotonic() - started >= 0.6  # not before its local deadline
        with pytest.raises(ClaimLost, match="ttl ran out"):
            claim.check()
    # expired on the backend as well (its deadline there is a little later than the local one)
    assert _wait_until(lambda: inbox.claim("k").state is ClaimState.NEW, within=2)


class _SlowCompleteReply(MemoryInboxBackend):
    """Completes the claim on the 'server', then holds the reply until a renewal has crossed
    it (and found the claim completed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crossed = threading.Event()
        self.completed = threading.Event()

    def renew(self, items: Any) -> list[bool]:
        answers = super().renew(items)
        if self.completed.is_set():
            self.crossed.set()
        return answers

    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        done = super().complete(key, owner, result, retention)
        self.completed.set()
        assert self.crossed.wait(5), "no renewal crossed the completion"
        time.sleep(0.05)  # the renewer handles the answer meanwhile
        return done


def test_a_renewal_that_crosses_the_completion_is_no_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The renewal finds the claim completed on the backend before complete() has its answer:
    the holder must not be told its claim was lost (found in review)."""
    inbox = jobfence.Inbox(_SlowCompleteReply(parse_url(_url())))
    try:
        with caplog.at_level(logging.WARNING, logger="jobfence"):
            claim = inbox.claim("k", ttl=0.3, renew=True)
            told: list[Any] = []
            claim.on_lost(told.append)
            claim.complete("done")
        assert told == [] and not claim.lost
        assert caplog.records == []
        assert inbox.claim("k").result == "done"
    finally:
        inbox.close()


def test_a_plain_claim_is_not_renewed(inbox: jobfence.Inbox) -> None:
    claim = inbox.claim("plain", ttl=0.2)
    assert not claim.renews
    time.sleep(0.3)
    assert claim.lost  # its ttl ran out: as far as its holder knows, it may be taken over
    taken = inbox.claim("plain", ttl=30)
    assert taken.state is ClaimState.NEW and taken.attempt == 2


async def test_an_async_with_claim_body_is_cancelled_when_the_claim_is_lost() -> None:
    inbox = jobfence.AsyncInbox(_url())
    try:
        claim = await inbox.claim("k", ttl=0.6, renew=True)
        reached = False
        with pytest.raises(ClaimLost, match="lost while its work ran"):
            async with claim:
                await inbox.backend.release("k", claim.owner)  # gone behind its back
                await asyncio.sleep(30)  # cancelled when the renewer finds it gone
                reached = True
        assert not reached
        assert (await inbox.claim("k")).state is ClaimState.NEW
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    finally:
        await inbox.close()


# -- guarded -------------------------------------------------------------------------------
def test_guarded_claims_are_renewed_with_a_short_default_ttl(inbox: jobfence.Inbox) -> None:
    assert inspect.signature(guarded).parameters["claim_ttl"].default == 30.0
    seen: list[Any] = []

    @guarded(inbox=inbox, key="job:{n}")
    def job(n: int) -> int:
        claim = current_claim()
        seen.append((claim.renews, claim.key, claim.state))
        return n

    assert current_claim() is None
    assert job(1) == 1
    assert seen == [(True, "job:1", ClaimState.NEW)]
    assert current_claim() is None


async def test_async_guarded_job_is_cancelled_when_its_claim_is_lost() -> None:
    inbox = jobfence.AsyncInbox(_url())
    runs: list[int] = []
    try:

        @guarded(inbox=inbox, key="job:{n}", claim_ttl=0.6)
        async def job(n: int) -> int:
            runs.append(n)
            if len(runs) == 1:
                claim = current_claim()
                await inbox.backend.release(claim.key, claim.owner)  # taken away
                await asyncio.sleep(30)  # cancelled when the renewer finds it gone
            return n

        with pytest.raises(ClaimLost):
            await asyncio.wait_for(job(1), 10)
        assert await job(1) == 1  # not completed: the redelivery runs
        assert await job(1) == 1  # replayed
        assert runs == [1, 1]
    finally:
        await inbox.close()


def test_sync_guarded_result_is_not_stored_when_the_claim_is_gone(
    inbox: jobfence.Inbox,
) -> None:
    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}", claim_ttl=0.6)
    def job(n: int) -> str:
        runs.append(n)
        claim = current_claim()
        if len(runs) == 1:
            inbox.backend.release(claim.key, claim.owner)  # taken away behind its back
            assert _wait_until(lambda: claim.lost)  # the renewer tells the holder
        return f"result-{len(runs)}"

    with pytest.raises(ClaimLost):
        job(1)
    assert job(1) == "result-2"
    assert job(1) == "result-2"


def test_no_retry_starts_once_the_claim_is_lost(inbox: jobfence.Inbox) -> None:
    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}", claim_ttl=30, attempts=3)
    def job(n: int) -> str:
        runs.append(n)
        claim = current_claim()
        inbox.backend.release(claim.key, claim.owner)
        with pytest.raises(ClaimLost):
            claim.extend()  # this worker notices: the claim is lost
        raise ConnectionResetError("transient: would be retried")

    with pytest.raises(ClaimLost):
        job(1)
    assert runs == [1]
