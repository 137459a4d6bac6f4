"""Listings on a Redis that holds many other keys: few SCAN pages, whatever the keyspace.

``Queue.names``, ``Locks.holders`` and ``Inbox.claims`` find their keys by ``SCAN``, which
visits the whole keyspace whatever it matches, one round trip per page. The dashboard lists
all three every few seconds; on a Redis that also holds an application's 100,000s of keys,
pages of 1,000 keys made each listing hundreds of round trips (the dashboard's answer
timeout was reached on a loaded machine). Counted on a disposable server: ``INFO
commandstats`` calls of ``scan``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import jobfence
from tests.reliability._redis_server import RedisServer

#: unrelated keys filled in before each listing (the application's own)
OTHER_KEYS = 120_000
#: SCAN pages a listing may take: 120,000 keys in pages of 10,000, plus the end of the scan
MOST_PAGES = 20


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    client = redis.Redis.from_url(srv.url)
    try:
        pipe = client.pipeline(transaction=False)
        for start in range(0, OTHER_KEYS, 10_000):
            pipe.mset({f"app:{n}": b"x" for n in range(start, start + 10_000)})
        pipe.execute()
        yield srv
    finally:
        client.close()
        srv.stop()


def scan_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


def pages(server: RedisServer, listing: object) -> tuple[object, int]:
    """What ``listing()`` returns, and the SCAN pages it took."""
    client = redis.Redis.from_url(server.url)
    try:
        before = scan_calls(client)
        result = listing()  # type: ignore[operator]
        return result, scan_calls(client) - before
    finally:
        client.close()


def test_queue_names_take_few_pages(server: RedisServer) -> None:
    with jobfence.Queue(server.url, "orders", namespace="shop") as queue:
        queue.publish({"order": 1})
    names, taken = pages(server, lambda: jobfence.Queue.names(server.url, namespace="shop"))
    assert names == ["orders"]
    assert taken <= MOST_PAGES, f"{taken} SCAN pages for {OTHER_KEYS} other keys"


def test_lock_holders_take_few_pages(server: RedisServer) -> None:
    with jobfence.Locks(server.url, namespace="shop") as locks:
        lease = locks.try_acquire("stock:1", ttl=60, renew=False)
        assert lease is not None
        try:
            holders, taken = pages(server, lambda: locks.holders())
        finally:
            lease.release()
    assert [name for name, _ in holders] == ["stock:1"]  # type: ignore[attr-defined]
    assert taken <= MOST_PAGES, f"{taken} SCAN pages for {OTHER_KEYS} other keys"


def test_inbox_claims_take_few_pages(server: RedisServer) -> None:
    with jobfence.Inbox(server.url, table="shop_inbox") as inbox:
        claim = inbox.claim("order-1")
        claim.complete("done")
        claims, taken = pages(server, lambda: inbox.claims())
    assert [info.key for info in claims] == ["order-1"]  # type: ignore[attr-defined]
    assert taken <= MOST_PAGES, f"{taken} SCAN pages for {OTHER_KEYS} other keys"


def test_a_schedules_info_lists_the_keyspace_three_times(server: RedisServer) -> None:
    """``Scheduler.info`` (the dashboard's and ``jobfence schedule list``'s read): this hour's
    records, then every record of the schedule in one listing, then its missed records:
    three passes over the keyspace, not one per day of retention."""

    def nightly() -> None:
        """A sparse schedule's target (never fired here)."""

    with jobfence.Inbox(server.url, table="sched_inbox") as inbox:
        _, per_pass = pages(server, lambda: inbox.claims())
    with jobfence.Scheduler(server.url, namespace="sched") as scheduler:
        scheduler.add("nightly", cron="30 3 * * *", target=nightly)
        info, taken = pages(server, lambda: scheduler.info("nightly"))
    assert info.name == "nightly" and info.last is None  # type: ignore[attr-defined]
    assert taken <= 3 * per_pass, f"{taken} SCAN pages, {per_pass} per pass over the keyspace"
