"""MySQL / MariaDB checks of ``jobfence doctor``: server version, clock, tables.

jobfence needs MySQL 8.0 or newer, or MariaDB 10.6 or newer (see the MySQL backend's page).
MySQL has no jobfence queue backend, so only the lock, inbox and fence tables are looked at.
"""

from __future__ import annotations

import re
from typing import Any

import pymysql

from ..._core.url import BackendURL
from ...doctor import Report, Timer
from ...doctor.tables import SQLDialect, inspect_tables
from .common import MySQLOptions

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
    inspect_tables(report, _dialect(cur))


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


def _dialect(cur: Any) -> SQLDialect:
    def rows(sql: str, params: Any) -> list[Any]:
        cur.execute(sql, params or None)
        return list(cur.fetchall())

    return SQLDialect(
        rows=rows,
        exists=lambda table: _exists(cur, table),
        ident=_ident,
        param="%s",
        now="UTC_TIMESTAMP(6)",
    )
