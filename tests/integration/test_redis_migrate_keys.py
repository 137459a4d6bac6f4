"""Upgrading from the key layout of earlier versions: keys without braces are where they were (a
live lease still excludes, a completed record is still a duplicate, a queue keeps its
messages); keys with a brace move with ``jobfence redis migrate-keys``, leases with their ttl
(still excluding), inbox records with their retention (still duplicates), queues whole."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from click.testing import CliRunner
from redis.cluster import key_slot

import jobfence
from jobfence import ClaimState
from jobfence.backends.redis.keys import (
    legacy_inbox_key,
    legacy_lock_key,
    legacy_queue_prefix,
    lock_key,
    queue_prefix,
)
from jobfence.backends.redis.migrate import migrate_keys
from jobfence.cli.app import cli
from tests.integration._redis_cluster import RedisCluster
from tests.servers import REDIS_URL, delete_redis_keys

QUEUE_SUFFIXES = ("s", "f", "o", "d", "ds", "dead", "m", "mx")


@pytest.fixture
def root() -> Iterator[str]:
    value = "mk" + uuid.uuid4().hex[:12]
    yield value
    delete_redis_keys(value + "*")


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def _old_lease(raw: redis.Redis, namespace: str, name: str, token: int, owner: str) -> None:
    """A lease as earlier versions wrote it."""
    raw.set(legacy_lock_key(namespace, name), f"{token}:{owner}", px=60_000)


def _old_record(raw: redis.Redis, inbox: jobfence.Inbox, table: str, key: str) -> None:
    """A completed record of ``key`` as earlier versions kept it (under ``table:key``), made by
    completing a claim of a brace-free key and renaming its record."""
    scratch = "scratch-" + uuid.uuid4().hex
    inbox.claim(scratch, ttl=30).complete({"done": key})
    raw.rename(legacy_inbox_key(table, scratch), legacy_inbox_key(table, key))


def test_keys_without_braces_did_not_move(root: str, raw: redis.Redis) -> None:
    table = root + "_inbox"
    _old_lease(raw, root, "report:1", 123, "old-worker")
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as locks,
        jobfence.Inbox(REDIS_URL, table=table) as inbox,
    ):
        assert locks.try_acquire("report:1", ttl=10) is None  # the old lease still excludes
        holder = locks.holder("report:1")
        assert holder is not None and (holder.owner, holder.token) == ("old-worker", 123)
        _old_record(raw, inbox, table, "order:7%")
        claim = inbox.claim("order:7%")
        assert claim.state is ClaimState.COMPLETED and claim.result == {"done": "order:7%"}
    assert migrate_keys(raw, namespaces=[root], tables=[table]).moved == []


def test_migrate_moves_leases_records_and_queues(root: str, raw: redis.Redis) -> None:
    table, braced = root + "_inbox", root + "{x}"
    _old_lease(raw, root, "a{b}", 456, "old-worker")
    _old_lease(raw, braced, "plain", 789, "old-worker")
    with (
        jobfence.Locks(REDIS_URL, namespace=root) as locks,
        jobfence.Locks(REDIS_URL, namespace=braced) as braced_locks,
        jobfence.Inbox(REDIS_URL, table=table) as inbox,
        jobfence.Queue(REDIS_URL, "jobs", namespace=root) as scratch_queue,
    ):
        _old_record(raw, inbox, table, "lock:{k}")
        # a queue of a namespace with a brace, as earlier versions kept it
        scratch_queue.publish_many(["one", "two"])
        for suffix in QUEUE_SUFFIXES:
            old = queue_prefix(root, "jobs") + suffix
            if raw.exists(old):
                raw.rename(old, legacy_queue_prefix(braced, "jobs") + suffix)
        # before the migration the new layout does not see them
        assert inbox.claim_info("lock:{k}") is None
        assert locks.holder("a{b}") is None

        planned = migrate_keys(raw, namespaces=[root, braced], tables=[table], dry_run=True)
        assert raw.exists(legacy_lock_key(root, "a{b}"))  # a dry run moves nothing
        done = migrate_keys(raw, namespaces=[root, braced], tables=[table])
        assert sorted(done.moved) == sorted(planned.moved) and done.conflicts == []
        assert (legacy_lock_key(root, "a{b}"), lock_key(root, "a{b}")) in done.moved

        # the moved leases still exclude, with their owner, token and ttl
        for client, name, token in ((locks, "a{b}", 456), (braced_locks, "plain", 789)):
            assert client.try_acquire(name, ttl=10) is None
            holder = client.holder(name)
            assert holder is not None and (holder.owner, holder.token) == ("old-worker", token)
            assert holder.expires_in is not None and 0 < holder.expires_in <= 60
        # the completed record is still a duplicate
        claim = inbox.claim("lock:{k}")
        assert claim.state is ClaimState.COMPLETED and claim.result == {"done": "lock:{k}"}
        # the queue kept its messages
        with jobfence.Queue(REDIS_URL, "jobs", namespace=braced) as queue:
            assert queue.stats().ready == 2
            assert jobfence.Queue.names(REDIS_URL, namespace=braced) == ["jobs"]
            assert sorted(m.body for m in queue.receive(max_messages=5)) == ["one", "two"]
            queue.drop()
        # a new grant's token is above the old lease's (floored at the server clock)
        assert locks.force_release("a{b}")
        lease = locks.try_acquire("a{b}", ttl=10)
        assert lease is not None and lease.token > 456
        lease.release()
    again = migrate_keys(raw, namespaces=[root, braced], tables=[table])
    assert (again.moved, again.conflicts) == ([], [])


def test_a_key_whose_new_key_exists_is_left_in_place(root: str, raw: redis.Redis) -> None:
    _old_lease(raw, root, "{n}", 1, "old")
    with jobfence.Locks(REDIS_URL, namespace=root) as locks:
        lease = locks.try_acquire("{n}", ttl=10)
        assert lease is not None
        done = migrate_keys(raw, namespaces=[root], tables=[])
        assert done.moved == [] and done.conflicts == [
            (legacy_lock_key(root, "{n}"), lock_key(root, "{n}"))
        ]
        assert raw.exists(legacy_lock_key(root, "{n}"))
        assert locks.holder("{n}") is not None and locks.holder("{n}").token == lease.token
        lease.release()


def test_the_cli_migrates_and_reports(root: str, raw: redis.Redis) -> None:
    _old_lease(raw, root, "x}y", 5, "old")
    runner = CliRunner()
    args = ["redis", "migrate-keys", REDIS_URL, "--namespace", root, "--table", root + "_t"]
    result = runner.invoke(cli, [*args, "--dry-run", "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "dry_run": True,
        "moved": [{"from": legacy_lock_key(root, "x}y"), "to": lock_key(root, "x}y")}],
        "conflicts": [],
    }
    result = runner.invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0 and "moved 1 key, 0 conflicts" in result.stdout
    assert raw.get(lock_key(root, "x}y")) == b"5:old"
    result = runner.invoke(cli, ["redis", "migrate-keys", "sqlite:///x.db"])
    assert result.exit_code == 2 and "redis://" in result.output


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


def test_migrate_moves_keys_across_slots_on_a_cluster(cluster: RedisCluster) -> None:
    root = "mk" + uuid.uuid4().hex[:12]
    table = root + "_inbox"
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        old = legacy_lock_key(root, "a{b}")
        assert key_slot(old.encode()) != key_slot(lock_key(root, "a{b}").encode())
        client.set(old, "77:old-worker", px=60_000)
        with (
            jobfence.Locks(client, namespace=root) as locks,
            jobfence.Inbox(client, table=table) as inbox,
        ):
            scratch = "scratch-" + uuid.uuid4().hex
            inbox.claim(scratch, ttl=30).complete("result")
            # as earlier versions kept the record of "x{y}" (another slot than the new key)
            payload = client.dump(legacy_inbox_key(table, scratch))
            client.restore(legacy_inbox_key(table, "x{y}"), 60_000, payload)
            done = migrate_keys(client, namespaces=[root], tables=[table])
            assert len(done.moved) == 2 and done.conflicts == []
            assert locks.try_acquire("a{b}", ttl=10) is None
            holder = locks.holder("a{b}")
            assert holder is not None and (holder.owner, holder.token) == ("old-worker", 77)
            assert 0 < client.pttl(lock_key(root, "a{b}")) <= 60_000
            claim = inbox.claim("x{y}")
            assert claim.state is ClaimState.COMPLETED and claim.result == "result"
            assert client.exists(old) == 0
            locks.force_release("a{b}")
            inbox.drop()
    finally:
        client.close()
