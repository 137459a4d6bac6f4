"""The handler of ``test_worker_not_now.py``, run by ``jobfence worker`` processes.

``effect``: ``jobfence.guarded`` with an inbox at its DEFAULTS (claim keyed on the message
id, ``claim_ttl`` 30 s), and the effect -- one ledger row -- committed in one transaction with
the inbox's marker (``claim_in``), all in PostgreSQL. Before the effect it notes its start in
``$JF_STARTED`` and works for ``$JF_SECONDS`` seconds, so that a worker killed (or a server
stopped) mid-run holds claims.

Configured by environment variables: ``JF_DSN`` (the PostgreSQL of the inbox and the ledger),
``JF_LEDGER_TABLE``, ``JF_INBOX_TABLE``, ``JF_STARTED`` (a file), ``JF_SECONDS``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

import jobfence

DSN = os.environ.get("JF_DSN", "postgresql://postgres@127.0.0.1:5432/test")
LEDGER = os.environ.get("JF_LEDGER_TABLE", "ledger")
INBOX_TABLE = os.environ.get("JF_INBOX_TABLE", "jobfence_inbox")
STARTED = os.environ.get("JF_STARTED", os.devnull)
SECONDS = float(os.environ.get("JF_SECONDS", "1"))

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    """One connection per handler thread, opened again once broken (a restarted server)."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = _local.conn = psycopg.connect(DSN, connect_timeout=5)
    return conn  # type: ignore[no-any-return]


inbox = jobfence.Inbox(DSN, table=INBOX_TABLE)


@jobfence.guarded(inbox=inbox)
def effect(message: Any) -> None:
    with open(STARTED, "a", encoding="utf-8") as out:
        out.write(f"{os.getpid()} {message.id} {message.delivery}\n")
    time.sleep(SECONDS)  # the work before the effect
    conn = _conn()
    with conn.transaction():
        if inbox.claim_in(conn):
            conn.execute(
                f'INSERT INTO "{LEDGER}" (msg_id, delivery, pid) VALUES (%s, %s, %s)',
                (message.id, message.delivery, os.getpid()),
            )
