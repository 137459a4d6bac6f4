"""Handlers for ``test_worker_pause.py``, run by ``jobfence worker`` in subprocesses.

Each appends ``started <id> <delivery> <pid>`` to $JF_OUT, dawdles on its first delivery
(the test pauses the process meanwhile), then writes the message's effect into the SQLite
ledger $JF_LEDGER: the naive way, or guarded (inbox claim keyed on the message id, the effect
committed with ``claim_in``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import jobfence

LEDGER = os.environ.get("JF_LEDGER", "ledger.db")


def _started(message: Any) -> None:
    with open(os.environ["JF_OUT"], "a", encoding="utf-8") as out:
        out.write(f"started {message.id} {message.delivery} {os.getpid()}\n")
    if message.delivery == 1:
        time.sleep(1.0)  # the test SIGSTOPs this process now


def _effect(conn: sqlite3.Connection, message: Any) -> None:
    conn.execute(
        "INSERT INTO effects (msg_id, delivery, pid) VALUES (?, ?, ?)",
        (message.id, message.delivery, os.getpid()),
    )


def naive(message: Any) -> None:
    _started(message)
    with sqlite3.connect(LEDGER, timeout=30) as conn:
        _effect(conn, message)


inbox = jobfence.Inbox(f"sqlite:///{LEDGER}", ttl=2)


@jobfence.guarded(inbox=inbox, claim_ttl=2)
def guarded(message: Any) -> None:
    _started(message)
    with sqlite3.connect(LEDGER, timeout=30) as conn:
        if inbox.claim_in(conn):
            _effect(conn, message)
