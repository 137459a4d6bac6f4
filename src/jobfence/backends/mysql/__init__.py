"""``mysql://`` / ``mariadb://``: locks and inbox on MySQL 8 / MariaDB 10.6+ (PyMySQL, aiomysql).

Modules: ``locks`` / ``locks_async``, ``inbox`` / ``inbox_async``, ``common`` (options,
namespace check, name hashing, the lock statements, error kinds), ``dialect`` (what fence,
claim_in, versioned_update and inbox.install(conn) need to know about MySQL/MariaDB; the name
limits ``NAMESPACE_LIMIT`` and ``TABLE_LIMIT``), ``sql/`` (``locks.sql``, ``inbox.sql``,
``fence.sql``). ``pip install 'jobfence[mysql]'``.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

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

__getattr__ = lazy_attributes(__name__, _LAZY)
