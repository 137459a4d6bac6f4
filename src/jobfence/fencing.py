# Generated from fencing_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Fenced writes: make a write under a lease commit only if no newer lease holder wrote first.

A lease can end while its holder still believes it holds it (a GC pause, SIGSTOP, a network
partition longer than the TTL). Another worker then takes the lease, with a larger fencing
token, and writes. When the paused holder wakes up and writes, :func:`fence_async` (sync:
:func:`fence`) rejects it: called first thing inside the transaction that makes the write, it
records ``token`` for ``resource`` in the table ``jobfence_fences`` and raises
:class:`~jobfence.errors.StaleToken` if a newer token has already been recorded. Because the
record is part of the caller's transaction, it commits or rolls back with the business write,
and the row lock it holds until then makes concurrent fenced transactions on one resource
take turns::

    async with conn.transaction():  # async
        await jobfence.fence_async(conn, "inventory:42", lease.token)
        await conn.execute("UPDATE inventory ...")

    with conn.transaction():  # sync
        jobfence.fence(conn, "inventory:42", lease.token)
        conn.execute("UPDATE inventory ...")

One atomic statement per dialect (shipped in ``backends/<server>/sql/fence.sql``):
PostgreSQL and SQLite use ``INSERT ... ON CONFLICT DO UPDATE ... WHERE old <= new
RETURNING``; MySQL/MariaDB use ``INSERT ... ON DUPLICATE KEY UPDATE`` keeping the larger token
and reporting the result through ``LAST_INSERT_ID(expr)``. Equal tokens pass (the same holder
may fence several times). The table is never created implicitly: run :func:`install_async`
(sync: :func:`install`) once, or apply the shipped SQL with your migration tool. See
docs/concepts/fencing.md.
"""

from __future__ import annotations

from typing import Any

from . import telemetry
from ._core.hooks import hook
from ._core.sqlconn import SqlConn, SQLDialect, adapt, check_ident, is_undefined_table
from ._core.transaction import own_transaction
from ._core.validate import check_name
from ._guard_spec import current_lease_var
from .backends import sql_dialect
from .errors import ConfigurationError, SchemaMissing, StaleToken

__all__ = ["DEFAULT_TABLE", "fence", "install"]

DEFAULT_TABLE = "jobfence_fences"
_MAX_TOKEN = 2**63 - 1


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


def _schema_missing(sc: SqlConn, dialect: SQLDialect, table: str) -> SchemaMissing:
    aborted = (
        f" On {dialect.title} the failed statement has aborted your transaction: roll it back."
        if dialect.failure_aborts_transaction
        else ""
    )
    args = "conn" if table == DEFAULT_TABLE else f"conn, table={table!r}"
    install = f"jobfence.fencing.install({args})"
    return SchemaMissing(
        f"the fencing table {table!r} does not exist: run "
        f"{install} once (and commit), or apply "
        f"{dialect.sql_file('fence.sql')} with your migration tool. fence() never creates "
        f"tables inside your transaction.{aborted}",
        backend=sc.dialect,
        operation="fence",
    )


def install(conn: Any, *, table: str = DEFAULT_TABLE) -> None:
    """Create the fencing table on ``conn`` if it does not exist (idempotent).

    Runs in the caller's transaction and does not commit: commit afterwards (on MySQL/MariaDB
    DDL commits implicitly). The same SQL ships in ``jobfence/backends/<server>/sql/fence.sql``.
    """
    check_ident(table, "table")
    sc = adapt(conn, operation="fence.install")
    sc.execute(sql_dialect(sc.dialect).fence_queries(table)["install"], {})


def _job_resource(resource: str | None, token: int | None) -> tuple[str, int]:
    """``resource`` and ``token`` as given, or both from the lease of the guarded job this
    runs in (its lock name and token), so the fenced resource is not a second string kept in
    sync with the lock template by hand."""
    if resource is not None and token is not None:
        return resource, token
    if resource is not None or token is not None:
        raise ConfigurationError(
            "pass both resource and token, or neither (inside a guarded job with a lock: "
            "its lock name and token)",
            argument="resource" if resource is None else "token",
        )
    lease = current_lease_var.get()
    if lease is None:
        raise ConfigurationError(
            "resource and token are needed here: only inside a jobfence.guarded job with a "
            "lock do they default to its lock name and token",
            argument="resource",
        )
    return lease.name, lease.token


def fence(
    conn: Any,
    resource: str | None = None,
    token: int | None = None,
    *,
    table: str = DEFAULT_TABLE,
) -> None:
    """Record ``token`` for ``resource`` in the caller's open transaction.

    Inside a :func:`jobfence.guarded` job with a lock, both may be left out: they are the
    job's lock name and its lease's token.

    Raises :class:`~jobfence.errors.StaleToken` (``resource``, ``token``, ``newest``) if a
    newer token has already written ``resource``; the caller should then roll back. Equal or
    newer tokens pass. ``conn`` is the caller's connection (see ``jobfence._core.sqlconn`` for the
    supported drivers); nothing is committed, begun or rolled back here. ``table`` is the
    fencing table (default ``jobfence_fences``, created by :func:`install`). Raises
    :class:`~jobfence.errors.SchemaMissing` if the table was not installed.
    """
    resource, token = _job_resource(resource, token)
    check_name(resource, argument="resource")
    _check_token(token)
    check_ident(table, "table")
    tx = own_transaction(conn)
    if tx is not None:  # e.g. a jobfence.testing simulated table or transaction
        hook("fence.check", resource=resource, token=token)
        recorded = tx.fence(resource, token, table)
        if recorded > token:
            telemetry.fence_rejection(tx.dialect)
            raise StaleToken(resource, token, recorded)
        return
    sc = adapt(conn, operation="fence")
    dialect = sql_dialect(sc.dialect)
    dialect.check_resource(resource)
    sql = dialect.fence_queries(table)
    hook("fence.check", resource=resource, token=token)
    try:
        result = sc.execute(sql["fence"], dialect.fence_params(resource, token))
        newest = dialect.fence_outcome(result, token)
        if newest is None:
            rows = (sc.execute(sql["newest"], dialect.newest_params(resource))).rows
            newest = int(rows[0][0]) if rows else token
    except Exception as exc:
        if is_undefined_table(exc):
            raise _schema_missing(sc, dialect, table) from exc
        raise
    if newest > token:
        telemetry.fence_rejection(sc.dialect)
        raise StaleToken(resource, token, newest)
