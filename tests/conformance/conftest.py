"""Fixtures of both conformance suites, parametrised from ``specs.py``.

The lock suite asks for ``env_async`` (one spec of ``specs_for("locks")``, ``AsyncLocks``
clients) in its async specs and for ``env`` (sync ``Locks`` clients) in their generated sync
twins; the inbox suite likewise for ``ienv_async`` / ``ienv`` (``specs_for("inbox")``) and
the queue suite for ``qenv_async`` / ``qenv`` (``specs_for("queue")``) and the outbox suite
for ``oenv_async`` / ``oenv`` (``specs_for("outbox")``). Each test gets a fresh
namespace; afterwards its clients are closed and the spec's
``cleanup`` removes what it left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.conformance.specs import (
    INBOX,
    LOCKS,
    OUTBOX,
    QUEUE,
    Spec,
    inbox_table,
    new_namespace,
    outbox_table,
    spec_params,
)
from tests.servers import MYSQL_URL, POSTGRES_URL


@pytest.fixture(params=spec_params(LOCKS))
def spec(request: pytest.FixtureRequest) -> Spec:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=spec_params(INBOX))
def inbox_spec(request: pytest.FixtureRequest) -> Spec:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=spec_params(QUEUE))
def queue_spec(request: pytest.FixtureRequest) -> Spec:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=spec_params(OUTBOX))
def outbox_spec(request: pytest.FixtureRequest) -> Spec:
    return request.param  # type: ignore[no-any-return]


class _Isolated:
    """One spec, one flavour, one fresh namespace."""

    def __init__(self, spec: Spec, flavour: str, tmp_path: Path) -> None:
        self.spec = spec
        self.flavour = flavour
        self.url = spec.make_url(tmp_path)
        self.namespace = new_namespace()

    def cleanup(self) -> None:
        self.spec.cleanup(self.url, self.namespace)


class AsyncEnv(_Isolated):
    """One lock backend, one namespace: makes ``AsyncLocks`` clients and cleans up."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "async", tmp_path)
        self.clients: list[jobfence.AsyncLocks] = []

    def client(self, **options: Any) -> jobfence.AsyncLocks:
        client = jobfence.AsyncLocks(self.url, namespace=self.namespace, **options)
        self.clients.append(client)
        return client

    async def aclose(self) -> None:
        try:
            for c in self.clients:
                try:
                    await c.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


class Env(_Isolated):
    """One lock backend, one namespace: makes sync ``Locks`` clients and cleans up."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "sync", tmp_path)
        self.clients: list[jobfence.Locks] = []

    def client(self, **options: Any) -> jobfence.Locks:
        client = jobfence.Locks(self.url, namespace=self.namespace, **options)
        self.clients.append(client)
        return client

    def close(self) -> None:
        try:
            for c in self.clients:
                try:
                    c.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


class AsyncInboxEnv(_Isolated):
    """One inbox backend, one table: makes ``AsyncInbox`` clients and cleans up."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "async", tmp_path)
        self.table = inbox_table(self.namespace)
        self.inboxes: list[jobfence.AsyncInbox] = []

    def inbox(self, **options: Any) -> jobfence.AsyncInbox:
        options.setdefault("table", self.table)
        inbox = jobfence.AsyncInbox(self.url, **options)
        self.inboxes.append(inbox)
        return inbox

    async def aclose(self) -> None:
        try:
            for inbox in self.inboxes:
                try:
                    await inbox.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


class InboxEnv(_Isolated):
    """One inbox backend, one table: makes sync ``Inbox`` clients and cleans up."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "sync", tmp_path)
        self.table = inbox_table(self.namespace)
        self.inboxes: list[jobfence.Inbox] = []

    def inbox(self, **options: Any) -> jobfence.Inbox:
        options.setdefault("table", self.table)
        inbox = jobfence.Inbox(self.url, **options)
        self.inboxes.append(inbox)
        return inbox

    def close(self) -> None:
        try:
            for inbox in self.inboxes:
                try:
                    inbox.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


class AsyncQueueEnv(_Isolated):
    """One queue backend, one queue name (the test's namespace): makes ``AsyncQueue``
    clients; afterwards closes them and drops the queue."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "async", tmp_path)
        self.name = self.namespace
        self.queues: list[jobfence.AsyncQueue] = []

    def queue(self, name: str | None = None, **options: Any) -> jobfence.AsyncQueue:
        queue = jobfence.AsyncQueue(self.url, name or self.name, **options)
        self.queues.append(queue)
        return queue

    async def aclose(self) -> None:
        try:
            names = {q.name for q in self.queues}
            for queue in self.queues:
                try:
                    await queue.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
            for name in names:
                try:
                    dropper = jobfence.AsyncQueue(self.url, name)
                    await dropper.drop()
                    await dropper.close()
                except Exception:
                    pass
        finally:
            self.cleanup()


class QueueEnv(_Isolated):
    """One queue backend, one queue name (the test's namespace): makes sync ``Queue``
    clients; afterwards closes them and drops the queue."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "sync", tmp_path)
        self.name = self.namespace
        self.queues: list[jobfence.Queue] = []

    def queue(self, name: str | None = None, **options: Any) -> jobfence.Queue:
        queue = jobfence.Queue(self.url, name or self.name, **options)
        self.queues.append(queue)
        return queue

    def close(self) -> None:
        try:
            names = {q.name for q in self.queues}
            for queue in self.queues:
                try:
                    queue.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
            for name in names:
                try:
                    dropper = jobfence.Queue(self.url, name)
                    dropper.drop()
                    dropper.close()
                except Exception:
                    pass
        finally:
            self.cleanup()


@pytest.fixture
async def qenv_async(queue_spec: Spec, tmp_path: Path) -> AsyncIterator[AsyncQueueEnv]:
    """The queue suite's environment: ``AsyncQueue`` clients (the async specs)."""
    e = AsyncQueueEnv(queue_spec, tmp_path)
    try:
        yield e
    finally:
        await e.aclose()


@pytest.fixture
def qenv(queue_spec: Spec, tmp_path: Path) -> Iterator[QueueEnv]:
    """The queue suite's environment for the generated sync specs: sync ``Queue`` clients,
    driven on the test's own thread."""
    e = QueueEnv(queue_spec, tmp_path)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
async def env_async(spec: Spec, tmp_path: Path) -> AsyncIterator[AsyncEnv]:
    """The lock suite's environment: ``AsyncLocks`` clients (the async specs)."""
    e = AsyncEnv(spec, tmp_path)
    try:
        yield e
    finally:
        await e.aclose()


@pytest.fixture
def env(spec: Spec, tmp_path: Path) -> Iterator[Env]:
    """The lock suite's environment for the generated sync specs: sync ``Locks`` clients,
    driven on the test's own thread."""
    e = Env(spec, tmp_path)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
async def ienv_async(inbox_spec: Spec, tmp_path: Path) -> AsyncIterator[AsyncInboxEnv]:
    """The inbox suite's environment: ``AsyncInbox`` clients (the async specs)."""
    e = AsyncInboxEnv(inbox_spec, tmp_path)
    try:
        yield e
    finally:
        await e.aclose()


@pytest.fixture
def ienv(inbox_spec: Spec, tmp_path: Path) -> Iterator[InboxEnv]:
    """The inbox suite's environment for the generated sync specs: sync ``Inbox`` clients,
    driven on the test's own thread."""
    e = InboxEnv(inbox_spec, tmp_path)
    try:
        yield e
    finally:
        e.close()


# -- the outbox suite -----------------------------------------------------------------------

#: the SQL dialect of each backend that holds outbox tables
_DIALECTS = {"postgres": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}


def _mysql_kwargs() -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(MYSQL_URL)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }


def _mysql_db() -> str:
    from urllib.parse import urlsplit

    return urlsplit(MYSQL_URL).path.lstrip("/") or "test"


class _OutboxIsolated(_Isolated):
    """One outbox backend, one table ``<namespace>_outbox``; the caller's connections are of
    the backend's default driver in the env's flavour."""

    def __init__(self, spec: Spec, flavour: str, tmp_path: Path) -> None:
        super().__init__(spec, flavour, tmp_path)
        self.table = outbox_table(self.namespace)
        self.dialect = _DIALECTS[spec.backend]
        self.sqlite_path = tmp_path / "jobfence.db"
        self.conns: list[Any] = []


class AsyncOutboxEnv(_OutboxIsolated):
    """``AsyncOutbox`` clients and asyncio caller connections (psycopg, aiomysql,
    aiosqlite), in a transaction until ``commit`` / ``rollback``."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "async", tmp_path)
        self.outboxes: list[jobfence.AsyncOutbox] = []

    def outbox(self, **options: Any) -> jobfence.AsyncOutbox:
        options.setdefault("table", self.table)
        outbox = jobfence.AsyncOutbox(self.url, **options)
        self.outboxes.append(outbox)
        return outbox

    async def connect(self) -> Any:
        """A caller's connection; its transaction begins with the first statement."""
        if self.dialect == "postgresql":
            import psycopg

            conn: Any = await psycopg.AsyncConnection.connect(POSTGRES_URL)
        elif self.dialect == "mysql":
            import aiomysql

            conn = await aiomysql.connect(**_mysql_kwargs(), db=_mysql_db())
        else:
            import aiosqlite

            conn = await aiosqlite.connect(self.sqlite_path, timeout=30)
        self.conns.append(conn)
        return conn

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()

    async def aclose(self) -> None:
        try:
            for conn in self.conns:
                try:
                    result = conn.close()
                    if hasattr(result, "__await__"):
                        await result
                except Exception:
                    pass
            for outbox in self.outboxes:
                try:
                    await outbox.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


class OutboxEnv(_OutboxIsolated):
    """Sync ``Outbox`` clients and blocking caller connections (psycopg, PyMySQL,
    sqlite3), in a transaction until ``commit`` / ``rollback``."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        super().__init__(spec, "sync", tmp_path)
        self.outboxes: list[jobfence.Outbox] = []

    def outbox(self, **options: Any) -> jobfence.Outbox:
        options.setdefault("table", self.table)
        outbox = jobfence.Outbox(self.url, **options)
        self.outboxes.append(outbox)
        return outbox

    def connect(self) -> Any:
        """A caller's connection; its transaction begins with the first statement."""
        if self.dialect == "postgresql":
            import psycopg

            conn: Any = psycopg.connect(POSTGRES_URL)
        elif self.dialect == "mysql":
            import pymysql

            conn = pymysql.connect(**_mysql_kwargs(), database=_mysql_db())
        else:
            import sqlite3

            conn = sqlite3.connect(self.sqlite_path, timeout=30, check_same_thread=False)
        self.conns.append(conn)
        return conn

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def close(self) -> None:
        try:
            for conn in self.conns:
                try:
                    conn.close()
                except Exception:
                    pass
            for outbox in self.outboxes:
                try:
                    outbox.close()
                except Exception:  # closing after a failed test must not hide the failure
                    pass
        finally:
            self.cleanup()


@pytest.fixture
async def oenv_async(outbox_spec: Spec, tmp_path: Path) -> AsyncIterator[AsyncOutboxEnv]:
    """The outbox suite's environment: ``AsyncOutbox`` clients (the async specs)."""
    e = AsyncOutboxEnv(outbox_spec, tmp_path)
    try:
        yield e
    finally:
        await e.aclose()


@pytest.fixture
def oenv(outbox_spec: Spec, tmp_path: Path) -> Iterator[OutboxEnv]:
    """The outbox suite's environment for the generated sync specs: sync ``Outbox`` clients
    and connections, driven on the test's own thread."""
    e = OutboxEnv(outbox_spec, tmp_path)
    try:
        yield e
    finally:
        e.close()
