"""SQLite as jobfence sees it, without any I/O.

What ``fence``, ``claim_in``, ``versioned_update`` and ``inbox.install(conn)`` need to know
when they run on a caller's SQLite connection (found through
``jobfence.backends.sql_dialect("sqlite")``), and the limits of the names this package's tables
are made from. SQLite has ``RETURNING`` (3.35+) and exact affected-row counts: the defaults.
"""

from __future__ import annotations

from ..._core.sqlconn import SQLDialect

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


DIALECT = SQLiteDialect()
