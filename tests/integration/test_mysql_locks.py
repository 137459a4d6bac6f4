"""The MySQL/MariaDB lock backend against the real server at tests.servers.MYSQL_URL.

Every test uses its own namespace (so its own tables) and drops them afterwards. The generic
lease contract is in tests/conformance; these tests cover what is specific to this backend:
its SQL (tokens, take-over, owner checks, batched renewal, names the SQL must not mangle), its
connection handling (a killed connection, a server that goes away) and its waiting.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import pymysql
import pytest

import jobfence
from jobfence.backends import open_lock_backend
from jobfence.backends.mysql.common import WAITERS, name_hash
from tests.servers import MYSQL_URL, mysql_params

pytestmark = pytest.mark.timeout(60)

_U = urlsplit(MYSQL_URL)


def _admin() -> Any:
    return pymysql.connect(**mysql_params(), autocommit=True)


def _drop_tables(namespace: str) -> None:
    conn = _admin()
    try:
        with conn.cursor() as cur:
            for suffix in ("_locks", "_schema", "_lock_tokens"):
                cur.execute(f"DROP TABLE IF EXISTS `{namespace}{suffix}`")
    finally:
        conn.close()


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = "tmy" + uuid.uuid4().hex[:10]
    try:
        yield ns
    finally:
        _drop_tables(ns)


@pytest.fixture
def locks(namespace: str) -> Iterator[jobfence.Locks]:
    with jobfence.Locks(MYSQL_URL, namespace=namespace) as client:
        yield client


@pytest.fixture
async def alocks(namespace: str) -> AsyncIterator[jobfence.AsyncLocks]:
    async with jobfence.AsyncLocks(MYSQL_URL, namespace=namespace) as client:
        yield client


def _row(namespace: str, name: str) -> tuple[Any, ...] | None:
    conn = _admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT name, owner, token, next_owner FROM `{namespace}_locks` "
                "WHERE name_hash = UNHEX(%s)",
                (name_hash(name),),
            )
            row = cur.fetchone()
            return None if row is None else tuple(row)
    finally:
        conn.close()


# -- tokens ---------------------------------------------------------------------------------
def test_tokens_keep_increasing_after_the_tables_are_lost(namespace: str) -> None:
    with jobfence.Locks(MYSQL_URL, namespace=namespace) as client:
        lease = client.try_acquire("job:restore", ttl=10)
        assert lease is not None
        before = lease.token
        assert lease.release()
    _drop_tables(namespace)  # data loss: the counter row is gone
    with jobfence.Locks(MYSQL_URL, namespace=namespace) as client:
        assert client.capabilities.tokens_survive_data_loss
        lease = client.try_acquire("job:restore", ttl=10)
        assert lease is not None
        assert lease.token > before
        assert lease.release()


# -- take-over and owner checks -------------------------------------------------------------
def test_an_expired_lease_cannot_be_extended_even_if_nobody_took_it(namespace: str) -> None:
    backend = open_lock_backend(MYSQL_URL, asynchronous=False, namespace=namespace)
    try:
        token = backend.acquire("job:late", "owner-1", 0.2)
        assert token is not None
        assert backend.extend("job:late", "owner-1", 10) is True  # live: extended
        assert backend.extend("job:late", "owner-1", 0.05) is True  # shortened
        deadline = time.monotonic() + 5
        while backend.renew([("job:late", "owner-1", 0.05)]) == [True]:
            assert time.monotonic() < deadline  # keeps "renewing" 50 ms leases by hand...
            time.sleep(0.2)  # ...until one ran out between two calls
        assert backend.extend("job:late", "owner-1", 10) is False
        assert backend.release("job:late", "owner-1") is False
        # the same owner retrying an acquire whose reply was lost gets its lease back...
        again = backend.acquire("job:late", "owner-2", 10)
        assert again is not None and again > token
        assert backend.acquire("job:late", "owner-2", 10) == again
        # ...and nobody else does
        assert backend.acquire("job:late", "owner-3", 10) is None
    finally:
        backend.close()


# -- names ----------------------------------------------------------------------------------
NASTY_NAMES = [
    "x" * 65,  # longer than MySQL's 64-character GET_LOCK limit
    "é" * 512,  # exactly 1024 bytes of UTF-8
    "🔒" * 256,  # 4-byte characters (utf8mb4), 1024 bytes
    'it\'s a "quoted" name',
    "back\\slash\\\\and\\'quote",
    "'; DROP TABLE jobfence_locks; --",
    "100% %s %(name)s {prefix} ?",  # driver and template metacharacters
    "tab\tnew\nline\x00nul",
    "名前:注文/42",
    "Case",
    "case",  # must not collide with "Case" (binary collation)
    "trailing space ",
    "trailing space",
]


async def test_names_are_stored_and_compared_exactly(
    alocks: jobfence.AsyncLocks, namespace: str
) -> None:
    leases = []
    for name in NASTY_NAMES:
        lease = await alocks.try_acquire(name, ttl=10)
        assert lease is not None, name
        leases.append(lease)
    for name in NASTY_NAMES:
        assert await alocks.try_acquire(name, ttl=10) is None, name
        row = _row(namespace, name)
        assert row is not None and row[0] == name  # stored verbatim
    # long names that differ only at the very end are different locks
    long_a, long_b = "n" * 1023 + "a", "n" * 1023 + "b"
    la = await alocks.try_acquire(long_a, ttl=10)
    lb = await alocks.try_acquire(long_b, ttl=10)
    assert la is not None and lb is not None
    for lease in [*leases, la, lb]:
        assert await lease.release(), lease.name
    for name in NASTY_NAMES:
        again = await alocks.try_acquire(name, ttl=10)
        assert again is not None, name
        assert await again.release()


# -- configuration and errors -----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["", "1abc", "has-dash", "x" * 49, "a;b", "ns`"])
def test_namespace_must_be_an_sql_identifier(bad: str) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        open_lock_backend(MYSQL_URL, asynchronous=False, namespace=bad)
    assert info.value.argument == "namespace"


def test_bad_url_options_are_configuration_errors() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(MYSQL_URL + "?colour=blue")
    assert info.value.argument == "colour"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(MYSQL_URL + "?mode=forever")
    assert info.value.argument == "mode" and "lease" in str(info.value)
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks("mysql://root@127.0.0.1:3306")
    assert info.value.argument == "url"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(MYSQL_URL, poll_max=-1)
    assert info.value.argument == "poll_max"


def test_mariadb_scheme_selects_the_same_backend(namespace: str) -> None:
    with jobfence.Locks(MYSQL_URL.replace("mysql://", "mariadb://", 1), namespace=namespace) as c:
        assert c.backend.kind == "mysql"
        lease = c.try_acquire("job:maria", ttl=5)
        assert lease is not None and lease.release()


def test_constructor_needs_no_server_and_no_event_loop() -> None:
    client = jobfence.AsyncLocks("mysql://root:secret@127.0.0.1:1/test")  # nothing connects yet
    assert client.capabilities == jobfence.backends.base.LockCapabilities(
        cross_process=True,
        ttl_expiry=True,
        fifo=False,
        handoff=False,
        tokens_survive_data_loss=True,
    )
    asyncio.run(client.close())


def test_unreachable_server_is_a_backend_error_with_the_password_masked() -> None:
    with (
        jobfence.Locks("mysql://root:secret@127.0.0.1:1/test", connect_timeout=2) as client,
        pytest.raises(jobfence.BackendError) as info,
    ):
        client.try_acquire("job:down", ttl=5)
    message = str(info.value)
    assert "secret" not in message and "***" in message
    assert info.value.backend == "mysql" and info.value.operation == "lock.acquire"
    assert isinstance(info.value.__cause__, pymysql.err.OperationalError)


async def test_unreachable_server_async_too() -> None:
    async with jobfence.AsyncLocks("mysql://root:secret@127.0.0.1:1/test") as client:
        with pytest.raises(jobfence.BackendError) as info:
            await client.try_acquire("job:down", ttl=5)
    assert "secret" not in str(info.value)


def test_tables_are_created_once_with_the_declared_schema(
    locks: jobfence.Locks, namespace: str
) -> None:
    locks.backend.install()
    locks.backend.install()  # idempotent
    other = open_lock_backend(MYSQL_URL, asynchronous=False, namespace=namespace)
    try:
        other.install()
    finally:
        other.close()
    conn = _admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name, engine, table_collation FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE %s ORDER BY table_name",
                (namespace + "%",),
            )
            tables = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
            cur.execute(f"SELECT component, version FROM `{namespace}_schema`")
            versions = cur.fetchall()
    finally:
        conn.close()
    assert set(tables) == {f"{namespace}_locks", f"{namespace}_schema"}
    assert all(
        engine == "InnoDB" and coll.startswith("utf8mb4") for engine, coll in tables.values()
    )
    assert tuple(versions) == (("locks", 1),)


# -- waiting --------------------------------------------------------------------------------
def test_a_release_wakes_a_waiter_in_the_same_process(namespace: str) -> None:
    # the waiter polls only every 20 s: only the in-process wake-up can get it the lease soon
    with (
        jobfence.Locks(MYSQL_URL, namespace=namespace) as holder,
        jobfence.Locks(
            MYSQL_URL,
            namespace=namespace,
            poll_interval=20,
            poll_initial=20,
            poll_max=20,
            next_in_line=0,
        ) as waiter,
    ):
        held = holder.try_acquire("job:wake", ttl=30)
        assert held is not None
        got: list[jobfence.Lease] = []
        thread = threading.Thread(
            target=lambda: got.append(waiter.acquire("job:wake", ttl=30, timeout=15))
        )
        thread.start()
        deadline = time.monotonic() + 10
        while not _waiting(waiter, "job:wake"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert held.release()
        thread.join(10)
        assert not thread.is_alive(), "the waiter was not woken by the release"
        assert got and got[0].token > held.token
        assert got[0].release()


def _waiting(client: jobfence.Locks, name: str) -> bool:
    return WAITERS.count(client.backend._key(name)) > 0


def test_a_releasing_worker_cannot_retake_the_lock_ahead_of_the_waiter_next_in_line(
    namespace: str,
) -> None:
    with (
        jobfence.Locks(MYSQL_URL, namespace=namespace) as a,
        jobfence.Locks(MYSQL_URL, namespace=namespace, poll_initial=0.05) as b,
    ):
        held = a.try_acquire("job:fair", ttl=30)
        assert held is not None
        got: list[jobfence.Lease] = []
        thread = threading.Thread(target=lambda: got.append(b.acquire("job:fair", timeout=15)))
        thread.start()
        deadline = time.monotonic() + 10
        while (row := _row(namespace, "job:fair")) is None or row[3] is None:
            assert time.monotonic() < deadline, "the waiter never became next in line"
            time.sleep(0.005)
        assert held.release()
        assert a.try_acquire("job:fair", ttl=30) is None  # reserved for the waiter
        thread.join(10)
        assert got and got[0].token > held.token
        assert _row(namespace, "job:fair")[3] is None  # type: ignore[index]
        assert got[0].release()


def test_a_timed_out_waiter_leaves_no_reservation_behind(
    locks: jobfence.Locks, namespace: str
) -> None:
    held = locks.try_acquire("job:gone", ttl=30)
    assert held is not None
    with pytest.raises(jobfence.LockTimeout):
        locks.acquire("job:gone", timeout=0.3)
    assert _row(namespace, "job:gone")[3] is None  # type: ignore[index]
    assert held.release()
    again = locks.try_acquire("job:gone", ttl=30)
    assert again is not None and again.release()


async def test_a_waiter_cancelled_before_its_answer_arrives_leaves_no_turn_behind(
    namespace: str,
) -> None:
    """The waiter's acquire makes it next in line on the server, and is cancelled while the
    answer is held on the way back (a proxy delays it): the cancelled acquire clears the turn,
    so the name is free for a newcomer once the holder releases it (not held for nobody until
    the turn's window ends)."""
    from tests.netproxy import FaultProxy

    name = "job:cut-off"
    async with jobfence.AsyncLocks(MYSQL_URL, namespace=namespace) as holder:
        held = await holder.try_acquire(name, ttl=30)
        assert held is not None
        with FaultProxy(_U.port or 3306) as proxy:
            url = proxy.url_for(MYSQL_URL, _U.port or 3306)
            url += ("&" if "?" in url else "?") + "next_in_line=30"
            async with jobfence.AsyncLocks(url, namespace=namespace) as waiter:
                warm = await waiter.try_acquire("job:warm", ttl=5)  # connected, tables ready
                assert warm is not None and await warm.release()
                proxy.latency(1.0)  # every chunk held 1 s each way
                task = asyncio.create_task(waiter.acquire(name, ttl=10, timeout=None))
                deadline = time.monotonic() + 10
                while (row := await asyncio.to_thread(_row, namespace, name)) is None or row[
                    3
                ] is None:
                    assert time.monotonic() < deadline, "the waiter never became next in line"
                    await asyncio.sleep(0.005)
                assert not task.done()  # the server answered; the answer is still on its way
                proxy.latency(0.0)  # the cancelled acquire's clean-up goes at once
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        assert _row(namespace, name)[3] is None  # type: ignore[index]
        assert await held.release()
        again = await holder.try_acquire(name, ttl=30)
        assert again is not None, "the cancelled waiter's turn still holds the name"
        assert await again.release()


# -- connection loss -------------------------------------------------------------------------
def _kill(thread_id: int) -> None:
    conn = _admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"KILL {int(thread_id)}")
    finally:
        conn.close()


def test_mysql_connection_kill_detected_and_renewal_recovers(namespace: str) -> None:
    with (
        jobfence.Locks(MYSQL_URL, namespace=namespace) as client,
        jobfence.Locks(MYSQL_URL, namespace=namespace) as other,
    ):
        ttl = 1.5  # room for the reconnect and a renewal on a loaded machine
        lease = client.try_acquire("job:kill", ttl=ttl)
        assert lease is not None
        first = client.backend._conn.thread_id()
        _kill(first)
        renewed = threading.Event()
        deadline = time.monotonic() + 3 * ttl  # several renewals must get through
        while time.monotonic() < deadline:
            time.sleep(ttl / 6)
            conn = client.backend._conn
            if conn is not None and conn.thread_id() != first:
                renewed.set()
        assert renewed.is_set(), "the renewer never reconnected"
        assert not lease.lost
        lease.check()
        assert other.try_acquire("job:kill", ttl=ttl) is None  # still held, by renewal only
        assert lease.release()


async def test_mysql_connection_kill_detected_async(namespace: str) -> None:
    async with jobfence.AsyncLocks(MYSQL_URL, namespace=namespace) as client:
        ttl = 0.6
        lease = await client.try_acquire("job:kill", ttl=ttl)
        assert lease is not None
        first = client.backend._conn.thread_id()
        await asyncio.to_thread(_kill, first)
        await asyncio.sleep(3 * ttl)
        assert client.backend._conn.thread_id() != first
        assert not lease.lost
        assert await client.try_acquire("job:kill", ttl=ttl) is None
        assert await lease.release()


class _Proxy:
    """A loopback TCP forwarder to the MySQL server that can be shut down (a 'closed port')."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopped = True
        try:  # wakes the accept() blocked in the kernel; close() alone would not
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    p = _Proxy(_U.hostname or "127.0.0.1", _U.port or 3306)
    try:
        yield p
    finally:
        if not p.stopped:
            p.stop()


def test_unreachable_server_marks_the_lease_lost_within_about_one_ttl(
    namespace: str, proxy: _Proxy
) -> None:
    url = MYSQL_URL.replace(f"{_U.hostname}:{_U.port}", f"127.0.0.1:{proxy.port}")
    with (
        jobfence.Locks(url, namespace=namespace, connect_timeout=1) as client,
        jobfence.Locks(MYSQL_URL, namespace=namespace) as other,
    ):
        ttl = 1.0
        lease = client.try_acquire("job:partition", ttl=ttl)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        proxy.stop()  # the server becomes unreachable: connection reset, new ones refused
        stopped = time.monotonic()
        assert lost.wait(ttl + 2.0), "the lease was not marked lost"
        assert time.monotonic() - stopped <= ttl + 2.0
        with pytest.raises(jobfence.LockLost):
            lease.check()
        # meanwhile the lease really expired on the server: another client takes it over
        taken = other.acquire("job:partition", ttl=10, timeout=10)
        assert taken.token > lease.token
        assert taken.release()
