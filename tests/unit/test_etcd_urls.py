"""The etcd backend's URL reading and key layout (no server needed)."""

from __future__ import annotations

import pytest

from jobfence import ConfigurationError
from jobfence.backends import parse_backend_url
from jobfence.backends.etcd import keys
from jobfence.backends.etcd.client import endpoints_of
from jobfence.backends.etcd.leases import lease_seconds


@pytest.mark.parametrize(
    ("url", "endpoints"),
    [
        ("etcd://db1", ["http://db1:2379"]),
        ("etcd://db1:2380", ["http://db1:2380"]),
        (
            "etcd://h1:1,h2:2,h3:3/?timeout=2",
            ["http://h1:1", "http://h2:2", "http://h3:3"],
        ),
        ("etcds://h1,h2:2400", ["https://h1:2379", "https://h2:2400"]),
        ("etcd://[::1]:2379,[::2]", ["http://[::1]:2379", "http://[::2]:2379"]),
    ],
)
def test_every_member_of_the_url_is_an_endpoint(url: str, endpoints: list[str]) -> None:
    assert endpoints_of(parse_backend_url(url)) == endpoints


@pytest.mark.parametrize("url", ["etcd://h1:x,h2:2", "etcd://h1:70000", "etcd://u:p@h1"])
def test_a_bad_endpoint_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        endpoints_of(parse_backend_url(url))


def test_lease_seconds_round_up_to_whole_seconds_of_at_least_two() -> None:
    assert [lease_seconds(t) for t in (0.05, 1.0, 2.0, 2.0000000001, 2.1, 30)] == [
        2,
        2,
        2,
        2,
        3,
        30,
    ]


def test_keys_never_meet_and_read_back() -> None:
    made = {
        keys.lock_key(ns, name, owner)
        for ns in ("a", "a/locks", "a%2F", "b")
        for name in ("n", "n/x", "x/n", "ü:名", "%2F")
        for owner in ("o", "o/p")
    }
    assert len(made) == 4 * 5 * 2
    assert keys.split_lock_key("a/locks", keys.lock_key("a/locks", "n/x", "o/p")) == ("n/x", "o/p")
    assert keys.split_lock_key("a", keys.lock_key("a/locks", "n", "o")) is None
    assert keys.inbox_name("t", keys.inbox_key("t", "k/1")) == "k/1"
    assert keys.inbox_name("t", keys.lock_key("t", "k", "o")) is None
    # a record's attempts key is apart from every record key, read back by its own prefix
    attempts = keys.attempts_key("t", "k/1")
    assert attempts != keys.inbox_key("t", "k/1")
    assert not attempts.startswith(keys.inbox_prefix("t"))
    assert keys.inbox_name("t", attempts) is None
    assert keys.inbox_name("t", attempts, attempts=True) == "k/1"
    assert keys.inbox_name("t", keys.inbox_key("t", "k"), attempts=True) is None
    # the encoding of a prefix is a prefix of the encoding: a range finds exactly those names
    assert keys.lock_prefix("a", "ü:名").startswith(keys.lock_prefix("a", "ü", whole=False))
    assert keys.range_end(b"a/\xff") == b"a0"


def test_only_schemes_the_registry_marks_take_several_hosts() -> None:
    """A comma in the host part is read as several members only where the backend says it
    takes them (etcd, Redis Sentinel): elsewhere it is an unreadable host or port."""
    assert parse_backend_url("etcd://h1:1,h2:2").port is None
    assert parse_backend_url("redis+sentinel://h1:26379,h2:26379/mymaster").port is None
    with pytest.raises(ConfigurationError) as info:
        parse_backend_url("redis://h1:6379,h2:6379/0")
    assert info.value.argument == "url"
