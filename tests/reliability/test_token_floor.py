"""Fencing tokens never repeat after data loss: every grant is floored at the clock.

SQLite: a file restored from an older copy (or one that lost its last unsynced pages) holds
an older token counter; the next grant must still be larger than every token handed out
before. ``memory://``: a store whose counters were cleared.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

import jobfence
from jobfence.backends.memory import MemoryLockBackend

pytestmark = pytest.mark.timeout(60)


def _grant(locks: jobfence.Locks, name: str) -> int:
    lease = locks.try_acquire(name, ttl=30, renew=False)
    assert lease is not None
    assert lease.release()
    return lease.token


def _backup(db: Path, to: Path) -> None:
    """A consistent copy of the live file (WAL included), as a backup tool would take it."""
    src, dst = sqlite3.connect(db), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _restore(copy: Path, db: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(copy, db)


def _clock_moves_past(wall: float) -> None:
    """The guarantee assumes the clock moved on since the last grant (SQLite's clock has
    millisecond resolution); a restore takes far longer, this only makes it certain."""
    for _ in range(1000):
        if time.time() > wall + 0.002:
            return
        time.sleep(0.001)


@pytest.mark.parametrize("handoff", [False, True], ids=["acquire", "release-hand-off"])
def test_sqlite_restored_from_an_older_copy_never_repeats_a_token(
    tmp_path: Path, handoff: bool
) -> None:
    db, copy = tmp_path / "locks.db", tmp_path / "old-copy.db"
    url = f"sqlite:///{db}"
    issued: list[int] = []
    with jobfence.Locks(url) as locks:
        assert locks.capabilities.tokens_survive_data_loss
        issued.append(_grant(locks, "job"))
        _backup(db, copy)  # the counter in the copy stops here
        issued += [_grant(locks, "job") for _ in range(5)]
        if handoff:  # the lease handed to a queued waiter by a release takes a token too
            holder = locks.try_acquire("job", ttl=30, renew=False)
            assert holder is not None
            issued.append(holder.token)
            waiter = jobfence.Locks(url)
            try:
                assert waiter.backend.acquire("job", "waiter", 30, wait=10) is None  # queued
                assert holder.release()
                token = waiter.backend.acquire("job", "waiter", 30, wait=10)  # handed to it
                assert token is not None and token > holder.token
                issued.append(token)
                assert waiter.backend.release("job", "waiter")
            finally:
                waiter.close()
    assert issued == sorted(set(issued))
    last_grant = time.time()

    _restore(copy, db)
    _clock_moves_past(last_grant)
    with jobfence.Locks(url) as locks:
        after = [_grant(locks, "job") for _ in range(3)]
    assert min(after) > max(issued), (issued, after)
    assert after == sorted(set(after))


async def test_async_sqlite_restored_from_an_older_copy_never_repeats_a_token(
    tmp_path: Path,
) -> None:
    db, copy = tmp_path / "locks.db", tmp_path / "old-copy.db"
    url = f"sqlite:///{db}"
    async with jobfence.AsyncLocks(url) as locks:
        lease = await locks.try_acquire("job", ttl=30, renew=False)
        assert lease is not None and await lease.release()
        _backup(db, copy)
        newest = lease.token
        for _ in range(3):
            lease = await locks.try_acquire("job", ttl=30, renew=False)
            assert lease is not None and await lease.release()
            newest = max(newest, lease.token)
    last_grant = time.time()
    _restore(copy, db)
    _clock_moves_past(last_grant)
    async with jobfence.AsyncLocks(url) as locks:
        lease = await locks.try_acquire("job", ttl=30, renew=False)
        assert lease is not None and lease.token > newest
        await lease.release()


def test_memory_store_that_lost_its_counters_never_repeats_a_token() -> None:
    with jobfence.Locks(f"memory://{uuid.uuid4().hex}") as locks:
        assert locks.capabilities.tokens_survive_data_loss
        issued = [_grant(locks, "job") for _ in range(3)]
        backend = locks.backend
        assert isinstance(backend, MemoryLockBackend)
        backend.store.tokens.clear()  # the counters are gone
        _clock_moves_past(time.time())
        assert _grant(locks, "job") > max(issued)
