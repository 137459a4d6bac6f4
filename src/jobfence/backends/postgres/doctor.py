"""PostgreSQL checks of ``jobfence doctor``: PgBouncer transaction pooling, clock, tables.

PgBouncer in transaction pooling mode is found by behaviour: two client connections each run
a few single-statement transactions and read ``pg_backend_pid()``. With direct connections
(or session pooling) each client keeps one server process, so a client sees one pid and two
clients never see the same one; when a client's pid changes between its transactions, or two
clients get the same server process, server connections are shared between clients.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..._core.options import TIMEOUT_OPTIONS, option_timeouts
from ..._core.url import BackendURL
from ...doctor import Report, Timer
from ...doctor.tables import SQLDialect, inspect_tables
from .common import connect_kwargs, libpq_uri

#: query options of jobfence's PostgreSQL backends, never handed to libpq
_OWN = ("mode", "notify", "pool_size", "prepare_threshold", "table", "max_idle", *TIMEOUT_OPTIONS)
#: the oldest PostgreSQL the queue supports (gen_random_uuid())
MIN_VERSION = 13


def _connect(url: BackendURL) -> psycopg.Connection[Any]:
    """A connection opened as the backends open theirs (:func:`.common.libpq_uri`,
    :func:`.common.connect_kwargs`), but whose errors are the driver's own (the report quotes
    them)."""
    timeouts = option_timeouts({}, url.options)
    return psycopg.connect(
        libpq_uri(url, *_OWN),
        autocommit=True,
        prepare_threshold=None,
        **connect_kwargs(url.options, timeouts),
    )


def _one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    with _connect(url) as conn:
        report.server_version = str(_one(conn, "SHOW server_version"))
        report.rtt_ms = timer.ping(lambda: conn.execute("SELECT 1").fetchone())
        report.clock_offset_ms = timer.clock(
            lambda: float(_one(conn, "SELECT extract(epoch FROM clock_timestamp())"))
        )
        report.clock_note = "PostgreSQL clock_timestamp()"
        number = int(_one(conn, "SHOW server_version_num") or 0)
        if number and number < MIN_VERSION * 10000:
            report.add(
                "warning",
                "postgres-version",
                f"PostgreSQL {report.server_version}: the PostgreSQL queue needs "
                f"{MIN_VERSION} or newer",
                f"upgrade PostgreSQL to {MIN_VERSION} or newer to use the queue",
            )
        else:
            report.add("ok", "postgres-version", f"PostgreSQL {report.server_version}")
        with _connect(url) as other:
            pooled = transaction_pooled(conn, other)
        _pooling(report, url, pooled)
        inspect_tables(report, _dialect(conn))


def transaction_pooled(first: psycopg.Connection[Any], second: psycopg.Connection[Any]) -> bool:
    """Whether two autocommit client connections share server processes (PgBouncer in
    transaction or statement pooling): their ``pg_backend_pid()`` over alternating
    single-statement transactions."""
    seen: tuple[set[int], set[int]] = (set(), set())
    for _ in range(3):
        for conn, pids in zip((first, second), seen, strict=True):
            pids.add(int(_one(conn, "SELECT pg_backend_pid()")))
    return len(seen[0]) > 1 or len(seen[1]) > 1 or bool(seen[0] & seen[1])


def _pooling(report: Report, url: BackendURL, pooled: bool) -> None:
    if not pooled:
        report.add(
            "ok",
            "pgbouncer",
            "each client connection keeps its own server process (direct connections or "
            "session pooling)",
        )
        return
    session = (url.options.get("mode") or "").lower() == "session"
    notify = (url.options.get("notify") or "true").lower() not in ("false", "0", "no", "off")
    report.add(
        "error" if session else "warning",
        "pgbouncer",
        "server connections are shared between client connections (PgBouncer in transaction "
        "pooling mode): session-mode locks (mode=session, session advisory locks) do not "
        "work -- the lock stays with a server process other clients then use -- and "
        "LISTEN/NOTIFY wake-ups of the PostgreSQL queue and of waiting lease-mode locks are "
        "not delivered"
        + (" (this URL asks for mode=session)" if session else "")
        + (" (this URL keeps notify on)" if notify else ""),
        "use the default lease mode for locks and add ?notify=false to the URL (waiters and "
        "queue receives then poll), or connect directly / through session pooling",
    )


def _exists(conn: psycopg.Connection[Any], table: str) -> bool:
    quoted = '"' + table.replace('"', '""') + '"'
    return _one(conn, "SELECT to_regclass(%s) IS NOT NULL", (quoted,)) is True


def _ident(table: str) -> str:
    return '"' + table.replace('"', '""') + '"'


def _dialect(conn: psycopg.Connection[Any]) -> SQLDialect:
    return SQLDialect(
        rows=lambda sql, params: conn.execute(sql, params or None).fetchall(),
        exists=lambda table: _exists(conn, table),
        ident=_ident,
        param="%s",
        now="clock_timestamp()",
        queue_counts=lambda table: (
            "SELECT count(DISTINCT q.queue),"
            " count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at <= c.now),"
            " count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at > c.now"
            "                  AND q.receipt IS NULL),"
            " count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at > c.now"
            "                  AND q.receipt IS NOT NULL),"
            " count(*) FILTER (WHERE q.state = 'dead')"
            f" FROM {table} AS q CROSS JOIN (SELECT clock_timestamp() AS now) AS c"
        ),
    )
