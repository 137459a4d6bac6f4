"""``holder(name)`` on every lock backend, and the ``LockTimeout`` that names the holder.

Runs against every lock spec of the conformance suites (``tests/conformance/specs.py``), with
the sync and the async client. PostgreSQL session mode records no owner id and no ttl on the
server: its holder is ``(None, token, None)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobfence
from jobfence.backends.base import LockHolder
from tests.conformance.specs import LOCKS, Spec, new_namespace, spec_params

pytestmark = pytest.mark.timeout(60)

TTL = 30.0


@pytest.fixture(params=spec_params(LOCKS))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Spec, str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    yield spec, url, namespace
    spec.cleanup(url, namespace)


def _expect(
    spec: Spec, holder: LockHolder | None, lease: jobfence.Lease | jobfence.AsyncLease
) -> None:
    assert holder is not None
    assert holder.token == lease.token
    if spec.ttl_expiry:
        assert holder.owner == lease.owner
        assert holder.expires_in is not None and 0 < holder.expires_in <= TTL
    else:  # session mode: the server knows the session, not our owner id or a ttl
        assert holder.owner is None and holder.expires_in is None


def _check_timeout(
    spec: Spec, error: jobfence.LockTimeout, lease: jobfence.Lease | jobfence.AsyncLease
) -> None:
    assert error.name == "job"
    assert error.token == lease.token
    assert f"token {lease.token}" in str(error)
    if spec.ttl_expiry:
        assert error.owner == lease.owner and lease.owner in str(error)
        assert error.expires_in is not None and 0 < error.expires_in <= TTL
        assert "s left on its lease" in str(error)
    else:
        assert error.owner is None and error.expires_in is None


def test_holder_and_lock_timeout_name_the_holder(where: tuple[Spec, str, str]) -> None:
    spec, url, namespace = where
    with (
        jobfence.Locks(url, namespace=namespace) as locks,
        jobfence.Locks(url, namespace=namespace) as other,
    ):
        locks.install()
        assert locks.backend.holder("job") is None
        lease = locks.acquire("job", ttl=TTL, timeout=10)
        _expect(spec, locks.backend.holder("job"), lease)
        _expect(spec, other.backend.holder("job"), lease)  # any client can ask
        with pytest.raises(jobfence.LockTimeout) as info:
            other.acquire("job", ttl=5, timeout=0.3)
        _check_timeout(spec, info.value, lease)
        assert lease.release()
        assert locks.backend.holder("job") is None


async def test_async_holder_and_lock_timeout_name_the_holder(where: tuple[Spec, str, str]) -> None:
    spec, url, namespace = where
    async with (
        jobfence.AsyncLocks(url, namespace=namespace) as locks,
        jobfence.AsyncLocks(url, namespace=namespace) as other,
    ):
        await locks.install()
        assert await locks.backend.holder("job") is None
        lease = await locks.acquire("job", ttl=TTL, timeout=10)
        _expect(spec, await locks.backend.holder("job"), lease)
        _expect(spec, await other.backend.holder("job"), lease)
        with pytest.raises(jobfence.LockTimeout) as info:
            await asyncio.wait_for(other.acquire("job", ttl=5, timeout=0.3), 30)
        _check_timeout(spec, info.value, lease)
        assert await lease.release()
        assert await locks.backend.holder("job") is None
