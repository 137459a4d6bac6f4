"""SQLite checks of ``jobfence doctor``: the file, its journal mode and jobfence's tables.

SQLite runs in the processes that use the file, on this host: there is no server clock other
than this host's (offset 0) and a "round trip" is a statement run in this process.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ..._core.url import BackendURL
from ...doctor import Report, TableStatus, Timer
from ...doctor.tables import (
    FENCE_TABLE,
    INBOX_TABLE,
    QUEUE_TABLE,
    SQLDialect,
    add_table_findings,
    inspect_tables,
)
from .common import sqlite_path

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
        inspect_tables(report, _dialect(conn))
    finally:
        conn.close()


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return bool(row[0])


def _ident(table: str) -> str:
    return '"' + table.replace('"', '""') + '"'


def _dialect(conn: sqlite3.Connection) -> SQLDialect:
    return SQLDialect(
        rows=lambda sql, params: conn.execute(sql, params).fetchall(),
        exists=lambda table: _exists(conn, table),
        ident=_ident,
        param="?",
        now=_NOW,
        queue_counts=lambda table: (
            "SELECT count(DISTINCT queue),"
            f" coalesce(sum(state = 'ready' AND visible_at <= {_NOW}), 0),"
            f" coalesce(sum(state = 'ready' AND receipt IS NULL AND visible_at > {_NOW}), 0),"
            f" coalesce(sum(state = 'ready' AND receipt IS NOT NULL AND visible_at > {_NOW}), 0),"
            f" coalesce(sum(state = 'dead'), 0) FROM {table}"
        ),
    )
