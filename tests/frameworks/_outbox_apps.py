"""The tasks ``test_outbox_targets.py`` runs real Celery, RQ, Dramatiq and arq workers of.

Configured by the environment variable ``JOBFENCE_OB_SCHEMA`` (set by the test): a PostgreSQL
schema holding two tables, and the name prefix of the queues, of the jobfence inbox table of
the tasks' claims and of the Dramatiq broker's namespace:

* ``received`` -- every message or job the worker started (its framework id), duplicates
  included, committed outside the guard;
* ``ledger`` -- one row per run of the guarded body: framework id, order id, the headers the
  task saw; written in ONE transaction with ``Inbox.claim_in``'s marker, so a duplicate of a
  message cannot write a second row.

Each framework's task is guarded by its jobfence integration without a ``key=``: its
idempotency key is ``"<framework>:<its task / job / message id>"``, and the relay sends each
outbox row with the row's id as that id. Each framework lives in a module of its own
(``_outbox_celery``, ...) so a worker imports only its framework; this module holds what they
share.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg

from tests.servers import POSTGRES_URL

SCHEMA = os.environ.get("JOBFENCE_OB_SCHEMA", "jf_ob_unset")
INBOX_TABLE = f"{SCHEMA}_inbox"


def received(ident: Any) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {SCHEMA}.received (msg_id) VALUES (%s)", (str(ident),))


def ran(inbox: Any, ident: Any, order_id: int, headers: Any = None) -> dict[str, Any]:
    """The guarded body: the ledger row commits with the claim's marker, or not at all."""
    with psycopg.connect(POSTGRES_URL) as conn, conn.transaction():
        if inbox.claim_in(conn):
            conn.execute(
                f"INSERT INTO {SCHEMA}.ledger (msg_id, order_id, headers, pid) "
                "VALUES (%s, %s, %s, %s)",
                (str(ident), order_id, json.dumps(headers or {}), os.getpid()),
            )
    return {"id": str(ident), "order_id": order_id}


async def ran_async(inbox: Any, ident: Any, order_id: int) -> dict[str, Any]:
    """:func:`ran` for ``async def`` tasks."""
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn, conn.transaction():
        if await inbox.claim_in(conn):
            await conn.execute(
                f"INSERT INTO {SCHEMA}.ledger (msg_id, order_id, headers, pid) "
                "VALUES (%s, %s, %s, %s)",
                (str(ident), order_id, "{}", os.getpid()),
            )
    return {"id": str(ident), "order_id": order_id}
