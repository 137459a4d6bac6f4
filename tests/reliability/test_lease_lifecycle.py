"""The lease lifecycle against real servers in trouble: stalled links (``FaultProxy``), a Redis
server stopped with SIGSTOP or restarted, a PostgreSQL server restarted (``pg_ctl restart -m
fast``).

* clients whose links stall delay only their own leases, never a healthy client's;
* ``acquire`` never returns a lease that is already lost when its grant arrives late;
* a waiting ``acquire`` rides out a server restart (or times out with the error chained);
* leaving the block of a lease lost to an unreachable backend is fast and raises ``LockLost``;
* an async ``release()`` cut off by a timeout finishes in the background, and a retried
  release answers ``True``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import jobfence
from jobfence.locks import EXIT_RELEASE_WAIT
from jobfence.testing import hooked
from tests.conformance.specs import _postgres_cleanup, _redis_cleanup, new_namespace
from tests.netproxy import FaultProxy
from tests.reliability._pg_server import PostgresServer
from tests.reliability._redis_server import RedisServer
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REDIS_PORT = int(REDIS_URL.split(":")[2].split("/")[0])
POSTGRES_PORT = int(POSTGRES_URL.split("@")[1].split(":")[1].split("/")[0])


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = new_namespace()
    try:
        yield ns
    finally:
        _redis_cleanup(REDIS_URL, ns)
        _postgres_cleanup(POSTGRES_URL, ns)


# -- 1. renewals are isolated per client ----------------------------------------------------
def test_sixteen_stalled_clients_never_cost_a_healthy_client_its_lease(namespace: str) -> None:
    """8 PostgreSQL and 8 Redis clients, each behind its own proxy, hold leases; then every
    proxy stalls, so each of those clients' renewals hangs. A Redis lease (ttl 3) of another
    client in the same process is renewed all along, for 15 s."""
    targets = [(POSTGRES_URL, POSTGRES_PORT)] * 8 + [(REDIS_URL, REDIS_PORT)] * 8
    proxies = [FaultProxy(port) for _, port in targets]
    stalled = [
        jobfence.Locks(proxy.url_for(url, port), namespace=namespace)
        for proxy, (url, port) in zip(proxies, targets, strict=True)
    ]
    healthy = jobfence.Locks(REDIS_URL, namespace=namespace)
    try:
        held = [client.try_acquire(f"stalled-{i}", ttl=1) for i, client in enumerate(stalled)]
        assert all(lease is not None for lease in held)
        lease = healthy.try_acquire("healthy", ttl=3)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        for proxy in proxies:
            proxy.stall()
        assert not lost.wait(15), f"the healthy lease was lost: {lease!r}"
        assert lease.held and lease.release()
        assert all(stale is not None and stale.lost for stale in held)  # theirs are gone
    finally:
        for proxy in proxies:  # the hung calls end with a reset, then the clients close
            proxy.close()
        for client in [*stalled, healthy]:
            client.close()


# -- 3. acquire never returns a lease that is already lost ----------------------------------
def _stop_server_on_first_acquire(server: RedisServer, seconds: float) -> Any:
    """A hook that SIGSTOPs the server just before the first acquire is sent and SIGCONTs it
    ``seconds`` later: that acquire's grant arrives ``seconds`` late."""
    assert server.proc is not None
    pid = server.proc.pid
    timers: list[threading.Timer] = []

    def hook(point: str, **info: Any) -> None:
        if point == "lock.acquire" and not timers:
            os.kill(pid, signal.SIGSTOP)
            timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
            timers.append(timer)
            timer.start()

    def resume() -> None:
        for timer in timers:
            timer.cancel()
        os.kill(pid, signal.SIGCONT)

    hook.resume = resume  # type: ignore[attr-defined]
    return hook


def test_a_grant_that_arrives_after_its_ttl_is_given_back_and_the_wait_goes_on(
    redis_server: RedisServer,
) -> None:
    hook = _stop_server_on_first_acquire(redis_server, 3.0)
    probe = redis.Redis.from_url(redis_server.url)
    try:
        with jobfence.Locks(redis_server.url, namespace="rs") as locks:
            with hooked(hook):
                lease = locks.acquire("job", ttl=2, timeout=10)
            assert lease.held and not lease.lost
            assert lease.expires_in > 1.0  # a fresh grant, not the one that came 3 s late
            holder = probe.get("rs:lock:{job}")
            assert holder is not None and holder.decode().endswith(lease.owner)
            assert lease.release()
    finally:
        hook.resume()
        probe.close()


def test_a_grant_that_arrives_after_its_ttl_and_the_timeout_raises_lock_timeout(
    redis_server: RedisServer,
) -> None:
    hook = _stop_server_on_first_acquire(redis_server, 3.0)
    try:
        with jobfence.Locks(redis_server.url, namespace="rs") as locks:
            with hooked(hook), pytest.raises(jobfence.LockTimeout):
                locks.acquire("job", ttl=2, timeout=2.5)
            other = locks.try_acquire("job", ttl=5)  # given back: free at once
            assert other is not None and other.release()
    finally:
        hook.resume()


# -- 4. a waiting acquire rides out a restart ------------------------------------------------
def _wait_in_thread(
    locks: jobfence.Locks, timeout: float
) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["lease"] = locks.acquire("job", ttl=5, timeout=timeout)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="waiter")
    thread.start()
    return thread, outcome


def _waiting_hook() -> tuple[Any, threading.Event]:
    waiting = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.wait":
            waiting.set()

    return hook, waiting


def test_a_waiter_rides_out_a_postgres_restart(postgres_server: PostgresServer) -> None:
    url = postgres_server.url
    with (
        jobfence.Locks(url, namespace="pr") as holder,
        jobfence.Locks(url, namespace="pr") as waiter,
    ):
        held = holder.try_acquire("job", ttl=4, renew=False)
        assert held is not None
        hook, waiting = _waiting_hook()
        with hooked(hook):
            thread, outcome = _wait_in_thread(waiter, timeout=25)
            assert waiting.wait(10)
            postgres_server.restart()  # every session is terminated: AdminShutdown
            thread.join(30)
        assert not thread.is_alive()
        assert "lease" in outcome, f"the waiter failed: {outcome.get('error')!r}"
        lease = outcome["lease"]
        assert lease.token > held.token and lease.held  # after the holder's ttl
        assert lease.release()


def test_a_waiter_rides_out_a_redis_restart(redis_server: RedisServer) -> None:
    with (
        jobfence.Locks(redis_server.url, namespace="rr") as holder,
        jobfence.Locks(redis_server.url, namespace="rr") as waiter,
    ):
        held = holder.try_acquire("job", ttl=30, renew=False)
        assert held is not None
        hook, waiting = _waiting_hook()
        with hooked(hook):
            thread, outcome = _wait_in_thread(waiter, timeout=25)
            assert waiting.wait(10)
            redis_server.restart()  # the holder's key is gone with the data
            thread.join(30)
        assert not thread.is_alive()
        assert "lease" in outcome, f"the waiter failed: {outcome.get('error')!r}"
        lease = outcome["lease"]
        assert lease.held and lease.release()


def test_a_waiter_whose_redis_stays_down_times_out_with_the_error_chained(
    redis_server: RedisServer,
) -> None:
    with (
        jobfence.Locks(redis_server.url, namespace="rd") as holder,
        jobfence.Locks(redis_server.url, namespace="rd") as waiter,
    ):
        held = holder.try_acquire("job", ttl=30, renew=False)
        assert held is not None
        hook, waiting = _waiting_hook()
        with hooked(hook):
            thread, outcome = _wait_in_thread(waiter, timeout=3)
            assert waiting.wait(10)
            redis_server.kill()
            thread.join(30)
        error = outcome.get("error")
        assert isinstance(error, jobfence.LockTimeout), repr(outcome)
        assert isinstance(error.__cause__, jobfence.BackendError)
        assert isinstance(error.__cause__.__cause__, redis.ConnectionError)


# -- 5. leaving a lost lease is fast and says LockLost ----------------------------------------
def test_leaving_a_block_whose_backend_became_unreachable_is_fast_and_raises_lock_lost(
    namespace: str,
) -> None:
    with FaultProxy(REDIS_PORT) as proxy:
        locks = jobfence.Locks(proxy.url_for(REDIS_URL, REDIS_PORT), namespace=namespace)
        known: list[float] = []
        lost = threading.Event()
        try:
            with pytest.raises(jobfence.LockLost), locks.acquire("job", ttl=1, timeout=5) as lease:
                lease.on_lost(lambda _lease: (known.append(time.monotonic()), lost.set()))
                proxy.stall()  # the backend cannot be reached from now on
                assert lost.wait(5)
            assert time.monotonic() - known[0] < EXIT_RELEASE_WAIT + 1.0
        finally:
            proxy.close()
            locks.close()


async def test_async_lock_lost_reaches_the_caller_soon_after_the_backend_became_unreachable(
    namespace: str,
) -> None:
    with FaultProxy(REDIS_PORT) as proxy:
        locks = jobfence.AsyncLocks(proxy.url_for(REDIS_URL, REDIS_PORT), namespace=namespace)
        known: list[float] = []
        try:
            with pytest.raises(jobfence.LockLost):
                async with locks.acquire("job", ttl=1, timeout=5) as lease:
                    lease.on_lost(lambda _lease: known.append(time.monotonic()))
                    proxy.stall()
                    await asyncio.sleep(30)  # cancelled when the loss is known
            assert known and time.monotonic() - known[0] < EXIT_RELEASE_WAIT + 1.0
        finally:
            proxy.close()
            await locks.close()


# -- 15. a cancelled async release is finished in the background ------------------------------
async def test_an_async_release_cut_off_by_a_timeout_finishes_and_a_retry_answers_true(
    namespace: str,
) -> None:
    probe = redis.Redis.from_url(REDIS_URL)
    with FaultProxy(REDIS_PORT) as proxy:
        locks = jobfence.AsyncLocks(proxy.url_for(REDIS_URL, REDIS_PORT), namespace=namespace)
        try:
            lease = await locks.try_acquire("job", ttl=30)
            assert lease is not None
            proxy.reset()  # the pooled connection is dropped ...
            proxy.stall()  # ... and the new one hangs
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lease.release(), 0.3)
            proxy.resume()
            assert await lease.release() is True  # the cut-off release's answer
            assert probe.get(f"{namespace}:lock:{{job}}") is None  # the name is free
        finally:
            proxy.close()
            await locks.close()
            probe.close()
