"""``postgresql://``: locks (lease and session modes), inbox and queue on PostgreSQL
(psycopg 3).

Modules: ``locks`` / ``locks_async`` (``PostgresLockBackend``: lease mode;
``PostgresSessionLockBackend``: session mode), ``inbox`` / ``inbox_async``, ``queue`` /
``queue_async``, ``common`` (text mapping, reusable connections), ``dialect`` (what fence,
claim_in, versioned_update and inbox.install(conn) need to know about PostgreSQL; the name
limits ``NAMESPACE_LIMIT``, ``TABLE_LIMIT`` and ``QUEUE_TABLE_LIMIT``), ``sql/``
(``locks.sql``, ``inbox.sql``, ``queue.sql``, ``fence.sql``).
``pip install 'jobfence[postgres]'``.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = [
    "LEASE_CAPABILITIES",
    "MODES",
    "NAMESPACE_LIMIT",
    "POLLING_CAPABILITIES",
    "QUEUE_TABLE_LIMIT",
    "SCHEMA_VERSION",
    "SESSION_CAPABILITIES",
    "TABLE_LIMIT",
    "AsyncPostgresInboxBackend",
    "AsyncPostgresLockBackend",
    "AsyncPostgresQueueBackend",
    "AsyncPostgresSessionLockBackend",
    "PostgresInboxBackend",
    "PostgresLockBackend",
    "PostgresQueueBackend",
    "PostgresSessionLockBackend",
    "advisory_key",
    "load_queries",
    "stored_name",
]

_LAZY = {
    "NAMESPACE_LIMIT": "dialect",
    "TABLE_LIMIT": "dialect",
    "QUEUE_TABLE_LIMIT": "dialect",
    "LEASE_CAPABILITIES": "locks",
    "MODES": "locks",
    "POLLING_CAPABILITIES": "locks",
    "SCHEMA_VERSION": "locks",
    "SESSION_CAPABILITIES": "locks",
    "PostgresLockBackend": "locks",
    "PostgresSessionLockBackend": "locks",
    "advisory_key": "locks",
    "load_queries": "locks",
    "stored_name": "locks",
    "AsyncPostgresLockBackend": "locks_async",
    "AsyncPostgresSessionLockBackend": "locks_async",
    "PostgresInboxBackend": "inbox",
    "AsyncPostgresInboxBackend": "inbox_async",
    "PostgresQueueBackend": "queue",
    "AsyncPostgresQueueBackend": "queue_async",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
