"""MySQL 8 / MariaDB 10.6+ as jobfence sees it, without any I/O.

What ``fence``, ``claim_in``, ``versioned_update`` and ``inbox.install(conn)`` need to know
when they run on a caller's MySQL or MariaDB connection (found through
``jobfence.backends.sql_dialect("mysql")``), and the limits of the names this package's tables
are made from.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import unquote, urlsplit

from ..._core.sqlconn import Result, SQLDialect

__all__ = ["DIALECT", "IDENTIFIER_LIMIT", "LOCK_TABLES", "NAMESPACE_LIMIT", "TABLE_LIMIT"]

#: MySQL and MariaDB table names are at most 64 characters
IDENTIFIER_LIMIT = 64
#: the lock tables, ``{namespace}<suffix>``
LOCK_TABLES = ("_locks", "_schema")
#: characters kept for ``{namespace}<suffix>`` table names: more than the longest suffix today
#: (``_schema``, 7), so that tables a later schema version adds (PostgreSQL's lock tables go up
#: to ``_lock_tokens``) fit every namespace that is valid now
SUFFIX_ROOM = 16
#: the longest namespace: 64 - 16 = 48
NAMESPACE_LIMIT = IDENTIFIER_LIMIT - SUFFIX_ROOM
#: the inbox ``table`` is a table name of its own
TABLE_LIMIT = IDENTIFIER_LIMIT

assert max(len(suffix) for suffix in LOCK_TABLES) <= SUFFIX_ROOM


class MySQLDialect(SQLDialect):
    name = "mysql"
    title = "MySQL/MariaDB"
    package = "jobfence.backends.mysql"
    namespace_limit = NAMESPACE_LIMIT
    table_limit = TABLE_LIMIT
    outbox_table_limit = TABLE_LIMIT
    #: the seq numbers a statement works on, filled in by the outbox backend (no arrays)
    outbox_slots = ("seqs",)
    quote_char = "`"
    # under REPEATABLE READ a plain read shows the transaction's snapshot
    locking_read = " FOR UPDATE"
    # INSERT IGNORE inserts the marker of an unknown key; a key that claim() holds is marked
    # applied by a second statement, only when the first one inserted nothing (changed-row
    # counts: both statements change the row they match, so CLIENT_FOUND_ROWS does not matter)
    claim_in_steps = ("claim_in", "claim_in_held")
    drivers = {True: (("aiomysql", "Connection"),), False: (("pymysql", "Connection"),)}
    driver_names = {True: "aiomysql (mysql+aiomysql)", False: "PyMySQL (mysql+pymysql)"}
    default_host = "127.0.0.1"

    def autocommit(self, conn: Any) -> bool:
        return bool(conn.get_autocommit())

    def set_autocommit(self, conn: Any, on: bool) -> Any:
        return conn.autocommit(on)

    def dbapi_connect(self, url: str) -> Any:
        import pymysql

        parts = urlsplit(url)
        return pymysql.connect(
            host=parts.hostname or self.default_host,
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=parts.path.lstrip("/") or None,
            ssl_disabled=True,
        )

    def fence_params(self, resource: str, token: int) -> dict[str, Any]:
        # the key is the SHA-256 of the UTF-8 name (names exceed InnoDB's key length); bytes
        # travel as hex, away from any driver's bytes escaping and the connection charset
        name = resource.encode("utf-8")
        return {"hash": hashlib.sha256(name).hexdigest(), "resource": name.hex(), "token": token}

    def newest_params(self, resource: str) -> dict[str, Any]:
        return {"hash": hashlib.sha256(resource.encode("utf-8")).hexdigest()}

    def fence_outcome(self, result: Result, token: int) -> int | None:
        # no RETURNING: the upsert leaves the row's token in LAST_INSERT_ID(expr), which the
        # OK packet reports as the cursor's lastrowid
        return None if result.lastrowid is None else int(result.lastrowid)

    def claim_in_params(
        self, key: str, fingerprint: str | None, retention: float
    ) -> dict[str, Any]:
        return {
            "key": key,
            "fingerprint": fingerprint,
            "retention_us": int(retention * 1_000_000),
        }


DIALECT = MySQLDialect()
