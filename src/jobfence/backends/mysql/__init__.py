"""``mysql://`` / ``mariadb://``: locks and inbox on MySQL 8 / MariaDB 10.6+ (PyMySQL, aiomysql).

Modules: ``locks`` / ``locks_async``, ``inbox`` / ``inbox_async``, ``common`` (options,
namespace check, name hashing, the lock statements, error kinds), ``dialect`` (what fence,
claim_in, versioned_update and inbox.install(conn) need to know about MySQL/MariaDB; the name
limits ``NAMESPACE_LIMIT`` and ``TABLE_LIMIT``), ``sql/`` (``locks.sql``, ``inbox.sql``,
``fence.sql``). ``pip install 'jobfence[mysql]'``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CAPABILITIES",
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncMySQLInboxBackend",
    "AsyncMySQLLockBackend",
    "MySQLInboxBackend",
    "MySQLLockBackend",
]

_LAZY = {
    "NAMESPACE_LIMIT": "dialect",
    "TABLE_LIMIT": "dialect",
    "MySQLLockBackend": "locks",
    "AsyncMySQLLockBackend": "locks_async",
    "MySQLInboxBackend": "inbox",
    "AsyncMySQLInboxBackend": "inbox_async",
    "CAPABILITIES": "common",
}


def __getattr__(name: str) -> Any:
    """Import on first use, so that importing one module of this package does not import
    every driver (e.g. the async clients' driver for a sync-only user)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
