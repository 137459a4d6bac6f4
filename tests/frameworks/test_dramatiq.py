"""Real Dramatiq workers (``python -m dramatiq``, RabbitMQ broker) run guarded actors; one is
SIGKILLed in the middle of a task.

Phase 1, two workers: the sync actor gets 20 distinct orders on one product and one order
sent as 5 messages (``key="order:{order_id}"``); the async actor gets 10 distinct orders on
another product and one message enqueued 5 times under the same message id (no ``key``: the
message id is the key). Every message must succeed, the duplicates must return the stored
result without running again, and each order must have exactly one effect.

Phase 2: an async order that stalls on its first run. When the stall has started, its worker
is SIGKILLed, a new worker is started and 10 more sync orders are sent: RabbitMQ redelivers
the killed worker's unacked messages at once (to the surviving worker). The stalled message's
redelivery finds its own key (the message id) claimed by the dead worker (``ClaimInProgress``),
is retried by Dramatiq after ``retry_delay`` until the claim expires, then takes it over
(attempt 2) and completes. The ledger must then show exactly one effect per order and the
right stock.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import dramatiq
import pika
import psycopg
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.results import ResultMissing
from dramatiq.results.backends import RedisBackend

import jobfence
from tests.frameworks._support import (
    DSN,
    REDIS_URL,
    STOCK,
    Ledger,
    env,
    python,
    wait_until,
    workers,
)
from tests.servers import RABBITMQ_URL, delete_redis_keys

#: pika reads the vhost from the URL's path: "/" must be spelt %2F
AMQP_URL = RABBITMQ_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STALL = "a-stall"
#: seconds to wait for every message's result
RESULT_TIMEOUT = 60


def _message(queue: str, actor: str, order_id: str, product_id: int, qty: int) -> Any:
    return dramatiq.Message(
        queue_name=queue,
        actor_name=actor,
        args=(order_id, product_id, qty),
        kwargs={},
        options={},
    )


def _delete_queues(queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = conn.channel()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel.queue_delete(name)
    finally:
        conn.close()


def _logs(log_dir: Path) -> str:
    """Everything the workers logged (Dramatiq logs each retry at INFO)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("worker-*.log")))


def _worker_of(pid: int, procs: list[Any]) -> Any:
    """The worker subprocess (a process group) that the process ``pid`` belongs to."""
    group = os.getpgid(pid)
    return next(proc for proc in procs if proc.pid == group)


def test_real_workers_apply_every_order_once_through_duplicates_and_a_killed_worker(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    ledger.create({1: STOCK, 2: STOCK, 3: STOCK})
    with psycopg.connect(DSN, autocommit=True) as conn:  # one row per run of a guarded body
        conn.execute(
            f"CREATE TABLE {ledger.schema}.runs "
            "(id serial PRIMARY KEY, order_id text, run text, pid int)"
        )
    tag = uuid.uuid4().hex[:12]
    queue = f"jobfence_dq_{tag}"
    namespace = f"jobfence-dq-{tag}"
    inbox = jobfence.Inbox(DSN, table=ledger.inbox_table)
    inbox.install()
    environ = {
        **env(ledger.schema),
        "JOBFENCE_DQ_QUEUE": queue,
        "JOBFENCE_DQ_NAMESPACE": namespace,
        "JOBFENCE_DQ_INBOX_TABLE": ledger.inbox_table,
        "JOBFENCE_DQ_REDIS": REDIS_URL,
        "JOBFENCE_DQ_AMQP": AMQP_URL,
        "JOBFENCE_FW_STALL": STALL,
    }
    argv = [python(), "-m", "dramatiq", "tests.frameworks._dramatiq_app", "-p", "1", "-t", "4"]
    broker = RabbitmqBroker(url=AMQP_URL)
    results = RedisBackend(url=REDIS_URL, namespace=namespace, use_namespace_prefix_keys=True)

    def result_of(message: Any) -> Any:
        """The message's result, once a worker stored it (a failure raises ResultFailure)."""

        def stored() -> tuple[Any] | None:
            try:
                return (results.get_result(message),)
            except ResultMissing:
                return None

        what = f"the result of {message.actor_name}{message.args}"
        return wait_until(what, stored, RESULT_TIMEOUT)[0]

    def runs(order_id: str) -> list[str]:
        rows = ledger.query("SELECT run FROM {s}.runs WHERE order_id = %s ORDER BY id", order_id)
        return [run for (run,) in rows]

    try:
        with workers(tmp_path) as pool:
            started = [pool.start(argv, environ) for _ in range(2)]
            # --- phase 1: duplicates and concurrent distinct orders, sync and async ---------
            sync_orders = [_message(queue, "order", f"s-{n}", 1, 1 + n % 3) for n in range(20)]
            sync_dups = [_message(queue, "order", "s-dup", 1, 7) for _ in range(5)]
            async_orders = [
                _message(queue, "order_async", f"a-{n}", 2, 2 + n % 2) for n in range(10)
            ]
            async_dup = _message(queue, "order_async", "a-dup", 2, 5)
            for message in [*sync_dups, *sync_orders, *async_orders]:
                broker.enqueue(message)
            for _ in range(5):  # one message, delivered 5 times: its id is its key
                broker.enqueue(async_dup)

            outcomes = {m.message_id: result_of(m) for m in [*sync_orders, *async_orders]}
            dup_results = [result_of(m) for m in sync_dups]
            # the 4 other messages of s-dup returned the first one's stored result: one run
            assert len(runs("s-dup")) == 1, runs("s-dup")
            assert [r["run"] for r in dup_results] == runs("s-dup") * 5
            assert result_of(async_dup)["key"] == f"dramatiq:{async_dup.message_id}"
            assert len(runs("a-dup")) == 1, runs("a-dup")  # 4 deliveries were duplicates
            assert {o["order_id"] for o in outcomes.values()} == {
                *(f"s-{n}" for n in range(20)),
                *(f"a-{n}" for n in range(10)),
            }
            default = inbox.claim(f"dramatiq:{async_orders[0].message_id}")
            assert default.state is jobfence.ClaimState.COMPLETED  # keyed by the message id

            # --- phase 2: a worker killed in the middle of a task -----------------------------
            stall = _message(queue, "order_async", STALL, 3, 4)
            late = [_message(queue, "order", f"late-{n}", 1, 2) for n in range(10)]
            broker.enqueue(stall)
            stalled_pid = wait_until("the stalling order to start", lambda: ledger.started(STALL))[
                0
            ]
            victim = _worker_of(stalled_pid, started)
            pool.kill(victim)
            survivor = next(p for p in started if p is not victim)
            pool.start(argv, environ)
            # more orders while the redelivered message waits out the dead worker's claim
            for message in late:
                broker.enqueue(message)

            stall_result = result_of(stall)
            # the redelivery found the dead worker's claim of its key still held
            # (ClaimInProgress) and went back to Dramatiq as a Retry until that claim's expiry
            retried = f"Retrying message {stall.message_id!r} in "
            try:
                wait_until("the stalled message's retry", lambda: retried in _logs(tmp_path), 10)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{_logs(tmp_path)}") from None
            late_results = [result_of(m) for m in late]
            assert survivor.poll() is None, pool.logs()
    finally:
        broker.close()
        try:
            _delete_queues(queue)
        finally:
            delete_redis_keys(f"{namespace}*")
    try:
        # the redelivery of the killed message ran under the same key: the message id
        assert stall_result["key"] == f"dramatiq:{stall.message_id}"
        assert stall_result["pid"] != stalled_pid
        pids = ledger.started(STALL)
        assert len(pids) == 2 and pids[0] == stalled_pid and pids[1] != stalled_pid, pids
        taken_over = inbox.claim(f"dramatiq:{stall.message_id}")
        assert taken_over.state is jobfence.ClaimState.COMPLETED
        assert taken_over.attempt == 2  # the dead worker's claim of that key, taken over
        assert {r["order_id"] for r in late_results} == {f"late-{n}" for n in range(10)}

        every_order = {
            **{f"s-{n}": 1 + n % 3 for n in range(20)},
            "s-dup": 7,
            **{f"late-{n}": 2 for n in range(10)},
        }
        async_orders_qty = {**{f"a-{n}": 2 + n % 2 for n in range(10)}, "a-dup": 5}
        assert ledger.effects() == dict.fromkeys([*every_order, *async_orders_qty, STALL], 1)
        assert ledger.stock(1) == STOCK - sum(every_order.values())
        assert ledger.stock(2) == STOCK - sum(async_orders_qty.values())
        assert ledger.stock(3) == STOCK - 4
    finally:
        inbox.close()
        ledger.drop()
