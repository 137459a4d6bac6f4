"""``sqlite:///path``: locks, inbox and queues in one SQLite file (the embedded default).

Modules: ``locks`` / ``locks_async`` (leases, FIFO hand-off), ``inbox`` / ``inbox_async``,
``queue`` / ``queue_async`` (one table for every queue name), ``common`` (options, namespace
check, in-process waiters), ``dialect`` (what fence, claim_in, versioned_update and
inbox.install(conn) need to know about SQLite; the name limits ``NAMESPACE_LIMIT`` and
``TABLE_LIMIT``), ``sql/`` (``locks.sql``, ``inbox.sql``, ``queue.sql``, ``fence.sql``).
The sync clients need only the standard library; the async ones need ``aiosqlite``
(``pip install 'jobfence[sqlite]'``).
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = [
    "CAPABILITIES",
    "NAMESPACE_LIMIT",
    "QUEUE_CAPABILITIES",
    "TABLE_LIMIT",
    "AsyncSQLiteInboxBackend",
    "AsyncSQLiteLockBackend",
    "AsyncSQLiteQueueBackend",
    "SQLiteInboxBackend",
    "SQLiteLockBackend",
    "SQLiteQueueBackend",
]

_LAZY = {
    "NAMESPACE_LIMIT": "dialect",
    "TABLE_LIMIT": "dialect",
    "SQLiteLockBackend": "locks",
    "AsyncSQLiteLockBackend": "locks_async",
    "SQLiteInboxBackend": "inbox",
    "AsyncSQLiteInboxBackend": "inbox_async",
    "SQLiteQueueBackend": "queue",
    "AsyncSQLiteQueueBackend": "queue_async",
    "CAPABILITIES": "common",
    "QUEUE_CAPABILITIES": "common",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
