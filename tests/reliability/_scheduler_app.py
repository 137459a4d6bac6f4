"""The scheduler process of the scheduler process tests, and its naive control.

``jobfence scheduler tests.reliability._scheduler_app:sched`` runs :data:`sched`: one schedule,
``proof.tick``, every second, whose target writes to a PostgreSQL ledger. Configured by
environment variables (read at import):

* ``PROOF_URL`` / ``PROOF_NAMESPACE`` -- the scheduler's backend and namespace.
* ``PROOF_LEDGER`` -- the ledger's PostgreSQL URL; ``PROOF_TABLES`` -- its tables' prefix
  (``<prefix>_attempts``, ``<prefix>_effects`` and the inbox table ``<prefix>_ledger``).
* ``PROOF_POD`` -- this process's pod id; ``PROOF_LEASE`` -- the scheduler's lease (s).
* ``PROOF_SKEW`` -- seconds added to this process's wall clock (a skewed host).
* ``PROOF_WORK`` -- seconds the target works between its attempt row and its effect.

Each invocation of the target inserts an ``attempts`` row (committed at once), works
``PROOF_WORK`` seconds, then in ONE PostgreSQL transaction marks the slot's key applied with
the ledger inbox's ``claim_in`` and, only if that was the first time, inserts the ``effects``
row: exactly one effect per slot, whoever runs the target and however often.

``python -m tests.reliability._scheduler_app naive`` is the naive control: a plain loop that
sleeps to the next whole second and writes an attempt and an effect for that second, with no
coordination between processes (what three copies of a cron-like loop do).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psycopg

import jobfence
from jobfence.testing import Clock, set_clock

LEDGER = os.environ.get("PROOF_LEDGER", "postgresql://postgres@127.0.0.1:5432/test")
TABLES = os.environ.get("PROOF_TABLES", "proof")
POD = os.environ.get("PROOF_POD", f"pod{os.getpid()}")
WORK = float(os.environ.get("PROOF_WORK", "0.3"))
SKEW = float(os.environ.get("PROOF_SKEW", "0"))
SCHEDULE = "proof.tick"


class SkewedClock(Clock):
    """The real clock, its wall-clock time moved by ``offset`` seconds (monotonic untouched)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset


def create_ledger(conn: psycopg.Connection[Any], tables: str) -> None:
    """The ledger's tables (the caller commits); the inbox table is created by ``install``."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {tables}_attempts (id bigserial PRIMARY KEY, "
        "slot text NOT NULL, slot_at double precision NOT NULL, pod text NOT NULL, "
        "started double precision NOT NULL, applied boolean)"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {tables}_effects (slot text NOT NULL, "
        "slot_at double precision NOT NULL, pod text NOT NULL, lag double precision NOT NULL)"
    )


def ledger_inbox(tables: str) -> jobfence.Inbox:
    """The ledger's inbox (its table in the ledger database, next to the effects)."""
    return jobfence.Inbox(LEDGER, table=f"{tables}_ledger")


def _attempt(conn: psycopg.Connection[Any], key: str, slot_at: float, started: float) -> int:
    row = conn.execute(
        f"INSERT INTO {TABLES}_attempts (slot, slot_at, pod, started) "
        "VALUES (%s, %s, %s, %s) RETURNING id",
        (key, slot_at, POD, started),
    ).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


_inbox: jobfence.Inbox | None = None


def tick(slot: jobfence.Slot) -> None:
    """The schedule's target: an attempt row, some work, then the effect exactly once."""
    global _inbox
    started = time.time()  # the real time (not the skewed clock): the lag is measured here
    slot_at = slot.at.timestamp()
    if _inbox is None:
        _inbox = ledger_inbox(TABLES)
    with psycopg.connect(LEDGER) as conn:
        attempt = _attempt(conn, slot.key, slot_at, started)
        time.sleep(WORK)
        applied = _inbox.claim_in(conn, slot.key)
        if applied:
            conn.execute(
                f"INSERT INTO {TABLES}_effects (slot, slot_at, pod, lag) VALUES (%s, %s, %s, %s)",
                (slot.key, slot_at, POD, started - slot_at),
            )
        conn.execute(f"UPDATE {TABLES}_attempts SET applied = %s WHERE id = %s", (applied, attempt))
        conn.commit()


if SKEW:
    set_clock(SkewedClock(SKEW))

sched = jobfence.Scheduler(
    os.environ.get("PROOF_URL", "sqlite:///proof.db"),
    namespace=os.environ.get("PROOF_NAMESPACE"),
    lease=float(os.environ.get("PROOF_LEASE", "2")),
    pod=POD,
)
sched.add(SCHEDULE, every=1, target=tick)


def naive() -> None:
    """The naive control: every whole second, an attempt and an effect, uncoordinated."""
    with psycopg.connect(LEDGER) as conn:
        while True:
            now = time.time()
            slot_at = float(int(now) + 1)
            time.sleep(slot_at - now)
            started = time.time()
            key = f"naive@{int(slot_at)}"
            _attempt(conn, key, slot_at, started)
            time.sleep(WORK)
            conn.execute(
                f"INSERT INTO {TABLES}_effects (slot, slot_at, pod, lag) VALUES (%s, %s, %s, %s)",
                (key, slot_at, POD, started - slot_at),
            )
            conn.commit()


if __name__ == "__main__" and sys.argv[1:] == ["naive"]:
    naive()
