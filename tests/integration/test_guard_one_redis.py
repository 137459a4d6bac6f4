"""``@jobfence.guarded`` with its lock and its inbox on the same Redis: two round trips a call --
one script takes the lease and claims the key (``guard_claim.lua``), one stores the result
only while the lease is still held and releases the lease (``guard_complete.lua``) -- with
the same outcomes as the separate calls: a lease gone or taken on the server stores nothing
and lets a redelivery in, a claim taken over stores nothing, a transient failure is retried,
a duplicate or a claim in progress elsewhere leaves the lease free, a waiter queued on the
lock gets it handed off; and the extend path is kept where the two are not on the same
database."""

from __future__ import annotations

import gc
import threading
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


def test_a_guarded_call_on_one_redis_leaves_the_lock_clients_connection_alone(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one script runs on the inbox's client: the lock client's own connection is not
    looked at before the grant (no poll of its idle connection, no checkout), while its
    renewals' connection is opened by the first call, and a release of the lease that the
    script did not make still works."""
    from jobfence.backends.redis import locks as redis_locks

    locks, inbox = clients
    looked: list[str] = []
    idle_open = redis_locks._idle_open

    def counted(client: Any) -> bool:
        looked.append("idle_open")
        return idle_open(client)

    monkeypatch.setattr(redis_locks, "_idle_open", counted)

    @guarded(locks=locks, inbox=inbox, lock="res:{n}", key="job:{n}")
    def job(n: int) -> dict[str, int]:
        if n == 2:
            raise ValueError("no")
        return {"n": n}

    assert job(0) == {"n": 0}
    backend: Any = locks.backend
    assert backend._renewals_ready  # the renewals' connection was opened by the first call
    looked.clear()
    assert job(1) == {"n": 1}
    assert looked == []
    with pytest.raises(ValueError):
        job(2)  # the lease is given back by the lock client itself
    lease = locks.try_acquire("res:2", ttl=5)
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


#: what a guarded call makes (lease, claim and their renewal state), by type name
_GUARD_TYPES = {"Lease", "AsyncLease", "Claim", "AsyncClaim", "RenewableHandle", "LeaseState"}


def _cyclic_garbage() -> list[str]:
    """The guard's objects only the cyclic collector would have freed since the last
    collection (it is disabled meanwhile)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [type(o).__name__ for o in gc.garbage if type(o).__name__ in _GUARD_TYPES]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


def test_guarded_calls_leave_no_cyclic_garbage(
    clients: tuple[jobfence.Locks, jobfence.Inbox],
) -> None:
    # in a framework's worker (a large heap) the collections cyclic garbage triggers cost
    # more than the guard's own work: a call's objects are freed when it returns
    locks, inbox = clients

    @guarded(locks=locks, inbox=inbox, lock="res:{n}", key="job:{n}")
    def job(n: int) -> int:
        return n

    assert job(0) == 0
    gc.collect()
    gc.disable()
    try:
        for n in range(1, 6):
            assert job(n) == n
        assert job(1) == 1  # a duplicate
        assert _cyclic_garbage() == []
    finally:
        gc.enable()


async def test_async_guarded_calls_leave_no_cyclic_garbage(
    async_clients: tuple[jobfence.AsyncLocks, jobfence.AsyncInbox],
) -> None:
    locks, inbox = async_clients

    @guarded(locks=locks, inbox=inbox, lock="res:{n}", key="job:{n}")
    async def job(n: int) -> int:
        return n

    assert await job(0) == 0
    gc.collect()
    gc.disable()
    try:
        for n in range(1, 6):
            assert await job(n) == n
        assert await job(1) == 1
        assert _cyclic_garbage() == []
    finally:
        gc.enable()


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


# -- the two scripts: what each outcome costs and leaves ---------------------------------------
class _Sent:
    """The commands each thread sends (sync and asyncio redis-py clients), with the digest of
    each ``EVALSHA``'s script."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, str, str | None]] = []
        sync_send = redis.Redis.execute_command
        async_send = redis.asyncio.Redis.execute_command
        calls = self.calls

        def note(args: tuple[Any, ...]) -> None:
            sha = str(args[1]) if args[0] == "EVALSHA" else None
            calls.append((threading.get_ident(), str(args[0]), sha))

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            note(args)
            return sync_send(self, *args, **kwargs)

        async def async_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            note(args)
            return await async_send(self, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "execute_command", counted)
        monkeypatch.setattr(redis.asyncio.Redis, "execute_command", async_counted)

    def here(self) -> list[str]:
        """The commands this thread sent so far (EVALSHA named by its script, see ``named``)."""
        me = threading.get_ident()
        return [sha or command for thread, command, sha in self.calls if thread == me]

    def everywhere(self) -> list[str]:
        """The commands every thread sent so far, but renewals."""
        return [sha or command for _, command, sha in self.calls]


def _named(inbox: jobfence.Inbox, locks: jobfence.Locks) -> dict[str, str]:
    """Script digest -> the script's name, for the scripts a guarded call may send."""
    backend: Any = inbox.backend
    lock_backend: Any = locks.backend
    return {
        backend._guard_claim.sha: "guard_claim",
        backend._guard_complete.sha: "guard_complete",
        backend._claim.sha: "inbox_claim",
        backend._release.sha: "inbox_release",
        backend._complete_held.sha: "inbox_complete_held",
        lock_backend._acquire.sha: "lock_acquire",
        lock_backend._release.sha: "lock_release",
        lock_backend._renew.sha: "lock_renew",
    }


def _scripts_here(sent: _Sent, names: dict[str, str]) -> list[str]:
    return [names.get(command, command) for command in sent.here()]


def _scripts_all(sent: _Sent, names: dict[str, str]) -> list[str]:
    """The scripts every thread sent (a lease's release at the end of a block that raised
    runs in the background), renewals left out."""
    named = [names.get(command, command) for command in sent.everywhere()]
    return [name for name in named if name != "lock_renew"]


def test_a_duplicate_costs_two_round_trips_and_leaves_the_lease_free(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, inbox = clients
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> dict[str, int]:
        runs.append(n)
        return {"n": n}

    assert job(1) == {"n": 1}
    sent = _Sent(monkeypatch)
    names = _named(inbox, locks)
    assert job(1) == {"n": 1}  # the stored result, not run again
    assert runs == [1]
    # the lease taken with the claim (found completed), then given back by the block
    assert _scripts_here(sent, names) == ["guard_claim", "lock_release"]
    assert locks.holder("res") is None


def test_a_claim_in_progress_elsewhere_raises_and_leaves_the_lease_free(
    clients: tuple[jobfence.Locks, jobfence.Inbox], ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, inbox = clients
    rival = jobfence.Inbox(REDIS_URL, table=ns)
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> int:
        runs.append(n)
        return n

    try:
        theirs = rival.claim("job:1", ttl=30)
        assert theirs.state is jobfence.ClaimState.NEW
        assert job(0) == 0  # the connections are open
        sent = _Sent(monkeypatch)
        names = _named(inbox, locks)
        with pytest.raises(jobfence.ClaimInProgress) as raised:
            job(1)
        assert raised.value.owner == theirs.owner
        # the lease taken with the claim, then given back by the block (in the background)
        assert _scripts_all(sent, names) == ["guard_claim", "lock_release"]
        assert locks.holder("res") is None
        assert runs == [0]
        info = inbox.claim_info("job:1")  # the rival's claim is untouched
        assert info is not None and info.owner == theirs.owner and info.attempt == 1
        theirs.complete(7)
        assert job(1) == 7
    finally:
        rival.close()


def test_a_lease_held_elsewhere_claims_nothing(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout=0``: the one script finds the lease taken and claims nothing; LockTimeout
    names the holder (one more round trip, on that path only)."""
    locks, inbox = clients

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", timeout=0)
    def job(n: int) -> int:
        return n

    assert job(0) == 0
    other = locks.try_acquire("res", ttl=30)
    assert other is not None
    try:
        sent = _Sent(monkeypatch)
        names = _named(inbox, locks)
        with pytest.raises(jobfence.LockTimeout) as raised:
            job(1)
        assert raised.value.owner == other.owner
        assert _scripts_here(sent, names)[0] == "guard_claim"
        assert len(_scripts_here(sent, names)) == 2  # and who holds the lease
        assert inbox.claim_info("job:1") is None  # nothing claimed
    finally:
        other.release()


def test_a_busy_lease_with_a_timeout_is_waited_for_then_the_key_claimed(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout`` > 0: the first try (with the claim) finds the lease taken; the call waits
    in the lock's FIFO queue as before, is handed the lease by the holder's release, claims
    the key on its own, and its completion still releases the lease in the same script."""
    from jobfence.testing import set_hook

    locks, inbox = clients
    waiting = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.wait":
            waiting.set()

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", timeout=20)
    def job(n: int) -> int:
        return current_lease().token  # type: ignore[no-any-return]

    job(0)  # the connections are open
    holder = locks.try_acquire("res", ttl=30)
    assert holder is not None
    sent = _Sent(monkeypatch)
    names = _named(inbox, locks)
    tokens: list[int] = []
    old = set_hook(hook)
    try:
        worker = threading.Thread(target=lambda: tokens.append(job(1)))
        worker.start()
        assert waiting.wait(10)
        assert holder.release()  # hands the lease to the queued call
        worker.join(20)
    finally:
        set_hook(old)
    assert tokens and tokens[0] > holder.token
    scripts = [
        name
        for thread, command, sha in sent.calls
        if thread == worker.ident
        for name in [names.get(sha or "", command)]
    ]
    assert scripts[0] == "guard_claim" and scripts[-1] == "guard_complete", scripts
    assert "inbox_claim" in scripts and "lock_release" not in scripts, scripts
    assert locks.holder("res") is None
    assert job(1) == tokens[0]  # stored


def test_a_waiter_queued_on_the_lock_is_handed_the_lease_by_the_completion(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script that stores the result releases the lease as a release does: the first live
    waiter of the FIFO queue owns it at once (a new, larger token) and is woken."""
    from jobfence.testing import set_hook

    locks, inbox = clients
    waiting = threading.Event()
    got: list[Any] = []

    def hook(point: str, **info: Any) -> None:
        if point == "lock.wait":
            waiting.set()

    def wait_for_it() -> None:
        got.append(locks.acquire("res", ttl=30, timeout=20))

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> int:
        if n:
            old = set_hook(hook)
            try:
                waiter.start()
                assert waiting.wait(10)  # queued behind this call's lease
            finally:
                set_hook(old)
        return current_lease().token  # type: ignore[no-any-return]

    waiter = threading.Thread(target=wait_for_it)
    job(0)  # the connections are open
    sent = _Sent(monkeypatch)
    names = _named(inbox, locks)
    token = job(1)
    scripts = _scripts_here(sent, names)
    held = locks.holder("res")  # handed off by the completion's own script
    waiter.join(20)
    assert got and held is not None and held.owner == got[0].owner
    assert got[0].token == held.token > token
    assert scripts == ["guard_claim", "guard_complete"]
    got[0].release()


def test_fencing_tokens_increase_across_guarded_calls(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, inbox = clients

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> int:
        return current_lease().token  # type: ignore[no-any-return]

    first = locks.try_acquire("res", ttl=30)
    assert first is not None
    first.release()
    sent = _Sent(monkeypatch)
    names = _named(inbox, locks)
    tokens = [job(n) for n in range(5)]
    assert _scripts_here(sent, names) == ["guard_claim", "guard_complete"] * 5
    last = locks.try_acquire("res", ttl=30)
    assert last is not None
    last.release()
    assert [first.token, *tokens, last.token] == sorted({first.token, *tokens, last.token})


def test_a_guarded_calls_token_is_above_the_server_clock_when_its_counter_is_lost(
    clients: tuple[jobfence.Locks, jobfence.Inbox], ns: str
) -> None:
    """The clock floor in the one script that takes the lease and the claim (it reads the
    server's clock once for both): a counter lost meanwhile (a restart, an older snapshot)
    never lets a token be handed out again, and the claim's times are the server's."""
    locks, inbox = clients

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> int:
        return current_lease().token  # type: ignore[no-any-return]

    server = redis.Redis.from_url(REDIS_URL)
    try:
        high = job(0)
        assert server.delete(locks.backend.lock_key("res") + ":tok") == 1
        seconds, micros = server.time()
        before = seconds * 1_000_000 + micros
        token = job(1)
        seconds, micros = server.time()
        after = seconds * 1_000_000 + micros
        assert before <= token <= after and token > high
        claimed_ms = int(server.hget(inbox.backend._key("job:1"), "c"))
        assert before // 1000 <= claimed_ms <= after // 1000
    finally:
        server.close()


def test_the_hook_points_of_the_two_scripts_and_a_fault_at_each(
    clients: tuple[jobfence.Locks, jobfence.Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race-testing toolkit still sees ``lock.acquire``, ``inbox.claim``,
    ``inbox.complete`` and ``lock.release``, in that order. A fault at ``inbox.claim`` lands
    before the script is sent: nothing is held or claimed. A fault at ``lock.release`` lands
    before the completing script: the completion is tried again, and stores the result and
    releases the lease."""
    from jobfence.testing import set_hook

    locks, inbox = clients
    effects: list[int] = []
    seen: list[str] = []
    fail: dict[str, int] = {}

    def hook(point: str, **info: Any) -> None:
        if point.startswith(("lock.", "inbox.")) and not point.endswith("renew"):
            seen.append(point)
        if fail.get(point):
            fail[point] -= 1
            raise ConnectionError(f"injected at {point}")

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}")
    def job(n: int) -> int:
        effects.append(n)
        return n

    assert job(0) == 0
    sent = _Sent(monkeypatch)
    names = _named(inbox, locks)
    old = set_hook(hook)
    try:
        assert job(1) == 1
        assert seen == ["lock.acquire", "inbox.claim", "inbox.complete", "lock.release"]
        assert _scripts_here(sent, names) == ["guard_claim", "guard_complete"]
        fail["inbox.claim"] = 1
        with pytest.raises(jobfence.BackendError):
            job(2)
        assert locks.holder("res") is None and inbox.claim_info("job:2") is None
        fail["lock.release"] = 1
        assert job(2) == 2
    finally:
        set_hook(old)
    assert locks.holder("res") is None
    assert job(2) == 2 and effects == [0, 1, 2]


def test_the_scripts_answer_a_re_send_as_the_first_send(
    clients: tuple[jobfence.Locks, jobfence.Inbox],
) -> None:
    """redis-py re-sends a script whose reply was lost: the second send of each answers as the
    first did and changes nothing more (the lease is not taken or released twice, the result
    not stored twice)."""
    locks, inbox = clients
    backend: Any = inbox.backend
    lease_key = locks.backend.lock_key("res")  # type: ignore[attr-defined]
    args = ("job:1", "claim-owner", None, 30.0, lease_key, "lease-owner", 30.0)
    token, record = backend.claim_leased(*args)
    again, record2 = backend.claim_leased(*args)
    assert token > 0 and again == token
    assert record is not None and record.mine and record2 is not None and record2.mine
    assert record2.attempt == 1
    holder = locks.holder("res")
    assert holder is not None and holder.owner == "lease-owner" and holder.token == token
    done = (b'"r"', 86400.0, lease_key, "lease-owner")
    assert backend.complete_held("job:1", "claim-owner", *done[:1], 60.0, *done[2:], release=True)
    assert locks.holder("res") is None
    other = locks.try_acquire("res", ttl=30)
    assert other is not None
    try:  # the re-sent completion stores nothing new and leaves the new holder's lease alone
        again_done = backend.complete_held(
            "job:1", "claim-owner", b'"other"', 60.0, lease_key, "lease-owner", release=True
        )
        assert again_done == 1
        assert locks.holder("res") is not None and other.held
        assert inbox.claim("job:1").result == "r"
    finally:
        other.release()
    # a lease not taken claims nothing
    other = locks.try_acquire("res", ttl=30)
    assert other is not None
    try:
        busy, nothing = backend.claim_leased("job:2", "o2", None, 30.0, lease_key, "l2", 30.0)
        assert busy < 0 and nothing is None and inbox.claim_info("job:2") is None
    finally:
        other.release()
