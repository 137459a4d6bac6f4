"""The backends the conformance suites run against: one spec per backend (or mode).

A spec says how to reach a backend (its URL), which conformance suites run it (its ``parts``,
named as in ``BackendInfo.parts``), how one test's objects are kept apart from every other
test's, and how to remove them afterwards. Both suites, their fixtures (``conftest.py``) and the
other tests that need a backend per spec take their parametrisation from :data:`SPECS`.

Isolation: every test gets a fresh namespace (:func:`new_namespace`). The lock suite passes it
as ``namespace=`` (SQL tables ``<namespace>_*``, Redis keys ``<namespace>:*``); the inbox suite
uses the table :func:`inbox_table` ``(namespace)`` (SQL table ``<namespace>_inbox``, Redis keys
``<namespace>_inbox:*``). So a spec's ``cleanup(url, namespace)`` removes whatever a test left,
of any part: the SQL tables whose names start with the namespace (and their rows in
``jobfence_inbox_schema`` and ``jobfence_outbox_schema``), or the Redis keys that start with
it. The queue suite names each test's queue after its namespace and drops that queue
afterwards (the SQL queue backends keep every queue in one table, isolated by name). The
outbox suite uses the table :func:`outbox_table` ``(namespace)`` (``<namespace>_outbox``).

``test_specs.py`` fails unless every part of every registered backend
(``jobfence.backends.registered()``) is run through that part's suite by some spec.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.etcd_cluster import delete_etcd_prefix, etcd_url
from tests.servers import (
    MYSQL_URL,
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    delete_redis_keys,
    mysql_params,
)

#: the API flavours (each suite's async specs and their generated sync twins run both; a test
#: that starts processes of either flavour is parametrised with these)
FLAVOURS = ["sync", "async"]

LOCKS = "locks"
INBOX = "inbox"
QUEUE = "queue"
OUTBOX = "outbox"

#: part (as in ``BackendInfo.parts``) -> the conformance suite that checks it, by file name in
#: this directory
SUITES: dict[str, str] = {
    LOCKS: "test_lock_conformance.py",
    INBOX: "test_inbox_conformance.py",
    QUEUE: "test_queue_conformance.py",
    OUTBOX: "test_outbox_conformance.py",
}

#: the table that holds the inbox schema versions, one row per inbox table (SQL backends)
INBOX_SCHEMA_TABLE = "jobfence_inbox_schema"
#: the tables that hold schema versions, one row per table of that kind (SQL backends)
SCHEMA_TABLES = (INBOX_SCHEMA_TABLE, "jobfence_outbox_schema")


@dataclass(frozen=True)
class Spec:
    """One backend (or one mode of a backend) as the conformance suites run it.

    * ``id`` -- the test id: ``test_x[<id>-sync]``, ``test_x[<id>-async]``.
    * ``backend`` -- its ``BackendInfo.name`` in the registry; the URL must open that backend.
    * ``parts`` -- the parts whose suites run this spec. A mode that changes one part only
      (PostgreSQL ``mode=session`` changes how locks are held) runs that part's suite only;
      the backend's other parts are run by its default spec.
    * ``make_url(tmp_path)`` -- the URL one test uses.
    * ``cleanup(url, namespace)`` -- removes what a test of either part left in the backend.
    * ``cross_process`` -- other processes see the same locks and claims (memory: no). Tests
      that need a second process (kill -9, SIGSTOP) run only specs that have it.
    * ``ttl_expiry`` -- a lock lease that is not renewed becomes free after its ttl (PostgreSQL
      session mode: no, the lock lives as long as its connection).
    * ``fifo`` -- lock waiters get the lease in arrival order, handed to the head of the wait
      queue (MySQL: no, waiters poll).
    * ``queue_follows_connection`` -- a waiter waits inside the server, for as long as its
      connection lives (PostgreSQL session mode): a backend ``acquire(..., wait=...)`` blocks
      there instead of joining a queue and returning. The lock suite's wait-queue specs run
      the specs with ``fifo`` and without it.
    * ``min_claim_ttl`` -- the shortest time, in seconds, after which the server ends an
      inbox claim that is not renewed, however short its ttl (etcd: 2, a claim is an etcd
      lease of whole seconds, at least 2; 0 where a claim ends at its ttl). The inbox suite
      waits that much longer for a claim to expire, and sleeps that much longer where it
      checks that a claim outlived its first deadline.

    These capability flags (all but ``note``) must equal what the backend's capabilities say
    (``test_specs.py`` checks it; ``min_claim_ttl`` by a claim that is still held, on the
    server, just before it); a new backend states them in its entry of :data:`SPECS`, and the
    specs that need a capability pick the specs by flag (:func:`spec_params`).
    """

    id: str
    backend: str
    parts: frozenset[str]
    make_url: Callable[[Path], str]
    cleanup: Callable[[str, str], None]
    cross_process: bool = True
    ttl_expiry: bool = True
    fifo: bool = True
    queue_follows_connection: bool = False
    min_claim_ttl: float = 0.0
    note: str = ""

    def runs(self, part: str) -> bool:
        return part in self.parts


def new_namespace() -> str:
    """A namespace no other test uses: ``t`` and 12 hex digits (no ``_`` or ``%``, so it is
    a literal prefix in LIKE patterns)."""
    return "t" + uuid.uuid4().hex[:12]


def inbox_table(namespace: str) -> str:
    """The inbox table of a test whose namespace is ``namespace``."""
    return f"{namespace}_inbox"


def outbox_table(namespace: str) -> str:
    """The outbox table of a test whose namespace is ``namespace``."""
    return f"{namespace}_outbox"


def specs_for(part: str) -> list[Spec]:
    """The specs the suite of ``part`` runs, in :data:`SPECS` order."""
    return [s for s in SPECS if s.runs(part)]


def spec_params(part: str, where: Callable[[Spec], bool] = lambda spec: True) -> list[Any]:
    """One ``pytest.param`` per spec that runs ``part`` (and satisfies ``where``), with the spec
    id as its test id."""
    return [pytest.param(s, id=s.id) for s in specs_for(part) if where(s)]


# -- clean-up -------------------------------------------------------------------------------


def _no_cleanup(url: str, namespace: str) -> None:
    """Memory (a URL of its own per test) and SQLite (a file in the test's tmp_path)."""


def _redis_cleanup(url: str, namespace: str) -> None:
    # lock keys "<namespace>:..." and inbox keys "<namespace>_inbox:..."
    delete_redis_keys(f"{namespace}*", url)


def _without_query(url: str) -> str:
    """The URL without jobfence's options (``?mode=session``), which the driver would refuse."""
    return urlunsplit(urlsplit(url)._replace(query="", fragment=""))


def _postgres_cleanup(url: str, namespace: str) -> None:
    import psycopg

    with psycopg.connect(_without_query(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (namespace + "%",),
        ).fetchall()
        for (table,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
        for schema in SCHEMA_TABLES:
            if conn.execute("SELECT to_regclass(%s)", (schema,)).fetchone() != (None,):
                conn.execute(f"DELETE FROM {schema} WHERE table_name LIKE %s", (namespace + "%",))


def _mysql_cleanup(url: str, namespace: str) -> None:
    import pymysql

    conn = pymysql.connect(**mysql_params())
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE %s",
                (namespace + "%",),
            )
            for (table,) in cur.fetchall():
                cur.execute(f"DROP TABLE IF EXISTS `{table}`")
            for schema in SCHEMA_TABLES:
                cur.execute(
                    "SELECT 1 FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name = %s",
                    (schema,),
                )
                if cur.fetchone():
                    cur.execute(
                        f"DELETE FROM {schema} WHERE table_name LIKE %s", (namespace + "%",)
                    )
        conn.commit()
    finally:
        conn.close()


def _with_option(url: str, option: str) -> str:
    return url + ("&" if "?" in url else "?") + option


BOTH = frozenset({LOCKS, INBOX})
ALL = frozenset({LOCKS, INBOX, QUEUE})
#: the SQL servers also hold outbox tables
SQL_ALL = ALL | {OUTBOX}

SPECS: list[Spec] = [
    Spec(
        "memory",
        "memory",
        ALL,
        lambda tmp: f"memory://{uuid.uuid4().hex}",
        _no_cleanup,
        cross_process=False,
    ),
    Spec("sqlite", "sqlite", SQL_ALL, lambda tmp: f"sqlite:///{tmp / 'jobfence.db'}", _no_cleanup),
    Spec("redis", "redis", ALL, lambda tmp: REDIS_URL, _redis_cleanup),
    Spec("postgres", "postgres", SQL_ALL, lambda tmp: POSTGRES_URL, _postgres_cleanup),
    Spec(
        "postgres-session",
        "postgres",
        frozenset({LOCKS}),
        lambda tmp: _with_option(POSTGRES_URL, "mode=session"),
        _postgres_cleanup,
        ttl_expiry=False,
        queue_follows_connection=True,
        note="mode=session changes how locks are held; the inbox does not read it",
    ),
    Spec("mysql", "mysql", BOTH | {OUTBOX}, lambda tmp: MYSQL_URL, _mysql_cleanup, fifo=False),
    # a one-member etcd of this worker's own, started on first use (tests/etcd_cluster.py)
    Spec("etcd", "etcd", BOTH, lambda tmp: etcd_url(), delete_etcd_prefix, min_claim_ttl=2.0),
    Spec(
        "rabbitmq",
        "rabbitmq",
        frozenset({QUEUE}),
        lambda tmp: RABBITMQ_URL,
        _no_cleanup,
        note="queues only; each test drops its own queue",
    ),
]
