"""What ``jobfence doctor`` reads from jobfence's tables on a SQL server, once for every
dialect: whether the locks, inbox, fence and queue tables exist, their schema versions and
their rows by state. Each server module describes its dialect with a :class:`SQLDialect`
(how to run a query, whether a table exists, how to quote a name, the server's "now", and the
query that counts a queue table's messages) and calls :func:`inspect_tables`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.inbox_support import DEFAULT_TABLE as INBOX_TABLE
from ..fencing import DEFAULT_TABLE as FENCE_TABLE
from . import Report, TableStatus

__all__ = [
    "FENCE_TABLE",
    "INBOX_TABLE",
    "QUEUE_COUNTS",
    "QUEUE_TABLE",
    "SQLDialect",
    "add_table_findings",
    "inspect_tables",
]

#: the queue table jobfence creates by default (PostgreSQL and SQLite)
QUEUE_TABLE = "jobfence_queue"

#: the counts a queue table's query answers, in this order
QUEUE_COUNTS = ("queues", "ready", "delayed", "in_flight", "dead")


@dataclass(frozen=True)
class SQLDialect:
    """How :func:`inspect_tables` talks to one SQL server.

    ``rows(sql, params)`` runs a query and returns its rows; ``exists(table)`` says whether the
    table is there; ``ident(name)`` quotes a table name; ``param`` is the driver's placeholder;
    ``now`` a SQL expression of the server's time, comparable with the lock table's
    ``expires_at``; ``queue_counts(table)`` the query of :data:`QUEUE_COUNTS` on a queue table
    (``None``: this server has no queue)."""

    rows: Callable[[str, Sequence[Any]], list[Sequence[Any]]]
    exists: Callable[[str], bool]
    ident: Callable[[str], str]
    param: str
    now: str
    queue_counts: Callable[[str], str] | None = None

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row of ``sql`` (``None`` without a row)."""
        found = self.rows(sql, params)
        return found[0][0] if found else None

    def version(self, schema_table: str, where: str, value: str) -> int | None:
        """The schema version of ``value`` in ``schema_table``, if that table exists."""
        if not self.exists(schema_table):
            return None
        found = self.one(
            f"SELECT version FROM {self.ident(schema_table)} WHERE {where} = {self.param}",
            (value,),
        )
        return None if found is None else int(found)


def inspect_tables(report: Report, sql: SQLDialect) -> None:
    """Fill ``report.tables`` with the locks (of the report's namespace), inbox, fence and
    (where the server has one) queue tables, and add one finding per table."""
    ns = report.namespace
    locks = TableStatus("locks", f"{ns}_locks", sql.exists(f"{ns}_locks"))
    if locks.installed:
        locks.schema_version = sql.version(f"{ns}_schema", "component", "locks")
        locks.rows["held"] = int(
            sql.one(f"SELECT count(*) FROM {sql.ident(locks.table)} WHERE expires_at > {sql.now}")
        )
    inbox = TableStatus("inbox", INBOX_TABLE, sql.exists(INBOX_TABLE))
    if inbox.installed:
        inbox.schema_version = sql.version("jobfence_inbox_schema", "table_name", INBOX_TABLE)
        for state, n in sql.rows(
            f"SELECT state, count(*) FROM {sql.ident(INBOX_TABLE)} GROUP BY state ORDER BY state",
            (),
        ):
            inbox.rows[str(state)] = int(n)
    fences = TableStatus("fences", FENCE_TABLE, sql.exists(FENCE_TABLE))
    if fences.installed:
        fences.rows["resources"] = int(sql.one(f"SELECT count(*) FROM {sql.ident(FENCE_TABLE)}"))
    found = [locks, inbox, fences]
    if sql.queue_counts is not None:
        queue = TableStatus("queue", QUEUE_TABLE, sql.exists(QUEUE_TABLE))
        if queue.installed:
            queue.schema_version = sql.version("jobfence_queue_schema", "table_name", QUEUE_TABLE)
            counts = sql.rows(sql.queue_counts(sql.ident(QUEUE_TABLE)), ())[0]
            for name, n in zip(QUEUE_COUNTS, counts, strict=True):
                queue.rows[name] = int(n)
        found.append(queue)
    report.tables = found
    add_table_findings(report)


def add_table_findings(report: Report) -> None:
    """One finding per table: installed (with its schema version and rows) or not yet."""
    for table in report.tables:
        if not table.installed:
            report.add(
                "ok",
                f"table-{table.component}",
                f"{table.component} table {table.table}: not installed (created on first use)",
            )
            continue
        version = "" if table.schema_version is None else f", schema v{table.schema_version}"
        rows = ", ".join(f"{k} {v}" for k, v in table.rows.items())
        report.add(
            "ok",
            f"table-{table.component}",
            f"{table.component} table {table.table}{version}" + (f": {rows}" if rows else ""),
        )
