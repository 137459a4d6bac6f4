# Generated from versioned_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Versioned (optimistic) updates: write only if the row is still at the version you read.

A retry that re-sends a write computed from an old read silently overwrites whatever changed
in between (a lost update). A *versioned* update makes the write conditional on the version
the unit of work read, and bumps it::

    UPDATE inventory SET stock = :s0, version = version + 1 WHERE id = :k0 AND version = :version

:func:`versioned_update_async` (sync: :func:`versioned_update`) builds that statement from
validated, quoted identifiers, runs it on the caller's connection inside the caller's
transaction, and returns the new version. When no row matched, it reads the row as the
database holds it now and raises :class:`~jobfence.errors.StaleVersion` with ``current`` (a
dict, or ``None`` if the row is gone): the caller should roll back and re-run the whole unit
of work from its reads (``jobfence.retry_unit`` does that).

MySQL/MariaDB report *changed* rows as the row count unless the client sets
``CLIENT_FOUND_ROWS``; the version bump always changes a matched row, so the count is
reliable either way. The follow-up read on MySQL is ``SELECT ... FOR UPDATE`` so that it sees
the latest committed row rather than the transaction's REPEATABLE READ snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._core.hooks import hook
from ._core.sqlconn import SqlConn, SQLDialect, adapt, check_ident
from ._core.transaction import own_transaction
from .backends import sql_dialect
from .errors import ConfigurationError, StaleVersion

__all__ = ["versioned_update"]


def _columns(mapping: object, argument: str, *, allow_empty: bool) -> dict[str, Any]:
    if not isinstance(mapping, Mapping):
        raise ConfigurationError(
            f"{argument} must be a mapping of column name -> value, got {type(mapping).__name__}",
            argument=argument,
        )
    if not mapping and not allow_empty:
        raise ConfigurationError(f"{argument} must name at least one column", argument=argument)
    for name in mapping:
        check_ident(name, argument, qualified=False)
    return dict(mapping)


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigurationError(
            f"version must be the int version you read, got {type(version).__name__}",
            argument="version",
        )
    return version


def versioned_update(
    conn: Any,
    table: str,
    key: Mapping[str, Any],
    version: int,
    values: Mapping[str, Any],
    *,
    version_column: str = "version",
) -> int:
    """Update the row ``key`` of ``table`` to ``values`` if it is still at ``version``.

    ``conn`` is the caller's connection or session, in its open transaction (psycopg,
    asyncpg, PyMySQL, aiomysql, sqlite3, aiosqlite, SQLAlchemy). ``key`` maps column names to
    values and must identify one row (its primary or a unique key); ``values`` maps the
    columns to set (may be empty: then only the version is bumped). ``version_column`` is the
    row's integer version column (default ``version``). Returns the new version
    (``version + 1``). Raises :class:`~jobfence.errors.StaleVersion` (``table``, ``key``,
    ``expected``, ``current``) when the row is at another version or gone. Nothing is
    committed, begun or rolled back here.
    """
    check_ident(table, "table")
    check_ident(version_column, "version_column", qualified=False)
    keys = _columns(key, "key", allow_empty=False)
    sets = _columns(values, "values", allow_empty=True)
    expected = _check_version(version)
    if version_column in sets or version_column in keys:
        raise ConfigurationError(
            f"the version column {version_column!r} is bumped by versioned_update itself: "
            "leave it out of key and values",
            argument="values" if version_column in sets else "key",
        )
    for col, val in keys.items():
        if val is None:
            raise ConfigurationError(
                f"key column {col!r} is None: SQL '= NULL' never matches a row", argument="key"
            )
    tx = own_transaction(conn)
    if tx is not None:  # e.g. a jobfence.testing simulated table or transaction
        hook("versioned.update", table=table, key=keys, version=expected)
        return tx.versioned_update(table, keys, expected, sets, version_column)
    sc = adapt(conn, operation="versioned_update")
    dialect = sql_dialect(sc.dialect)
    quote = dialect.quote
    ver = quote(version_column)
    # numbered parameter names: column names need not be valid parameter names
    assignments = [f"{quote(c)} = :s{i}" for i, c in enumerate(sets)] + [f"{ver} = {ver} + 1"]
    where = " AND ".join(f"{quote(c)} = :k{i}" for i, c in enumerate(keys))
    sql = f"UPDATE {quote(table)} SET {', '.join(assignments)} WHERE {where} AND {ver} = :version"
    params = {f"s{i}": v for i, v in enumerate(sets.values())}
    params.update({f"k{i}": v for i, v in enumerate(keys.values())})
    params["version"] = expected
    hook("versioned.update", table=table, key=keys, version=expected)
    result = sc.execute(sql, params)
    if result.rowcount == 0:
        current = _current(sc, dialect, table, keys)
        found = (
            "the row is gone" if current is None else f"it is at {current.get(version_column)!r}"
        )
        raise StaleVersion(
            f"stale version for {table} {keys!r}: expected {version_column} = {expected!r}, "
            f"but {found}; re-run the unit of work from its reads",
            table=table,
            key=keys,
            expected=expected,
            current=current,
        )
    return expected + 1


def _current(
    sc: SqlConn, dialect: SQLDialect, table: str, keys: dict[str, Any]
) -> dict[str, Any] | None:
    quote = dialect.quote
    where = " AND ".join(f"{quote(c)} = :k{i}" for i, c in enumerate(keys))
    result = sc.execute(
        f"SELECT * FROM {quote(table)} WHERE {where}{dialect.locking_read}",
        {f"k{i}": v for i, v in enumerate(keys.values())},
    )
    if not result.rows:
        return None
    return dict(zip(result.columns, result.rows[0], strict=True))
