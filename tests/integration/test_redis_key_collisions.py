"""On a real Redis, no lock, inbox record or queue reaches another's key, whatever its
namespace, table or name holds: the collisions of the previous layout, and a Hypothesis
property over generated namespaces, names and tables on a private server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.redis.inbox import RedisInboxBackend
from jobfence.backends.redis.locks import RedisLockBackend
from jobfence.backends.redis.queue import RedisQueueBackend
from jobfence.dashboard.state import DashboardConfig, Target
from tests.reliability._redis_server import RedisServer
from tests.servers import REDIS_URL, delete_redis_keys


@pytest.fixture
def root() -> Iterator[str]:
    """A fresh name (an SQL identifier, so that it can be an inbox table too)."""
    value = "kc" + uuid.uuid4().hex[:12]
    yield value
    delete_redis_keys(value + "*")


def test_two_namespaces_never_share_a_lock(root: str) -> None:
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as a,
        jobfence.Locks(REDIS_URL, namespace=root + ":lock:{zz") as b,
    ):
        first = a.try_acquire("zz:lock:{k", ttl=30)
        second = b.try_acquire("k", ttl=30)
        assert first is not None and second is not None
        assert [name for name, _ in a.holders()] == ["zz:lock:{k"]
        assert [name for name, _ in b.holders()] == ["k"]
        first.release()
        second.release()


def test_an_inbox_key_shaped_like_a_lock_key_is_an_inbox_key(root: str) -> None:
    """``claim("lock:{k}")`` in the inbox whose table is the lock namespace: a claim of its own
    (no WRONGTYPE), which neither the lock nor the inbox's forget, drop and listing disturb."""
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as locks,
        jobfence.Inbox(REDIS_URL, table=root) as inbox,
    ):
        lease = locks.try_acquire("k", ttl=30)
        assert lease is not None
        claim = inbox.claim("lock:{k}", ttl=30)
        assert claim.state is jobfence.ClaimState.NEW
        claim.complete("done")
        assert inbox.claim("lock:{k}").state is jobfence.ClaimState.COMPLETED  # a duplicate
        assert [info.key for info in inbox.claims()] == ["lock:{k}"]
        assert inbox.forget("lock:{k}") is True
        assert inbox.forget("lock:{k}") is False  # the lock's key was never its to delete
        assert locks.holder("k") is not None
        lease.extend(30)  # still held: no LockLost
        assert lease.release() is True


def test_inbox_forget_never_deletes_a_lock_or_a_queue(root: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as locks,
        jobfence.Inbox(REDIS_URL, table=root) as inbox,
        jobfence.Queue(REDIS_URL, "x", namespace=root) as queue,
    ):
        lease = locks.try_acquire("k", ttl=30)
        assert lease is not None
        queue.publish("body")
        keys_before = sorted(client.scan_iter(match=root + "*"))
        for key in ("lock:{k}", "lock:{k}:tok", "q:{x}:s", "q:{x}:m", "x"):
            assert inbox.forget(key) is False
        assert inbox.claims() == []
        inbox.drop()  # deletes the inbox's records only
        assert sorted(client.scan_iter(match=root + "*")) == keys_before
        assert locks.holder("k") is not None
        assert queue.stats().ready == 1
        lease.release()
        queue.drop()
    client.close()


def test_the_dashboard_s_forget_never_deletes_a_lock(root: str) -> None:
    """The dashboard's forget action (like ``jobfence inbox``'s) goes through
    ``Inbox.forget``: on the inbox whose table is the lock namespace, it leaves the lease."""
    config = DashboardConfig(urls=(REDIS_URL,), namespace=root, inbox_table=root)
    target = Target(0, REDIS_URL, config)
    with jobfence.Locks(REDIS_URL, namespace=root) as locks:
        lease = locks.try_acquire("k", ttl=30)
        assert lease is not None
        try:
            assert target.forget("lock:{k}") == {"forgotten": False}
            lease.extend(30)  # still held: LockLost otherwise
            assert lease.release() is True
        finally:
            target.close()


def test_queue_names_lists_only_its_namespace(root: str) -> None:
    with (
        jobfence.Queue(REDIS_URL, "mine", namespace=root) as mine,
        jobfence.Queue(REDIS_URL, "other", namespace=root + ":q:{a}:x") as other,
    ):
        mine.publish(1)
        other.publish(2)
        assert jobfence.Queue.names(REDIS_URL, namespace=root) == ["mine"]
        assert jobfence.Queue.names(REDIS_URL, namespace=root + ":q:{a}:x") == ["other"]
        mine.drop()
        other.drop()


def test_holders_lists_only_its_namespace(root: str) -> None:
    names = ["a", "a}:w:x", "{b}", "%7Bb%7D", "lock:{c}"]
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as a,
        jobfence.Locks(REDIS_URL, namespace=root + ":lock:{a") as b,
        jobfence.Locks(REDIS_URL, namespace=root + "%7B") as c,
    ):
        leases = [x.try_acquire(n, ttl=30) for x in (a, b, c) for n in names]
        assert all(lease is not None for lease in leases)
        for x in (a, b, c):
            assert [n for n, _ in x.holders()] == sorted(names)
            assert [n for n, _ in x.holders(prefix="a")] == ["a", "a}:w:x"]
            assert [n for n, _ in x.holders(prefix="{")] == ["{b}"]
        for lease in leases:
            assert lease is not None and lease.release()


# -- the property, on a private server (flushed between examples) ------------------------------
_PIECES = [":", "{", "}", "%", "%7B", "%7D", "lock", "lock%", "q", "inbox%", "w"]
_text = st.one_of(
    st.lists(
        st.one_of(st.sampled_from(_PIECES), st.text(alphabet="ab:{}%ü", max_size=2)), max_size=6
    ).map("".join),
    st.text(max_size=12),
    st.text(min_size=100, max_size=200),
)
#: namespaces and tables drawn from one small pool, so that parts share them
_roots = st.sampled_from(["t", "t_inbox", "jobs"])
_namespaces = st.one_of(_roots, st.tuples(_roots, _text).map("".join)).filter(
    lambda s: len(s) <= 64
)
_names = _text.filter(lambda s: s and "\x00" not in s)  # NUL: legal, but noisy in reports
_queue_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,12}", fullmatch=True)
_triples = st.one_of(
    st.tuples(st.just("lock"), _namespaces, _names),
    st.tuples(st.just("inbox"), _roots, _names),
    st.tuples(st.just("q"), _namespaces, _queue_names),
)


@pytest.fixture(scope="module")
def private() -> Iterator[redis.Redis]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(_triples, min_size=2, max_size=8, unique=True))
def test_distinct_triples_never_meet_on_a_real_redis(
    private: redis.Redis, triples: list[tuple[str, str, str]]
) -> None:
    """Every (part, namespace, name) takes its own key: each lock is granted, each claim is
    new, each queue holds only its own message; then every listing returns exactly its own
    names, and forgetting every inbox key leaves every lock and queue in place."""
    private.flushall()
    url = parse_url("redis://127.0.0.1/0")
    backends: dict[tuple[str, str], Any] = {}

    def backend(part: str, namespace: str, name: str) -> Any:
        if part == "q":
            return RedisQueueBackend(url, name=name, namespace=namespace, client=private)
        if (part, namespace) not in backends:
            if part == "lock":
                backends[part, namespace] = RedisLockBackend(
                    url, namespace=namespace, client=private
                )
            else:
                backends[part, namespace] = RedisInboxBackend(url, table=namespace, client=private)
        return backends[part, namespace]

    for part, namespace, name in triples:
        b = backend(part, namespace, name)
        if part == "lock":
            assert b.acquire(name, "owner", 60) is not None, (namespace, name)
        elif part == "inbox":
            assert b.claim(name, "owner", None, 60).mine, (namespace, name)
        else:
            b.publish([(name, name.encode(), {})])
    for part, namespace, name in triples:
        b = backend(part, namespace, name)
        mine = sorted({n for p, s, n in triples if (p, s) == (part, namespace)})
        if part == "lock":
            assert [n for n, _ in b.holders("", 1000)] == mine
        elif part == "inbox":
            assert sorted(info.key for info in b.claim_infos(None, "", 1000)) == mine
        else:
            assert b.stats().ready == 1
            assert b.names(1000) == mine
    for _, _, name in triples:  # forget each inbox key as a lock's or queue's name
        for table in ("t", "t_inbox", "jobs"):
            inbox = backend("inbox", table, name)
            for key in (name, f"lock:{{{name}}}", f"q:{{{name}}}:s"):
                if ("inbox", table, key) not in triples:
                    assert inbox.forget(key) is False, (table, key)
    for part, namespace, name in triples:
        b = backend(part, namespace, name)
        if part == "lock":
            assert b.holder(name) is not None
        elif part == "q":
            assert b.stats().ready == 1
