"""The SQLite lock backend (``sqlite:///path``) against real files, threads and processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.sqlite.common import WAITERS
from jobfence.backends.sqlite.locks import SQLiteLockBackend
from jobfence.backends.sqlite.locks_async import AsyncSQLiteLockBackend
from jobfence.errors import BackendError, ConfigurationError

NS = "jf_test"


def backend(path: Path, namespace: str = NS, **options: Any) -> SQLiteLockBackend:
    return SQLiteLockBackend(parse_url(f"sqlite:///{path}"), namespace=namespace, **options)


def expire_now(path: Path, name: str, namespace: str = NS) -> None:
    """Move a lease's expiry into the past, as if its ttl had run out (no sleeping)."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        changed = conn.execute(
            f"UPDATE {namespace}_locks SET expires_at = expires_at - 3600 WHERE name = ?", (name,)
        ).rowcount
    assert changed == 1
    conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "locks.db"


@pytest.fixture
def be(db: Path) -> Any:
    b = backend(db)
    yield b
    b.close()


# -- expiry, owner checks, tokens -------------------------------------------------------
def test_an_expired_lease_cannot_be_extended_or_released_even_if_nobody_took_it(
    be: Any, db: Path
) -> None:
    assert be.acquire("job", "me", 30) is not None
    expire_now(db, "job")
    assert be.extend("job", "me", 30) is False
    assert be.renew([("job", "me", 30)]) == [False]
    assert be.release("job", "me") is False


def test_tokens_survive_release_and_a_lost_counter_never_goes_backwards(be: Any, db: Path) -> None:
    tokens = []
    for i in range(5):
        token = be.acquire("n", f"o{i}", 30)
        assert token is not None and be.release("n", f"o{i}")
        tokens.append(token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    # the counter row is deleted (data loss): the next token is still larger. The loss comes
    # after the last grant's millisecond (the resolution of SQLite's clock, the token floor):
    # within one millisecond only the counter keeps tokens apart.
    with sqlite3.connect(db, isolation_level=None) as conn:
        now_us = "SELECT CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
        while conn.execute(now_us).fetchone()[0] <= tokens[-1]:
            pass
        conn.execute(f"DELETE FROM {NS}_lock_tokens")
    conn.close()
    after = be.acquire("n", "late", 30)
    assert after is not None and after > tokens[-1]


def test_force_release_drops_any_holder_and_keeps_the_counter(be: Any) -> None:
    t1 = be.acquire("f", "holder", 30)
    assert be.force_release("f") is True
    assert be.force_release("f") is False
    assert be.extend("f", "holder", 30) is False
    t2 = be.acquire("f", "next", 30)
    assert t1 is not None and t2 is not None and t2 > t1


# -- waiting ----------------------------------------------------------------------------
def _wait_for_waiters(b: Any, name: str, count: int) -> None:
    """Spin (with a deadline) until ``count`` waiters on ``name`` are registered."""
    deadline = time.monotonic() + 10
    while WAITERS.count(b._key(name)) < count:
        assert time.monotonic() < deadline, "the waiter never started waiting"
        time.sleep(0.001)


def test_in_process_release_wakes_a_waiting_thread(db: Path) -> None:
    # The backoff is huge, so only the release notification can end this wait in time:
    # polling would next look after an hour, and the lease itself lives for two minutes.
    b = backend(db, poll_initial=3600, poll_max=3600)
    try:
        assert b.acquire("w", "holder", 120) is not None
        result: list[Any] = []
        waiter = threading.Thread(target=lambda: result.append(b.wait("w", "waiter", 3600)))
        waiter.start()
        _wait_for_waiters(b, "w", 1)
        assert b.release("w", "holder") is True
        waiter.join(timeout=30)
        assert not waiter.is_alive(), "release did not wake the waiter"
        assert result == [None]  # the caller now acquires
        assert b.acquire("w", "waiter", 30) is not None
        assert WAITERS.count(b._key("w")) == 0  # the waiter unregistered itself
    finally:
        b.close()


def test_release_through_locks_wakes_a_thread_blocked_in_acquire(db: Path) -> None:
    url = f"sqlite:///{db}"
    # poll_interval (core) and poll_initial/poll_max (backend) all one hour: only the
    # notification can hand the lock over before the join deadline.
    locks = jobfence.Locks(url, namespace=NS, poll_interval=3600, poll_initial=3600, poll_max=3600)
    other = jobfence.Locks(url, namespace=NS)  # a second client on the same file
    try:
        held = other.acquire("job", ttl=120)
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(locks.acquire("job", timeout=600).token))
        t.start()
        _wait_for_waiters(locks.backend, "job", 1)
        held.release()
        t.join(timeout=30)
        assert not t.is_alive()
        assert got and got[0] > held.token
    finally:
        locks.close()
        other.close()


async def test_sync_release_wakes_an_async_waiter(db: Path) -> None:
    url = parse_url(f"sqlite:///{db}")
    ab = AsyncSQLiteLockBackend(url, namespace=NS, poll_initial=3600, poll_max=3600)
    sb = SQLiteLockBackend(url, namespace=NS)
    try:
        assert sb.acquire("x", "sync-holder", 120) is not None
        waiting = asyncio.create_task(ab.wait("x", "async-waiter", 3600))
        while WAITERS.count(ab._key("x")) < 1:
            assert not waiting.done()
            await asyncio.sleep(0.001)
        await asyncio.to_thread(sb.release, "x", "sync-holder")
        assert await asyncio.wait_for(waiting, 30) is None
        assert await ab.acquire("x", "async-waiter", 30) is not None
    finally:
        await ab.close()
        sb.close()


def test_wait_never_sleeps_past_the_lease_expiry(db: Path) -> None:
    """No notification comes when a lease simply expires: the poll is bounded by its expiry."""
    b = backend(db, poll_initial=3600, poll_max=3600)
    try:
        assert b.acquire("e", "holder", 0.2) is not None
        done = threading.Event()
        threading.Thread(target=lambda: (b.wait("e", "waiter", 3600), done.set())).start()
        assert done.wait(30), "the wait slept past the lease's expiry"
        assert b.acquire("e", "waiter", 30) is not None
    finally:
        b.close()


def test_wait_returns_at_its_timeout_and_cancel_wait_reports_no_token(be: Any) -> None:
    assert be.acquire("t", "holder", 120) is not None
    assert be.wait("t", "waiter", 0.01) is None  # bounded by the timeout
    assert be.cancel_wait("t", "waiter") is None
    assert be.cancel_wait("t", "holder") is not None
    with pytest.raises(jobfence.LockTimeout):
        locks = jobfence.Locks(f"sqlite:///{be.path}", namespace=NS)
        try:
            locks.acquire("t", timeout=0.02)
        finally:
            locks.close()


# -- schema -----------------------------------------------------------------------------
def test_schema_is_created_once_and_idempotently(db: Path) -> None:
    first, second = backend(db), backend(db)
    try:
        assert first.acquire("s", "a", 30) is not None  # first use creates the tables
        second.install()  # again, from another connection: a no-op
        first.install()
        assert second.acquire("s", "b", 30) is None  # both see the same lease
        with sqlite3.connect(db) as conn:
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            rows = conn.execute(f"SELECT component, version FROM {NS}_schema").fetchall()
            (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        conn.close()
        assert {f"{NS}_locks", f"{NS}_lock_tokens", f"{NS}_schema"} <= tables
        assert rows == [("locks", 1)]
        assert mode == "wal"
    finally:
        first.close()
        second.close()


def test_namespaces_on_one_file_are_independent(db: Path) -> None:
    a, b = backend(db, "ns_a"), backend(db, "ns_b")
    try:
        assert a.acquire("same", "o1", 30) is not None
        assert b.acquire("same", "o2", 30) is not None
    finally:
        a.close()
        b.close()


def test_a_newer_schema_version_is_refused(db: Path) -> None:
    b = backend(db)
    b.install()
    b.close()
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute(f"UPDATE {NS}_schema SET version = 99 WHERE component = 'locks'")
    conn.close()
    locks = jobfence.Locks(f"sqlite:///{db}", namespace=NS)
    try:
        with pytest.raises(BackendError, match="version 99"):
            locks.try_acquire("x")
    finally:
        locks.close()


# -- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:////", "sqlite://host/x.db"],
)
def test_urls_without_a_shared_file_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        jobfence.Locks(url)
    assert err.value.argument == "url"
    with pytest.raises(ConfigurationError) as aerr:
        jobfence.AsyncLocks(url)  # no event loop needed to construct (and fail)
    assert aerr.value.argument == "url"


def test_memory_url_suggests_memory_scheme() -> None:
    with pytest.raises(ConfigurationError, match="memory://"):
        jobfence.Locks("sqlite:///:memory:")


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(ConfigurationError, match="does not exist") as err:
        jobfence.Locks(f"sqlite:///{missing / 'locks.db'}")
    assert err.value.argument == "url"
    assert not missing.exists()  # not created behind the user's back


def test_relative_and_absolute_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = SQLiteLockBackend(parse_url("sqlite:///rel.db"))
    absolute = SQLiteLockBackend(parse_url(f"sqlite:///{tmp_path / 'rel.db'}"))
    try:
        assert rel.path == str(tmp_path / "rel.db") == absolute.path
        assert rel.acquire("n", "o", 30) is not None
        assert absolute.acquire("n", "p", 30) is None  # the same file
    finally:
        rel.close()
        absolute.close()


@pytest.mark.parametrize("namespace", ["bad-name", "1abc", "a" * 64, "x; DROP TABLE y", "", "ä"])
def test_namespace_must_be_an_sql_identifier(db: Path, namespace: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        backend(db, namespace)
    assert err.value.argument == "namespace"


def test_options_are_validated(db: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        backend(db, no_such_option=1)
    assert err.value.argument == "no_such_option"
    with pytest.raises(ConfigurationError) as err:
        SQLiteLockBackend(parse_url(f"sqlite:///{db}?busy_timeout=soon"))
    assert err.value.argument == "busy_timeout"
    with pytest.raises(ConfigurationError) as err:
        backend(db, synchronous="sometimes")
    assert err.value.argument == "synchronous"
    ok = SQLiteLockBackend(parse_url(f"sqlite:///{db}?busy_timeout=0.5&synchronous=normal"))
    assert ok.options.busy_timeout == 0.5 and ok.options.synchronous == "normal"
    ok.close()


def test_database_locked_past_the_busy_timeout_is_a_backend_error(db: Path) -> None:
    locks = jobfence.Locks(f"sqlite:///{db}", namespace=NS, busy_timeout=0.05)
    locks.backend.install()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(BackendError) as err:
            locks.try_acquire("x")
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(err.value.__cause__)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert locks.try_acquire("x") is not None  # the connection is usable again
    locks.close()


# -- names ------------------------------------------------------------------------------
NAMES = [
    "it's",
    'say "hi"',
    "'; DROP TABLE jf_test_locks; --",
    "100% _wild_ [card] * ?",
    "ünïcødé 🔒 名前",
    "a\x00b",
    "a",
    "A",
    "a ",
    "\\",
    "x" * 1024,
]


def test_any_name_is_stored_exactly(be: Any) -> None:
    tokens = {}
    for name in NAMES:
        token = be.acquire(name, "o", 30)
        assert token is not None, name  # each name is its own lock
        tokens[name] = token
    for name in NAMES:
        assert be.acquire(name, "other", 30) is None
        assert be.extend(name, "o", 30) is True
        assert be.cancel_wait(name, "o") == tokens[name]
    assert be.renew([(n, "o", 30) for n in NAMES]) == [True] * len(NAMES)
    for name in NAMES:
        assert be.release(name, "o") is True
        assert be.release(name, "o") is False


async def test_async_client_end_to_end(db: Path) -> None:
    locks = jobfence.AsyncLocks(f"sqlite:///{db}", namespace=NS)
    try:
        async with locks.acquire("ünï 'q'", ttl=5) as lease:
            assert await locks.try_acquire("ünï 'q'") is None
            first = lease.token
        again = await locks.try_acquire("ünï 'q'")
        assert again is not None and again.token > first
        await again.release()

        order: list[int] = []

        async def worker(i: int) -> None:
            async with locks.acquire("shared", ttl=5, timeout=30) as lease:
                order.append(lease.token)

        await asyncio.gather(*(worker(i) for i in range(5)))
        assert order == sorted(order) and len(set(order)) == 5
    finally:
        await locks.close()
        await locks.close()  # idempotent


def _open_and_acquire(path: str, start: Any, out: Any) -> None:
    start.wait()
    try:
        with jobfence.Locks(f"sqlite:///{path}") as locks:
            lease = locks.acquire("first-use", ttl=5, timeout=30)
            lease.release()
        out.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(f"{type(exc).__name__}: {exc}")


def test_many_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Creating the schema and switching to WAL races when processes open a new file
    together; none of them may fail with 'database is locked'."""

    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        path = tmp_path / f"fresh-{round_}.db"
        start, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_open_and_acquire, args=(str(path), start, out)) for _ in range(8)
        ]
        for p in procs:
            p.start()
        start.set()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert results == ["ok"] * 8, results


async def test_a_cancelled_acquire_does_not_leave_the_file_write_locked(tmp_path: Path) -> None:
    """Cancelling an acquire while BEGIN IMMEDIATE waits for another writer must not leave
    the backend's connection inside a write transaction (review finding)."""
    path = tmp_path / "cancel.db"
    locks = jobfence.AsyncLocks(f"sqlite:///{path}")
    try:
        warm = await locks.try_acquire("warm-up", ttl=5)  # creates the schema
        assert warm is not None and await warm.release()
        blocker = sqlite3.connect(path, timeout=0, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the file
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(locks.try_acquire("job", ttl=5), 0.3)
        blocker.execute("COMMIT")
        blocker.close()
        # the backend's own next operation works ...
        lease = await asyncio.wait_for(locks.try_acquire("job", ttl=5), 10)
        assert lease is not None
        # ... and other connections can write to the file again
        other = sqlite3.connect(path, timeout=2, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        other.close()
        assert await lease.release()
    finally:
        await locks.close()


# -- fairness: the FIFO wait queue and hand-off ------------------------------------------------
def _queue(path: Path, name: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            f"SELECT owner FROM {NS}_lock_queue WHERE name = ? "
            "AND until > (julianday('now') - 2440587.5) * 86400.0 ORDER BY seq, owner",
            (name,),
        ).fetchall()
        return [row[0] for row in rows]
    finally:
        conn.close()


def test_without_next_in_line_there_is_no_queue(db: Path) -> None:
    b = backend(db, next_in_line=0)
    try:
        assert not b.capabilities.fifo and not b.capabilities.handoff
        assert b.acquire("n", "holder", 30) is not None
        assert b.acquire("n", "waiter", 30, wait=10) is None
        assert _queue(db, "n") == []
        assert b.release("n", "holder") is True
        assert b.acquire("n", "holder", 30) is not None  # the releaser may re-take it
    finally:
        b.close()


def test_dead_queue_entries_are_skipped_and_swept(db: Path) -> None:
    b = backend(db, next_in_line=0.1)
    try:
        assert b.acquire("d", "holder", 30) is not None
        assert b.acquire("d", "crashed", 30, wait=10) is None  # never comes back
        time.sleep(0.15)  # past its entry's life
        assert b.release("d", "holder") is True  # nobody to hand it to: freed
        assert b.acquire("d", "newcomer", 30) is not None
        conn = sqlite3.connect(db)
        assert conn.execute(f"SELECT count(*) FROM {NS}_lock_queue").fetchone()[0] == 0
        conn.close()
    finally:
        b.close()


# -- the one-statement paths --------------------------------------------------------------
class _Recording:
    """A sqlite3 connection that records the first word of every statement it is given."""

    def __init__(self, raw: sqlite3.Connection, seen: list[str]) -> None:
        self._raw, self._seen = raw, seen

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._seen.append(sql.split()[0])
        return self._raw.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _statements(be: Any) -> list[str]:
    """Start recording the statements ``be`` sends on its connection."""
    be.install()
    seen: list[str] = []
    be._conn = _Recording(be._conn, seen)
    return seen


def test_an_uncontended_cycle_is_one_statement_each_way(be: Any) -> None:
    seen = _statements(be)
    assert be.acquire("u", "o", 30) is not None
    # take, in the acquire's transaction (a cancelled acquire must be able to roll back)
    assert seen == ["BEGIN", "INSERT", "COMMIT"]
    seen.clear()
    assert be.release("u", "o") is True
    assert seen == ["DELETE"]  # release_alone
    seen.clear()
    # held by someone else: take changes nothing, and the full transaction answers
    assert be.acquire("u", "a", 30) is not None
    seen.clear()
    assert be.acquire("u", "b", 30) is None
    assert seen[:2] == ["BEGIN", "INSERT"] and seen[2] == "SELECT" and seen[-1] == "COMMIT"


def test_tokens_increase_across_the_one_statement_and_the_transaction_paths(
    be: Any, db: Path
) -> None:
    def counter() -> int:
        with sqlite3.connect(db) as conn:
            (value,) = conn.execute(
                f"SELECT token FROM {NS}_lock_tokens WHERE name = 'm'"
            ).fetchone()
        conn.close()
        return int(value)

    tokens = [be.acquire("m", "a", 30)]  # take
    assert tokens[0] is not None and counter() == tokens[0]  # the trigger moved the counter
    assert be.release("m", "a") is True  # release_alone
    tokens.append(be.acquire("m", "b", 30))  # take again
    assert be.acquire("m", "w", 30, wait=10) is None  # queued: the next grant is a hand-off
    assert be.release("m", "b") is True  # hand-off: next_token + grant in one transaction
    tokens.append(be.wait("m", "w", 1))
    assert be.release("m", "w") is True  # the queue is empty again: release_alone
    tokens.append(be.acquire("m", "c", 30))  # take
    assert None not in tokens
    assert all(earlier < later for earlier, later in pairwise(tokens)), tokens
    assert counter() == tokens[-1]


def test_a_file_made_before_the_counter_trigger_gets_it_and_keeps_its_counter(db: Path) -> None:
    first = backend(db)
    try:
        assert first.acquire("old", "a", 30) is not None
        assert first.release("old", "a") is True
    finally:
        first.close()
    high = 10**17  # far past the host clock in microseconds: only the counter can beat it
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute(f'DROP TRIGGER "{NS}_locks_counter"')
        conn.execute(f"UPDATE {NS}_lock_tokens SET token = ? WHERE name = 'old'", (high,))
    conn.close()
    second = backend(db)
    try:
        assert second.acquire("old", "b", 30) == high + 1
        assert second.release("old", "b") is True
        assert second.acquire("old", "c", 30) == high + 2  # the counter followed the take
        with sqlite3.connect(db) as conn:
            triggers = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'"
            ).fetchall()
        conn.close()
        assert (f"{NS}_locks_counter",) in triggers
    finally:
        second.close()
