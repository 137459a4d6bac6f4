"""Inbox backend plugins, chosen by URL scheme (kept apart from the lock backends).

=================  ===========================================  =================
scheme             backend                                      extra
=================  ===========================================  =================
``memory://``      in-process (tests, the testing toolkit)      --
``sqlite:///p``    SQLite file, cross-process on one host       ``[sqlite]`` async
``redis://``       Redis (``rediss://`` for TLS)                ``[redis]``
``postgresql://``  PostgreSQL                                   ``[postgres]``
``mysql://``       MySQL 8 / MariaDB 10.6+                      ``[mysql]``
=================  ===========================================  =================
"""

from __future__ import annotations

from typing import Any

from .._url import parse_url
from ..backends import load_class

__all__ = ["INBOX_BACKENDS", "open_inbox_backend"]

# scheme -> (module stem, class stem, pip extra)
INBOX_BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "memory": ("memory", "MemoryInboxBackend", None),
    "sqlite": ("sqlite", "SQLiteInboxBackend", "sqlite"),
    "redis": ("redis", "RedisInboxBackend", "redis"),
    "rediss": ("redis", "RedisInboxBackend", "redis"),
    "postgresql": ("postgres", "PostgresInboxBackend", "postgres"),
    "postgres": ("postgres", "PostgresInboxBackend", "postgres"),
    "mysql": ("mysql", "MySQLInboxBackend", "mysql"),
    "mariadb": ("mysql", "MySQLInboxBackend", "mysql"),
}


def open_inbox_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the inbox backend for ``url`` (a str); ``options`` go to its constructor."""
    parsed = parse_url(url)
    cls = load_class(
        INBOX_BACKENDS, parsed, asynchronous=asynchronous, what="inbox", package=__name__
    )
    return cls(parsed, **options)
