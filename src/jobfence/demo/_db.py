"""A DB-API connection to the demo's database, from a URL (sqlite, postgresql, mysql)."""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import unquote, urlsplit

from ..backends import parse_backend_url
from ..backends.sqlite.common import sqlite_path
from ..errors import ConfigurationError

SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")


def dialect_of(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``mysql`` for a database URL; ``ConfigurationError``
    (argument ``db``) for any other."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"--db must be a sqlite:///FILE, postgresql:// or mysql:// URL, got {url!r}",
            argument="db",
        )
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


def connect(url: str) -> Any:
    """A new connection; transactions begin implicitly and end with ``commit``/``rollback``."""
    dialect = dialect_of(url)
    if dialect == "sqlite":
        conn = sqlite3.connect(
            sqlite_path(parse_backend_url(url, argument="db")), timeout=30, check_same_thread=False
        )
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1))
    import pymysql

    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/") or None,
        ssl_disabled=True,
    )


def begin_write(conn: Any, dialect: str) -> None:
    """Start a write transaction that holds the write lock from its first read (SQLite:
    ``BEGIN IMMEDIATE``; the servers lock rows with ``FOR UPDATE`` instead)."""
    if dialect == "sqlite":
        conn.execute("BEGIN IMMEDIATE")


def for_update(dialect: str) -> str:
    """The suffix that locks the rows a SELECT reads, until the transaction ends."""
    return "" if dialect == "sqlite" else " FOR UPDATE"


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
                + ("?" if dialect_of(url) == "sqlite" else "%s"),
                (inbox,),
            )
        conn.commit()
    finally:
        conn.close()
