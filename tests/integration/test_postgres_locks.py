"""The PostgreSQL lock backend against a real server (tests/servers.py POSTGRES_URL).

Both modes: ``lease`` (default: rows with a server-clock expiry) and ``session`` (session
advisory locks). Every test uses its own namespace (table prefix) and drops its tables.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.postgres.locks_async import (
    LEASE_CAPABILITIES,
    POLLING_CAPABILITIES,
    SESSION_CAPABILITIES,
    AsyncPostgresLockBackend,
    advisory_key,
    stored_name,
)
from tests.servers import POSTGRES_URL

pytestmark = pytest.mark.timeout(60)


def _url(mode: str, **extra: str) -> str:
    options = {"mode": mode, **extra}
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + query


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        yield conn


@pytest.fixture
def ns(admin: psycopg.Connection[Any]) -> Iterator[str]:
    namespace = "pgl_" + uuid.uuid4().hex[:12]
    yield namespace
    for table in ("locks", "lock_tokens", "lock_queue", "schema"):
        admin.execute(f'DROP TABLE IF EXISTS "{namespace}_{table}"')


class Clients:
    """Makes AsyncLocks clients for one namespace and closes them all at the end."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.made: list[Any] = []

    def __call__(self, mode: str = "lease", **options: Any) -> jobfence.AsyncLocks:
        extra = {k: str(options.pop(k)) for k in list(options) if k in ("notify",)}
        client = jobfence.AsyncLocks(_url(mode, **extra), namespace=self.namespace, **options)
        self.made.append(client)
        return client


@pytest.fixture
async def clients(ns: str) -> AsyncIterator[Clients]:
    made = Clients(ns)
    yield made
    for client in made.made:
        await client.close()


def _key_halves(namespace: str, name: str) -> tuple[int, int]:
    key = advisory_key(namespace, name) & 0xFFFFFFFFFFFFFFFF
    return key >> 32, key & 0xFFFFFFFF


def _advisory_locks(admin: psycopg.Connection[Any], namespace: str, name: str) -> list[Any]:
    """(pid, granted) of every session holding or waiting for ``name``'s advisory lock."""
    hi, lo = _key_halves(namespace, name)
    return admin.execute(
        "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1 "
        "ORDER BY granted DESC",
        (hi, lo),
    ).fetchall()


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    """Poll a server-side condition (there is no event to wait on for another backend)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# -- the 64-bit advisory key ---------------------------------------------------------------
def test_advisory_key_is_stable_and_uses_64_bits() -> None:
    # fixed values: the key is part of the on-server format, it must never change
    assert advisory_key("jobfence", "inventory:42") == 8923473969388972996
    assert advisory_key("jobfence", "job:11352") == -2845176798809660915
    # signed int64 (PostgreSQL bigint) range, and the namespace separates keys
    assert -(2**63) <= advisory_key("jobfence", "x") < 2**63
    assert advisory_key("other", "inventory:42") != advisory_key("jobfence", "inventory:42")
    # these two names collide in the low 32 bits of the key: a 32-bit key space would
    # put them on the same lock; the full 64-bit keys differ
    a, b = advisory_key("jobfence", "job:61783"), advisory_key("jobfence", "job:68749")
    assert a & 0xFFFFFFFF == b & 0xFFFFFFFF
    assert a != b
    # the full name is hashed: long names differing only at the end differ
    assert advisory_key("jobfence", "x" * 1000 + "a") != advisory_key("jobfence", "x" * 1000 + "b")


def test_advisory_key_separates_names_that_collide_in_postgres_hashtext(
    admin: psycopg.Connection[Any],
) -> None:
    # the usual hand-written pg_advisory_lock(hashtext(name)) is 32-bit: these collide
    row = admin.execute("SELECT hashtext('job:11352') = hashtext('job:189279')").fetchone()
    assert row == (True,)
    assert advisory_key("jobfence", "job:11352") != advisory_key("jobfence", "job:189279")


def test_stored_name_is_one_to_one() -> None:
    names = ["plain", "a\0b", "\ufffeplain", "\ufffe" + b"a\0b".hex(), ""]
    stored = [stored_name(n) for n in names]
    assert len(set(stored)) == len(names)
    assert stored[0] == "plain"
    assert all("\0" not in s for s in stored)


# -- configuration -------------------------------------------------------------------------
@pytest.mark.parametrize("namespace", ["bad-name", "1abc", "a b", "x" * 52, 'q"uote', ""])
def test_bad_namespace_is_a_configuration_error(namespace: str) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        AsyncPostgresLockBackend(parse_url(POSTGRES_URL), namespace=namespace)
    assert info.value.argument == "namespace"


def test_bad_mode_is_a_configuration_error_listing_the_modes() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(_url("advisory"), namespace="ok")
    assert info.value.argument == "mode"
    assert "lease" in str(info.value) and "session" in str(info.value)


def test_bad_options_are_configuration_errors() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(_url("lease", notify="maybe"), namespace="ok")
    assert info.value.argument == "notify"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(POSTGRES_URL, namespace="ok", colour="blue")
    assert info.value.argument == "colour"


def test_capabilities_per_mode() -> None:
    with jobfence.Locks(_url("lease"), namespace="ok") as lease_mode:
        assert lease_mode.capabilities == LEASE_CAPABILITIES
    with jobfence.Locks(_url("session"), namespace="ok") as session_mode:
        session = session_mode.capabilities
    assert session == SESSION_CAPABILITIES
    assert LEASE_CAPABILITIES.ttl_expiry and LEASE_CAPABILITIES.fifo and LEASE_CAPABILITIES.handoff
    assert not LEASE_CAPABILITIES.queue_follows_connection  # the queue is a table
    assert session.fifo and not session.ttl_expiry


def test_async_client_is_created_without_an_event_loop(ns: str) -> None:
    locks = jobfence.AsyncLocks(POSTGRES_URL, namespace=ns)  # no loop is running here

    async def use() -> int:
        lease = await locks.try_acquire("loopless", ttl=5)
        assert lease is not None
        await lease.release()
        await locks.close()
        return lease.token

    assert asyncio.run(use()) > 0


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@127.0.0.1:1/x",  # nothing listens there
        "postgresql://u:secret@127.0.0.1:1/x?sslmode=bogus",
        "postgresql://u:sec%zzret@127.0.0.1:1/x",  # libpq quotes the bad token in its error
    ],
)
@pytest.mark.parametrize("mode", ["lease", "session"])
async def test_unreachable_server_or_bad_url_is_a_backend_error_without_password(
    url: str, mode: str
) -> None:
    secret = "sec%zzret" if "zz" in url else "secret"
    locks = jobfence.AsyncLocks(url + ("&" if "?" in url else "?") + f"mode={mode}")
    try:
        with pytest.raises(jobfence.BackendError) as info:
            await locks.try_acquire("x")
    finally:
        await locks.close()
    error = info.value
    assert error.backend == "postgres" and error.operation == "lock.acquire"
    assert isinstance(error.__cause__, psycopg.Error)
    for text in (str(error), str(error.__cause__), repr(error.__cause__)):
        assert secret not in text
    sync = jobfence.Locks(url)
    with pytest.raises(jobfence.BackendError) as sync_info:
        sync.try_acquire("x")
    sync.close()
    assert secret not in str(sync_info.value)


# -- both modes ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["lease", "session"])
async def test_tokens_from_the_database_strictly_increase_across_two_clients(
    mode: str, clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a, b = clients(mode), clients(mode)
    tokens = []
    for client in (a, b, a, b, b, a):
        lease = await client.acquire("counter", ttl=10, timeout=5)
        tokens.append(lease.token)
        row = admin.execute(
            f'SELECT token FROM "{ns}_lock_tokens" WHERE name = %s', ("counter",)
        ).fetchone()
        assert row == (lease.token,)  # the token IS the database counter
        assert await lease.release()
    assert all(x < y for x, y in itertools.pairwise(tokens)), tokens


@pytest.mark.parametrize("mode", ["lease", "session"])
async def test_tokens_keep_increasing_when_the_counter_row_is_lost(
    mode: str, clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a = clients(mode)
    first = await a.try_acquire("job", ttl=10)
    assert first is not None and await first.release()
    admin.execute(f'DELETE FROM "{ns}_lock_tokens"')  # data loss
    second = await a.try_acquire("job", ttl=10)
    assert second is not None and second.token > first.token  # re-seeded from server time
    await second.release()


@pytest.mark.parametrize("mode", ["lease", "session"])
async def test_tokens_keep_increasing_when_the_counter_loses_its_last_updates(
    mode: str, clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a = clients(mode)
    tokens = []
    for _ in range(3):
        lease = await a.try_acquire("job", ttl=10)
        assert lease is not None and await lease.release()
        tokens.append(lease.token)
    # a crash with synchronous_commit=off or a failover may lose the last bumps: roll back
    admin.execute(f'UPDATE "{ns}_lock_tokens" SET token = %s', (tokens[0] - 1000,))
    again = await a.try_acquire("job", ttl=10)
    assert again is not None and again.token > max(tokens)
    await again.release()


NASTY_NAMES = [
    "it's",
    'say "hi"',
    "back\\slash\\\\",
    "ünïcödé ☃ 日本語 🚀",
    "'; DROP TABLE pg_class; --",
    "%(name)s %s %% {prefix} $1 ?",
    "KEYS[1] ARGV[1] redis.call('DEL', KEYS[1]) -- ]]",
    "line\nbreak\ttab\r",
    "nul\0inside",
    "\ufffestarts with the escape mark",
    "x" * 1024,
    "日" * 341,  # 1023 bytes of UTF-8
]


@pytest.mark.parametrize("mode", ["lease", "session"])
async def test_names_with_quotes_backslashes_unicode_and_metacharacters(
    mode: str, clients: Clients
) -> None:
    a, b = clients(mode), clients(mode)
    held = []
    for name in NASTY_NAMES:
        lease = await a.try_acquire(name, ttl=10)
        assert lease is not None, name
        assert await b.try_acquire(name, ttl=10) is None, name
        await lease.extend()
        held.append(lease)
    # the names are distinct locks: none of them blocked another, all are held at once
    assert len({lease.token for lease in held}) >= 1
    for lease in held:
        assert await lease.release(), lease.name
        again = await b.try_acquire(lease.name, ttl=10)
        assert again is not None and again.token > lease.token, lease.name
        assert await again.release()


# -- lease mode ----------------------------------------------------------------------------
async def test_lease_mode_expired_row_is_taken_over_and_the_stale_holder_is_fenced_off(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a, b = clients(), clients()
    old = await a.try_acquire("job", ttl=0.3, renew=False)
    assert old is not None
    assert await b.try_acquire("job", ttl=10) is None
    new = await b.acquire("job", ttl=10, timeout=10)  # waits for the server-side expiry
    assert new.token > old.token
    owner, token = admin.execute(
        f'SELECT owner, token FROM "{ns}_locks" WHERE name = %s', ("job",)
    ).fetchone() or (None, None)
    assert (owner, token) == (new.owner, new.token)
    # the stale holder cannot release or extend the new lease, at the server...
    backend = a.backend
    assert await backend.extend("job", old.owner, 10) is False
    assert await backend.release("job", old.owner) is False
    assert await backend.renew([("job", old.owner, 10)]) == [False]
    # ...nor through its lease object
    with pytest.raises(jobfence.LockLost):
        await old.extend()
    assert await old.release() is False
    row = admin.execute(f'SELECT owner, token FROM "{ns}_locks" WHERE name = %s', ("job",))
    assert row.fetchone() == (new.owner, new.token)
    await new.extend(10)
    assert await new.release()


async def test_lease_mode_release_wakes_a_waiter_through_notify(clients: Clients) -> None:
    # poll_interval and ttl of 60 s: only the NOTIFY can wake the waiter in time
    a, b = clients(poll_interval=60), clients(poll_interval=60)
    held = await a.try_acquire("job", ttl=60)
    assert held is not None

    async def wait() -> jobfence.AsyncLease:
        return await b.acquire("job", ttl=60, timeout=50)

    waiter = asyncio.create_task(wait())
    # the waiter has made its attempt and is now asleep in wait()
    await _until(
        lambda: (
            b.backend._listener_up
            and any(w.left is not None for w in b.backend._waiters.get("job", {}).values())
        )
    )
    assert await held.release()
    got = await asyncio.wait_for(waiter, 15)
    assert got.token > held.token
    await got.release()


async def test_lease_mode_without_notify_polls_and_opens_no_listener(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a, b = clients(notify="false"), clients(notify="false", poll_interval=0.05)
    held = await a.try_acquire("job", ttl=60)
    assert held is not None

    async def wait() -> jobfence.AsyncLease:
        return await b.acquire("job", ttl=10, timeout=30)

    waiter = asyncio.create_task(wait())
    await asyncio.sleep(0.1)
    listening = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{ns}_locks"',)
    ).fetchone()
    assert listening == (0,)
    assert not waiter.done()
    assert await held.release()
    got = await asyncio.wait_for(waiter, 15)
    assert got.token > held.token
    await got.release()


# -- session mode --------------------------------------------------------------------------
async def test_session_mode_waiters_get_the_lock_in_arrival_order(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    holder = clients("session")
    held = await holder.try_acquire("queue", ttl=10)
    assert held is not None
    order: list[tuple[int, int]] = []

    async def waiter(index: int, client: jobfence.AsyncLocks) -> None:
        lease = await client.acquire("queue", ttl=10, timeout=30)
        order.append((index, lease.token))
        assert await lease.release()

    tasks = []
    for index in range(3):
        tasks.append(asyncio.create_task(waiter(index, clients("session"))))
        # wait until this waiter is queued in the server before starting the next one
        await _until(
            lambda n=index + 1: sum(not g for _pid, g in _advisory_locks(admin, ns, "queue")) == n
        )
    waiting_pids = [pid for pid, granted in _advisory_locks(admin, ns, "queue") if not granted]
    events = admin.execute(
        "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = ANY(%s)",
        (waiting_pids,),
    ).fetchall()
    assert events == [("Lock", "advisory")] * 3
    assert order == []
    assert await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert [index for index, _token in order] == [0, 1, 2]
    tokens = [held.token] + [token for _index, token in order]
    assert tokens == sorted(set(tokens))
    assert _advisory_locks(admin, ns, "queue") == []  # nothing left held or queued


async def test_session_mode_timed_out_waiter_leaves_nothing_behind(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    a, b = clients("session"), clients("session")
    held = await a.try_acquire("job", ttl=10)
    assert held is not None
    for _ in range(3):
        with pytest.raises(jobfence.LockTimeout):
            await b.acquire("job", ttl=10, timeout=0.2)
    locks = _advisory_locks(admin, ns, "job")
    assert [granted for _pid, granted in locks] == [True]  # only the holder, no waiter
    assert await held.release()
    assert _advisory_locks(admin, ns, "job") == []
    got = await b.try_acquire("job", ttl=10)
    assert got is not None and got.token > held.token
    await got.release()


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_session_mode_terminated_connection_is_a_lost_lease(
    flavour: str, clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    ttl = 0.6  # renewal (the liveness check) every 0.2 s
    lost = asyncio.Event()
    loop = asyncio.get_running_loop()
    if flavour == "async":
        locks: Any = clients("session")
        lease = await locks.try_acquire("job", ttl=ttl)
    else:
        locks = jobfence.Locks(_url("session"), namespace=ns)
        lease = await asyncio.to_thread(locks.try_acquire, "job", ttl=ttl)
    assert lease is not None
    lease.on_lost(lambda _lease: loop.call_soon_threadsafe(lost.set))
    [(pid, granted)] = _advisory_locks(admin, ns, "job")
    assert granted
    assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    await asyncio.wait_for(lost.wait(), ttl / 3 + 1.0)  # within about one renewal interval
    assert lease.lost
    with pytest.raises(jobfence.LockLost):
        lease.check()
    if flavour == "async":
        assert await lease.release() is False
    else:
        assert await asyncio.to_thread(lease.release) is False
        await asyncio.to_thread(locks.close)
    other = await clients("session").try_acquire("job", ttl=10)
    assert other is not None and other.token > lease.token
    await other.release()


async def test_session_mode_waiters_keep_their_place_in_the_server_queue(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    """Waiting in the server must not be cut into poll-interval slices: each slice would send
    the waiter to the back of the queue (FIFO lost for holds longer than a slice)."""
    holder = clients("session")
    held = await holder.try_acquire("long", ttl=10)
    assert held is not None
    waiters = [clients("session", poll_interval=0.05) for _ in range(2)]
    tasks = [asyncio.create_task(w.acquire("long", ttl=10, timeout=30)) for w in waiters[:1]]
    await _until(lambda: sum(not g for _pid, g in _advisory_locks(admin, ns, "long")) == 1)
    tasks.append(asyncio.create_task(waiters[1].acquire("long", ttl=10, timeout=None)))
    await _until(lambda: sum(not g for _pid, g in _advisory_locks(admin, ns, "long")) == 2)
    pids = [pid for pid, granted in _advisory_locks(admin, ns, "long") if not granted]

    def starts() -> list[Any]:
        rows = admin.execute(
            "SELECT pid, query_start FROM pg_stat_activity WHERE pid = ANY(%s) ORDER BY pid",
            (pids,),
        ).fetchall()
        return list(rows)

    before = starts()
    await asyncio.sleep(0.6)  # many times 3 x poll_interval (0.15 s)
    assert starts() == before  # the same blocking statements: nobody re-queued
    assert await held.release()
    first = await asyncio.wait_for(tasks[0], 15)
    assert await first.release()
    second = await asyncio.wait_for(tasks[1], 15)
    assert second.token > first.token > held.token
    assert await second.release()


# -- lease mode: FIFO hand-off ---------------------------------------------------------------
def _queue(admin: psycopg.Connection[Any], ns: str, name: str) -> list[str]:
    rows = admin.execute(
        f'SELECT owner FROM "{ns}_lock_queue" WHERE name = %s AND deadline > clock_timestamp() '
        "ORDER BY seq, owner",
        (name,),
    ).fetchall()
    return [row[0] for row in rows]


def _holder(admin: psycopg.Connection[Any], ns: str, name: str) -> str | None:
    row = admin.execute(f'SELECT owner FROM "{ns}_locks" WHERE name = %s', (name,)).fetchone()
    return None if row is None else str(row[0])


async def test_lease_mode_release_gives_the_lease_to_the_head_at_once(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    backend = clients().backend
    assert await backend.acquire("j", "holder", 30) is not None
    assert await backend.acquire("j", "w1", 30, wait=30) is None  # queued
    assert await backend.acquire("j", "w2", 30, wait=30) is None
    assert _queue(admin, ns, "j") == ["w1", "w2"]
    assert await backend.release("j", "holder") is True
    assert _holder(admin, ns, "j") == "w1"  # handed over before w1 even looked
    assert _queue(admin, ns, "j") == ["w2"]
    token = await backend.acquire("j", "w1", 30, wait=30)  # w1 comes back: it is the owner
    assert token is not None
    assert await backend.release("j", "w1") is True
    assert _holder(admin, ns, "j") == "w2"
    assert await backend.cancel_wait("j", "w2") is not None  # handed just as it gave up
    assert await backend.release("j", "w2") is True
    assert _holder(admin, ns, "j") is None


async def test_lease_mode_a_dead_waiter_is_skipped_after_its_deadline(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    backend = clients().backend
    assert await backend.acquire("d", "holder", 30) is not None
    assert await backend.acquire("d", "dead", 30, wait=0.0) is None  # deadline: slack only
    assert await backend.acquire("d", "alive", 30, wait=30) is None
    await asyncio.sleep(1.2)  # past the dead waiter's deadline (wait 0 + slack 1 s)
    assert _queue(admin, ns, "d") == ["alive"]
    assert await backend.release("d", "holder") is True
    assert _holder(admin, ns, "d") == "alive"


async def test_lease_mode_without_notify_polls_and_does_not_queue(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    """A FIFO queue served by polling would pass the lease on once per poll: ``notify=false``
    waiters poll without queueing (and say so in their capabilities)."""
    holder = clients()
    poller = clients(notify="false", poll_interval=0.05)
    assert poller.capabilities == POLLING_CAPABILITIES
    held = await holder.try_acquire("p", ttl=30)
    assert held is not None
    task = asyncio.create_task(poller.acquire("p", ttl=30, timeout=30))
    await asyncio.sleep(0.3)  # several polls
    assert not task.done() and _queue(admin, ns, "p") == []
    assert await held.release()
    lease = await asyncio.wait_for(task, 10)
    assert lease.token > held.token
    assert await lease.release()


def _blocked_on_a_lock(admin: psycopg.Connection[Any], ns: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (f'%"{ns}_lock_queue"%',),
    ).fetchone()
    return int(row[0]) if row else 0


async def test_lease_mode_never_hands_off_to_a_waiter_that_just_left(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    """Found in review: a release that picked its head from its snapshot handed the lease to a
    waiter that gave up while the release ran, and the name stalled for that waiter's ttl."""
    holder, leaving, newcomer = clients(), clients(), clients()
    held = await holder.try_acquire("n", ttl=30)
    assert held is not None
    waiting = asyncio.create_task(leaving.acquire("n", ttl=30))
    await _until(lambda: len(_queue(admin, ns, "n")) == 1)
    with psycopg.connect(POSTGRES_URL) as blocker:  # holds the counter row: the release
        blocker.execute(  # takes its snapshot (the waiter at the head), then waits here
            f'SELECT 1 FROM "{ns}_lock_tokens" WHERE name = %s FOR UPDATE', ("n",)
        )
        release = asyncio.create_task(held.release())
        await _until(lambda: _blocked_on_a_lock(admin, ns) == 1)
        waiting.cancel()  # the waiter leaves the queue while the release runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert _queue(admin, ns, "n") == []
        blocker.commit()
    assert await asyncio.wait_for(release, 10) is True
    assert _holder(admin, ns, "n") is None  # not handed to the waiter that left
    taken = await newcomer.acquire("n", ttl=10, timeout=2)  # free at once
    assert taken.token > held.token
    assert await taken.release()


async def test_lease_mode_closing_a_client_takes_its_waiters_out_of_the_queue(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    holder, closing, other = clients(), clients(), clients()
    held = await holder.try_acquire("c", ttl=30)
    assert held is not None
    waiting = asyncio.create_task(closing.acquire("c", ttl=30))
    await _until(lambda: len(_queue(admin, ns, "c")) == 1)
    await closing.close()
    assert _queue(admin, ns, "c") == []
    assert await held.release() is True
    assert _holder(admin, ns, "c") is None  # nobody was handed a lease it cannot use
    taken = await other.acquire("c", ttl=10, timeout=2)
    assert await taken.release()
    waiting.cancel()
    with pytest.raises((asyncio.CancelledError, jobfence.JobfenceError)):
        await waiting


async def test_lease_mode_sweeps_the_queue_rows_of_crashed_waiters(
    clients: Clients, admin: psycopg.Connection[Any], ns: str
) -> None:
    backend = clients().backend
    assert await backend.acquire("s", "holder", 30) is not None
    assert await backend.acquire("s", "crashed", 30, wait=0.0) is None  # deadline: slack only
    await asyncio.sleep(1.2)  # past its deadline; it never comes back
    assert await backend.release("s", "holder") is True
    rows = admin.execute(f'SELECT owner FROM "{ns}_lock_queue"').fetchall()
    assert rows == []  # swept, not only skipped


async def test_lease_mode_names_with_newlines_keep_the_listener_alive(
    clients: Clients, admin: psycopg.Connection[Any], ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = "a\nb"
    holder, waiter = clients(), clients()
    held = await holder.try_acquire(name, ttl=30)
    assert held is not None
    task = asyncio.create_task(waiter.acquire(name, ttl=30, timeout=10))
    await _until(lambda: len(_queue(admin, ns, name)) == 1)
    assert await holder.force_release(name)  # a "look again" notification with the name
    lease = await asyncio.wait_for(task, 10)
    assert lease.token > held.token
    other = await holder.try_acquire(name + "2", ttl=30)
    assert other is not None
    assert not [r for r in caplog.records if "LISTEN connection lost" in r.getMessage()]
    assert await lease.release()
    assert await other.release()
