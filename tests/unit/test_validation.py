"""Bad input gets a clear jobfence error naming the argument; nothing is left locked."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import pytest

import jobfence
from jobfence._core.url import mask_url, parse_url


@pytest.fixture
def locks() -> Iterator[jobfence.Locks]:
    client = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    yield client
    client.close()


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        (b"bytes", "must be a str"),
        (42, "must be a str"),
        (None, "must be a str"),
        ("x" * 1025, "at most 1024 bytes"),
        ("é" * 513, "at most 1024 bytes"),  # 1026 bytes in UTF-8
        ("\ud800", "UTF-8"),
    ],
)
def test_bad_names_raise_configuration_error_naming_name(
    locks: jobfence.Locks, name: object, fragment: str
) -> None:
    with pytest.raises(jobfence.ConfigurationError, match=fragment) as info:
        locks.try_acquire(name, ttl=1)  # type: ignore[arg-type]
    assert info.value.argument == "name"
    with pytest.raises(jobfence.ConfigurationError):
        locks.acquire(name, ttl=1, timeout=0)  # type: ignore[arg-type]


def test_longest_allowed_name_works(locks: jobfence.Locks) -> None:
    name = "ü" * 512  # exactly 1024 bytes
    lease = locks.try_acquire(name, ttl=1)
    assert lease is not None and lease.release()


def test_a_name_used_before_is_still_held_to_its_limit(locks: jobfence.Locks) -> None:
    """A client does not check a name it checked before again, but still its limit: once
    the name was taken with limit=2, limit=1 is refused, however often it was used before."""
    for _ in range(2):  # the second use finds the name checked
        lease = locks.try_acquire("n", ttl=5)
        assert lease is not None and lease.release()
    limited = locks.try_acquire("n", ttl=5, limit=2)
    assert limited is not None
    with pytest.raises(jobfence.ConfigurationError, match="limit=2") as info:
        locks.try_acquire("n", ttl=5)
    assert info.value.argument == "limit"
    with pytest.raises(jobfence.ConfigurationError, match="limit=2"):
        locks.acquire("n", ttl=5, timeout=0)
    assert limited.release()
    with pytest.raises(jobfence.ConfigurationError) as bad:
        locks.try_acquire("n", ttl=5, limit=True)  # type: ignore[arg-type]
    assert bad.value.argument == "limit"


@pytest.mark.parametrize("ttl", [0, -1, 0.0, math.nan, math.inf, "30", True, 10**9])
def test_bad_ttl(locks: jobfence.Locks, ttl: object) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        locks.try_acquire("a", ttl=ttl)  # type: ignore[arg-type]
    assert info.value.argument == "ttl"
    lease = locks.try_acquire("a", ttl=1)
    assert lease is not None  # nothing was left locked
    assert lease.release()


@pytest.mark.parametrize("timeout", [-0.1, -5, math.nan, "1"])
def test_bad_timeout(locks: jobfence.Locks, timeout: object) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        locks.acquire("a", ttl=1, timeout=timeout)  # type: ignore[arg-type]
    assert info.value.argument == "timeout"


def test_bad_extend_ttl(locks: jobfence.Locks) -> None:
    lease = locks.try_acquire("a", ttl=5)
    assert lease is not None
    with pytest.raises(jobfence.ConfigurationError) as info:
        lease.extend(-1)
    assert info.value.argument == "ttl"
    assert lease.held
    assert lease.release()


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("zookeeper://host", "unknown scheme 'zookeeper'"),
        ("", "non-empty URL"),
        (42, "non-empty URL"),
        ("redis://host:notaport", "not a valid URL"),
        ("localhost:6379", "unknown scheme"),
    ],
)
def test_bad_urls(url: object, fragment: str) -> None:
    with pytest.raises(jobfence.ConfigurationError, match=fragment) as info:
        jobfence.Locks(url)  # type: ignore[arg-type]
    assert info.value.argument == "url"


def test_unknown_scheme_error_lists_allowed_schemes() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks("zookeeper://localhost:2181")
    assert "redis://" in str(info.value) and "sqlite://" in str(info.value)


def test_namespace_and_poll_interval_are_validated() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks("memory://", namespace="")
    assert info.value.argument == "namespace"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks("memory://", poll_interval=0)
    assert info.value.argument == "poll_interval"


def test_passwords_are_masked() -> None:
    assert mask_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("postgresql://bob:s3cret@db/app?x=1") == "postgresql://bob:***@db/app?x=1"
    assert mask_url("sqlite:///x.db") == "sqlite:///x.db"
    parsed = parse_url("postgresql://bob:s3cret@db:5433/app?mode=session")
    assert parsed.password == "s3cret" and parsed.port == 5433
    assert parsed.options == {"mode": "session"}
    assert "s3cret" not in parsed.masked


def test_error_tree() -> None:
    assert issubclass(jobfence.LockTimeout, jobfence.LockError)
    assert issubclass(jobfence.LockLost, jobfence.LockError)
    assert issubclass(jobfence.LockError, jobfence.JobfenceError)
    for cls in (
        jobfence.StaleToken,
        jobfence.InboxError,
        jobfence.ConflictError,
        jobfence.BackendError,
        jobfence.ConfigurationError,
    ):
        assert issubclass(cls, jobfence.JobfenceError)
    assert issubclass(jobfence.ClaimInProgress, jobfence.InboxError)
    assert issubclass(jobfence.FingerprintMismatch, jobfence.InboxError)
    assert issubclass(jobfence.StaleVersion, jobfence.ConflictError)
    err = jobfence.StaleToken("inventory:42", 3, 7)
    assert "inventory:42" in str(err) and "3" in str(err) and "7" in str(err)


def test_closed_client_refuses_work() -> None:
    locks = jobfence.Locks("memory://closed")
    locks.close()
    with pytest.raises(jobfence.ConfigurationError, match="closed"):
        locks.try_acquire("a", ttl=1)
