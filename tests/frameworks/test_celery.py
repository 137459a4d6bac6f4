"""Real Celery workers (prefork, in subprocesses) on RabbitMQ run guarded tasks of the shared
scenario, and one worker is SIGKILLed in the middle of a task.

* the same order sent as 5 tasks (``key="order:{order_id}"``): applied once, every task returns
  the one stored result;
* 20 distinct orders on one product at once (a lease per product): each applied once;
* an order whose key is the test's own claim: the worker gets ``ClaimInProgress`` and Celery
  retries it (state RETRY) until the test gives the key back, then it runs once;
* a ``bind=True`` task without a key template (the key is the Celery task id) stalls in the
  first worker, which is killed: RabbitMQ delivers the unacknowledged message again, a second
  worker takes the dead worker's claim over once ``claim_ttl`` passed (attempt 2, the same
  key) and applies it once; the same message sent again afterwards is a duplicate that returns
  the stored result without running.

The ledger in PostgreSQL must show exactly one effect per order and the right stock.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import celery
import kombu
import pytest

import jobfence
from tests.frameworks._support import (
    AMQP_URL,
    DSN,
    REDIS_URL,
    STOCK,
    Ledger,
    Workers,
    env,
    python,
    wait_until,
    workers,
)
from tests.servers import delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

APPLY_ORDER = "jf_fw.apply_order"
APPLY_MESSAGE = "jf_fw.apply_message"
#: the distinct orders on product 1 and their quantities
ORDERS = {f"o-{i}": 1 + i % 5 for i in range(20)}
DUP_QTY, HELD_QTY, KILLED_QTY = 7, 4, 11


def _start(pool: Workers, queue: str, environ: dict[str, str], name: str) -> Any:
    return pool.start(
        [
            *(python(), "-m", "celery", "-A", "tests.frameworks._celery_app", "worker"),
            *("-P", "prefork", "-c", "3", "-Q", queue, "-n", f"{name}-{queue}@%h"),
            *("--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        environ,
    )


def test_celery_workers_apply_every_order_once_through_a_sigkill(tmp_path: Path) -> None:
    ledger = Ledger()
    ledger.create({1: STOCK, 2: STOCK})
    queue = f"jf-fw-celery-{uuid.uuid4().hex[:12]}"
    environ = {
        **env(ledger.schema),
        "JOBFENCE_CELERY_BROKER": AMQP_URL,
        "JOBFENCE_CELERY_BACKEND": REDIS_URL,
        "JOBFENCE_CELERY_QUEUE": queue,
        "JOBFENCE_FW_STALL": "killed",
    }
    inbox = jobfence.Inbox(DSN, table=ledger.inbox_table)
    inbox.install()
    client = celery.Celery("jf_fw_celery_client", broker=AMQP_URL, backend=REDIS_URL)
    sent: list[Any] = []

    def send(name: str, *args: Any, task_id: str | None = None) -> Any:
        result = client.send_task(name, args=args, queue=queue, task_id=task_id)
        sent.append(result)
        return result

    try:
        # the test holds the key of order "held": its task must wait in Celery's retry
        held = inbox.claim("order:held", ttl=3, renew=True)  # held (renewed) until released
        assert held.state.value == "new"
        with workers(tmp_path) as pool:
            first = _start(pool, queue, environ, "first")
            killed = send(APPLY_MESSAGE, "killed", 2, KILLED_QTY)
            held_task = send(APPLY_ORDER, "held", 1, HELD_QTY)
            dups, distinct = [], []
            for n, (order, qty) in enumerate(ORDERS.items()):
                distinct.append(send(APPLY_ORDER, order, 1, qty))
                if n % 4 == 0:
                    dups.append(send(APPLY_ORDER, "dup", 1, DUP_QTY))

            # the stalling task is in the middle of its run, the other orders are under way:
            # kill the worker
            wait_until("the stalling task to start", lambda: ledger.started("killed"), 60)
            wait_until("the first worker to apply orders", lambda: len(ledger.effects()) >= 3)
            wait_until(
                "Celery to retry the order whose key the test holds",
                lambda: held_task.state == "RETRY",
                60,
            )
            pool.kill(first)
            assert ledger.effects().get("killed") is None  # it never got to its effect

            _start(pool, queue, environ, "second")
            held.release()  # the key is free: the next retry of "held" applies it

            try:
                outcomes = {r.id: r.get(timeout=60) for r in sent}
            except Exception as exc:  # pragma: no cover - a failure's diagnosis
                raise AssertionError(f"a task failed: {exc!r}\n{pool.logs()}") from exc

            # the killed task's message once more, as a broker may deliver it again
            runs = ledger.started("killed")
            killed.forget()
            again = send(APPLY_MESSAGE, "killed", 2, KILLED_QTY, task_id=killed.id)
            duplicate = again.get(timeout=60)
            logs = pool.logs()

        # exactly one effect per order, and the stock that follows
        expected = {**dict.fromkeys(ORDERS, 1), "dup": 1, "held": 1, "killed": 1}
        assert ledger.effects() == expected, logs
        assert ledger.stock(1) == STOCK - sum(ORDERS.values()) - DUP_QTY - HELD_QTY
        assert ledger.stock(2) == STOCK - KILLED_QTY

        # the 5 tasks of one order all return the one stored result of its only run
        dup_results = [outcomes[r.id] for r in dups]
        assert len(dup_results) == 5 and all(d == dup_results[0] for d in dup_results)
        (dup_pid,) = ledger.query("SELECT pid FROM {s}.effects WHERE order_id = 'dup'")[0]
        assert dup_results[0] == {"order_id": "dup", "pid": dup_pid}
        assert [outcomes[r.id]["order_id"] for r in distinct] == list(ORDERS)

        # the killed task: run twice (killed, then redelivered), applied once, by the second
        # worker, under the key of its Celery task id, taken over from the dead worker
        assert len(runs) == 2 and runs[0] != runs[1], logs
        (effect_pid,) = ledger.query("SELECT pid FROM {s}.effects WHERE order_id = 'killed'")[0]
        key = f"celery:{killed.id}"
        assert outcomes[killed.id] == {
            "order_id": "killed",
            "pid": effect_pid,
            "key": key,
            "task_id": killed.id,
        }
        assert effect_pid == runs[1]
        record = inbox.claim(key)
        assert (record.state.value, record.attempt) == ("completed", 2)

        # the same message sent again is a duplicate: the stored result, no run
        assert duplicate == outcomes[killed.id]
        assert ledger.started("killed") == runs
    finally:
        try:
            for result in sent:
                result.forget()
            client.close()
            inbox.close()
            with kombu.Connection(AMQP_URL) as conn:  # the queue and the exchange Celery made
                conn.default_channel.queue_delete(queue)
                conn.default_channel.exchange_delete(queue)
            delete_redis_keys(f"*{ledger.schema}*")
        finally:
            ledger.drop()
