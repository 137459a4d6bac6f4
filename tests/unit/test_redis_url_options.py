"""The query options of a Redis URL: an option neither jobfence nor redis-py's connection takes
is refused when the part is built, naming it (redis-py would hand it to its connection class,
which fails with a ``TypeError`` at the first connection); ``namespace`` works in a lock URL
as in a queue URL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

import jobfence
from jobfence.errors import ConfigurationError
from tests.servers import REDIS_URL

BUILDERS: dict[str, Callable[[str], Any]] = {
    "Locks": jobfence.Locks,
    "AsyncLocks": jobfence.AsyncLocks,
    "Inbox": jobfence.Inbox,
    "AsyncInbox": jobfence.AsyncInbox,
    "Queue": lambda url: jobfence.Queue(url, "q"),
    "AsyncQueue": lambda url: jobfence.AsyncQueue(url, "q"),
}


def _with(query: str) -> str:
    return REDIS_URL + ("&" if "?" in REDIS_URL else "?") + query


@pytest.mark.parametrize("part", sorted(BUILDERS))
def test_an_unknown_query_option_is_refused_when_the_part_is_built(part: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        BUILDERS[part](_with("bogus_option=1"))
    assert caught.value.argument == "url"
    assert "'bogus_option'" in str(caught.value) and "allowed:" in str(caught.value)


def test_redis_py_connection_options_in_the_url_still_work() -> None:
    name = f"url-opts-{uuid.uuid4().hex[:8]}"
    locks = jobfence.Locks(_with(f"client_name={name}&health_check_interval=5"))
    try:
        with locks.acquire("x", ttl=5):
            clients = redis.Redis.from_url(REDIS_URL).client_list()
            assert any(c.get("name") == name for c in clients)
    finally:
        locks.close()


def test_a_lock_url_takes_the_namespace_as_a_queue_url_does() -> None:
    namespace = f"urlns-{uuid.uuid4().hex[:8]}"
    locks = jobfence.Locks(_with(f"namespace={namespace}"))
    r = redis.Redis.from_url(REDIS_URL)
    try:
        with locks.acquire("x", ttl=5):
            assert r.exists(f"{namespace}:lock:{{x}}")
        same = jobfence.Locks(REDIS_URL, namespace=namespace)
        assert same.try_acquire("x", ttl=5) is not None  # released above, same key
        same.close()
    finally:
        locks.close()
        for key in r.scan_iter(f"{namespace}:*"):
            r.delete(key)


def test_a_url_namespace_and_a_different_keyword_are_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:
        jobfence.Locks(_with("namespace=a"), namespace="b")
    assert caught.value.argument == "namespace"
