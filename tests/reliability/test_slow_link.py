"""A slow link does not lose a lease by itself.

Every client here is cold (a new ``Locks`` / ``AsyncLocks``, no connection yet) and talks to its
server through a :class:`FaultProxy` that delays every chunk by 0.1 s or 0.3 s each way (a round
trip of 0.2 s or 0.6 s). It acquires a lease with ttl 2 s or 3 s and holds it for 12 s: the
lease must never be lost, must still be the server's at the end, and right after the acquire
it must have (nearly) its whole ttl left -- connection setup (handshake, script loading, table
creation, the LISTEN connection) happens before the lease's clock starts, and the grant and
every renewal cost one round trip.

The cases of one test run side by side (one thread or task per case, one proxy per delay), so a
test takes about 12 s (and its connection setups) whatever the number of cases. Redis runs on
a disposable server, so its script cache is empty, as on a server that just started.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

import jobfence
from tests.conformance.specs import _postgres_cleanup, new_namespace
from tests.netproxy import FaultProxy
from tests.reliability._redis_server import RedisServer
from tests.servers import POSTGRES_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: how long each lease is held: 4 to 6 of its ttls, a dozen renewals or more (one every third
#: of the ttl), past PostgreSQL's prepared renewal statement (its fifth run, see below)
HOLD = 12.0
#: (delay each way, ttl): round trips of 0.2 s and 0.6 s
REDIS_CASES = [(0.1, 2.0), (0.1, 3.0), (0.3, 2.0), (0.3, 3.0)]
#: PostgreSQL prepares a statement on its fifth run on a connection (psycopg's
#: prepare_threshold), which costs one more round trip once: at a 0.6 s round trip that one
#: renewal needs 1.2 s, too close to a 2 s ttl's renewal margin (ttl - ttl / 3) to be a fair
#: test of the link alone; ttl 3 s covers that round trip
POSTGRES_CASES = [(0.1, 2.0), (0.1, 3.0), (0.3, 3.0)]


@dataclass
class Outcome:
    delay: float
    ttl: float
    left_after_acquire: float = -1.0
    lost: str | None = None
    held_at_end: bool = False
    server_owner_matches: bool = False
    released: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def rtt(self) -> float:
        return 2 * self.delay

    def check(self) -> None:
        where = f"delay {self.delay} s each way, ttl {self.ttl} s"
        assert not self.errors, (where, self.errors)
        # the lease's clock started right before the grant request: one round trip of the ttl
        # is spent, not the connection setup (generous bound: 2.5 round trips)
        assert self.left_after_acquire > self.ttl - 2.5 * self.rtt, (where, self.left_after_acquire)
        assert self.lost is None, (where, self.lost)
        assert self.held_at_end, where
        assert self.server_owner_matches, where
        assert self.released, where


def _hold_sync(url: str, namespace: str, outcome: Outcome) -> None:
    try:
        with jobfence.Locks(url, namespace=namespace) as locks:
            lease = locks.acquire("slow-link", ttl=outcome.ttl, timeout=30)
            outcome.left_after_acquire = lease.expires_in
            gone = threading.Event()

            def lost(lease: jobfence.Lease) -> None:
                outcome.lost = repr(lease)
                gone.set()

            lease.on_lost(lost)
            gone.wait(HOLD)  # returns early only if the lease is lost
            outcome.held_at_end = lease.held
            holder = locks.backend.holder("slow-link")
            outcome.server_owner_matches = holder is not None and holder.owner == lease.owner
            outcome.released = lease.release()
    except Exception as exc:  # reported by Outcome.check in the test's thread
        outcome.errors.append(repr(exc))


async def _hold_async(url: str, namespace: str, outcome: Outcome) -> None:
    try:
        async with jobfence.AsyncLocks(url, namespace=namespace) as locks:
            lease = await locks.acquire("slow-link", ttl=outcome.ttl, timeout=30)
            outcome.left_after_acquire = lease.expires_in
            gone = asyncio.Event()

            def lost(lease: jobfence.AsyncLease) -> None:
                outcome.lost = repr(lease)
                gone.set()

            lease.on_lost(lost)
            try:  # returns early only if the lease is lost
                await asyncio.wait_for(gone.wait(), HOLD)
            except asyncio.TimeoutError:
                pass
            outcome.held_at_end = lease.held
            holder = await locks.backend.holder("slow-link")
            outcome.server_owner_matches = holder is not None and holder.owner == lease.owner
            outcome.released = await lease.release()
    except Exception as exc:
        outcome.errors.append(repr(exc))


def _run_cases(
    flavour: str,
    server_url: str,
    port: int,
    cases: list[tuple[float, float]],
    namespaces: list[str],
) -> list[Outcome]:
    delays = sorted({delay for delay, _ in cases})
    proxies = {delay: FaultProxy(port) for delay in delays}
    try:
        for delay, proxy in proxies.items():
            proxy.latency(delay)
        outcomes = [Outcome(delay, ttl) for delay, ttl in cases]
        urls = [proxies[o.delay].url_for(server_url, port) for o in outcomes]
        if flavour == "sync":
            threads = [
                threading.Thread(target=_hold_sync, args=(url, ns, o), daemon=True)
                for url, ns, o in zip(urls, namespaces, outcomes, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(HOLD + 60)
                assert not thread.is_alive()
        else:

            async def main() -> None:
                await asyncio.gather(
                    *(
                        _hold_async(url, ns, o)
                        for url, ns, o in zip(urls, namespaces, outcomes, strict=True)
                    )
                )

            asyncio.run(main())
        return outcomes
    finally:
        for proxy in proxies.values():
            proxy.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_redis_lease_survives_a_slow_link(redis_server: RedisServer, flavour: str) -> None:
    redis_server.restart()  # an empty script cache, as after a server start
    namespaces = [new_namespace() for _ in REDIS_CASES]
    for outcome in _run_cases(
        flavour, redis_server.url, redis_server.port, REDIS_CASES, namespaces
    ):
        outcome.check()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_postgres_lease_survives_a_slow_link(flavour: str) -> None:
    namespaces = [new_namespace() for _ in POSTGRES_CASES]
    try:
        port = urlsplit(POSTGRES_URL).port or 5432
        for outcome in _run_cases(flavour, POSTGRES_URL, port, POSTGRES_CASES, namespaces):
            outcome.check()
    finally:
        for namespace in namespaces:
            _postgres_cleanup(POSTGRES_URL, namespace)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_redis_renewals_do_not_queue_behind_a_waiter(
    redis_server: RedisServer, flavour: str
) -> None:
    """One client holds a lease (ttl 2 s) over a 0.6 s round trip while it also waits for a
    name another client holds (its connection blocked in BLPOP): the renewals keep the lease."""
    namespace = new_namespace()
    hold = 10.0
    with (
        FaultProxy(redis_server.port) as proxy,
        jobfence.Locks(redis_server.url, namespace=namespace) as other,
    ):
        proxy.latency(0.3)
        url = proxy.url_for(redis_server.url, redis_server.port)
        blocker = other.try_acquire("taken", ttl=60)
        assert blocker is not None
        lost: list[str] = []
        if flavour == "sync":
            with jobfence.Locks(url, namespace=namespace) as locks:
                lease = locks.acquire("mine", ttl=2, timeout=30)
                lease.on_lost(lambda lease: lost.append(repr(lease)))
                with pytest.raises(jobfence.LockTimeout):
                    locks.acquire("taken", ttl=2, timeout=hold)  # waits in BLPOP meanwhile
                assert lease.held and not lost
                assert lease.release()
        else:

            async def main() -> None:
                async with jobfence.AsyncLocks(url, namespace=namespace) as locks:
                    lease = await locks.acquire("mine", ttl=2, timeout=30)
                    lease.on_lost(lambda lease: lost.append(repr(lease)))
                    with pytest.raises(jobfence.LockTimeout):
                        await locks.acquire("taken", ttl=2, timeout=hold)
                    assert lease.held and not lost
                    assert await lease.release()

            asyncio.run(main())
        assert blocker.release()
