"""Outboxes and destination queues on the real servers, for the relay's tests.

:class:`OutboxSide` is an outbox table of its own on PostgreSQL, MariaDB or SQLite, with the
caller's side of it: a driver connection (psycopg, PyMySQL, sqlite3) on which rows are added
in transactions that commit or roll back. :class:`QueueSide` is a destination of its own
(Redis Streams namespace, RabbitMQ queue names, PostgreSQL or SQLite queue table) with a
consumer that receives and acks what the relay published. Both drop what they made.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import jobfence
from jobfence.backends.base import OutboxEntry
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL, delete_redis_keys, mysql_params

OUTBOX_KINDS = ("postgres", "mysql", "sqlite")
QUEUE_KINDS = ("redis", "rabbitmq", "postgres", "sqlite")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def _with_query(url: str, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return url + ("&" if "?" in url else "?") + query


class OutboxSide:
    """An outbox table of the test's own, and the application's connection to add rows."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.table = unique("jfo")
        if kind == "postgres":
            self.url = POSTGRES_URL
        elif kind == "mysql":
            self.url = "mysql://{user}@{host}:{port}/{database}".format(**mysql_params())
        elif kind == "sqlite":
            self.url = f"sqlite:///{tmp / 'outbox.db'}"
        else:
            raise ValueError(kind)
        self.path = tmp / "outbox.db"
        with self.open() as outbox:
            outbox.install()

    @property
    def full_url(self) -> str:
        """The outbox URL with its table as a URL option (for a relay process)."""
        return _with_query(self.url, table=self.table)

    def open(self) -> jobfence.Outbox:
        return jobfence.Outbox(self.url, table=self.table)

    def open_async(self) -> jobfence.AsyncOutbox:
        return jobfence.AsyncOutbox(self.url, table=self.table)

    def connect(self) -> Any:
        """A driver connection of the application (not in autocommit)."""
        if self.kind == "postgres":
            import psycopg

            return psycopg.connect(POSTGRES_URL)
        if self.kind == "mysql":
            import pymysql

            return pymysql.connect(**mysql_params())
        return sqlite3.connect(self.path, timeout=30)

    def add(
        self,
        outbox: jobfence.Outbox,
        rows: list[dict[str, Any]],
        *,
        commit: bool = True,
    ) -> list[str]:
        """Add ``rows`` (``add`` keyword arguments each) in ONE transaction of the
        application's connection, then commit it (or roll it back); their ids."""
        conn = self.connect()
        try:
            ids = [outbox.add(conn, **row) for row in rows]
            if commit:
                conn.commit()
            else:
                conn.rollback()
            return ids
        finally:
            conn.close()

    def entries(self, outbox: jobfence.Outbox, state: str | None = None) -> list[OutboxEntry]:
        out: list[OutboxEntry] = []
        after = None
        while True:
            page = outbox.entries(state=state, limit=1000, after=after)
            out.extend(page)
            if len(page) < 1000:
                return out
            after = page[-1].seq

    def drop(self) -> None:
        with self.open() as outbox:
            outbox.drop()


class QueueSide:
    """A destination of the test's own: its URL for the relay, and a consumer."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.token = unique("jfr")
        if kind == "redis":
            self.url = _with_query(REDIS_URL, namespace=self.token)
        elif kind == "rabbitmq":
            self.url = RABBITMQ_URL
        elif kind == "postgres":
            self.url = _with_query(POSTGRES_URL, table=self.token)
        elif kind == "sqlite":
            self.url = f"sqlite:///{tmp / 'queue.db'}"
        else:
            raise ValueError(kind)
        self.names: set[str] = set()

    def name(self, label: str) -> str:
        """A queue name of this test (RabbitMQ queues are shared by every test)."""
        name = f"{label}-{self.token}" if self.kind == "rabbitmq" else label
        self.names.add(name)
        return name

    def receive(self, name: str, count: int, timeout: float = 30.0) -> list[jobfence.Message]:
        """Receive and ack ``count`` messages of queue ``name`` (RuntimeError if fewer come
        within ``timeout``), then check that no more is there."""
        got: list[jobfence.Message] = []
        deadline = time.monotonic() + timeout
        with jobfence.Queue(self.url, name) as queue:
            while len(got) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{len(got)} of {count} messages came to {name!r}")
                for message in queue.receive(min(100, count - len(got)), wait=min(left, 1.0)):
                    message.ack()
                    got.append(message)
            extra = queue.receive(10, wait=0.2)
            for message in extra:
                message.ack()
            got.extend(extra)
        return got

    def drop(self) -> None:
        for name in self.names:
            try:
                with jobfence.Queue(self.url, name) as queue:
                    queue.drop()
            except Exception:
                pass
        if self.kind == "redis":
            delete_redis_keys(f"{self.token}:*")
        elif self.kind == "postgres":
            import psycopg

            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f'DROP TABLE IF EXISTS "{self.token}"')
