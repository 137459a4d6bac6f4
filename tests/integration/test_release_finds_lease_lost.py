"""A ``release()`` that finds its lease no longer held -- the holder was paused right after it
started releasing, the lease ran out and another worker took it -- marks the lease lost: the
``on_lost`` callbacks run, in that release call. A release that finds the lease already given
back by its own holder (a second ``release()``, the end of a block after an explicit release)
is no loss. On every backend whose leases expire by their ttl, sync and async.

The pause is the I/O hook at ``lock.release``: it runs after ``release()`` has started and
before the release reaches the backend, and waits there (a blocking ``acquire`` by another
client) until the lease has expired on the server and the other client holds it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.testing import hooked
from tests.conformance.specs import LOCKS, Spec, new_namespace, spec_params

pytestmark = pytest.mark.timeout(60)

#: the holder's lease: not renewed, so it runs out while the holder is paused
TTL = 1.0
NAME = "job:nightly"


@pytest.fixture(params=spec_params(LOCKS, lambda spec: spec.ttl_expiry))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    yield url, namespace
    spec.cleanup(url, namespace)


def test_a_release_that_finds_the_lease_taken_runs_on_lost(where: tuple[str, str]) -> None:
    url, namespace = where
    with (
        jobfence.Locks(url, namespace=namespace) as holder,
        jobfence.Locks(url, namespace=namespace) as other,
    ):
        lease = holder.try_acquire(NAME, ttl=TTL, renew=False)
        assert lease is not None
        told: list[tuple[jobfence.Lease, threading.Thread]] = []
        lease.on_lost(lambda lost: told.append((lost, threading.current_thread())))
        taken: list[jobfence.Lease] = []

        def paused(point: str, **info: Any) -> None:
            if point == "lock.release" and info["name"] == NAME and not taken:
                # the holder sleeps past its ttl; another worker takes the name meanwhile
                taken.append(other.acquire(NAME, ttl=30, timeout=20))

        with hooked(paused):
            assert lease.release() is False
        assert taken and taken[0].token > lease.token
        assert told == [(lease, threading.current_thread())]  # told, in the release call
        assert lease.lost and lease.released and not lease.held
        assert lease.release() is False  # given back already: not told again
        assert len(told) == 1
        assert other.holder(NAME) is not None  # the new holder is untouched
        assert taken[0].release() is True


async def test_an_async_release_that_finds_the_lease_taken_runs_on_lost(
    where: tuple[str, str],
) -> None:
    url, namespace = where
    async with (
        jobfence.AsyncLocks(url, namespace=namespace) as holder,
        jobfence.AsyncLocks(url, namespace=namespace) as other,
    ):
        lease = await holder.try_acquire(NAME, ttl=TTL, renew=False)
        assert lease is not None
        told: list[tuple[jobfence.AsyncLease, asyncio.Task[Any] | None]] = []
        lease.on_lost(lambda lost: told.append((lost, asyncio.current_task())))
        taken: list[jobfence.AsyncLease] = []

        async def paused(point: str, **info: Any) -> None:
            if point == "lock.release" and info["name"] == NAME and not taken:
                taken.append(await other.acquire(NAME, ttl=30, timeout=20))

        with hooked(paused):
            assert await lease.release() is False
        assert taken and taken[0].token > lease.token
        assert len(told) == 1 and told[0][0] is lease
        assert lease.lost and lease.released and not lease.held
        assert await lease.release() is False
        assert len(told) == 1
        assert await other.holder(NAME) is not None
        assert await taken[0].release() is True


def test_a_release_inside_its_block_is_no_loss(where: tuple[str, str]) -> None:
    url, namespace = where
    with jobfence.Locks(url, namespace=namespace) as locks:
        told: list[jobfence.Lease] = []
        with locks.acquire(NAME, ttl=30) as lease:
            lease.on_lost(told.append)
            assert lease.release() is True
        # the block ended quietly: the holder gave the lease back itself
        assert told == [] and not lease.lost and lease.released
        assert lease.release() is False and told == []
        with pytest.raises(ValueError, match="boom"), locks.acquire(NAME, ttl=30) as again:
            again.on_lost(told.append)
            assert again.release() is True
            raise ValueError("boom")
        assert told == []


async def test_an_async_release_inside_its_block_is_no_loss(where: tuple[str, str]) -> None:
    url, namespace = where
    async with jobfence.AsyncLocks(url, namespace=namespace) as locks:
        told: list[jobfence.AsyncLease] = []
        async with locks.acquire(NAME, ttl=30) as lease:
            lease.on_lost(told.append)
            assert await lease.release() is True
        assert told == [] and not lease.lost and lease.released
        assert await lease.release() is False and told == []
        with pytest.raises(ValueError, match="boom"):
            async with locks.acquire(NAME, ttl=30) as again:
                again.on_lost(told.append)
                assert await again.release() is True
                raise ValueError("boom")
        assert told == []
