"""The functions that run on the caller's connection -- ``fence``, ``fencing.install``,
``versioned_update``, ``Inbox.claim_in`` and ``Inbox.install(conn)``, sync and async -- given a
connection its owner has closed: a :class:`BackendError` naming the dialect, the driver, the
operation and that the connection is closed, with the driver's own error as ``__cause__``,
on every driver whose connections can be closed (psycopg, asyncpg, PyMySQL, aiomysql,
sqlite3, aiosqlite, SQLAlchemy connections). Never the raw driver error."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import BackendError
from jobfence._core.sqlconn import adapt, adapt_async

from ._sqldrivers import FLAVOURS, Flavour

pytestmark = pytest.mark.timeout(60)

#: a SQLAlchemy Session is never closed for good: it opens a new connection when used again
CLOSABLE = [f for f in FLAVOURS if not f.id.endswith("-session")]


@pytest.fixture(params=CLOSABLE, ids=[f.id for f in CLOSABLE])
async def closed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Flavour, Any]:
    flavour: Flavour = request.param(tmp_path / "app.db")
    conn = await flavour.connect()
    await flavour.close(conn)
    return flavour, conn


async def _operations(flavour: Flavour, conn: Any) -> list[tuple[str, Any]]:
    """``(operation, awaitable or thunk)`` of each function on ``conn``."""
    inbox_url = f"memory://{uuid.uuid4().hex}"
    if flavour.is_async:
        inbox = jobfence.AsyncInbox(inbox_url)
        return [
            ("fence", lambda: jobfence.fence_async(conn, "inventory:42", 7)),
            ("fence.install", lambda: jobfence.fencing_async.install_async(conn)),
            (
                "versioned_update",
                lambda: jobfence.versioned_update_async(conn, "t", {"id": 1}, 1, {}),
            ),
            ("inbox.claim_in", lambda: inbox.claim_in(conn, "order:1")),
            ("inbox.install", lambda: inbox.install(conn)),
        ]
    sync_inbox = jobfence.Inbox(inbox_url)
    return [
        ("fence", lambda: jobfence.fence(conn, "inventory:42", 7)),
        ("fence.install", lambda: jobfence.fencing.install(conn)),
        ("versioned_update", lambda: jobfence.versioned_update(conn, "t", {"id": 1}, 1, {})),
        ("inbox.claim_in", lambda: sync_inbox.claim_in(conn, "order:1")),
        ("inbox.install", lambda: sync_inbox.install(conn)),
    ]


async def test_every_function_on_a_closed_connection_raises_a_backend_error(
    closed: tuple[Flavour, Any],
) -> None:
    flavour, conn = closed
    sc = adapt_async(conn) if flavour.is_async else adapt(conn)
    assert sc.closed()
    for operation, call in await _operations(flavour, conn):
        with pytest.raises(BackendError) as info:
            result = call()
            if flavour.is_async:
                await result
        error = info.value
        message = str(error)
        assert error.operation == operation and error.backend == flavour.dialect, message
        assert f"{flavour.dialect} connection ({sc.driver}): {operation} failed" in message
        assert "the connection is closed" in message, message
        cause = error.__cause__
        assert cause is not None and not isinstance(cause, jobfence.JobfenceError), repr(cause)
        assert type(cause).__name__ in message  # the driver's error is named, and chained


async def test_an_open_connection_is_not_reported_closed(tmp_path: Path) -> None:
    for cls in CLOSABLE:
        flavour = cls(tmp_path / "app.db")
        conn = await flavour.connect()
        try:
            sc = adapt_async(conn) if flavour.is_async else adapt(conn)
            assert not sc.closed(), flavour.id
        finally:
            await flavour.rollback(conn)
            await flavour.close(conn)
