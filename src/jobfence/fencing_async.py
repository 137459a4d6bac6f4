"""Fenced writes: make a write under a lease commit only if no newer lease holder wrote first.

A lease can end while its holder still believes it holds it (a GC pause, SIGSTOP, a network
partition longer than the TTL). Another worker then takes the lease, with a larger fencing
token, and writes. When the paused holder wakes up and writes, :func:`fence_async` rejects
it: called first thing inside the transaction that makes the write, it records ``token`` for
``resource`` in the table ``jobfence_fences`` and raises :class:`~jobfence.errors.StaleToken`
if a newer token has already been recorded. Because the record is part of the caller's
transaction, it commits or rolls back with the business write, and the row lock it holds
until then makes concurrent fenced transactions on one resource take turns::

    async with conn.transaction():
        await jobfence.fence_async(conn, "inventory:42", lease.token)
        await conn.execute("UPDATE inventory ...")

One atomic statement per dialect (shipped in ``backends/sql/fence_<dialect>.sql``):
PostgreSQL and SQLite use ``INSERT ... ON CONFLICT DO UPDATE ... WHERE old <= new
RETURNING``; MySQL/MariaDB use ``INSERT ... ON DUPLICATE KEY UPDATE`` keeping the larger token
and reporting the result through ``LAST_INSERT_ID(expr)``. Equal tokens pass (the same holder
may fence several times). The table is never created implicitly: run :func:`install_async`
once, or apply the shipped SQL with your migration tool. See docs/fencing.md.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ._core.hooks import ahook
from ._core.sqlconn import AsyncSqlConn, adapt_async, check_ident, is_undefined_table, quote_ident
from ._core.sqlfiles import statements
from ._core.validate import check_name
from .errors import ConfigurationError, SchemaMissing, StaleToken

__all__ = ["DEFAULT_TABLE", "fence_async", "install_async"]

DEFAULT_TABLE = "jobfence_fences"
_MAX_TOKEN = 2**63 - 1
#: the backend package that ships each dialect's fence SQL
_PACKAGE = {"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"}


def _sql(sc: AsyncSqlConn, table: str) -> dict[str, str]:
    return statements(
        f"{_PACKAGE[sc.dialect]}/sql/fence.sql", DEFAULT_TABLE, quote_ident(sc.dialect, table)
    )


def _check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise ConfigurationError(
            f"token must be an int fencing token (lease.token), got {type(token).__name__}",
            argument="token",
        )
    if not 0 <= token <= _MAX_TOKEN:
        raise ConfigurationError(
            f"token must be between 0 and 2**63-1, got {token}", argument="token"
        )
    return token


def _schema_missing(sc: AsyncSqlConn, table: str) -> SchemaMissing:
    aborted = (
        " On PostgreSQL the failed statement has aborted your transaction: roll it back."
        if sc.dialect == "postgresql"
        else ""
    )
    args = "conn" if table == DEFAULT_TABLE else f"conn, table={table!r}"
    return SchemaMissing(
        f"the fencing table {table!r} does not exist: run "
        f"await jobfence.fencing_async.install_async({args}) once (and commit), or apply "
        f"backends/sql/fence_{sc.dialect}.sql with your migration tool. fence() never creates "
        f"tables inside your transaction.{aborted}",
        backend=sc.dialect,
        operation="fence",
    )


async def install_async(conn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Create the fencing table on ``conn`` if it does not exist (idempotent).

    Runs in the caller's transaction and does not commit: commit afterwards (on MySQL/MariaDB
    DDL commits implicitly). The same SQL ships in ``jobfence/backends/sql/fence_*.sql``.
    """
    check_ident(table, "table")
    sc = adapt_async(conn)
    await sc.execute(_sql(sc, table)["install"])


async def fence_async(conn: Any, resource: str, token: int, *, table: str = DEFAULT_TABLE) -> None:
    """Record ``token`` for ``resource`` in the caller's open transaction.

    Raises :class:`~jobfence.errors.StaleToken` (``resource``, ``token``, ``newest``) if a
    newer token has already written ``resource``; the caller should then roll back. Equal or
    newer tokens pass. ``conn`` is the caller's connection (see ``jobfence._sqlconn`` for the
    supported drivers); nothing is committed, begun or rolled back here. Raises
    :class:`~jobfence.errors.SchemaMissing` if the table was not installed.
    """
    check_name(resource, argument="resource")
    _check_token(token)
    check_ident(table, "table")
    sc = adapt_async(conn)
    if sc.dialect == "postgresql" and "\x00" in resource:
        raise ConfigurationError(
            "resource must not contain NUL characters on PostgreSQL (text cannot store them)",
            argument="resource",
        )
    sql = _sql(sc, table)
    await ahook("fence.check", resource=resource, token=token)
    try:
        if sc.dialect == "mysql":
            newest = await _fence_mysql(sc, sql, resource, token)
        else:
            result = await sc.execute(sql["fence"], (resource, token))
            if result.rows:
                return
            rows = (await sc.execute(sql["newest"], (resource,))).rows
            newest = int(rows[0][0]) if rows else token
    except Exception as exc:
        if is_undefined_table(exc):
            raise _schema_missing(sc, table) from exc
        raise
    if newest > token:
        raise StaleToken(resource, token, newest)


async def _fence_mysql(sc: AsyncSqlConn, sql: dict[str, str], resource: str, token: int) -> int:
    """Run the MySQL upsert; return the token the row holds afterwards."""
    name = resource.encode("utf-8")
    key = hashlib.sha256(name).hexdigest()
    result = await sc.execute(sql["fence"], (key, name.hex(), token, token, token, token))
    if result.lastrowid is not None:
        return int(result.lastrowid)
    rows = (await sc.execute(sql["newest"], (key,))).rows  # pragma: no cover - driver fallback
    return int(rows[0][0]) if rows else token  # pragma: no cover
