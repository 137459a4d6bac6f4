"""A claim interrupted after the backend took the key (the reply was lost, or the caller was
cancelled while waiting for it) gives the key back, so a redelivery runs at once instead of
seeing ``ClaimInProgress`` for the whole claim ttl. The memory backend stands in for the
server; the interruption is real (an exception after the backend call, a real cancellation).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import jobfence
from jobfence import ClaimState
from jobfence._core.url import parse_url
from jobfence.backends.memory.inbox import AsyncMemoryInboxBackend, MemoryInboxBackend


class ReplyLost(MemoryInboxBackend):
    """Takes the key on the 'server', then the reply never arrives."""

    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> Any:
        super().claim(key, owner, fingerprint, ttl)
        raise ConnectionResetError("injected: the reply to the claim was lost")


class SlowReply(AsyncMemoryInboxBackend):
    """Takes the key on the 'server', then the reply is slow to come back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taken = asyncio.Event()

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> Any:
        record = await super().claim(key, owner, fingerprint, ttl)
        self.taken.set()
        await asyncio.Event().wait()  # the caller gives up first
        return record


def _url() -> Any:
    return parse_url(f"memory://{uuid.uuid4().hex}")


def test_a_claim_whose_reply_was_lost_gives_the_key_back() -> None:
    url = _url()
    inbox = jobfence.Inbox(ReplyLost(url))
    with pytest.raises(jobfence.BackendError):
        inbox.claim("order:1", ttl=300)
    redelivery = jobfence.Inbox(MemoryInboxBackend(url)).claim("order:1", ttl=300)
    assert redelivery.state is ClaimState.NEW  # not IN_PROGRESS for 300 s
    assert redelivery.attempt == 2  # the lost claim did count as an attempt


async def test_a_cancelled_claim_gives_the_key_back() -> None:
    url = _url()
    backend = SlowReply(url)
    inbox = jobfence.AsyncInbox(backend)
    task = asyncio.ensure_future(inbox.claim("order:2", ttl=300))
    await backend.taken.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    redelivery = await jobfence.AsyncInbox(AsyncMemoryInboxBackend(url)).claim("order:2")
    assert redelivery.state is ClaimState.NEW and redelivery.attempt == 2


def test_a_claim_that_failed_before_the_backend_took_it_changes_nothing() -> None:
    url = _url()

    class Unreachable(MemoryInboxBackend):
        def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> Any:
            raise ConnectionRefusedError("injected: server down")

    with pytest.raises(jobfence.BackendError):
        jobfence.Inbox(Unreachable(url)).claim("order:3")
    first = jobfence.Inbox(MemoryInboxBackend(url)).claim("order:3")
    assert first.state is ClaimState.NEW and first.attempt == 1
