"""Redis failover: what survives the promotion of a lagging replica, with and without
``wait_replicas``, and a Sentinel client following a failover.

Every test runs its own disposable primary and replica (and Sentinel), never the shared server.
The replica follows the primary through a loopback ``FaultProxy``: its ``latency`` makes the
replica lag, ``stall`` cuts it off. A failover is played as it happens: the link stalls (what
the replica has not received yet stays unreceived), the primary is SIGKILLed, the link is cut
and the replica promoted (``REPLICAOF NO ONE``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

import jobfence
from jobfence.backends.base import ClaimState
from jobfence.doctor import diagnose
from tests.netproxy import FaultProxy
from tests.reliability._redis_server import (
    RedisServer,
    SentinelServer,
    promote,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

#: one-way delay of the replication link while the replica lags (a round trip is twice this)
LAG = 0.15
WAITING = "wait_replicas=1&wait_timeout=2"


class Pair:
    def __init__(self, primary: RedisServer, proxy: FaultProxy, replica: RedisServer) -> None:
        self.primary, self.proxy, self.replica = primary, proxy, replica

    def url(self, query: str = "") -> str:
        return self.primary.url + (f"?{query}" if query else "")

    def caught_up(self) -> None:
        """Wait until the replica has every write so far (a WAIT of our own)."""
        client = redis.Redis(port=self.primary.port)
        try:
            assert client.execute_command("WAIT", 1, 10_000) == 1
        finally:
            client.close()

    def fail_over(self) -> str:
        """The primary dies with the replica behind; the replica is promoted. Its URL."""
        self.proxy.stall()  # what is on its way to the replica stays there
        self.primary.kill()
        self.proxy.reset()  # ... and is lost with the link
        promote(self.replica)
        return self.replica.url


@pytest.fixture
def pair() -> Iterator[Pair]:
    with (
        RedisServer() as primary,
        FaultProxy(primary.port) as proxy,
        RedisServer(replica_of=proxy.port) as replica,
    ):
        wait_until(lambda: replica.info()["master_link_status"] == "up", 15, "the replica's link")
        pair = Pair(primary, proxy, replica)
        pair.caught_up()
        yield pair


def _complete(inbox: jobfence.Inbox, key: str) -> None:
    with inbox.claim(key, ttl=30) as claim:
        claim.complete({"done": key})


def _states(url: str, keys: list[str]) -> dict[str, ClaimState | None]:
    with jobfence.Inbox(url) as inbox:
        found = {}
        for key in keys:
            info = inbox.claim_info(key)
            found[key] = None if info is None else info.state
        return found


def test_without_wait_completed_records_written_during_the_lag_vanish(pair: Pair) -> None:
    """The documented default (wait_replicas=0): a completion returns once the primary has it;
    a failover to a replica that lagged loses it, and the job can run again."""
    with jobfence.Inbox(pair.url()) as inbox:
        _complete(inbox, "before")
        pair.caught_up()
        pair.proxy.latency(2.0)  # nothing waits for the replica: let it lag far behind
        lagged = [f"lag-{i}" for i in range(5)]
        for key in lagged:
            _complete(inbox, key)  # every one returned successfully
        new_url = pair.fail_over()
    states = _states(new_url, ["before", *lagged])
    assert states["before"] is ClaimState.COMPLETED
    assert all(states[key] is None for key in lagged), states  # gone: they would run again


def test_with_wait_every_completion_that_returned_survives(pair: Pair) -> None:
    with jobfence.Inbox(pair.url(WAITING)) as inbox:
        assert inbox.backend.replica_wait is not None
        pair.proxy.latency(LAG)
        done = [f"job-{i}" for i in range(3)]
        for key in done:
            _complete(inbox, key)
        new_url = pair.fail_over()  # at once: nothing is given time to catch up
    states = _states(new_url, done)
    assert all(state is ClaimState.COMPLETED for state in states.values()), states


def test_with_wait_a_renewal_that_returned_survives(pair: Pair) -> None:
    with jobfence.Locks(pair.url(WAITING), namespace="fo") as locks:
        lease = locks.try_acquire("job", ttl=4, renew=False)
        assert lease is not None
        pair.proxy.latency(LAG)
        lease.extend(60)  # returned: a replica has the new lifetime
        new_url = pair.fail_over()
    promoted = redis.Redis.from_url(new_url)
    try:
        assert promoted.pttl("fo:lock:{job}") > 30_000
    finally:
        promoted.close()
    with jobfence.Locks(new_url, namespace="fo") as locks:
        assert locks.try_acquire("job", ttl=5) is None  # still held: no second holder


def test_with_wait_an_unreplicated_grant_is_given_back(pair: Pair) -> None:
    with (
        jobfence.Locks(pair.url("wait_replicas=1&wait_timeout=1"), namespace="fo") as locks,
        jobfence.Inbox(pair.url("wait_replicas=1&wait_timeout=1")) as inbox,
    ):
        held = locks.try_acquire("held", ttl=30, renew=False)
        assert held is not None
        pair.proxy.stall()  # the replica hears nothing more
        with pytest.raises(jobfence.NotReplicated) as grant:
            locks.try_acquire("job", ttl=30)
        assert (grant.value.acknowledged, grant.value.required) == (0, 1)
        assert "given back" in str(grant.value)
        assert jobfence.is_transient(grant.value)
        assert locks.holder("job") is None  # not handed out on the primary either
        with pytest.raises(jobfence.NotReplicated, match="unconfirmed"):
            held.extend(60)
        with pytest.raises(jobfence.NotReplicated, match="released"):
            inbox.claim("key", ttl=30)
        assert inbox.claim_info("key") is None or inbox.claim_info("key").owner is None
        held.release()


def test_with_wait_a_resent_claim_waits_for_the_first_send(pair: Pair) -> None:
    """A claim re-sent after a lost reply (redis-py retries on a new connection) finds the key
    already its own and writes nothing; its WAIT must still cover the first send's write."""
    with (
        jobfence.Inbox(pair.url()) as first,
        jobfence.Inbox(pair.url("wait_replicas=1&wait_timeout=0.5")) as resend,
        jobfence.Locks(pair.url()) as first_locks,
        jobfence.Locks(pair.url("wait_replicas=1&wait_timeout=0.5")) as resend_locks,
    ):
        resend.backend.install()  # its connection is open: a PING is no write
        resend_locks.backend.prepare()
        pair.proxy.stall()
        # the first send, whose reply was lost: on the primary only
        assert first.backend.claim("key", "owner-1", None, 30).mine
        assert first_locks.backend.acquire("job", "owner-1", 30)
        with pytest.raises(jobfence.NotReplicated):
            resend.backend.claim("key", "owner-1", None, 30)
        with pytest.raises(jobfence.NotReplicated):
            resend_locks.backend.acquire("job", "owner-1", 30)


def _replication(url: str) -> tuple[str, str]:
    found = [f for f in diagnose(url, probe=False).findings if f.code == "redis-replication"]
    assert len(found) == 1, found
    return found[0].level, found[0].message


def test_doctor_says_which_choice_the_deployment_is_on(pair: Pair) -> None:
    level, message = _replication(pair.url())
    assert level == "warning"
    assert "1 connected replica" in message and "wait_replicas is 0" in message
    assert "lose completed inbox records" in message
    level, message = _replication(pair.url("wait_replicas=1"))
    assert level == "ok" and "wait_replicas is 1" in message
    level, message = _replication(pair.url("wait_replicas=2"))
    assert level == "error" and "NotReplicated" in message
    level, message = _replication(pair.replica.url)
    assert level == "error" and "replica" in message


def test_bad_replica_options_are_refused() -> None:
    for query, argument in [
        ("wait_replicas=-1", "wait_replicas"),
        ("wait_replicas=two", "wait_replicas"),
        ("wait_replicas=101", "wait_replicas"),
        ("wait_replicas=1&wait_timeout=0", "wait_timeout"),
        ("wait_replicas=1&wait_timeout=nan", "wait_timeout"),
        ("wait_replicas=1&wait_timeout=5&timeout=5", "wait_timeout"),  # must beat the reply
    ]:
        for opener in (jobfence.Locks, jobfence.Inbox):
            with pytest.raises(jobfence.ConfigurationError) as err:
                opener(f"redis://127.0.0.1:1/0?{query}")
            assert err.value.argument == argument, query
    with pytest.raises(jobfence.ConfigurationError) as err:
        jobfence.Locks("redis://127.0.0.1:1/0", wait_replicas=True)
    assert err.value.argument == "wait_replicas"
    with pytest.raises(jobfence.ConfigurationError) as err:
        jobfence.Locks("redis+sentinel://127.0.0.1:1,bad:port/mymaster")
    assert err.value.argument == "url"
    with pytest.raises(jobfence.ConfigurationError) as err:
        jobfence.Locks("redis+sentinel://127.0.0.1:26379")  # no service name
    assert err.value.argument == "url"


async def _async_through_sentinel(url: str) -> ClaimState:
    """The asyncio clients open the primary through the Sentinel too (and close their
    connections to it with their own)."""
    async with (
        jobfence.AsyncLocks(f"{url}?{WAITING}", namespace="fo") as locks,
        jobfence.AsyncInbox(f"{url}?{WAITING}") as inbox,
    ):
        lease = await locks.try_acquire("async", ttl=30)
        assert lease is not None
        await lease.release()
        async with await inbox.claim("async") as claim:
            await claim.complete("done")
        info = await inbox.claim_info("async")
        assert info is not None
        return info.state


def test_a_sentinel_client_follows_the_failover() -> None:
    with RedisServer() as primary, RedisServer(replica_of=primary.port) as replica:
        wait_until(lambda: replica.info()["master_link_status"] == "up", 15, "the replica's link")
        with SentinelServer(primary.port) as sentinel:
            wait_until(lambda: sentinel.replicas() == 1, 15, "the Sentinel to see the replica")
            with (
                jobfence.Inbox(f"{sentinel.url}?{WAITING}") as waiting,
                jobfence.Inbox(sentinel.url) as inbox,
                jobfence.Locks(sentinel.url, namespace="fo") as locks,
            ):
                _complete(waiting, "before")  # a replica has it
                assert asyncio.run(_async_through_sentinel(sentinel.url)) == ClaimState.COMPLETED
                first = locks.try_acquire("job", ttl=30, renew=False)
                assert first is not None
                primary.kill()
                # the same clients, whose connections went to the old primary, get through
                # again once the Sentinel names the promoted replica
                deadline = time.monotonic() + 30
                while True:
                    try:
                        lease = locks.try_acquire("other", ttl=30)
                        break
                    except jobfence.BackendError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
                assert lease is not None
                assert sentinel.primary_port() == replica.port
                assert replica.info()["role"] == "master"
                info = inbox.claim_info("before")
                assert info is not None and info.state is ClaimState.COMPLETED
                assert lease.token > first.token
                lease.release()
            # the doctor follows the Sentinel too: the promoted replica has no replica left
            level, message = _replication(sentinel.url)
            assert level == "ok" and "no replicas" in message


async def test_async_hand_off_waits_for_the_replica(pair: Pair) -> None:
    """A waiting acquire takes a hand-off with a BLPOP and a WAIT on one connection: granted
    once the replica has it; while the replica is cut off, the hand-off is given back and the
    wait ends in LockTimeout, from NotReplicated."""
    url = pair.url("wait_replicas=1&wait_timeout=1")
    async with (
        jobfence.AsyncLocks(url, namespace="fo") as a,
        jobfence.AsyncLocks(url, namespace="fo") as b,
    ):
        held = await a.try_acquire("job", ttl=30, renew=False)
        assert held is not None
        waiter = asyncio.ensure_future(b.acquire("job", ttl=30, timeout=10, renew=False))
        await _queued(pair.primary.url, "job")
        await held.release()
        lease = await waiter
        assert lease.token > held.token
        await lease.release()

        held = await a.try_acquire("job", ttl=30, renew=False)
        assert held is not None
        waiter = asyncio.ensure_future(b.acquire("job", ttl=30, timeout=2.5, renew=False))
        await _queued(pair.primary.url, "job")
        pair.proxy.stall()
        await held.release()  # hands the lease to the waiter, which cannot get it confirmed
        with pytest.raises(jobfence.LockTimeout) as timeout:
            await waiter
        causes = []
        link: BaseException | None = timeout.value
        while link is not None:
            causes.append(type(link))
            link = link.__cause__
        assert jobfence.NotReplicated in causes
        assert await a.holder("job") is None  # given back, not left held


async def _queued(url: str, name: str) -> None:
    """Wait until someone queues for ``name`` (the waiter's acquire reached the server)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        for _ in range(500):
            if await client.zcard(f"fo:lock:{{{name}}}:q"):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("nobody queued")
    finally:
        await client.aclose()
