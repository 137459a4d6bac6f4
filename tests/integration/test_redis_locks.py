"""The Redis lock backend against a real Redis (tests/servers.py REDIS_URL).

Each test works in its own namespace and deletes its keys afterwards. Command counting uses
a private, disposable redis-server, so no other client can disturb the counts.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

import jobfence
import jobfence.testing
from jobfence._core.url import parse_url
from jobfence.backends.redis.keys import lock_key
from jobfence.backends.redis.locks import RedisLockBackend
from jobfence.backends.redis.locks_async import AsyncRedisLockBackend
from tests.reliability._redis_server import RedisServer
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)

SOURCES = Path(jobfence.__file__).parent / "backends" / "redis"


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture
def ns() -> Iterator[str]:
    namespace = "t" + uuid.uuid4().hex[:12]
    yield namespace
    delete_redis_keys(f"{namespace}:*")


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # fail (not skip) when Redis is unreachable
    yield client
    client.close()


@pytest.fixture
async def araw() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def backend(ns: str) -> Iterator[RedisLockBackend]:
    b = RedisLockBackend(parse_url(REDIS_URL), namespace=ns)
    yield b
    b.close()


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _name() -> str:
    return "job:" + uuid.uuid4().hex[:8]


def _key(ns: str, kind: str, name: str) -> bytes:
    """The lease key ("lock") or a key derived from it ("tok", "q", "qd", "w")."""
    base = lock_key(ns, name)
    return (base if kind == "lock" else f"{base}:{kind}").encode()


def _holder(raw: redis.Redis, ns: str, name: str) -> tuple[int, str] | None:
    value = raw.get(_key(ns, "lock", name))
    if value is None:
        return None
    token, _, owner = value.decode().partition(":")
    return int(token), owner


# -- one round trip per operation -------------------------------------------------------
class CountingConnection(redis.Connection):
    """Counts requests written to the socket: one per round trip (a pipeline is one too)."""

    sent = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[arg-type]


class AsyncCountingConnection(redis.asyncio.Connection):
    sent = 0

    async def send_packed_command(self, command: object, check_health: bool = True) -> None:
        AsyncCountingConnection.sent += 1
        await super().send_packed_command(command, check_health)  # type: ignore[arg-type]


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


def test_every_operation_is_one_round_trip(private_redis: RedisServer) -> None:
    """Counted on both ends: one request leaves the client, one EVALSHA reaches the server."""
    observer = redis.Redis.from_url(private_redis.url)
    locks = jobfence.Locks(private_redis.url, namespace="rt", connection_class=CountingConnection)
    backend = locks.backend
    try:
        warm = locks.try_acquire("warm-up", ttl=30)  # connects, loads the scripts
        assert warm is not None
        warm.extend()
        warm.release()
        results = []

        def measure(fn: Callable[[], object]) -> tuple[int, int]:
            evalsha = _calls(observer).get("evalsha", 0)
            sent = CountingConnection.sent
            results.append(fn())
            return CountingConnection.sent - sent, _calls(observer)["evalsha"] - evalsha

        # the default path: renew=True
        assert measure(lambda: locks.try_acquire("a", ttl=30)) == (1, 1)
        lease = results[-1]
        assert isinstance(lease, jobfence.Lease)
        assert measure(lambda: locks.try_acquire("a", ttl=30)) == (1, 1)
        assert results[-1] is None
        assert measure(lease.extend) == (1, 1)
        others = [locks.try_acquire(n, ttl=30) for n in ("b", "c")]
        items = [(x.name, x.owner, 30.0) for x in [lease, *others] if x is not None]
        assert measure(lambda: backend.renew(items)) == (1, 1)
        assert results[-1] == [True, True, True]
        assert measure(lease.release) == (1, 1)
        assert results[-1] is True
        for other in others:
            assert other is not None
            other.release()
    finally:
        locks.close()
        observer.close()


async def test_async_acquire_and_release_are_one_round_trip_each(
    private_redis: RedisServer,
) -> None:
    locks = jobfence.AsyncLocks(
        private_redis.url, namespace="rt-async", connection_class=AsyncCountingConnection
    )
    try:
        warm = await locks.try_acquire("warm-up", ttl=30)
        assert warm is not None
        await warm.release()
        sent = AsyncCountingConnection.sent
        lease = await locks.try_acquire("a", ttl=30)
        assert lease is not None
        assert AsyncCountingConnection.sent - sent == 1
        assert await lease.release()
        assert AsyncCountingConnection.sent - sent == 2
    finally:
        await locks.close()


def test_locks_reload_their_scripts_after_a_script_flush(private_redis: RedisServer) -> None:
    """A server that forgot the scripts (SCRIPT FLUSH, a restart, a failover) answers
    NOSCRIPT: the script is loaded again and the same call answers as usual."""
    admin = redis.Redis.from_url(private_redis.url)
    locks = jobfence.Locks(private_redis.url, namespace="flush")
    try:
        lease = locks.try_acquire("a", ttl=30)
        assert lease is not None
        admin.script_flush()
        assert locks.try_acquire("a", ttl=30) is None  # still held: the script ran
        admin.script_flush()
        assert lease.release() is True
        admin.script_flush()
        again = locks.try_acquire("a", ttl=30)
        assert again is not None and again.token > lease.token
        admin.script_flush()
        again.extend()
        assert locks.holder("a") is not None
        assert again.release() is True
    finally:
        locks.close()
        admin.close()


async def test_async_locks_reload_their_scripts_after_a_script_flush(
    private_redis: RedisServer,
) -> None:
    admin = redis.asyncio.Redis.from_url(private_redis.url)
    locks = jobfence.AsyncLocks(private_redis.url, namespace="flush-async")
    try:
        lease = await locks.try_acquire("a", ttl=30)
        assert lease is not None
        await admin.script_flush()
        assert await locks.try_acquire("a", ttl=30) is None
        await admin.script_flush()
        assert await lease.release() is True
        await admin.script_flush()
        again = await locks.try_acquire("a", ttl=30)
        assert again is not None and again.token > lease.token
        assert await again.release() is True
    finally:
        await locks.close()
        await admin.aclose()


def test_prepare_reopens_an_idle_connection_the_server_closed(private_redis: RedisServer) -> None:
    """A warm client skips the pool checkout before a grant request, but not when the
    server closed its idle connection: the acquire is sent on a connection opened before
    the lease's clock started."""
    admin = redis.Redis.from_url(private_redis.url)
    locks = jobfence.Locks(private_redis.url, namespace="reopen")
    pool = locks.backend._client.connection_pool
    seen: list[object] = []

    def hook(point: str, **info: object) -> None:
        if point == "lock.acquire":  # after prepare, right before the grant request
            idle = pool._available_connections
            seen.append(idle[-1]._sock if idle else None)

    try:
        warm = locks.try_acquire("warm-up", ttl=30)
        assert warm is not None
        warm.release()
        [conn] = pool._available_connections
        old = conn._sock
        assert old is not None
        port = old.getsockname()[1]
        killed = [c for c in admin.client_list() if c["addr"].endswith(f":{port}")]
        assert killed, "the pool's idle connection is not known to the server"
        admin.client_kill(killed[0]["addr"])
        previous = jobfence.testing.set_hook(hook)
        try:
            lease = locks.try_acquire("a", ttl=30)
        finally:
            jobfence.testing.set_hook(previous)
        assert lease is not None
        assert seen and seen[0] is not None and seen[0] is not old  # reopened before the clock
        assert lease.release() is True
    finally:
        locks.close()
        admin.close()


async def test_async_write_to_a_server_that_stopped_reading_fails_within_the_timeout() -> None:
    """A request that cannot be written (the server stopped reading, its socket buffers are
    full) fails within ``timeout`` with redis-py's "Timeout writing to socket", and its
    connection is closed; the client goes on once the server reads again."""
    with RedisServer() as server:
        assert server.proc is not None
        backend = AsyncRedisLockBackend(parse_url(server.url), namespace="stall", timeout=1)
        client = backend._client
        try:
            assert await client.ping()  # connected: the bounded write applies
            server.proc.send_signal(signal.SIGSTOP)
            try:
                began = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError, match="writing to socket"):
                    await client.set("big", b"x" * (64 << 20))
                assert time.monotonic() - began < 1 + 5  # the deadline, with slack
                assert all(not c.is_connected for c in client.connection_pool._in_use_connections)
            finally:
                server.proc.send_signal(signal.SIGCONT)
            assert await backend.acquire("a", "me", 30) is not None
        finally:
            await backend.close()


async def test_async_requests_are_bounded_without_a_timer_each(ns: str) -> None:
    """Each read and write of the async client is bounded by the connection's watchdog: one
    timer per connection, set again only when it fires, never one made and cancelled per
    request (the stalled-request tests show that the deadline still fires)."""
    backend = AsyncRedisLockBackend(parse_url(REDIS_URL), namespace=ns)
    loop = asyncio.get_running_loop()
    scheduled: list[float] = []
    call_at = loop.call_at

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        scheduled.append(when)
        return call_at(when, *args, **kwargs)

    try:
        await backend.prepare()  # connections open: only requests are counted below
        loop.call_at = counting_call_at  # type: ignore[method-assign]
        try:
            for i in range(50):
                assert await backend.acquire("a", f"owner-{i}", 30) is not None
                assert await backend.release("a", f"owner-{i}") is True
        finally:
            del loop.call_at
        assert len(scheduled) <= 1, len(scheduled)  # the watchdog's, if none was set yet
    finally:
        await backend.close()


# -- ownership -----------------------------------------------------------------------------
def test_release_and_extend_are_owner_only(ns: str, raw: redis.Redis) -> None:
    name = _name()
    with jobfence.Locks(REDIS_URL, namespace=ns) as locks:
        lease = locks.try_acquire(name, ttl=10)
        assert lease is not None
        before = raw.get(_key(ns, "lock", name))
        assert locks.backend.release(name, "intruder") is False
        assert locks.backend.extend(name, "intruder", 100) is False
        assert raw.get(_key(ns, "lock", name)) == before  # untouched
        assert raw.pttl(_key(ns, "lock", name)) <= 10_000
        assert _holder(raw, ns, name) == (lease.token, lease.owner)
        assert lease.release() is True
        assert raw.exists(_key(ns, "lock", name)) == 0
        assert lease.release() is False


def test_foreign_value_is_nobodys_lease(
    ns: str, raw: redis.Redis, backend: RedisLockBackend
) -> None:
    name = _name()
    raw.set(_key(ns, "lock", name), "not written by jobfence", px=10_000)
    assert backend.acquire(name, "o", 10) is None
    assert backend.release(name, "o") is False
    assert backend.renew([(name, "o", 10)]) == [False]
    assert raw.get(_key(ns, "lock", name)) == b"not written by jobfence"


def test_try_acquire_never_enqueues(ns: str, raw: redis.Redis, backend: RedisLockBackend) -> None:
    name = _name()
    assert backend.acquire(name, "holder", 10) is not None
    assert backend.acquire(name, "trier", 10) is None
    assert raw.exists(_key(ns, "q", name), _key(ns, "qd", name)) == 0


# -- waiting: fair FIFO hand-off ----------------------------------------------------------
async def _until(predicate: object, timeout: float = 5.0) -> None:
    """Poll an async predicate (the state change is the event we wait for)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def _zcard_is(client: redis.asyncio.Redis, key: bytes, n: int) -> bool:
    return int(await client.zcard(key)) == n


def test_waiter_owns_the_lease_when_it_wakes(
    ns: str, raw: redis.Redis, backend: RedisLockBackend
) -> None:
    name = _name()
    t1 = backend.acquire(name, "holder", 10)
    assert t1 is not None
    assert backend.acquire(name, "w", 10, wait=10) is None
    assert raw.zrange(_key(ns, "q", name), 0, -1) == [b"w"]
    assert backend.release(name, "holder") is True
    # before the waiter does anything, the lease is already its own
    held = _holder(raw, ns, name)
    assert held is not None and held[1] == "w" and held[0] > t1
    assert backend.wait(name, "w", 5) == held[0]  # the wake-up carries the token
    assert raw.exists(_key(ns, "w", name) + b":w") == 0  # consumed
    # a retry after a missed wake-up finds the lease already held by the same owner
    assert backend.acquire(name, "w", 10, wait=10) == held[0]
    assert backend.release(name, "w") is True
    assert raw.exists(_key(ns, "lock", name)) == 0  # nobody else waits: just deleted


async def test_blocked_waiter_is_woken_with_its_token(ns: str, araw: redis.asyncio.Redis) -> None:
    name = _name()
    b = AsyncRedisLockBackend(parse_url(REDIS_URL), namespace=ns)
    try:
        t1 = await b.acquire(name, "holder", 10)
        assert t1 is not None
        assert await b.acquire(name, "w", 10, wait=10) is None
        waiting = asyncio.create_task(b.wait(name, "w", 5))
        await _until(lambda: _blocked_clients(araw))
        assert await b.release(name, "holder")
        token = await asyncio.wait_for(waiting, 5)
        assert token is not None and token > t1
    finally:
        await b.close()


async def _blocked_clients(client: redis.asyncio.Redis) -> bool:
    return int((await client.info("clients"))["blocked_clients"]) > 0


def test_dead_waiter_is_skipped_after_its_deadline(ns: str, raw: redis.Redis) -> None:
    name = _name()
    b = RedisLockBackend(parse_url(REDIS_URL), namespace=ns, waiter_slack=0.05)
    try:
        assert b.acquire(name, "holder", 10) is not None
        assert b.acquire(name, "dead", 10, wait=0.05) is None  # never polls again
        assert b.acquire(name, "live", 10, wait=30) is None
        assert raw.zrange(_key(ns, "q", name), 0, -1) == [b"dead", b"live"]
        deadline = int(raw.hget(_key(ns, "qd", name), "dead").split(b":")[0])
        while _server_ms(raw) <= deadline:  # wait for the server clock to pass it
            pass
        assert b.release(name, "holder") is True
        held = _holder(raw, ns, name)
        assert held is not None and held[1] == "live"
        assert raw.zrange(_key(ns, "q", name), 0, -1) == []
        assert raw.exists(_key(ns, "w", name) + b":dead") == 0
        assert b.wait(name, "live", 5) == held[0]
    finally:
        b.close()


def _server_ms(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return seconds * 1000 + micros // 1000


def test_cancel_wait(ns: str, raw: redis.Redis, backend: RedisLockBackend) -> None:
    name = _name()
    assert backend.acquire(name, "holder", 10) is not None
    assert backend.acquire(name, "w1", 10, wait=10) is None
    assert backend.acquire(name, "w2", 10, wait=10) is None
    assert backend.cancel_wait(name, "w1") is None
    assert raw.zrange(_key(ns, "q", name), 0, -1) == [b"w2"]
    assert backend.release(name, "holder")  # handed to w2 ...
    token = backend.cancel_wait(name, "w2")  # ... who gives up just then: it keeps the lease
    assert token is not None and _holder(raw, ns, name) == (token, "w2")
    assert raw.exists(_key(ns, "w", name) + b":w2") == 0
    assert raw.exists(_key(ns, "q", name), _key(ns, "qd", name)) == 0


def test_force_release_hands_off(ns: str, raw: redis.Redis, backend: RedisLockBackend) -> None:
    name = _name()
    assert backend.force_release(name) is False
    assert backend.acquire(name, "holder", 10) is not None
    assert backend.acquire(name, "w", 10, wait=10) is None
    assert backend.force_release(name) is True
    held = _holder(raw, ns, name)
    assert held is not None and held[1] == "w"


# -- names, keys, source -------------------------------------------------------------------
ODD_NAMES = [
    "q'uote\"double",
    "back\\slash\\",
    "{brace}",
    "}{",
    "a}:b{",
    "ünïcødé 🔒 名前",
    "%s %d %%",
    "]]--[[ end",
    "KEYS[1]",
    "\" .. redis.call('FLUSHDB') .. \"",
    "*?[^]",
    "line\nbreak\ttab",
    "nul\x00byte",
    "x" * 1024,
]


@pytest.mark.parametrize("name", ODD_NAMES, ids=range(len(ODD_NAMES)))
def test_names_with_metacharacters(ns: str, raw: redis.Redis, name: str) -> None:
    with jobfence.Locks(REDIS_URL, namespace=ns) as a, jobfence.Locks(REDIS_URL, namespace=ns) as b:
        lease = a.try_acquire(name, ttl=10)
        assert lease is not None
        assert b.try_acquire(name, ttl=10) is None
        assert _holder(raw, ns, name) == (lease.token, lease.owner)
        lease.extend(20)
        assert raw.pttl(_key(ns, "lock", name)) > 10_000
        got: list[jobfence.Lease] = []
        thread = threading.Thread(target=lambda: got.append(b.acquire(name, timeout=10)))
        thread.start()
        while raw.zcard(_key(ns, "q", name)) == 0:  # the waiter is queued
            pass
        assert lease.release() is True  # hands over through the name's wake list
        thread.join(10)
        assert got and got[0].token > lease.token
        assert _holder(raw, ns, name) == (got[0].token, got[0].owner)
        assert got[0].release() is True
        assert raw.exists(_key(ns, "lock", name)) == 0
    assert raw.dbsize() > 0  # nothing flushed the database


def test_keys_are_namespaced(ns: str, raw: redis.Redis, backend: RedisLockBackend) -> None:
    name = "marker-" + uuid.uuid4().hex
    assert backend.acquire(name, "holder", 10) is not None
    assert backend.acquire(name, "w1", 10, wait=10) is None
    assert backend.acquire(name, "w2", 10, wait=10) is None
    assert backend.release(name, "holder")  # leaves a wake list for w1
    keys = sorted(k.decode() for k in raw.scan_iter(match=f"*{name}*", count=1000))
    assert keys == sorted(
        [
            f"{ns}:lock:{{{name}}}",
            f"{ns}:lock:{{{name}}}:tok",
            f"{ns}:lock:{{{name}}}:q",
            f"{ns}:lock:{{{name}}}:qd",
            f"{ns}:lock:{{{name}}}:qf",
            f"{ns}:lock:{{{name}}}:w:w1",
            f"{ns}:lock:{{{name}}}:rel",
        ]
    )
    # every key but the token counter has an expiry; the counter's is long (>= 1 day)
    for key in keys:
        assert raw.pttl(key) > 0, key
    assert raw.pttl(f"{ns}:lock:{{{name}}}:tok") > 86_000_000


def test_no_keys_command_in_the_source() -> None:
    files = [*sorted(SOURCES.glob("*.py")), *sorted(SOURCES.glob("lua/*.lua"))]
    assert len(files) >= 5
    lua_keys = re.compile(r"""redis\.p?call\(\s*['"]keys['"]""", re.IGNORECASE)
    py_keys = re.compile(r"""\.keys\(|['"]KEYS['"]""")
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not lua_keys.search(text), path
        if path.suffix == ".py":
            assert not py_keys.search(text), path


# -- sync and async together ----------------------------------------------------------------
async def test_sync_and_async_clients_share_locks(ns: str, araw: redis.asyncio.Redis) -> None:
    name = _name()
    sync_locks = jobfence.Locks(REDIS_URL, namespace=ns)
    async_locks = jobfence.AsyncLocks(REDIS_URL, namespace=ns)
    try:
        held = sync_locks.try_acquire(name, ttl=10)
        assert held is not None
        assert await async_locks.try_acquire(name, ttl=10) is None

        async def take() -> jobfence.AsyncLease:
            return await async_locks.acquire(name, ttl=10, timeout=10)

        waiting = asyncio.create_task(take())
        await _until(lambda: _zcard_is(araw, _key(ns, "q", name), 1))  # it waits in line
        assert await asyncio.to_thread(held.release)
        lease = await asyncio.wait_for(waiting, 10)
        assert lease.token > held.token
        assert await asyncio.to_thread(sync_locks.try_acquire, name) is None
        assert await lease.release()
        again = await asyncio.to_thread(sync_locks.try_acquire, name)
        assert again is not None and again.token > lease.token
        again.release()
    finally:
        await asyncio.to_thread(sync_locks.close)
        await async_locks.close()


# -- configuration -------------------------------------------------------------------------
def test_options() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(REDIS_URL, socket_timout=3)
    assert info.value.argument == "socket_timout"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(REDIS_URL + "?waiter_slack=abc")
    assert info.value.argument == "waiter_slack"
    sep = "&" if "?" in REDIS_URL else "?"
    locks = jobfence.Locks(REDIS_URL + sep + "waiter_slack=0.25&socket_timeout=2")
    try:
        assert locks.backend._slack_ms == 250
        assert locks.backend._blpop_cap == pytest.approx(1.6)
        assert locks.capabilities.fifo and locks.capabilities.handoff
        assert locks.capabilities.tokens_survive_data_loss
    finally:
        locks.close()


# -- the uncontended path, and keys written by the previous layout -----------------------------
def test_an_uncontended_cycle_runs_seven_commands(private_redis: RedisServer) -> None:
    """Acquire reads the lease, the counter and the waiters flag with one MGET, then TIME and
    two SETs; release one MGET, the DEL and the release marker's SET. No probe of the queue."""
    observer = redis.Redis.from_url(private_redis.url)
    locks = jobfence.Locks(private_redis.url, namespace="cycle")
    try:
        warm = locks.try_acquire("warm-up", ttl=30)
        assert warm is not None and warm.release()
        before = _calls(observer)
        for _ in range(10):
            lease = locks.try_acquire("a", ttl=30, renew=False)
            assert lease is not None and lease.release()
        after = _calls(observer)
        ran = {
            cmd: (after.get(cmd, 0) - before.get(cmd, 0)) // 10
            for cmd in set(after) | set(before)
            if cmd not in ("info", "evalsha") and after.get(cmd, 0) != before.get(cmd, 0)
        }
        assert ran == {"mget": 2, "time": 1, "set": 3, "del": 1}
        assert after["evalsha"] - before["evalsha"] == 20
    finally:
        locks.close()
        observer.close()


def test_a_lease_of_the_previous_layout_is_not_taken_over(
    ns: str, raw: redis.Redis, backend: RedisLockBackend
) -> None:
    """Keys written by a client of the previous layout (a lease, its counter, a queued waiter,
    no waiters flag): the held lease excludes every new acquire, a new waiter queues behind
    the old one, and the release hands the lease to the old waiter first, with a larger
    token than the old counter's."""
    name = _name()
    seconds, micros = raw.time()
    old_token = (seconds + 3600) * 1_000_000 + micros  # a counter ahead of the clock
    raw.set(_key(ns, "lock", name), f"{old_token}:old-holder", px=30_000)
    raw.set(_key(ns, "tok", name), str(old_token), px=86_400_000)
    far = (seconds + 60) * 1000
    raw.zadd(_key(ns, "q", name), {"old-waiter": 1})
    raw.hset(_key(ns, "qd", name), "old-waiter", f"{far}:30000")
    raw.pexpire(_key(ns, "q", name), 61_000)
    raw.pexpire(_key(ns, "qd", name), 61_000)
    assert raw.exists(_key(ns, "qf", name)) == 0

    assert backend.acquire(name, "new", 10) is None
    assert backend.acquire(name, "new", 10, wait=10) is None
    assert _holder(raw, ns, name) == (old_token, "old-holder")
    assert raw.zrange(_key(ns, "q", name), 0, -1) == [b"old-waiter", b"new"]
    assert raw.exists(_key(ns, "qf", name)) == 1

    assert backend.release(name, "old-holder") is True
    handed = _holder(raw, ns, name)
    assert handed is not None and handed[1] == "old-waiter" and handed[0] == old_token + 1
    assert backend.release(name, "old-waiter") is True
    got = _holder(raw, ns, name)
    assert got is not None and got == (old_token + 2, "new")
    assert backend.release(name, "new") is True
    # the queue drained: its flag went with it, and the next cycle is uncontended
    assert raw.exists(_key(ns, "q", name), _key(ns, "qd", name), _key(ns, "qf", name)) == 0
    assert backend.acquire(name, "later", 10) == old_token + 3


def test_a_waiters_flag_without_a_queue_is_dropped(
    ns: str, raw: redis.Redis, backend: RedisLockBackend
) -> None:
    """A waiters flag whose queue is gone (its waiters left by another version's script,
    or the queue expired first) only sends the acquire down the queue's path once."""
    name = _name()
    raw.set(_key(ns, "qf", name), "1", px=60_000)
    token = backend.acquire(name, "a", 10)
    assert token is not None and _holder(raw, ns, name) == (token, "a")
    assert raw.exists(_key(ns, "qf", name)) == 0
    raw.set(_key(ns, "qf", name), "1", px=60_000)
    assert backend.release(name, "a") is True
    assert raw.exists(_key(ns, "lock", name), _key(ns, "qf", name)) == 0


def test_an_uncontended_acquire_keeps_the_counter_ahead_of_the_clock(
    ns: str, raw: redis.Redis, backend: RedisLockBackend
) -> None:
    """The counter read by the acquire's one MGET still counts: a counter ahead of the
    server clock is continued, not replaced by the clock."""
    name = _name()
    seconds, micros = raw.time()
    ahead = (seconds + 3600) * 1_000_000 + micros
    raw.set(_key(ns, "tok", name), str(ahead), px=86_400_000)
    assert backend.acquire(name, "a", 10) == ahead + 1
    assert backend.release(name, "a") is True
    assert backend.acquire(name, "b", 10) == ahead + 2
    assert int(raw.get(_key(ns, "tok", name)) or 0) == ahead + 2


async def test_an_async_release_cancelled_in_flight_is_sent_again_and_answers_true(
    private_redis: RedisServer,
) -> None:
    """``AsyncLease.release()`` runs in its caller's task on Redis. Cancelled while its
    command waits on the server (a client pause holds it), the release is sent again in the
    background; the next ``release()`` answers True, and the name is free."""
    observer = redis.asyncio.Redis.from_url(private_redis.url)
    locks = jobfence.AsyncLocks(private_redis.url, namespace="cancelled-release")
    try:
        lease = await locks.try_acquire("x", ttl=30)
        assert lease is not None
        await observer.execute_command("CLIENT", "PAUSE", "300", "WRITE")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lease.release(), 0.05)
        assert lease.released and not lease.lost
        assert await lease.release() is True  # the background send's answer
        assert not lease.lost
        assert await observer.exists(lock_key("cancelled-release", "x")) == 0
        assert await lease.release() is False
        again = await locks.try_acquire("x", ttl=30)
        assert again is not None and again.token > lease.token
        assert await again.release() is True
    finally:
        await observer.execute_command("CLIENT", "UNPAUSE")
        await locks.close()
        await observer.aclose()
