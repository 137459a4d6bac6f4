"""A DB-API connection to the demo's database, from a URL (sqlite, postgresql, mysql)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .._core.sqlconn import SQLDialect
from ..backends import registered, sql_dialect
from ..errors import ConfigurationError


def dialect_of(url: str) -> SQLDialect:
    """The SQL dialect of a database URL (``sqlite:///FILE``, ``postgresql://``,
    ``mysql://``, or another scheme of those backends; ``+driver`` is ignored);
    ``ConfigurationError`` (argument ``db``) for any other."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    info = registered().get(scheme)
    if info is None or info.dialect is None:
        raise ConfigurationError(
            f"--db must be a sqlite:///FILE, postgresql:// or mysql:// URL, got {url!r}",
            argument="db",
        )
    return sql_dialect(info.dialect)


def connect(url: str) -> Any:
    """A new connection; transactions begin implicitly and end with ``commit``/``rollback``."""
    return dialect_of(url).dbapi_connect(url)


def begin_write(conn: Any, dialect: SQLDialect) -> None:
    """Start a write transaction that holds the write lock from its first read (SQLite:
    ``BEGIN IMMEDIATE``; the servers lock rows with ``FOR UPDATE`` instead)."""
    if dialect.begin_write:
        conn.execute(dialect.begin_write)


def for_update(dialect: SQLDialect) -> str:
    """The suffix that locks the rows a SELECT reads, until the transaction ends."""
    return dialect.row_lock


def set_up_file(conn: Any, url: str) -> None:
    """Set up a database file before first use (SQLite: WAL); nothing on a server."""
    for statement in dialect_of(url).setup_statements:
        conn.execute(statement)


def drop_tables(url: str, names: list[str], *, inbox: str | None = None) -> None:
    """Drop ``names`` (and forget ``inbox``'s schema record) on a server database."""
    conn = connect(url)
    try:
        cur = conn.cursor()
        for name in names:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
        if inbox is not None:
            cur.execute(
                "DELETE FROM jobfence_inbox_schema WHERE table_name = "
                + dialect_of(url).dbapi_param,
                (inbox,),
            )
        conn.commit()
    finally:
        conn.close()
