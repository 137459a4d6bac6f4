"""PostgreSQL as jobfence sees it, without any I/O.

What ``fence``, ``claim_in``, ``versioned_update`` and ``inbox.install(conn)`` need to know
when they run on a caller's PostgreSQL connection (found through
``jobfence.backends.sql_dialect("postgresql")``), and the limits of the names this package's
tables are made from.
"""

from __future__ import annotations

from typing import Any

from ..._core.sqlconn import SQLDialect
from ...errors import ConfigurationError
from .common import pg_text

__all__ = [
    "DIALECT",
    "IDENTIFIER_LIMIT",
    "LOCK_TABLES",
    "NAMESPACE_LIMIT",
    "OUTBOX_TABLE_LIMIT",
    "QUEUE_TABLE_LIMIT",
    "TABLE_LIMIT",
]

#: PostgreSQL identifiers are at most 63 bytes (NAMEDATALEN - 1); longer ones are cut
IDENTIFIER_LIMIT = 63
#: the lock tables, ``{namespace}<suffix>``
LOCK_TABLES = ("_locks", "_lock_tokens", "_lock_queue", "_schema")
#: the longest namespace whose lock tables all fit: 63 - len("_lock_tokens") = 51
NAMESPACE_LIMIT = IDENTIFIER_LIMIT - max(len(suffix) for suffix in LOCK_TABLES)
#: the inbox ``table`` is a table name of its own
TABLE_LIMIT = IDENTIFIER_LIMIT
#: the outbox ``table`` names its indexes ``{table}_published`` too: 63 - 10 = 53
OUTBOX_TABLE_LIMIT = IDENTIFIER_LIMIT - len("_published")
#: the queue ``table`` names its index ``{table}_next`` too: 63 - len("_next") = 58
QUEUE_TABLE_LIMIT = IDENTIFIER_LIMIT - len("_next")


class PostgresDialect(SQLDialect):
    name = "postgresql"
    title = "PostgreSQL"
    package = "jobfence.backends.postgres"
    namespace_limit = NAMESPACE_LIMIT
    table_limit = TABLE_LIMIT
    outbox_table_limit = OUTBOX_TABLE_LIMIT
    quote_char = '"'
    failure_aborts_transaction = True
    drivers = {True: (("psycopg", "AsyncConnection"),), False: (("psycopg", "Connection"),)}
    driver_names = {
        True: "psycopg (postgresql+psycopg_async)",
        False: "psycopg (postgresql+psycopg)",
    }

    def dbapi_connect(self, url: str) -> Any:
        import psycopg

        return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1))

    def inbox_quote(self, name: str) -> str:
        # The inbox's statements have always named its table unquoted, which PostgreSQL folds
        # to lower case; quoting the lower-case name finds the same table (and allows names
        # that are keywords).
        return self.quote(name.lower())

    def outbox_table(self, name: str) -> str:
        # one spelling, the one PostgreSQL gives the unquoted name: it is also the name of
        # the LISTEN/NOTIFY channel the outbox's statements write inside quotes
        return name.lower()

    def db_key(self, key: str) -> str:
        return pg_text(key)  # text cannot hold NUL

    def check_resource(self, resource: str) -> None:
        if "\x00" in resource:
            raise ConfigurationError(
                "resource must not contain NUL characters on PostgreSQL (text cannot store them)",
                argument="resource",
            )


DIALECT = PostgresDialect()
