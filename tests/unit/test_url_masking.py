"""What :func:`mask_url` hides, and what ``parse_url`` refuses, without any server."""

from __future__ import annotations

import pytest

import jobfence
from jobfence._core.url import is_secret_option, mask_url, parse_url


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://default:s3cret@host/0", "redis://default:***@host/0"),
        ("redis://host:6379/0?password=s3cret", "redis://host:6379/0?password=***"),
        (
            "postgresql://bob@db/app?sslmode=require&sslpassword=s3cret&sslkey=/k.pem&x=1",
            "postgresql://bob@db/app?sslmode=require&sslpassword=***&sslkey=***&x=1",
        ),
        ("mysql://u@h/db?passwd=s3cret&pwd=s3cret", "mysql://u@h/db?passwd=***&pwd=***"),
        (
            "redis://h/0?access_token=s3cret&client-secret=s3cret",
            "redis://h/0?access_token=***&client-secret=***",
        ),
        ("redis://:s3/cret@h:1/0", "redis://***@h:1/0"),  # an unencoded '/'
        ("redis://:s3?cret@h/0", "redis://***@h/0"),
        ("redis://:s3#cret@h/0", "redis://***@h/0"),
        ("postgresql://u:s3@c/ret@h/db", "postgresql://***@h/db"),
        ("user:s3cret@host", "user:***@host"),  # no scheme
        ("redis://h/0#s3cret", "redis://h/0#***"),
        ("sqlite:///data/app@1.db", "sqlite:///data/app@1.db"),  # a path, no user-info
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("memory://", "memory://"),
    ],
)
def test_every_secret_of_a_url_is_masked(url: str, masked: str) -> None:
    shown = mask_url(url)
    assert shown == masked
    assert "s3" not in shown
    assert "s3" not in repr(jobfence.ConfigurationError(shown))


def test_secret_option_names() -> None:
    for name in (
        "password",
        "PASSWORD",
        "passwd",
        "sslpassword",
        "ssl_password",
        "pwd",
        "sslkey",
        "ssl_keyfile",
        "token",
        "auth_token",
        "client_secret",
        "pass%77ord",
    ):
        assert is_secret_option(name), name
    for name in (
        "sslmode",
        "db",
        "table",
        "mode",
        "busy_timeout",
        "next_in_line",
        "pool_size",
        "socket_timeout",
        "application_name",
        "namespace",
        "waiter_slack",
    ):
        assert not is_secret_option(name), name


def test_a_parsed_url_shows_only_its_masked_form() -> None:
    parsed = parse_url("postgresql://bob:s3cret@db:5433/app?mode=session&password=pw%2Fx")
    assert parsed.password == "s3cret" and parsed.options["password"] == "pw/x"
    assert "s3cret" not in repr(parsed) and "pw" not in repr(parsed)
    assert (
        repr(parsed) == "BackendURL('postgresql://bob:***@db:5433/app?mode=session&password=***')"
    )
    assert set(parsed.secrets) >= {"s3cret", "pw%2Fx", "pw/x"}
    assert parsed.redact("a driver said pw/x and s3cret") == "a driver said *** and ***"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3/cret@host:6379/0",
        "redis://:s3?cret@host:6379/0",
        "redis://:s3#cret@host:6379/0",
        "postgresql://bob:s3/cret@db/app",
        "redis://:s3cret@host:99999/0",  # a port out of range
        "redis://:s3cret@host:port/0",
    ],
)
def test_a_url_that_cannot_be_split_is_refused_without_showing_the_password(url: str) -> None:
    for cls in (jobfence.Locks, jobfence.Inbox):
        with pytest.raises(jobfence.ConfigurationError) as info:
            cls(url)
        assert info.value.argument == "url"
        assert "s3" not in str(info.value) and "cret" not in str(info.value)
        assert "percent-encode" in str(info.value)


def test_a_percent_encoded_password_is_accepted() -> None:
    parsed = parse_url("redis://:s3%2Fc%3Fr%23et@host:6379/0")
    assert parsed.password == "s3/c?r#et" and parsed.host == "host" and parsed.port == 6379
    assert "s3" not in parsed.masked


def test_a_url_parsed_again_is_reused_with_options_of_its_own_and_no_secret_is_kept() -> None:
    from jobfence.backends import registry

    first = registry.parse_backend_url("memory://reused-url")
    again = registry.parse_backend_url("memory://reused-url")
    assert first == again and first.options is not again.options
    again.options["x"] = "1"  # a caller's own dict: the next one does not see it
    assert registry.parse_backend_url("memory://reused-url").options == {}
    for url in (
        "redis://user:s3cret-in-info@localhost:6379/0",
        "redis://localhost:6379/0?password=s3cret-in-query",
        "redis://localhost:6379/0#s3cret-in-fragment",
    ):
        assert registry.parse_backend_url(url).scheme == "redis"
    assert not any("s3cret" in url for url, _argument in registry._PARSED)
