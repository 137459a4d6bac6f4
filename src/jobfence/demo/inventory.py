"""The lost-update scenario: concurrent jobs deduct stock, with injected failures.

``jobs`` jobs each deduct a small quantity from one of :data:`PRODUCTS` products. They run
in ``workers`` processes (``python -m jobfence.demo.inventory``), :data:`THREADS` threads
each. Some attempts fail on purpose (a seeded draw per job and attempt): a connection lost
before the commit (``ConnectionError``, transient), or a commit that WAS applied but reported
failed (:class:`jobfence.CommitOutcomeUnknown`).

* naive: read the stock, compute ``stock - qty``, write it; on any error re-send that same
  write (a blind, statement-level retry). Two jobs that read the same stock overwrite each
  other's deduction, and a re-sent write overwrites what changed since its read.
* guarded: one unit of work per attempt -- ``Inbox.claim_in`` (the job's marker commits with
  the deduction), read stock and version, ``versioned_update`` -- re-run whole by
  ``retry_unit``; a "commit outcome unknown" re-run sees its own marker and does nothing.
  With a locks URL each guarded job also holds a lease on its product while it runs.

Every write also inserts a ledger row with the stock the job computed from (``seen``) and the
stock the row held when the write took its lock (``before``): a write with ``before != seen``
overwrote a change it never read -- a lost update. The results are counted from the tables.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._core.sqlconn import adapt
from ..errors import CommitOutcomeUnknown
from ..inbox import Inbox
from ..locks import Locks
from ..retry import retry_unit
from ..versioned import versioned_update
from ._db import begin_write, connect, dialect_of, drop_tables, for_update, set_up_file

PRODUCTS = 3
INITIAL_STOCK = 100_000
THREADS = 4
MODES = ("naive", "guarded")


def job_spec(job: int) -> tuple[int, int]:
    """(product, quantity) of job number ``job``."""
    return job % PRODUCTS + 1, 1 + (job * 7) % 3


def fault(seed: int, job: int, attempt: int) -> str | None:
    """The failure injected into ``attempt`` (0, 1, ...) of ``job``: ``"transient"`` (lost
    before the commit), ``"unknown"`` (commit applied, reported failed) or ``None``. Only the
    first two attempts fail, so every job can finish."""
    if attempt >= 2:
        return None
    draw = random.Random(f"{seed}:{job}:{attempt}").random()
    if draw < 0.15:
        return "transient"
    if draw < 0.27:
        return "unknown"
    return None


def tables(ns: str) -> dict[str, str]:
    return {"inventory": f"{ns}_inventory", "ledger": f"{ns}_ledger", "inbox": f"{ns}_inbox"}


def _sql(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    return adapt(conn).execute(sql, params)


def setup(db: str, ns: str) -> None:
    """Create the inventory (both modes' rows at :data:`INITIAL_STOCK`), the ledger and the
    guarded run's inbox table."""
    t = tables(ns)
    conn = connect(db)
    try:
        set_up_file(conn, db)
        _sql(
            conn,
            f"CREATE TABLE {t['inventory']} (mode varchar(16) NOT NULL, id int NOT NULL, "
            "stock int NOT NULL, version int NOT NULL, PRIMARY KEY (mode, id))",
        )
        _sql(
            conn,
            f"CREATE TABLE {t['ledger']} (mode varchar(16) NOT NULL, job int NOT NULL, "
            "product int NOT NULL, qty int NOT NULL, seen int NOT NULL, before_write int NOT NULL)",
        )
        for mode in MODES:
            for product in range(1, PRODUCTS + 1):
                _sql(
                    conn,
                    f"INSERT INTO {t['inventory']} (mode, id, stock, version) VALUES (?, ?, ?, 0)",
                    (mode, product, INITIAL_STOCK),
                )
        conn.commit()
    finally:
        conn.close()
    inbox = Inbox(db, table=t["inbox"])
    try:
        inbox.install()
    finally:
        inbox.close()


def drop(db: str, ns: str) -> None:
    """Drop the scenario's tables (used for server databases; SQLite files are deleted)."""
    drop_tables(db, list(tables(ns).values()), inbox=tables(ns)["inbox"])


# -- the jobs, run in the worker processes ----------------------------------------------------


def naive_job(db: str, ns: str, job: int, seed: int) -> None:
    """Read, compute, write; on any error re-send the same write."""
    t, dialect = tables(ns), dialect_of(db)
    product, qty = job_spec(job)
    conn = connect(db)
    try:
        row = _sql(
            conn, f"SELECT stock FROM {t['inventory']} WHERE mode = 'naive' AND id = ?", (product,)
        ).rows[0]
        conn.commit()  # the read is its own transaction, as an ORM's load-then-save does
        seen = int(row[0])
        new_stock = seen - qty
        time.sleep(0.002)  # the job's work between its read and its write
        for attempt in range(5):
            injected = fault(seed, job, attempt)
            try:
                begin_write(conn, dialect)
                before = _sql(
                    conn,
                    f"SELECT stock FROM {t['inventory']} WHERE mode = 'naive' AND id = ?"
                    + for_update(dialect),
                    (product,),
                ).rows[0][0]
                _sql(
                    conn,
                    f"INSERT INTO {t['ledger']} (mode, job, product, qty, seen, before_write) "
                    "VALUES ('naive', ?, ?, ?, ?, ?)",
                    (job, product, qty, seen, int(before)),
                )
                _sql(
                    conn,
                    f"UPDATE {t['inventory']} SET stock = ? WHERE mode = 'naive' AND id = ?",
                    (new_stock, product),
                )
                if injected == "transient":
                    raise ConnectionError("injected: connection lost before the commit")
                conn.commit()
                if injected == "unknown":
                    raise CommitOutcomeUnknown("injected: commit applied but reported failed")
                return
            except Exception:
                conn.rollback()
                time.sleep(0.005 * (attempt + 1))  # then re-send the same write, blindly
    finally:
        conn.close()


def guarded_job(db: str, ns: str, job: int, seed: int, inbox: Inbox) -> None:
    """One unit of work per attempt: claim_in + versioned update, re-run whole."""
    t = tables(ns)
    product, qty = job_spec(job)
    attempts = iter(range(1000))

    @retry_unit(attempts=10, backoff=0.01)
    def unit() -> None:
        injected = fault(seed, job, next(attempts))
        conn = connect(db)
        try:
            if not inbox.claim_in(conn, f"inventory:{job}"):
                conn.rollback()  # already applied: a re-run after "commit outcome unknown"
                return
            stock, version = _sql(
                conn,
                f"SELECT stock, version FROM {t['inventory']} WHERE mode = 'guarded' AND id = ?",
                (product,),
            ).rows[0]
            versioned_update(
                conn,
                t["inventory"],
                {"mode": "guarded", "id": product},
                int(version),
                {"stock": int(stock) - qty},
            )
            _sql(
                conn,
                f"INSERT INTO {t['ledger']} (mode, job, product, qty, seen, before_write) "
                "VALUES ('guarded', ?, ?, ?, ?, ?)",
                (job, product, qty, int(stock), int(stock)),
            )
            if injected == "transient":
                raise ConnectionError("injected: connection lost before the commit")
            conn.commit()
            if injected == "unknown":
                raise CommitOutcomeUnknown("injected: commit applied but reported failed")
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    unit()


def _worker_main(config: dict[str, Any]) -> None:
    db, ns, mode, seed = config["db"], config["ns"], config["mode"], config["seed"]
    mine = range(config["index"], config["jobs"], config["workers"])
    inbox = Inbox(db, table=tables(ns)["inbox"]) if mode == "guarded" else None
    locks = Locks(config["locks"]) if config.get("locks") else None
    run: Callable[[int], None]
    if inbox is None:

        def run(job: int) -> None:
            naive_job(db, ns, job, seed)

    else:

        def run(job: int) -> None:
            if locks is None:
                guarded_job(db, ns, job, seed, inbox)
                return
            product, _qty = job_spec(job)
            with locks.acquire(f"{ns}:inventory:{product}", ttl=30, timeout=60):
                guarded_job(db, ns, job, seed, inbox)

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            for result in [pool.submit(run, job) for job in mine]:
                result.result()
    finally:
        if inbox is not None:
            inbox.close()
        if locks is not None:
            locks.close()


def counts(db: str, ns: str, mode: str) -> dict[str, int]:
    """What the database holds after (or during) ``mode``'s run: ``stock`` (summed over the
    products), ``writes`` (ledger rows), ``jobs_applied`` (distinct jobs in the ledger),
    ``lost_updates`` (writes that overwrote a change they never read), ``ledger_deducted``
    (the quantities the ledger says were deducted)."""
    t = tables(ns)
    conn = connect(db)
    try:
        stock = _sql(conn, f"SELECT sum(stock) FROM {t['inventory']} WHERE mode = ?", (mode,)).rows[
            0
        ][0]
        writes, jobs, lost = _sql(
            conn,
            f"SELECT count(*), count(DISTINCT job), "
            f"coalesce(sum(CASE WHEN before_write <> seen THEN 1 ELSE 0 END), 0) "
            f"FROM {t['ledger']} WHERE mode = ?",
            (mode,),
        ).rows[0]
        conn.commit()
    finally:
        conn.close()
    return {
        "stock": int(stock),
        "writes": int(writes),
        "jobs_applied": int(jobs),
        "lost_updates": int(lost),
    }


def expected_stock(jobs: int) -> int:
    """The stock summed over the products once each of ``jobs`` jobs deducted once."""
    return PRODUCTS * INITIAL_STOCK - sum(job_spec(job)[1] for job in range(jobs))


if __name__ == "__main__":
    _worker_main(json.loads(sys.argv[1]))
