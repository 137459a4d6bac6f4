"""``holders(prefix, limit)`` -- the live leases of a namespace -- on every lock backend.

Runs against every lock spec of the conformance suites (``tests/conformance/specs.py``), with
the sync and the async client. PostgreSQL session mode cannot list (its advisory locks are
keyed by a hash of the name) and says so with a ``ConfigurationError``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.base import LockBackend
from jobfence.backends.memory.locks import MemoryLockBackend
from tests.conformance.specs import LOCKS, Spec, new_namespace, spec_params

pytestmark = pytest.mark.timeout(60)

TTL = 30.0
#: names that a backend could get wrong: glob characters (Redis MATCH), a NUL (escaped in
#: PostgreSQL), non-ASCII text, a closing brace (Redis lease keys end with one)
NAMES = ["job:a", "job:b[*]?", "job:\x00nul", "job:é", "job:z}", "other"]


@pytest.fixture(params=spec_params(LOCKS))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Spec, str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    yield spec, url, namespace
    spec.cleanup(url, namespace)


def _check(
    listed: list[tuple[str, jobfence.LockHolder]],
    leases: dict[str, jobfence.Lease] | dict[str, jobfence.AsyncLease],
    names: list[str],
) -> None:
    assert [name for name, _ in listed] == names
    for name, holder in listed:
        lease = leases[name]
        assert holder.owner == lease.owner
        assert holder.token == lease.token
        assert holder.expires_in is not None and 0 < holder.expires_in <= TTL


def test_holders_lists_the_live_leases_by_name(where: tuple[Spec, str, str]) -> None:
    spec, url, namespace = where
    with (
        jobfence.Locks(url, namespace=namespace) as locks,
        jobfence.Locks(url, namespace=namespace) as other,
        jobfence.Locks(url, namespace=new_namespace()) as elsewhere,
    ):
        locks.install()
        elsewhere.install()
        if not spec.ttl_expiry:  # session mode: refused, naming what to do instead
            with pytest.raises(jobfence.ConfigurationError) as info:
                locks.holders()
            assert info.value.argument == "mode" and "session mode" in str(info.value)
            return
        assert locks.holders() == []
        leases = {name: locks.acquire(name, ttl=TTL, timeout=10) for name in NAMES}
        everything = sorted(NAMES)
        _check(other.holders(), leases, everything)  # any client of the namespace may ask
        jobs = [n for n in everything if n.startswith("job:")]
        _check(other.holders("job:"), leases, jobs)
        _check(other.holders("job:b[*]"), leases, ["job:b[*]?"])  # glob characters literal
        _check(other.holders("job:\x00"), leases, ["job:\x00nul"])
        _check(other.holders(limit=2), leases, everything[:2])
        assert other.holders("nothing-here") == []
        assert elsewhere.holders() == []  # another namespace holds nothing
        assert leases["job:a"].release()
        _check(other.holders("job:"), leases, [n for n in jobs if n != "job:a"])
        other.force_release("other")
        _check(other.holders(), leases, [n for n in everything if n not in ("job:a", "other")])
        for name, lease in leases.items():
            if name not in ("job:a", "other"):
                assert lease.release()
        assert other.holders() == []


async def test_async_holders_lists_the_live_leases(where: tuple[Spec, str, str]) -> None:
    spec, url, namespace = where
    async with (
        jobfence.AsyncLocks(url, namespace=namespace) as locks,
        jobfence.AsyncLocks(url, namespace=namespace) as other,
    ):
        await locks.install()
        if not spec.ttl_expiry:
            with pytest.raises(jobfence.ConfigurationError):
                await locks.holders()
            return
        leases = {name: await locks.acquire(name, ttl=TTL, timeout=10) for name in NAMES[:3]}
        _check(await other.holders("job:"), leases, sorted(NAMES[:3]))
        _check(await other.holders("job:", limit=1), leases, ["job:\x00nul"])
        for lease in leases.values():
            assert await lease.release()
        assert await other.holders() == []


def test_an_expired_lease_is_not_listed(tmp_path: Path) -> None:
    with jobfence.Locks(f"sqlite:///{tmp_path / 'h.db'}") as locks:
        locks.acquire("short", ttl=0.2, renew=False)
        long = locks.acquire("long", ttl=TTL)
        assert [name for name, _ in locks.holders()] == ["long", "short"]
        deadline = time.monotonic() + 10
        while [name for name, _ in locks.holders()] != ["long"]:  # the server's clock ends it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert long.release()


def test_holders_refuses_bad_arguments_and_a_closed_client(tmp_path: Path) -> None:
    locks = jobfence.Locks(f"sqlite:///{tmp_path / 'h.db'}")
    for bad in (7, None, "x" * 1025):
        with pytest.raises(jobfence.ConfigurationError) as info:
            locks.holders(bad)  # type: ignore[arg-type]
        assert info.value.argument == "prefix"
    for limit in (0, -1, 100_001, 1.5, True, "10"):
        with pytest.raises(jobfence.ConfigurationError) as info:
            locks.holders(limit=limit)  # type: ignore[arg-type]
        assert info.value.argument == "limit"
    locks.close()
    with pytest.raises(jobfence.ConfigurationError):
        locks.holders()


class _NoListing(MemoryLockBackend):
    """A third-party backend that does not implement holders()."""

    holders = LockBackend.holders


def test_a_backend_without_holders_says_so() -> None:
    with (
        jobfence.Locks(_NoListing(parse_url("memory://no-listing"))) as locks,
        pytest.raises(NotImplementedError) as info,
    ):
        locks.holders()
    assert "_NoListing cannot list the leases it holds" in str(info.value)
