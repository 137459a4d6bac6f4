"""SQLite checks of ``jobfence doctor``: the file, its journal mode and jobfence's tables.

SQLite runs in the processes that use the file, on this host: there is no server clock other
than this host's (offset 0) and a "round trip" is a statement run in this process.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .._core.inbox_support import DEFAULT_TABLE as INBOX_TABLE
from .._core.url import BackendURL
from ..backends.sqlite.common import sqlite_path
from ..fencing import DEFAULT_TABLE as FENCE_TABLE
from . import Report, TableStatus, Timer
from .postgres import add_table_findings

QUEUE_TABLE = "jobfence_queue"
_NOW = "(julianday('now') - 2440587.5) * 86400.0"


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    path = sqlite_path(url)
    report.server_version = f"SQLite {sqlite3.sqlite_version}"
    report.clock_offset_ms = 0.0
    report.clock_note = "SQLite uses this host's clock: no offset"
    if not os.path.exists(path):
        report.add(
            "ok",
            "sqlite-file",
            f"{path} does not exist yet (created on first use)",
            "" if Path(path).parent.is_dir() else f"its directory {Path(path).parent} is missing",
        )
        report.tables = [
            TableStatus(c, t, False)
            for c, t in (
                ("locks", f"{report.namespace}_locks"),
                ("inbox", INBOX_TABLE),
                ("fences", FENCE_TABLE),
                ("queue", QUEUE_TABLE),
            )
        ]
        add_table_findings(report)
        return
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        report.rtt_ms = timer.ping(lambda: conn.execute("SELECT 1").fetchone())
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
        if mode.lower() == "wal":
            report.add("ok", "sqlite-file", f"{path}: journal mode WAL")
        else:
            report.add(
                "ok",
                "sqlite-file",
                f"{path}: journal mode {mode} (jobfence switches the file to WAL on first use)",
            )
        _tables(report, conn)
    finally:
        conn.close()


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return bool(row[0])


def _ident(table: str) -> str:
    return '"' + table.replace('"', '""') + '"'


def _tables(report: Report, conn: sqlite3.Connection) -> None:
    ns = report.namespace
    locks = TableStatus("locks", f"{ns}_locks", _exists(conn, f"{ns}_locks"))
    if locks.installed:
        if _exists(conn, f"{ns}_schema"):
            row = conn.execute(
                f"SELECT version FROM {_ident(ns + '_schema')} WHERE component = 'locks'"
            ).fetchone()
            locks.schema_version = None if row is None else int(row[0])
        locks.rows["held"] = int(
            conn.execute(
                f"SELECT count(*) FROM {_ident(ns + '_locks')} WHERE expires_at > {_NOW}"
            ).fetchone()[0]
        )
    inbox = TableStatus("inbox", INBOX_TABLE, _exists(conn, INBOX_TABLE))
    if inbox.installed:
        if _exists(conn, "jobfence_inbox_schema"):
            row = conn.execute(
                "SELECT version FROM jobfence_inbox_schema WHERE table_name = ?", (INBOX_TABLE,)
            ).fetchone()
            inbox.schema_version = None if row is None else int(row[0])
        for state, n in conn.execute(
            f"SELECT state, count(*) FROM {_ident(INBOX_TABLE)} GROUP BY state ORDER BY state"
        ):
            inbox.rows[str(state)] = int(n)
    fences = TableStatus("fences", FENCE_TABLE, _exists(conn, FENCE_TABLE))
    if fences.installed:
        fences.rows["resources"] = int(
            conn.execute(f"SELECT count(*) FROM {_ident(FENCE_TABLE)}").fetchone()[0]
        )
    queue = TableStatus("queue", QUEUE_TABLE, _exists(conn, QUEUE_TABLE))
    if queue.installed:
        if _exists(conn, "jobfence_queue_schema"):
            row = conn.execute(
                "SELECT version FROM jobfence_queue_schema WHERE table_name = ?", (QUEUE_TABLE,)
            ).fetchone()
            queue.schema_version = None if row is None else int(row[0])
        row = conn.execute(
            "SELECT count(DISTINCT queue),"
            f" coalesce(sum(state = 'ready' AND visible_at <= {_NOW}), 0),"
            f" coalesce(sum(state = 'ready' AND receipt IS NULL AND visible_at > {_NOW}), 0),"
            f" coalesce(sum(state = 'ready' AND receipt IS NOT NULL AND visible_at > {_NOW}), 0),"
            " coalesce(sum(state = 'dead'), 0)"
            f" FROM {_ident(QUEUE_TABLE)}"
        ).fetchone()
        for name, n in zip(("queues", "ready", "delayed", "in_flight", "dead"), row, strict=True):
            queue.rows[name] = int(n)
    report.tables = [locks, inbox, fences, queue]
    add_table_findings(report)
