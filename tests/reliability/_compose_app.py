"""The app that ``test_compose_schedules.py`` runs in ``jobfence worker _compose_app:handle
--scheduler _compose_app:sched`` processes: the parts with their defaults, only the leases
short.

* ``sched`` -- one schedule, ``tick``, every second, whose target is the queue: each slot is
  published with the slot key as message id and a body naming a tenant (``t0`` / ``t1`` by
  the parity of the slot's second).
* ``handle`` -- ``guarded`` by the tenant's lock (one handler per tenant at a time) and an inbox
  claim keyed on the message id (the default in a worker). It writes a row to the ``started``
  table (committed at once: the test sees that a handler runs), takes a while, and writes its
  effect, one row of the ``ledger`` table, in the same transaction as ``inbox.claim_in``.
  While the file ``before-<pid>`` exists in ``$JF_HOLD_DIR`` it waits after the ``started``
  row, and while ``after-<pid>`` exists it waits after the commit of its effect (before it
  returns): so the test can kill the process, or its server, with a handler in the middle of
  its work.

Configured by environment variables: ``JF_URL`` (the scheduler's records, the tenant locks and
the queue), ``JF_QUEUE_URL`` (the queue's URL: ``JF_URL`` or ``JF_URL`` with options),
``JF_QUEUE``, ``JF_NAMESPACE`` (every table and key prefix of the test), ``JF_LEDGER_DSN``
(PostgreSQL: the ledger, the started rows and the handler's inbox), ``JF_HOLD_DIR``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import jobfence

URL = os.environ["JF_URL"]
NAMESPACE = os.environ["JF_NAMESPACE"]
LEDGER_DSN = os.environ["JF_LEDGER_DSN"]
HOLD_DIR = Path(os.environ["JF_HOLD_DIR"])
#: the one timing every part is given: lease, claim ttl, lock ttl (seconds)
LEASE = 2.0
#: how long a handler works before it writes its effect (seconds)
WORK = 0.3

LEDGER = f"{NAMESPACE}_ledger"
STARTED = f"{NAMESPACE}_started"
HANDLED = f"{NAMESPACE}_handled"  # the handler's inbox table

queue = jobfence.Queue(os.environ["JF_QUEUE_URL"], os.environ["JF_QUEUE"])
sched = jobfence.Scheduler(URL, namespace=f"{NAMESPACE}_sched", lease=LEASE)


def body(slot: jobfence.Slot) -> dict[str, str]:
    """The message of a slot: its tenant and its key."""
    return {"tenant": f"t{int(slot.at.timestamp()) % 2}", "slot": slot.key}


sched.add("tick", every=1, queue=queue, body=body)

inbox = jobfence.Inbox(LEDGER_DSN, table=HANDLED)
locks = jobfence.Locks(URL, namespace=NAMESPACE)

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    """One autocommit connection per handler thread."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(LEDGER_DSN, autocommit=True)
    return conn


def _wait_while_held(point: str) -> None:
    """Wait while the test holds this process's handlers at ``point`` (at most a minute)."""
    hold = HOLD_DIR / f"{point}-{os.getpid()}"
    deadline = time.monotonic() + 60
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@jobfence.guarded(
    locks=locks,
    inbox=inbox,
    lock="tenant:{message.body[tenant]}",
    ttl=LEASE,
    claim_ttl=LEASE,
)
def handle(message: jobfence.Message) -> None:
    """Say it started, work, then apply the effect once: the ledger row commits with the
    inbox's marker of the message id, or not at all."""
    conn = _conn()
    conn.execute(
        f'INSERT INTO "{STARTED}" (msg_id, pid, delivery) VALUES (%s, %s, %s)',
        (message.id, os.getpid(), message.delivery),
    )
    _wait_while_held("before")
    time.sleep(WORK)
    with conn.transaction():
        if inbox.claim_in(conn):
            conn.execute(
                f'INSERT INTO "{LEDGER}" (msg_id, tenant, pid, delivery) VALUES (%s, %s, %s, %s)',
                (message.id, message.body["tenant"], os.getpid(), message.delivery),
            )
    _wait_while_held("after")
