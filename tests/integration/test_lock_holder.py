"""``holder(name)`` on every lock backend, and the ``LockTimeout`` that names the holder.

Runs against every lock spec of the conformance suites (``tests/conformance/specs.py``), with
the sync and the async client. PostgreSQL session mode records no owner id and no ttl on the
server: its holder is ``(None, token, None)``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobfence
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
    spec: Spec, holder: jobfence.LockHolder | None, lease: jobfence.Lease | jobfence.AsyncLease
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
        assert locks.holder("job") is None
        lease = locks.acquire("job", ttl=TTL, timeout=10)
        _expect(spec, locks.holder("job"), lease)
        _expect(spec, other.holder("job"), lease)  # any client can ask
        with pytest.raises(jobfence.LockTimeout) as info:
            other.acquire("job", ttl=5, timeout=0.3)
        _check_timeout(spec, info.value, lease)
        assert lease.release()
        assert locks.holder("job") is None


async def test_async_holder_and_lock_timeout_name_the_holder(where: tuple[Spec, str, str]) -> None:
    spec, url, namespace = where
    async with (
        jobfence.AsyncLocks(url, namespace=namespace) as locks,
        jobfence.AsyncLocks(url, namespace=namespace) as other,
    ):
        await locks.install()
        assert await locks.holder("job") is None
        lease = await locks.acquire("job", ttl=TTL, timeout=10)
        _expect(spec, await locks.holder("job"), lease)
        _expect(spec, await other.holder("job"), lease)
        with pytest.raises(jobfence.LockTimeout) as info:
            await asyncio.wait_for(other.acquire("job", ttl=5, timeout=0.3), 30)
        _check_timeout(spec, info.value, lease)
        assert await lease.release()
        assert await locks.holder("job") is None


def test_holder_refuses_bad_names_and_a_closed_client(tmp_path: Path) -> None:
    locks = jobfence.Locks(f"sqlite:///{tmp_path / 'h.db'}")
    for bad in ("", "x" * 1025, 7):
        with pytest.raises(jobfence.ConfigurationError) as info:
            locks.holder(bad)  # type: ignore[arg-type]
        assert info.value.argument == "name"
    locks.close()
    with pytest.raises(jobfence.ConfigurationError):
        locks.holder("job")


def test_a_lease_given_back_or_expired_has_no_holder(tmp_path: Path) -> None:
    with jobfence.Locks(f"sqlite:///{tmp_path / 'h.db'}") as locks:
        lease = locks.acquire("short", ttl=0.2, renew=False)
        assert locks.holder("short") is not None
        deadline = time.monotonic() + 10
        while locks.holder("short") is not None:  # the server's clock ends it, not ours
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not lease.release()  # it was nobody's any more
