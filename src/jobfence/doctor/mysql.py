"""MySQL / MariaDB checks of ``jobfence doctor``: server version, clock, tables.

jobfence needs MySQL 8.0 or newer, or MariaDB 10.6 or newer (see the MySQL backend's page).
MySQL has no jobfence queue backend, so only the lock, inbox and fence tables are looked at.
"""

from __future__ import annotations

import re
from typing import Any

import pymysql

from .._core.inbox_support import DEFAULT_TABLE as INBOX_TABLE
from .._core.url import BackendURL
from ..backends.mysql.common import MySQLOptions
from ..fencing import DEFAULT_TABLE as FENCE_TABLE
from . import Report, TableStatus, Timer
from .postgres import add_table_findings

MIN_MYSQL = (8, 0)
MIN_MARIADB = (10, 6)


def parse_version(text: str) -> tuple[str, tuple[int, int]]:
    """``("MariaDB" | "MySQL", (major, minor))`` of a ``SELECT VERSION()`` answer."""
    match = re.match(r"(\d+)\.(\d+)", text)
    numbers = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    return ("MariaDB" if "mariadb" in text.lower() else "MySQL"), numbers


def _one(cur: Any, sql: str, params: Any = None) -> Any:
    cur.execute(sql, params)
    row = cur.fetchone()
    return None if row is None else row[0]


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    options = MySQLOptions.parse(url, {})
    conn = pymysql.connect(
        database=options.database,
        read_timeout=options.timeout,
        write_timeout=options.timeout,
        **options.connect_kwargs(),
    )
    try:
        with conn.cursor() as cur:
            _inspect(report, cur, timer)
    finally:
        conn.close()


def _inspect(report: Report, cur: Any, timer: Timer) -> None:
    version = str(_one(cur, "SELECT VERSION()"))
    report.server_version = version
    report.rtt_ms = timer.ping(lambda: _one(cur, "SELECT 1"))
    report.clock_offset_ms = timer.clock(lambda: float(_one(cur, "SELECT UNIX_TIMESTAMP(NOW(6))")))
    report.clock_note = "UNIX_TIMESTAMP(NOW(6))"
    product, numbers = parse_version(version)
    minimum = MIN_MARIADB if product == "MariaDB" else MIN_MYSQL
    wanted = f"{product} {minimum[0]}.{minimum[1]}"
    if numbers < minimum:
        report.add(
            "error",
            "mysql-version",
            f"{product} {version}: jobfence needs {wanted} or newer",
            f"upgrade to {wanted} or newer (the lock and inbox statements need it)",
        )
    else:
        report.add("ok", "mysql-version", f"{product} {version} (needs {wanted} or newer)")
    _tables(report, cur)


def _exists(cur: Any, table: str) -> bool:
    return bool(
        _one(
            cur,
            "SELECT COUNT(*) FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name = %s",
            (table,),
        )
    )


def _ident(table: str) -> str:
    return "`" + table.replace("`", "``") + "`"


def _tables(report: Report, cur: Any) -> None:
    ns = report.namespace
    locks = TableStatus("locks", f"{ns}_locks", _exists(cur, f"{ns}_locks"))
    if locks.installed:
        if _exists(cur, f"{ns}_schema"):
            locks.schema_version = _one(
                cur, f"SELECT version FROM {_ident(ns + '_schema')} WHERE component = 'locks'"
            )
        locks.rows["held"] = int(
            _one(
                cur,
                f"SELECT COUNT(*) FROM {_ident(ns + '_locks')} WHERE expires_at > UTC_TIMESTAMP(6)",
            )
        )
    inbox = TableStatus("inbox", INBOX_TABLE, _exists(cur, INBOX_TABLE))
    if inbox.installed:
        if _exists(cur, "jobfence_inbox_schema"):
            inbox.schema_version = _one(
                cur,
                "SELECT version FROM jobfence_inbox_schema WHERE table_name = %s",
                (INBOX_TABLE,),
            )
        cur.execute(
            f"SELECT state, COUNT(*) FROM {_ident(INBOX_TABLE)} GROUP BY state ORDER BY state"
        )
        for state, n in cur.fetchall():
            inbox.rows[str(state)] = int(n)
    fences = TableStatus("fences", FENCE_TABLE, _exists(cur, FENCE_TABLE))
    if fences.installed:
        fences.rows["resources"] = int(_one(cur, f"SELECT COUNT(*) FROM {_ident(FENCE_TABLE)}"))
    report.tables = [locks, inbox, fences]
    add_table_findings(report)
