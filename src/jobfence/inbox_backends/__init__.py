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

import importlib
from typing import Any

from .._url import parse_url
from ..errors import ConfigurationError

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

#: modules whose sync and async classes live in one hand-written file
_SINGLE_FILE = {"memory"}


def open_inbox_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the inbox backend for ``url`` (a str); ``options`` go to its constructor."""
    parsed = parse_url(url)
    try:
        module_stem, class_stem, extra = INBOX_BACKENDS[parsed.scheme]
    except KeyError:
        raise ConfigurationError(
            f"url scheme {parsed.scheme!r} has no inbox backend; allowed: "
            + ", ".join(f"{s}://" for s in INBOX_BACKENDS),
            argument="url",
        ) from None
    module_name = (
        module_stem if (module_stem in _SINGLE_FILE or not asynchronous) else module_stem + "_async"
    )
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(f"{__name__}."):
            raise ConfigurationError(
                f"the {parsed.scheme}:// inbox backend is not available in this version",
                argument="url",
            ) from None
        hint = f" Install it with: pip install 'jobfence[{extra}]'" if extra else ""
        raise ConfigurationError(
            f"the {parsed.scheme}:// backend needs the missing package {exc.name!r}.{hint}",
            argument="url",
        ) from exc
    cls = getattr(module, ("Async" if asynchronous else "") + class_stem)
    return cls(parsed, **options)
