"""What the real-worker tests of the framework integrations share.

Every framework test runs the same scenario: orders on one product are enqueued (one order id
several times, plus distinct orders at once), the framework's own worker runs them in a
subprocess, one worker is killed with SIGKILL in the middle of a task, and the effect ledger in
PostgreSQL must show exactly one effect per order and the right stock.

The task body is :func:`apply_order` (sync) or :func:`apply_order_async`: inside a guarded
task, it claims the task's key in the ledger's transaction (``claim_in(conn)`` without a key)
and writes the effect in that same transaction. An order listed in ``JOBFENCE_FW_STALL``
stalls its first run (after writing a ``started`` row, committed on its own) until the process
is killed, so the test knows when to kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

DSN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
ROOT = Path(__file__).resolve().parents[2]

#: products start with this much stock
STOCK = 1000


def env(schema: str) -> dict[str, str]:
    """Environment for a worker subprocess of the scenario on ``schema``."""
    return {
        **os.environ,
        "JOBFENCE_FW_DSN": DSN,
        "JOBFENCE_FW_SCHEMA": schema,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


class Ledger:
    """The scenario's tables in their own PostgreSQL schema: ``products`` (stock), ``effects``
    (one row per applied order: the external effect) and ``started`` (one row per run of a
    stalling order, committed before it stalls)."""

    def __init__(self, schema: str | None = None) -> None:
        self.schema = schema or f"jf_fw_{uuid.uuid4().hex[:12]}"

    @property
    def inbox_table(self) -> str:
        """The table name to give the scenario's ``Inbox`` (dropped with the schema)."""
        return f"{self.schema}_inbox"

    def create(self, products: dict[int, int] | None = None) -> None:
        products = products if products is not None else {1: STOCK}
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(f"CREATE TABLE {self.schema}.products (id int PRIMARY KEY, stock int)")
            conn.execute(
                f"CREATE TABLE {self.schema}.effects (id serial PRIMARY KEY, order_id text, "
                "product_id int, qty int, pid int)"
            )
            conn.execute(
                f"CREATE TABLE {self.schema}.started "
                "(id serial PRIMARY KEY, order_id text, pid int)"
            )
            for pid, stock in products.items():
                conn.execute(f"INSERT INTO {self.schema}.products VALUES (%s, %s)", (pid, stock))

    def drop(self) -> None:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            conn.execute(f"DROP TABLE IF EXISTS {self.inbox_table}")

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(DSN, autocommit=True) as conn:
            return conn.execute(sql.format(s=self.schema), params).fetchall()

    def effects(self) -> dict[str, int]:
        """Order id -> how many effects it has."""
        rows = self.query("SELECT order_id, count(*) FROM {s}.effects GROUP BY order_id")
        return {order: n for order, n in rows}

    def stock(self, product: int = 1) -> int:
        return int(self.query("SELECT stock FROM {s}.products WHERE id = %s", product)[0][0])

    def started(self, order_id: str) -> list[int]:
        """The pids of the runs of a stalling order so far."""
        rows = self.query("SELECT pid FROM {s}.started WHERE order_id = %s ORDER BY id", order_id)
        return [pid for (pid,) in rows]


def wait_until(what: str, condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``condition`` until it returns something true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class Workers:
    """Worker subprocesses, each in its own process group (killed as a group)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], environ: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            argv, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and every process it started."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.log_dir.glob("worker-*.log"))
        )


@contextmanager
def workers(log_dir: Path) -> Iterator[Workers]:
    pool = Workers(log_dir)
    try:
        yield pool
    finally:
        pool.stop_all()


def python() -> str:
    return sys.executable


# --- the task body, run inside the worker subprocess -------------------------------------------


def _schema() -> str:
    return os.environ["JOBFENCE_FW_SCHEMA"]


def _stalls(order_id: str) -> bool:
    return order_id in os.environ.get("JOBFENCE_FW_STALL", "").split(",")


def apply_order(inbox: Any, order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    """The effect of one order, exactly once: claim the guarded task's key in the ledger's own
    transaction and write the effect there. A stalling order's first run hangs until killed."""
    schema = _schema()
    dsn = os.environ["JOBFENCE_FW_DSN"]
    if _stalls(order_id):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {schema}.started (order_id, pid) VALUES (%s, %s)",
                (order_id, os.getpid()),
            )
            runs = conn.execute(
                f"SELECT count(*) FROM {schema}.started WHERE order_id = %s", (order_id,)
            ).fetchone()
        if runs is not None and runs[0] == 1:
            time.sleep(3600)  # the test kills this process here
    with psycopg.connect(dsn) as conn, conn.transaction():
        if inbox.claim_in(conn):
            conn.execute(
                f"UPDATE {schema}.products SET stock = stock - %s WHERE id = %s", (qty, product_id)
            )
            conn.execute(
                f"INSERT INTO {schema}.effects (order_id, product_id, qty, pid) "
                "VALUES (%s, %s, %s, %s)",
                (order_id, product_id, qty, os.getpid()),
            )
    return {"order_id": order_id, "pid": os.getpid()}


async def apply_order_async(inbox: Any, order_id: str, product_id: int, qty: int) -> dict[str, Any]:
    """:func:`apply_order` for ``async def`` tasks (``AsyncInbox``, psycopg's async
    connection)."""
    import asyncio

    schema = _schema()
    dsn = os.environ["JOBFENCE_FW_DSN"]
    if _stalls(order_id):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                f"INSERT INTO {schema}.started (order_id, pid) VALUES (%s, %s)",
                (order_id, os.getpid()),
            )
            cur = await conn.execute(
                f"SELECT count(*) FROM {schema}.started WHERE order_id = %s", (order_id,)
            )
            runs = await cur.fetchone()
        if runs is not None and runs[0] == 1:
            await asyncio.sleep(3600)  # the test kills this process here
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        if await inbox.claim_in(conn):
            await conn.execute(
                f"UPDATE {schema}.products SET stock = stock - %s WHERE id = %s", (qty, product_id)
            )
            await conn.execute(
                f"INSERT INTO {schema}.effects (order_id, product_id, qty, pid) "
                "VALUES (%s, %s, %s, %s)",
                (order_id, product_id, qty, os.getpid()),
            )
    return {"order_id": order_id, "pid": os.getpid()}
