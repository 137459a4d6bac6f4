"""Every backend call passes the I/O hook, clean-ups included, in the order
docs/reference/testing-seams.md ("The order of the points") documents.

One scripted scenario per backend, sync and async: a lease taken; a second client's waiting
acquire interrupted by a failure at its first wait (so it leaves the queue and gives back what
it may have been granted); a claim interrupted by a failure (so it gives the key back); the
client closed with the lease still held (so close() gives it back). Real servers.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.testing import hooked
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

BACKENDS = ["memory", "sqlite", "redis", "postgres", "mysql"]

#: the points of the scenario, in the documented order
EXPECTED = [
    ("lock.acquire", "seam:job"),  # try_acquire
    ("lock.acquire", "seam:job"),  # the second client's acquire: denied, it waits ...
    ("lock.wait", "seam:job"),  # ... and its wait fails
    ("lock.abandon_wait", "seam:job"),  # the interrupted acquire leaves the queue
    ("lock.abandon_release", "seam:job"),  # and gives back what it may have been granted
    ("inbox.claim", "seam:key"),  # a claim that fails
    ("inbox.abandon", "seam:key"),  # gives back the key it may have been given
    ("lock.close_release", "seam:job"),  # close() gives back the lease still held
]


def _url(backend: str, tmp_path: Path) -> str:
    return {
        "memory": f"memory://{uuid.uuid4().hex}",
        "sqlite": f"sqlite:///{tmp_path}/hooks.db",
        "redis": REDIS_URL,
        "postgres": POSTGRES_URL,
        "mysql": MYSQL_URL,
    }[backend]


class InjectedFault(Exception):
    """A non-transient failure (a waiting acquire retries transient ones within its timeout)."""


class Script:
    """Records the scenario's points; fails the first ``lock.wait`` and ``inbox.claim``."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.points: list[tuple[str, str]] = []
        self.failed: set[str] = set()

    def __call__(self, point: str, **info: Any) -> None:
        subject = info.get("name", info.get("key"))
        if subject not in ("seam:job", "seam:key"):
            return  # another test's renewer, or a sleep
        assert info["backend"] == self.backend
        self.points.append((point, subject))
        if point in ("lock.wait", "inbox.claim") and point not in self.failed:
            self.failed.add(point)
            if point == "lock.wait":
                raise InjectedFault(f"injected at {point}")
            raise ConnectionResetError(f"injected at {point}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_hook_sees_every_call_in_the_documented_order(backend: str, tmp_path: Path) -> None:
    url, ns = _url(backend, tmp_path), f"h{uuid.uuid4().hex[:10]}"
    locks, other = jobfence.Locks(url, namespace=ns), jobfence.Locks(url, namespace=ns)
    inbox = jobfence.Inbox(url, table=ns)
    script = Script(backend)
    try:
        with hooked(script):
            held = locks.try_acquire("seam:job", ttl=60, renew=False)
            assert held is not None
            with pytest.raises(jobfence.BackendError) as info:
                other.acquire("seam:job", ttl=60, timeout=30)
            assert info.value.operation == "lock.wait"
            with pytest.raises(jobfence.BackendError) as info:
                inbox.claim("seam:key")
            assert info.value.operation == "inbox.claim"
            locks.close()
        assert script.points == EXPECTED
        assert held.lost  # close() gave it back: its holder is told
        taken = other.try_acquire("seam:job", ttl=60, renew=False)  # free again at once
        assert taken is not None and taken.token > held.token and taken.release()
        fresh = inbox.claim("seam:key")  # the interrupted claim left nothing behind
        assert fresh.state is jobfence.ClaimState.NEW and fresh.attempt == 1
        fresh.complete(None)
    finally:
        locks.close()
        other.close()
        inbox.drop()
        inbox.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_async_hook_sees_every_call_in_the_documented_order(
    backend: str, tmp_path: Path
) -> None:
    url, ns = _url(backend, tmp_path), f"h{uuid.uuid4().hex[:10]}"
    locks, other = jobfence.AsyncLocks(url, namespace=ns), jobfence.AsyncLocks(url, namespace=ns)
    inbox = jobfence.AsyncInbox(url, table=ns)
    script = Script(backend)
    try:
        with hooked(script):
            held = await locks.try_acquire("seam:job", ttl=60, renew=False)
            assert held is not None
            with pytest.raises(jobfence.BackendError):
                await other.acquire("seam:job", ttl=60, timeout=30)
            with pytest.raises(jobfence.BackendError):
                await inbox.claim("seam:key")
            await locks.close()
        assert script.points == EXPECTED
        taken = await other.try_acquire("seam:job", ttl=60, renew=False)
        assert taken is not None and taken.token > held.token and await taken.release()
    finally:
        await locks.close()
        await other.close()
        await inbox.drop()
        await inbox.close()


@pytest.mark.parametrize("point", ["lock.abandon_wait", "lock.abandon_release"])
def test_a_failure_at_a_clean_up_point_is_logged_like_the_clean_up_failing(
    point: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    locks, other = jobfence.Locks(url), jobfence.Locks(url)
    seen: list[str] = []

    def fail(at: str, **info: Any) -> None:
        seen.append(at)
        if at in ("lock.wait", point):
            raise InjectedFault(f"injected at {at}")

    try:
        held = locks.try_acquire("job", ttl=60, renew=False)
        assert held is not None
        with hooked(fail), pytest.raises(jobfence.BackendError) as info:
            other.acquire("job", ttl=60, timeout=30)
        assert isinstance(info.value.__cause__, InjectedFault)
        assert f"injected at {point}" in caplog.text  # logged, not raised instead
        if point == "lock.abandon_wait":  # the release after it is skipped, as on a failure
            assert "lock.abandon_release" not in seen
    finally:
        locks.close()
        other.close()


def test_a_failure_at_close_release_is_logged_and_close_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    first = locks.try_acquire("a", ttl=60, renew=False)
    second = locks.try_acquire("b", ttl=60, renew=False)
    assert first is not None and second is not None
    seen: list[str] = []

    def fail_first(point: str, **info: Any) -> None:
        seen.append(f"{point}:{info['name']}")
        if point == "lock.close_release" and info["name"] == "a":
            raise ConnectionResetError("injected")

    with hooked(fail_first):
        locks.close()
    assert sorted(seen) == ["lock.close_release:a", "lock.close_release:b"]
    assert "releasing 'a' on close failed" in caplog.text
