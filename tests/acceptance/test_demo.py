"""``jobfence demo`` in a subprocess, as a new user runs it: no server URL, no JOBFENCE_URL.
Its ``--json`` numbers are checked against the SQLite databases it leaves (``--keep``), and
its guarded runs must be exact: in the dual-write scenario, the naive apps lose or invent at
least one job and the outbox app neither, counted from the orders and jobs tables."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.servers import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", "demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=cwd,
        env=env,
        check=False,
    )


def _one(conn: sqlite3.Connection, sql: str, *params: Any) -> Any:
    return conn.execute(sql, params).fetchone()


def test_demo_on_sqlite_prints_what_the_databases_hold_and_guarded_is_exact(
    tmp_path: Path,
) -> None:
    keep = tmp_path / "kept"
    proc = _demo(
        # 60 orders: at 10 ms of work each, no app is done before its first kill (<= 0.2 s)
        *("--jobs", "90", "--messages", "60", "--orders", "60", "--workers", "2"),
        *("--keep", str(keep)),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert sorted(p.name for p in keep.iterdir()) == [
        "demo.db",
        "locks.db",
        "queue.db",
        "workers.log",
    ]
    assert not list(tmp_path.glob("*.db"))  # nothing left in the working directory
    ns = result["namespace"]
    inv, dup = result["inventory"], result["duplicates"]
    with sqlite3.connect(keep / "demo.db") as conn:
        for mode in ("naive", "guarded"):
            (stock,) = _one(conn, f"SELECT sum(stock) FROM {ns}_inventory WHERE mode = ?", mode)
            writes, jobs, lost = _one(
                conn,
                f"SELECT count(*), count(DISTINCT job), "
                f"sum(CASE WHEN before_write <> seen THEN 1 ELSE 0 END) "
                f"FROM {ns}_ledger WHERE mode = ?",
                mode,
            )
            assert inv[mode]["stock"] == stock
            assert inv[mode]["writes"] == writes
            assert inv[mode]["jobs_applied"] == jobs == 90
            assert inv[mode]["lost_updates"] == lost
            assert inv[mode]["stock_off_by"] == stock - inv["expected_stock"]
            effects, distinct = _one(
                conn,
                f"SELECT count(*), count(DISTINCT msg_id) FROM {ns}_effects WHERE mode = ?",
                mode,
            )
            assert dup[mode]["effects"] == effects
            assert dup[mode]["duplicate_effects"] == effects - distinct
            assert dup[mode]["kills"] == 1
        # the guarded stock is what the guarded ledger says was deducted, product by product
        deducted = dict(
            conn.execute(
                f"SELECT product, sum(qty) FROM {ns}_ledger WHERE mode = 'guarded' GROUP BY product"
            ).fetchall()
        )
        stocks = dict(conn.execute(f"SELECT id, stock FROM {ns}_inventory WHERE mode = 'guarded'"))
        assert {p: 100_000 - deducted[p] for p in stocks} == stocks
    # guarded: exact
    assert inv["guarded"]["stock"] == inv["expected_stock"]
    assert inv["guarded"]["writes"] == 90
    assert inv["guarded"]["lost_updates"] == 0
    assert dup["guarded"]["effects"] == 60
    assert dup["guarded"]["duplicate_effects"] == 0
    assert result["anomalies"]["guarded"] == 0
    # naive: every fourth message was published twice, and the naive handler repeats it
    assert dup["published"] == 60 + 15
    assert dup["naive"]["duplicate_effects"] >= 15
    assert result["anomalies"]["naive"] > 0
    # dual write, counted from the database: orders committed, jobs run, lost, phantom
    dual = result["dual_write"]
    with sqlite3.connect(keep / "demo.db") as conn:
        counted = {mode: _dual_counts(conn, ns, mode) for mode in DUAL_MODES}
    for mode in DUAL_MODES:
        assert {k: dual[mode][k] for k in counted[mode]} == counted[mode], mode
        assert counted[mode]["orders"] == 60, mode  # each app committed its 60 orders
        assert dual[mode]["kills"] >= 1, mode  # ... and was SIGKILLed on the way
    naive_anomalies = sum(
        counted[m]["lost"] + counted[m]["phantom"] for m in DUAL_MODES if m != "outbox"
    )
    assert naive_anomalies >= 1, counted
    assert counted["outbox"] == {"orders": 60, "jobs": 60, "job_rows": 60, "lost": 0, "phantom": 0}


DUAL_MODES = ("commit_then_publish", "publish_then_commit", "outbox")


def _dual_counts(conn: sqlite3.Connection, ns: str, mode: str) -> dict[str, int]:
    """The dual-write scenario's numbers, straight from its two tables."""
    select = "SELECT order_id FROM {} WHERE mode = ?"
    orders = {r[0] for r in conn.execute(select.format(f"{ns}_orders"), (mode,))}
    job_rows = [r[0] for r in conn.execute(select.format(f"{ns}_jobs"), (mode,))]
    jobs = set(job_rows)
    return {
        "orders": len(orders),
        "jobs": len(jobs),
        "job_rows": len(job_rows),
        "lost": len(orders - jobs),
        "phantom": len(jobs - orders),
    }


def test_demo_on_postgresql_leaves_no_tables_and_guarded_is_exact(tmp_path: Path) -> None:
    proc = _demo(
        "--jobs",
        "60",
        "--messages",
        "40",
        "--orders",
        "30",
        "--workers",
        "2",
        "--db",
        POSTGRES_URL,
        "--queue",
        POSTGRES_URL,
        "--locks",
        POSTGRES_URL,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["anomalies"]["guarded"] == 0
    assert result["inventory"]["guarded"]["stock"] == result["inventory"]["expected_stock"]
    assert result["duplicates"]["guarded"]["effects"] == 40
    assert result["duplicates"]["naive"]["duplicate_effects"] >= 10
    outbox = result["dual_write"]["outbox"]
    assert (outbox["orders"], outbox["jobs"], outbox["lost"], outbox["phantom"]) == (30, 30, 0, 0)
    with psycopg.connect(POSTGRES_URL) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE %s",
            (result["namespace"] + "%",),
        ).fetchone()
    assert left == (0,)


def test_demo_names_a_bad_db_url(tmp_path: Path) -> None:
    proc = _demo("--db", "oracle://db/x", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--db must be a sqlite:///FILE, postgresql:// or mysql:// URL" in proc.stderr
