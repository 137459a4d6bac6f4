"""Fixtures and helpers of the inbox conformance suite (the lead owns conftest.py).

Every scheme registered in ``jobfence.backends.INBOX_BACKENDS`` must be covered by
:data:`INBOX_SPECS`; ``test_every_registered_inbox_backend_is_in_the_suite`` fails otherwise.
Tests are written once as ``async def``; the ``sync`` flavour runs every call of the sync
``Inbox``/``Claim`` in a worker thread, so both twins meet exactly the same assertions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL


@dataclass(frozen=True)
class InboxSpec:
    id: str
    module: str  # module stem in jobfence.backends
    url: str  # "{tmp}" is replaced by the test's tmp_path


INBOX_SPECS: list[InboxSpec] = [
    InboxSpec("memory", "memory", "memory://inbox-{uid}"),
    InboxSpec("sqlite", "sqlite", "sqlite:///{tmp}/inbox.db"),
    InboxSpec("redis", "redis", REDIS_URL),
    InboxSpec("postgres", "postgres", POSTGRES_URL),
    InboxSpec("mysql", "mysql", MYSQL_URL),
]


def new_table() -> str:
    return "tinbox_" + uuid.uuid4().hex[:12]


class ClaimW:
    """A Claim or AsyncClaim behind one awaitable interface."""

    def __init__(self, claim: Any, sync: bool) -> None:
        self.claim = claim
        self.sync = sync

    def __getattr__(self, item: str) -> Any:
        return getattr(self.claim, item)

    def __repr__(self) -> str:
        return repr(self.claim)

    async def complete(self, result: Any = None) -> None:
        if self.sync:
            await asyncio.to_thread(self.claim.complete, result)
        else:
            await self.claim.complete(result)

    async def release(self) -> bool:
        if self.sync:
            return bool(await asyncio.to_thread(self.claim.release))
        return bool(await self.claim.release())


class InboxW:
    """An Inbox or AsyncInbox behind one awaitable interface."""

    def __init__(self, url: str, sync: bool, **options: Any) -> None:
        self.sync = sync
        cls = jobfence.Inbox if sync else jobfence.AsyncInbox
        self.inbox: Any = cls(url, **options)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inbox, item)

    async def _do(self, name: str, *args: Any, **kw: Any) -> Any:
        fn = getattr(self.inbox, name)
        if self.sync:
            return await asyncio.to_thread(lambda: fn(*args, **kw))
        return await fn(*args, **kw)

    async def claim(self, key: str, **kw: Any) -> ClaimW:
        return ClaimW(await self._do("claim", key, **kw), self.sync)

    async def purge(self) -> int:
        return int(await self._do("purge"))

    async def install(self) -> None:
        await self._do("install")

    async def drop(self) -> None:
        await self._do("drop")

    async def close(self) -> None:
        await self._do("close")


class InboxEnv:
    """One backend, one table: makes inboxes of either flavour and drops the table after."""

    def __init__(self, spec: InboxSpec, flavour: str, tmp_path: Path) -> None:
        self.spec = spec
        self.flavour = flavour
        self.url = spec.url.format(tmp=tmp_path, uid=uuid.uuid4().hex)
        self.table = new_table()
        self.inboxes: list[InboxW] = []

    @property
    def sync(self) -> bool:
        return self.flavour == "sync"

    def inbox(self, flavour: str | None = None, **options: Any) -> InboxW:
        options.setdefault("table", self.table)
        inbox = InboxW(self.url, (flavour or self.flavour) == "sync", **options)
        self.inboxes.append(inbox)
        return inbox

    async def aclose(self) -> None:
        for inbox in self.inboxes:
            try:
                await inbox.close()
            except Exception:  # closing after a failed test must not hide the failure
                pass
        cleaner = jobfence.Inbox(self.url, table=self.table)
        try:
            cleaner.drop()
        finally:
            cleaner.close()


@pytest.fixture(params=INBOX_SPECS, ids=[s.id for s in INBOX_SPECS])
def inbox_spec(request: pytest.FixtureRequest) -> InboxSpec:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["sync", "async"])
def inbox_flavour(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def ienv(
    inbox_spec: InboxSpec, inbox_flavour: str, tmp_path: Path
) -> AsyncIterator[InboxEnv]:
    env = InboxEnv(inbox_spec, inbox_flavour, tmp_path)
    try:
        yield env
    finally:
        await env.aclose()


# -- worker processes ---------------------------------------------------------------------


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
