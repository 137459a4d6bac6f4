"""``@jobfence.guarded`` with its lock and its inbox on the same Redis: two round trips a call --
one script takes the lease and claims the key (``guard_claim.lua``), one stores the result
only while the lease is still held and releases the lease (``guard_complete.lua``) -- with
the same outcomes as the separate calls: a lease gone or taken on the server stores nothing
and lets a redelivery in, a claim taken over stores nothing, a transient failure is retried,
a duplicate or a claim in progress elsewhere leaves the lease free, a waiter queued on the
lock gets it handed off; and the extend path is kept where the two are not on the same
database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import jobfence
from jobfence.backends.redis.inbox import _same_database
from jobfence.guard import current_claim, current_lease, guarded
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)

OTHER_DB_URL = REDIS_URL.rsplit("/", 1)[0] + "/1"


@pytest.fixture
def ns() -> Iterator[str]:
    name = "guard1r_" + uuid.uuid4().hex[:8]
    yield name
    delete_redis_keys(f"*{name}*")
    delete_redis_keys(f"*{name}*", OTHER_DB_URL)


@pytest.fixture
def clients(ns: str) -> Iterator[tuple[jobfence.Locks, jobfence.Inbox]]:
    locks = jobfence.Locks(REDIS_URL, namespace=ns)
    inbox = jobfence.Inbox(REDIS_URL, table=ns)
    yield locks, inbox
    inbox.close()
    locks.close()


@pytest.fixture
async def async_clients(ns: str) -> AsyncIterator[tuple[jobfence.AsyncLocks, jobfence.AsyncInbox]]:
    locks = jobfence.AsyncLocks(REDIS_URL, namespace=ns)
    inbox = jobfence.AsyncInbox(REDIS_URL, table=ns)
    yield locks, inbox
    await inbox.close()
    await locks.close()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands every redis-py client of this process sends (sync and asyncio)."""
    sent: list[str] = []
    sync_send = redis.Redis.execute_command
    async_send = redis.asyncio.Redis.execute_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return sync_send(self, *args, **kwargs)

    async def async_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return await async_send(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    monkeypatch.setattr(redis.asyncio.Redis, "execute_command", async_counted)
    return sent


def _scripts(sent: list[str]) -> int:
    return sum(1 for command in sent if command in ("EVALSHA", "EVAL"))


def test_a_guarded_call_on_one_redis_is_two_round_trips_and_replays(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, inbox = clients
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res:{n}", key="job:{n}")
    def job(n: int) -> dict[str, int]:
        runs.append(n)
        return {"n": n}

    assert job(0) == {"n": 0}  # opens the connections
    sent = _counting(monkeypatch)
    assert job(1) == {"n": 1}
    # acquire + claim, lease check + completion + release: no confirming extend
    assert _scripts(sent) == 2 and len(sent) == 2, sent
    sent.clear()
    assert job(1) == {"n": 1}  # a duplicate: the stored result, not run again
    assert runs == [0, 1]
    # acquire + claim (found completed), the release of the lease
    assert _scripts(sent) == 2 and len(sent) == 2, sent
    lease = locks.try_acquire("res:1", ttl=5)  # released after the call
    assert lease is not None
    lease.release()


async def test_async_a_guarded_call_on_one_redis_is_two_round_trips(
    async_clients: tuple[jobfence.AsyncLocks, jobfence.AsyncInbox],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locks, inbox = async_clients

    @guarded(locks=locks, inbox=inbox, lock="res:{n}", key="job:{n}")
    async def job(n: int) -> int:
        return n * 2

    assert await job(0) == 0
    sent = _counting(monkeypatch)
    assert await job(1) == 2
    assert _scripts(sent) == 2 and len(sent) == 2, sent
    assert await job(1) == 2


@pytest.mark.parametrize("taken", [False, True], ids=["gone", "held-by-another"])
def test_a_lease_gone_or_taken_on_the_server_stores_nothing(
    clients: tuple[jobfence.Locks, jobfence.Inbox], taken: bool
) -> None:
    """The body ends before the renewer noticed the loss; the completion's own check finds
    the lease gone (or another worker's): nothing is stored, the claim is given back (a
    redelivery runs the work), the lease is marked lost and LockLost is raised."""
    locks, inbox = clients
    runs: list[int] = []
    lost: list[str] = []
    other: list[Any] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            lease = current_lease()
            lease.on_lost(lambda held: lost.append(held.name))
            locks.force_release("res")
            if taken:
                other.append(locks.try_acquire("res", ttl=30, renew=False))
                assert other[0] is not None
            assert not lease.lost  # not noticed yet
        return f"result-{len(runs)}"

    with pytest.raises(jobfence.LockLost):
        job(1)
    assert lost == ["res"]
    claim = inbox.claim("job:1")
    assert claim.state is jobfence.ClaimState.NEW and claim.attempt == 2  # given back
    claim.release()
    if taken:
        assert locks.holder("res") is not None  # the other worker's lease is untouched
        other[0].release()
    assert locks.holder("res") is None  # nothing of ours is held
    assert job(1) == "result-2"  # the redelivery runs; its result is the one stored
    assert job(1) == "result-2"
    assert runs == [1, 1]


async def test_async_a_lease_gone_on_the_server_stores_nothing(
    async_clients: tuple[jobfence.AsyncLocks, jobfence.AsyncInbox],
) -> None:
    locks, inbox = async_clients
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    async def job(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            await locks.force_release("res")
            other = await locks.try_acquire("res", ttl=30, renew=False)
            assert other is not None
            await other.release()
        return f"result-{len(runs)}"

    with pytest.raises(jobfence.LockLost):
        await job(1)
    claim = await inbox.claim("job:1")
    assert claim.state is jobfence.ClaimState.NEW and claim.attempt == 2
    await claim.release()
    assert await job(1) == "result-2"
    assert await job(1) == "result-2"


def test_a_claim_taken_over_on_the_server_is_not_completed(
    clients: tuple[jobfence.Locks, jobfence.Inbox], ns: str
) -> None:
    """The lease is held but the claim is another worker's now: ClaimLost, and the other
    worker's claim is left as it is."""
    locks, inbox = clients
    rival = jobfence.Inbox(REDIS_URL, table=ns)
    taken: list[Any] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        inbox.forget(current_claim().key)
        taken.append(rival.claim("job:1", ttl=30))
        return "mine"

    try:
        with pytest.raises(jobfence.ClaimLost):
            job(1)
        assert taken[0].state is jobfence.ClaimState.NEW
        info = inbox.claim_info("job:1")
        assert info is not None and info.state is jobfence.ClaimState.IN_PROGRESS
        assert info.owner == taken[0].owner
        taken[0].complete("theirs")
        assert job(1) == "theirs"  # the rival's result, not ours
        assert locks.holder("res") is None
    finally:
        rival.close()


def test_a_transient_failure_of_the_checked_completion_is_retried(
    clients: tuple[jobfence.Locks, jobfence.Inbox],
) -> None:
    from jobfence.testing import set_hook

    locks, inbox = clients
    effects: list[int] = []
    failed: list[str] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        effects.append(n)
        return "done"

    def flaky(point: str, **info: Any) -> None:
        if point == "inbox.complete" and not failed:
            failed.append(point)
            raise ConnectionError("injected: the inbox did not answer")

    old = set_hook(flaky)
    try:
        assert job(1) == "done"
    finally:
        set_hook(old)
    assert failed == ["inbox.complete"]
    assert job(1) == "done"  # stored by the retry: replayed
    assert effects == [1]


def test_lock_and_inbox_on_other_databases_confirm_the_lease_with_an_extend(
    ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the same database: the inbox's scripts cannot see the lease, so it is confirmed
    by an extend of its own (five round trips), and a lease lost still stores nothing."""
    locks = jobfence.Locks(REDIS_URL, namespace=ns)
    inbox = jobfence.Inbox(OTHER_DB_URL, table=ns)
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        runs.append(n)
        if n == 2 and runs.count(2) == 1:
            locks.force_release("res")
        return f"r{n}"

    try:
        assert job(0) == "r0"
        sent = _counting(monkeypatch)
        assert job(1) == "r1"
        assert _scripts(sent) == 5, sent
        with pytest.raises(jobfence.LockLost):
            job(2)
        assert job(2) == "r2"
        assert runs == [0, 1, 2, 2]
    finally:
        inbox.close()
        locks.close()


def test_same_database_compares_server_and_database() -> None:
    a = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    b = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=3)
    other_db = redis.Redis.from_url("redis://127.0.0.1:6379/1")
    other_port = redis.Redis.from_url("redis://127.0.0.1:6380/0")
    other_user = redis.Redis.from_url("redis://inbox:secret@127.0.0.1:6379/0")
    unix = redis.Redis(unix_socket_path="/tmp/redis.sock")
    asyncio_client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379/0")
    assert _same_database(a, b)
    assert _same_database(a, asyncio_client)
    assert not _same_database(a, other_db)
    assert not _same_database(a, other_port)
    assert not _same_database(a, other_user)  # an ACL may keep it from the lock's keys
    assert not _same_database(a, unix)
    assert _same_database(unix, redis.Redis(unix_socket_path="/tmp/redis.sock"))
