"""Names and keys as PostgreSQL ``text`` can store them; which pooled connection is reusable;
the deadlines of every connection and statement (hand-written for both flavours)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..._core.options import Timeouts, request_timed_out
from ..._core.url import BackendURL
from ...errors import ConfigurationError
from .._deadline import guard, guard_async

__all__ = [
    "KEEPALIVES",
    "connect_kwargs",
    "execute_bounded",
    "execute_bounded_async",
    "pg_text",
    "refuse_connect_options",
    "reusable",
]

#: TCP keepalive settings (libpq parameters) used unless the URL sets its own: a dead peer
#: behind an idle connection (a pooled one, the LISTEN connection) is noticed within about
#: 5 + 2 * 3 = 11 s instead of the kernel's default of over two hours
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}

_ESCAPE = "\ufffe"


def pg_text(name: str) -> str:
    """``name`` as jobfence's PostgreSQL tables store it: unchanged, unless ``text`` cannot hold
    it.

    ``text`` cannot contain NUL, so a name with a NUL character -- or one starting with the
    escape mark U+FFFE, to keep the mapping one-to-one -- is stored as U+FFFE followed by the
    hex of its UTF-8 bytes. Every other name is stored as it is (readable for operators).
    """
    if "\0" in name or name.startswith(_ESCAPE):
        return _ESCAPE + name.encode("utf-8").hex()
    return name


def pg_untext(stored: str) -> str:
    """The name that :func:`pg_text` stored as ``stored`` (its inverse)."""
    if stored.startswith(_ESCAPE):
        return bytes.fromhex(stored[len(_ESCAPE) :]).decode("utf-8")
    return stored


def pg_text_prefix(prefix: str) -> str:
    """What the stored form of every *escaped* name starting with ``prefix`` starts with (the
    escape mark and the hex of the prefix's UTF-8 bytes); names stored unchanged start with
    ``prefix`` itself."""
    return _ESCAPE + prefix.encode("utf-8").hex()


def reusable(conn: Any) -> bool:
    """Whether a psycopg connection may serve the next statement of a pool: open, not broken,
    and not inside a transaction (a statement cut off mid-way leaves it ACTIVE). Read from
    libpq's own status numbers (``CONNECTION_OK``, ``PQTRANS_IDLE``: both 0), without the
    ``ConnectionInfo`` and enum objects that ``conn.info.transaction_status`` builds."""
    pgconn = conn.pgconn
    return bool(not conn.broken and pgconn.status == 0 and pgconn.transaction_status == 0)


def refuse_connect_options(options: dict[str, Any], what: str) -> None:
    """Options that set up new connections do not apply to connections of the caller's."""
    for key in ("prepare_threshold", "connect_timeout"):
        if key in options:
            raise ConfigurationError(
                f"option {key!r} configures the connections the {what} opens; with a "
                "client passed in, configure its connections instead",
                argument=key,
            )


def libpq_uri(url: BackendURL, *own: str) -> str:
    """The URL for libpq: without jobfence's own query options ``own`` (everything else goes
    to libpq unchanged), ``postgres://`` spelt ``postgresql://``."""
    conninfo = url.without_options(*own)
    if conninfo.startswith("postgres://"):
        conninfo = "postgresql://" + conninfo[len("postgres://") :]
    return conninfo


def connect_kwargs(url_options: Mapping[str, Any], timeouts: Timeouts) -> dict[str, Any]:
    """libpq parameters for a new connection: ``connect_timeout`` (libpq counts whole seconds,
    at least 2, and bounds the whole opening: TCP, TLS, authentication), the TCP keepalives
    and ``tcp_user_timeout`` (sent data unacknowledged for ``timeout`` breaks the connection),
    each unless the URL sets that libpq parameter itself."""
    params: dict[str, Any] = {"connect_timeout": max(2, math.ceil(timeouts.connect))}
    defaults = {**KEEPALIVES, "tcp_user_timeout": math.ceil(timeouts.request * 1000)}
    params.update({k: v for k, v in defaults.items() if k not in url_options})
    return params


#: libpq's ``PGRES_TUPLES_OK`` (``psycopg.pq.ExecStatus.TUPLES_OK``): a result with rows
_TUPLES_OK = 2


def _returns_rows(cursor: Any) -> bool:
    """Whether the statement just run returned rows: its result's status, read without
    ``cursor.description``, which builds a column object per column on every call."""
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


async def execute_bounded_async(
    conn: Any, query: str, params: Any = None, *, limit: float
) -> tuple[list[tuple[Any, ...]], int]:
    """Run ``query`` on the psycopg ``AsyncConnection`` ``conn``: (rows, rowcount). If the
    reply has not arrived within ``limit`` seconds, the connection is broken off and closed
    and ``TimeoutError`` is raised (the statement may or may not have run)."""
    watch = guard_async(conn.fileno(), limit)
    try:
        cursor = await conn.execute(query, params)
        rows = await cursor.fetchall() if _returns_rows(cursor) else []
        count = cursor.rowcount
    except Exception as exc:
        if watch.done():
            await conn.close()
            raise request_timed_out(limit) from exc
        raise
    finally:
        fired = watch.done()
    if fired:  # the reply came just as the deadline passed: the socket is shut all the same
        await conn.close()
    return rows, count


def execute_bounded(
    conn: Any, query: str, params: Any = None, *, limit: float
) -> tuple[list[tuple[Any, ...]], int]:
    """The blocking twin of :func:`execute_bounded_async`, for a psycopg ``Connection``."""
    watch = guard(conn.fileno(), limit)
    try:
        cursor = conn.execute(query, params)
        rows = cursor.fetchall() if _returns_rows(cursor) else []
        count = cursor.rowcount
    except Exception as exc:
        if watch.done():
            conn.close()
            raise request_timed_out(limit) from exc
        raise
    finally:
        fired = watch.done()
    if fired:
        conn.close()
    return rows, count
