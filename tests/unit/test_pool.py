"""The one idle-connection pool (``jobfence._core.pool_async`` / ``pool``) and the one option
that sizes it everywhere, ``pool_size`` (``max_idle`` is its deprecated name)."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence._core.pool import ConnPool
from jobfence._core.pool_async import AsyncConnPool
from jobfence.errors import ConfigurationError
from tests.servers import MYSQL_URL, POSTGRES_URL


class Conn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False
        self.healthy = True


class Factory:
    def __init__(self) -> None:
        self.made: list[Conn] = []

    def connect(self) -> Conn:
        self.made.append(Conn(len(self.made)))
        return self.made[-1]

    @staticmethod
    def close(conn: Conn) -> None:
        conn.closed = True

    async def aconnect(self) -> Conn:
        return self.connect()

    @staticmethod
    async def aclose(conn: Conn) -> None:
        conn.closed = True


def test_idle_connections_are_reused_up_to_pool_size() -> None:
    f = Factory()
    pool = ConnPool(f.connect, f.close, pool_size=1)
    a, b = pool.take(), pool.take()
    pool.give(a)
    pool.give(b)  # no room: closed
    assert (a.closed, b.closed) == (False, True)
    assert pool.take() is a
    pool.give(a)
    pool.close()
    assert a.closed
    c = pool.take()
    pool.give(c)  # a closed pool keeps nothing
    assert c.closed


def test_a_connection_that_saw_an_error_is_closed_unless_reusable_says_otherwise() -> None:
    f = Factory()
    pool = ConnPool(f.connect, f.close)
    with pytest.raises(RuntimeError), pool.connection() as conn:
        raise RuntimeError("boom")
    assert conn.closed  # state unknown: not reused
    checked = ConnPool(f.connect, f.close, reusable=lambda c: c.healthy)
    with pytest.raises(RuntimeError), checked.connection() as conn:
        raise RuntimeError("boom")
    assert not conn.closed  # still usable: kept
    with checked.connection() as again:
        assert again is conn
        again.healthy = False
    assert again.closed
    with checked.connection() as fresh:
        assert fresh is not conn


def test_take_skips_idle_connections_that_went_bad() -> None:
    f = Factory()
    pool = ConnPool(f.connect, f.close, reusable=lambda c: c.healthy)
    a = pool.take()
    pool.give(a)
    a.healthy = False
    b = pool.take()
    assert b is not a and a.closed


async def test_the_async_pool_behaves_the_same() -> None:
    f = Factory()
    pool = AsyncConnPool(f.aconnect, f.aclose, pool_size=1)
    async with pool.connection() as a:
        pass
    async with pool.connection() as again:
        assert again is a
    with pytest.raises(RuntimeError):
        async with pool.connection() as b:
            raise RuntimeError("boom")
    assert b.closed
    await pool.close()
    assert all(c.closed for c in f.made)


def _pool_of(client: Any) -> Any:
    backend = client.backend
    return backend._pool


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp, **kw: jobfence.Inbox(POSTGRES_URL, **kw),
        lambda tmp, **kw: jobfence.Inbox(MYSQL_URL, **kw),
        lambda tmp, **kw: jobfence.Inbox(f"sqlite:///{tmp}/p.db", **kw),
        lambda tmp, **kw: jobfence.Locks(POSTGRES_URL, **kw),
        lambda tmp, **kw: jobfence.AsyncLocks(POSTGRES_URL, **kw),
    ],
    ids=["postgres-inbox", "mysql-inbox", "sqlite-inbox", "postgres-locks", "postgres-alocks"],
)
def test_pool_size_everywhere_and_max_idle_as_a_deprecated_alias(make: Any, tmp_path: Path) -> None:
    client = make(tmp_path, pool_size=3)
    assert _pool_of(client).pool_size == 3
    with pytest.warns(DeprecationWarning, match="pool_size"):
        old = make(tmp_path, max_idle=2)
    assert _pool_of(old).pool_size == 2
    with pytest.raises(ConfigurationError) as info:
        make(tmp_path, pool_size=-1)
    assert info.value.argument == "pool_size"
    for c in (client, old):
        if isinstance(c, jobfence.AsyncLocks):
            asyncio.run(c.close())  # nothing was opened, but close it all the same
        else:
            c.close()


def test_pool_size_from_the_url() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inbox = jobfence.Inbox(POSTGRES_URL + "?pool_size=5")
    assert _pool_of(inbox).pool_size == 5
    inbox.close()
    with pytest.warns(DeprecationWarning):
        inbox = jobfence.Inbox(POSTGRES_URL + "?max_idle=6")
    assert _pool_of(inbox).pool_size == 6
    inbox.close()


def test_each_client_has_its_own_pool() -> None:
    a, b = jobfence.Inbox(POSTGRES_URL), jobfence.Inbox(POSTGRES_URL)
    try:
        assert _pool_of(a) is not _pool_of(b)
        for inbox in (a, b):
            claim = inbox.claim(f"jf-pool-test-{uuid.uuid4().hex}")
            assert claim.state.name == "NEW"
            assert claim.release()
    finally:
        a.close()
        b.close()
