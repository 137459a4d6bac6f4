"""Handlers of the worker scenario (``test_worker_scenario.py``), run by ``jobfence worker``
in worker processes. Each writes the message's external effect -- one row in a ledger table
in PostgreSQL -- the naive way or guarded.

Configured by environment variables: ``JF_LEDGER_DSN`` (PostgreSQL), ``JF_LEDGER_TABLE``,
``JF_INBOX_TABLE`` (the guarded handler's inbox, in the same database).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

import jobfence

DSN = os.environ.get("JF_LEDGER_DSN", "postgresql://postgres@127.0.0.1:5432/test")
LEDGER = os.environ.get("JF_LEDGER_TABLE", "ledger")
INBOX_TABLE = os.environ.get("JF_INBOX_TABLE", "jobfence_inbox")

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    """One connection per handler thread."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(DSN)
    return conn  # type: ignore[no-any-return]


def _effect(conn: psycopg.Connection[Any], message: Any) -> None:
    conn.execute(
        f'INSERT INTO "{LEDGER}" (msg_id, delivery, pid) VALUES (%s, %s, %s)',
        (message.id, message.delivery, os.getpid()),
    )


def naive(message: Any) -> None:
    """The hand-written handler: do the effect, return (the worker acks)."""
    conn = _conn()
    with conn.transaction():
        _effect(conn, message)


inbox = jobfence.Inbox(DSN, table=INBOX_TABLE, ttl=5)


@jobfence.guarded(inbox=inbox, claim_ttl=5)
def guarded(message: Any) -> None:
    """The guarded handler: the inbox claim is keyed on the message id (the default in a
    worker), and the effect commits in one transaction with the inbox's marker
    (``claim_in``), so a worker killed between the commit and the ack cannot repeat it."""
    conn = _conn()
    with conn.transaction():
        if inbox.claim_in(conn):
            _effect(conn, message)
