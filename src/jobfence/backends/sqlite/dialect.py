"""SQLite as jobfence sees it, without any I/O.

What ``fence``, ``claim_in``, ``versioned_update`` and ``inbox.install(conn)`` need to know
when they run on a caller's SQLite connection (found through
``jobfence.backends.sql_dialect("sqlite")``), and the limits of the names this package's tables
are made from. SQLite has ``RETURNING`` (3.35+) and exact affected-row counts: the defaults.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..._core.sqlconn import SQLDialect
from ..._core.url import parse_url
from .path import sqlite_path

__all__ = ["DIALECT", "IDENTIFIER_LIMIT", "LOCK_TABLES", "NAMESPACE_LIMIT", "TABLE_LIMIT"]

#: SQLite sets no limit on identifiers; jobfence keeps names as short as PostgreSQL's
IDENTIFIER_LIMIT = None
#: the lock tables, ``{namespace}<suffix>``
LOCK_TABLES = ("_locks", "_lock_tokens", "_lock_queue", "_schema")
#: a cap, not a server limit: 63 characters
NAMESPACE_LIMIT = 63
#: a cap, not a server limit: 63 characters
TABLE_LIMIT = 63


class SQLiteDialect(SQLDialect):
    name = "sqlite"
    title = "SQLite"
    package = "jobfence.backends.sqlite"
    namespace_limit = NAMESPACE_LIMIT
    table_limit = TABLE_LIMIT
    quote_char = '"'
    in_process = True
    dbapi_param = "?"
    begin_write = "BEGIN IMMEDIATE"
    row_lock = ""
    setup_statements = ("PRAGMA journal_mode = WAL",)

    def dbapi_connect(self, url: str) -> Any:
        conn = sqlite3.connect(
            sqlite_path(parse_url(url, argument="db")), timeout=30, check_same_thread=False
        )
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn


DIALECT = SQLiteDialect()
