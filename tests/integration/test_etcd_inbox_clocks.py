"""Two etcd inbox workers whose wall clocks disagree by an hour, far more than a claim's ttl.

The etcd server ends a claim (its lease), not a comparison of the workers' clocks: the worker
whose clock is ahead must not take over a claim that is still live, and the worker whose
clock is behind must take over a claim the server ended, once the server ended it, not an
hour later. Each second worker is a forked process with its clock shifted (jobfence's clock
seam, ``jobfence.testing.set_clock``); the first worker and the etcd server keep real time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence import ClaimLost, ClaimState
from jobfence.testing import Clock, set_clock
from tests.conformance.specs import FLAVOURS, inbox_table, new_namespace
from tests.etcd_cluster import delete_etcd_prefix, etcd_url

FORK = multiprocessing.get_context("fork")
#: how far the second worker's wall clock is off
HOUR = 3600.0


class ShiftedClock(Clock):
    """Real time, with the wall clock ``by`` seconds off (the monotonic clock is untouched)."""

    def __init__(self, by: float) -> None:
        self.by = by

    def time(self) -> float:
        return super().time() + self.by


def _claim_with_shifted_clock(
    url: str, table: str, key: str, by: float, flavour: str, within: float, out: Any
) -> None:
    """In a forked process: install a clock ``by`` seconds off, claim ``key`` until the claim
    is NEW or ``within`` seconds passed (``within`` 0: once), report ``(state, owner,
    attempt)``, and leave a NEW claim held (no renewal, no release)."""
    set_clock(ShiftedClock(by))

    async def claim_async() -> tuple[str, str | None, int]:
        inbox = jobfence.AsyncInbox(url, table=table)
        try:
            deadline = time.monotonic() + within
            while True:
                claim = await inbox.claim(key, ttl=30)
                if claim.state is ClaimState.NEW or time.monotonic() >= deadline:
                    return claim.state.value, claim.owner, claim.attempt
                await asyncio.sleep(0.05)
        finally:
            await inbox.close()

    def claim_sync() -> tuple[str, str | None, int]:
        inbox = jobfence.Inbox(url, table=table)
        try:
            deadline = time.monotonic() + within
            while True:
                claim = inbox.claim(key, ttl=30)
                if claim.state is ClaimState.NEW or time.monotonic() >= deadline:
                    return claim.state.value, claim.owner, claim.attempt
                time.sleep(0.05)
        finally:
            inbox.close()

    try:
        out.put(asyncio.run(claim_async()) if flavour == "async" else claim_sync())
    except BaseException as exc:  # reported, so that the test fails with the cause
        out.put(("error", repr(exc), 0))


def _second_worker(
    url: str, table: str, key: str, by: float, flavour: str, within: float
) -> tuple[str, str | None, int]:
    out = FORK.Queue()
    child = FORK.Process(
        target=_claim_with_shifted_clock, args=(url, table, key, by, flavour, within, out)
    )
    child.start()
    try:
        answer: tuple[str, str | None, int] = out.get(timeout=within + 60)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return answer


@pytest.fixture
def where() -> Iterator[tuple[str, str]]:
    url, namespace = etcd_url(), new_namespace()
    yield url, inbox_table(namespace)
    delete_etcd_prefix(url, namespace)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_clock_an_hour_ahead_does_not_take_over_a_live_claim(
    where: tuple[str, str], flavour: str
) -> None:
    url, table = where
    with jobfence.Inbox(url, table=table) as inbox:
        first = inbox.claim("job:ahead", ttl=20)
        assert first.state is ClaimState.NEW
        state, owner, attempt = _second_worker(url, table, "job:ahead", HOUR, flavour, 0)
        assert (state, owner, attempt) == ("in_progress", first.owner, 1)
        first.complete("done once")  # still the first worker's claim
        replay = inbox.claim("job:ahead")
        assert replay.state is ClaimState.COMPLETED and replay.result == "done once"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_clock_an_hour_behind_takes_over_a_claim_the_server_ended(
    where: tuple[str, str], flavour: str
) -> None:
    url, table = where
    with jobfence.Inbox(url, table=table) as inbox:
        first = inbox.claim("job:behind", ttl=0.5)  # a lease of 2 s on the server
        assert first.state is ClaimState.NEW
        state, owner, attempt = _second_worker(url, table, "job:behind", -HOUR, flavour, 20)
        assert state == "new" and attempt == 2, (state, owner, attempt)
        assert owner != first.owner
        with pytest.raises(ClaimLost):
            first.complete("too late")
        info = inbox.claim_info("job:behind")
        assert info is not None and info.owner == owner and info.attempt == 2
