"""The Dramatiq application ``test_dramatiq.py`` runs real workers of (``python -m dramatiq
tests.frameworks._dramatiq_app``), configured by environment variables the test sets.

RabbitMQ is the broker (a killed worker's unacked messages go back to the queue as soon as its
connection drops); results are stored in Redis so the test can wait for every message. Two
guarded actors apply orders through the shared scenario's exactly-once body:

* ``order`` (sync): ``key="order:{order_id}"``, so messages of one order are duplicates;
* ``order_async`` (``async def``, on Dramatiq's ``AsyncIO`` event loop, no lock): no ``key``,
  so the key is the message id and only a redelivery or a retry of the same message is a
  duplicate.

Leases and claims are short (3 s; 6 s for the async claims) and retries come after 0.5 s, so a
killed worker's claim is taken over within seconds. Each run of a guarded body first records itself
in the ledger's ``runs`` table (made by the test), so the test can tell a duplicate that
returned the stored result from one that ran again.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import dramatiq
import psycopg
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import AsyncIO
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

import jobfence
from jobfence.integrations.dramatiq import JobfenceMiddleware, guarded
from tests.frameworks._support import apply_order, apply_order_async

DSN = os.environ["JOBFENCE_FW_DSN"]
SCHEMA = os.environ["JOBFENCE_FW_SCHEMA"]
QUEUE = os.environ["JOBFENCE_DQ_QUEUE"]
NAMESPACE = os.environ["JOBFENCE_DQ_NAMESPACE"]
INBOX_TABLE = os.environ["JOBFENCE_DQ_INBOX_TABLE"]
REDIS = os.environ["JOBFENCE_DQ_REDIS"]

#: short leases and claims: a killed worker's are free again within seconds
TTL = 3.0
#: the async actor's claims live longer, so that the redelivery of a killed worker's message
#: surely finds its claim still held (ClaimInProgress) and goes through Dramatiq's retry
ASYNC_CLAIM_TTL = 6.0
RETRY_DELAY = 0.5

broker = RabbitmqBroker(url=os.environ["JOBFENCE_DQ_AMQP"])
broker.add_middleware(
    Results(backend=RedisBackend(url=REDIS, namespace=NAMESPACE, use_namespace_prefix_keys=True))
)
broker.add_middleware(AsyncIO())
dramatiq.set_broker(broker)

inbox = jobfence.Inbox(DSN, table=INBOX_TABLE)
ainbox = jobfence.AsyncInbox(DSN, table=INBOX_TABLE)
locks = jobfence.Locks(REDIS, namespace=NAMESPACE)
# after AsyncIO: the async clients are closed on its event loop when the worker stops
broker.add_middleware(JobfenceMiddleware(clients=[inbox, ainbox, locks]))


def _record_run(order_id: str) -> str:
    run = uuid.uuid4().hex
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.runs (order_id, run, pid) VALUES (%s, %s, %s)",
            (order_id, run, os.getpid()),
        )
    return run


@dramatiq.actor(queue_name=QUEUE, store_results=True, max_retries=100)
@guarded(
    locks=locks,
    inbox=inbox,
    lock="product:{product_id}",
    key="order:{order_id}",
    ttl=TTL,
    timeout=20,
    claim_ttl=TTL,
    retry_delay=RETRY_DELAY,
)
def order(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    run = _record_run(order_id)
    return {**apply_order(inbox, order_id, product_id, qty), "run": run}


@dramatiq.actor(queue_name=QUEUE, store_results=True, max_retries=100)
@guarded(inbox=ainbox, claim_ttl=ASYNC_CLAIM_TTL, retry_delay=RETRY_DELAY)
async def order_async(order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    run = uuid.uuid4().hex
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(
            f"INSERT INTO {SCHEMA}.runs (order_id, run, pid) VALUES (%s, %s, %s)",
            (order_id, run, os.getpid()),
        )
    key = jobfence.guard.current_claim().key
    return {**await apply_order_async(ainbox, order_id, product_id, qty), "run": run, "key": key}
