"""Inbox argument validation and error wrapping (real servers where a backend is involved)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import BackendError, ConfigurationError
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL


@pytest.mark.parametrize("table", ["", "1abc", "a-b", "x; DROP TABLE users", "a" * 64, 5])
def test_table_names_are_validated(table: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        jobfence.Inbox("memory://", table=table)  # type: ignore[arg-type]
    assert info.value.argument == "table"


def test_table_name_from_the_url_is_validated_too() -> None:
    with pytest.raises(ConfigurationError) as info:
        jobfence.Inbox("postgresql://localhost/x?table=bad%20name")
    assert info.value.argument == "table"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"ttl": 0}, "ttl"),
        ({"retention": -1}, "retention"),
        ({"serializer": object()}, "serializer"),
        ({"url": "ftp://x"}, "url"),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict[str, object], argument: str) -> None:
    url = kwargs.pop("url", "memory://")
    with pytest.raises(ConfigurationError) as info:
        jobfence.Inbox(url, **kwargs)  # type: ignore[arg-type]
    assert info.value.argument == argument


def test_bad_keys_and_fingerprints() -> None:
    inbox = jobfence.Inbox("memory://")
    for key in ("", None, "x" * 1025):
        with pytest.raises(ConfigurationError) as info:
            inbox.claim(key)  # type: ignore[arg-type]
        assert info.value.argument == "key"
    with pytest.raises(ConfigurationError) as info:
        inbox.claim("k", fingerprint=12)  # type: ignore[arg-type]
    assert info.value.argument == "fingerprint"
    with pytest.raises(ConfigurationError) as info:
        inbox.claim_in(object(), "k")
    assert info.value.argument == "conn"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret-pw@127.0.0.1:1/app",
        "mysql://app:s3cret-pw@127.0.0.1:1/app",
        "redis://:s3cret-pw@127.0.0.1:1/0",
    ],
)
async def test_driver_errors_become_backend_errors_with_the_password_masked(url: str) -> None:
    inbox = jobfence.AsyncInbox(url)
    try:
        with pytest.raises(BackendError) as info:
            await inbox.claim("k")
    finally:
        await inbox.close()
    assert "s3cret-pw" not in str(info.value)
    assert "***" in str(info.value)
    assert info.value.operation == "inbox.claim"
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda tmp: jobfence.Inbox(f"sqlite:///{tmp}/i.db?busy_timeout=abc"), "busy_timeout"),
        (lambda tmp: jobfence.Inbox(f"sqlite:///{tmp}/i.db?busy_timeout=-1"), "busy_timeout"),
        (lambda tmp: jobfence.Inbox(f"sqlite:///{tmp}/i.db?bogus=1"), "bogus"),
        (lambda tmp: jobfence.Inbox(f"sqlite:///{tmp}/i.db", bogus=1), "bogus"),
        (lambda tmp: jobfence.Inbox(POSTGRES_URL + "?max_idle=x"), "max_idle"),
        (lambda tmp: jobfence.Inbox(POSTGRES_URL + "?pool_size=x"), "pool_size"),
        (lambda tmp: jobfence.Inbox(POSTGRES_URL, pool=3), "pool"),
        (lambda tmp: jobfence.Inbox(MYSQL_URL, pool=3), "pool"),
        (lambda tmp: jobfence.Inbox(REDIS_URL, pool=3), "pool"),
    ],
)
def test_bad_backend_options_name_the_option(make: Any, argument: str, tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(jobfence.ConfigurationError) as info:
            make(tmp_path)
    assert info.value.argument == argument
    deprecated = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    # max_idle is the deprecated name of pool_size: using it says so
    assert len(deprecated) == (1 if argument == "max_idle" else 0), deprecated
