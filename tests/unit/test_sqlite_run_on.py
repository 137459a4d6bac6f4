"""``run_on``: every async SQLite operation runs whole on aiosqlite's thread, in one hop.

It rests on aiosqlite's private ``Connection._execute(fn, *args)`` and ``Connection._conn``;
the first test fails, saying so, when an aiosqlite release changes them."""

from __future__ import annotations

import asyncio
import inspect
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.sqlite.connect_async import (
    connect,
    run_in_transaction,
    run_on,
    write_gate,
)
from jobfence.backends.sqlite.locks_async import AsyncSQLiteLockBackend

PRIVATE_API = (
    "aiosqlite's private Connection._execute(fn, *args) / Connection._conn changed: "
    "jobfence.backends.sqlite.connect_async.run_on needs another way onto the connection's "
    f"thread (aiosqlite {getattr(aiosqlite, '__version__', '?')}; see the pin in pyproject.toml)"
)


async def test_run_on_calls_the_function_with_the_raw_connection_on_its_thread(
    tmp_path: Path,
) -> None:
    execute = getattr(aiosqlite.Connection, "_execute", None)
    assert execute is not None and inspect.iscoroutinefunction(execute), PRIVATE_API
    assert isinstance(inspect.getattr_static(aiosqlite.Connection, "_conn"), property), PRIVATE_API
    conn = await connect(str(tmp_path / "r.db"), 5.0)
    try:
        worker = getattr(conn, "_thread", conn)  # aiosqlite < 0.22: the connection is the thread
        seen: dict[str, Any] = {}

        def fn(raw: sqlite3.Connection, a: int, *, b: int) -> int:
            seen["raw"] = raw
            seen["thread"] = threading.get_ident()
            return a + b

        assert await run_on(conn, fn, 1, b=2) == 3, PRIVATE_API
        assert isinstance(seen["raw"], sqlite3.Connection), PRIVATE_API
        assert seen["raw"] is conn._conn, PRIVATE_API
        assert seen["thread"] == worker.ident != threading.get_ident(), PRIVATE_API

        def fails(raw: sqlite3.Connection) -> None:
            raw.execute("SELECT * FROM no_such_table")

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await run_on(conn, fails)
    finally:
        await conn.close()


async def test_a_failing_transaction_is_rolled_back(tmp_path: Path) -> None:
    conn = await connect(str(tmp_path / "t.db"), 5.0)
    try:
        await run_on(conn, lambda raw: raw.execute("CREATE TABLE t (x INTEGER)"))

        def insert_then_fail(raw: sqlite3.Connection) -> None:
            raw.execute("INSERT INTO t VALUES (1)")
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await run_in_transaction(conn, insert_then_fail)
        assert not conn.in_transaction
        assert await run_on(conn, lambda raw: raw.execute("SELECT count(*) FROM t").fetchone()) == (
            0,
        )
        await run_in_transaction(conn, lambda raw: raw.execute("INSERT INTO t VALUES (2)"))
        assert await run_on(conn, lambda raw: raw.execute("SELECT x FROM t").fetchall()) == [(2,)]
    finally:
        await conn.close()


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls every aiosqlite connection hands to its thread."""
    count = [0]
    real = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    return count


async def _hops_of(count: list[int], operation: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    count[0] = 0
    result = await operation()
    return count[0], result


async def test_each_async_operation_is_one_hop(tmp_path: Path, hops: list[int]) -> None:
    url = f"sqlite:///{tmp_path / 'hops.db'}"
    async with jobfence.AsyncLocks(url, namespace="jf_hops") as locks:
        assert await locks.try_acquire("warm", renew=False) is not None  # schema, connection
        n, lease = await _hops_of(hops, lambda: locks.try_acquire("job", renew=False))
        assert lease is not None and n == 1
        n, released = await _hops_of(hops, lease.release)
        assert released and n == 1
    async with jobfence.AsyncInbox(url, table="jf_hops_inbox") as inbox:
        await (await inbox.claim("warm")).complete(0)
        n, claim = await _hops_of(hops, lambda: inbox.claim("k"))
        assert claim.state is jobfence.ClaimState.NEW and n == 1
        n, _ = await _hops_of(hops, lambda: claim.complete(1))
        assert n == 1
    async with jobfence.AsyncQueue(url, "q", table="jf_hops_queue") as queue:
        await queue.publish({"warm": True})
        await (await queue.receive())[0].ack()
        n, _ = await _hops_of(hops, lambda: queue.publish({"n": 1}))
        assert n == 1
        n, messages = await _hops_of(hops, queue.receive)
        assert len(messages) == 1 and n == 1
        n, _ = await _hops_of(hops, messages[0].ack)
        assert n == 1
        n, messages = await _hops_of(hops, queue.receive)
        assert messages == [] and n == 1


async def test_a_cancelled_acquire_rolls_back_and_holds_the_gate_until_it_ended(
    tmp_path: Path,
) -> None:
    """Cancelled while its transaction waits for another writer: the caller's CancelledError
    comes only once the transaction ended (the write gate is held until then), and it was
    rolled back, not committed, although its statements ran once the file was free."""
    path = tmp_path / "cancel.db"
    backend = AsyncSQLiteLockBackend(parse_url(f"sqlite:///{path}"), namespace="jf_cancel")
    try:
        await backend.prepare()
        gate = write_gate(os.path.realpath(path))
        blocker = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another writer holds the file
            task = asyncio.create_task(backend.acquire("job", "me", 30.0))
            while not gate.locked():  # the acquire is in: its BEGIN waits for the blocker
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=0.3)
            assert not done, "cancelled while its transaction still ran"
            assert gate.locked()
        finally:
            blocker.execute("COMMIT")  # the acquire's BEGIN goes through, its grant runs
            blocker.close()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not gate.locked()
        assert backend._conn is not None and not backend._conn.in_transaction
        assert await backend.holder("job") is None  # the grant was rolled back
        assert await backend.acquire("job", "other", 30.0) is not None
    finally:
        await backend.close()
