"""``sqlite:///path``: locks and inbox in one SQLite file (the embedded default).

Modules: ``locks`` / ``locks_async`` (leases, FIFO hand-off), ``inbox`` / ``inbox_async``,
``common`` (options, namespace check, in-process waiters), ``dialect`` (what fence, claim_in,
versioned_update and inbox.install(conn) need to know about SQLite; the name limits
``NAMESPACE_LIMIT`` and ``TABLE_LIMIT``), ``sql/`` (``locks.sql``, ``inbox.sql``,
``fence.sql``). The sync clients need only the standard library; the async
ones need ``aiosqlite`` (``pip install 'jobfence[sqlite]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CAPABILITIES",
    "NAMESPACE_LIMIT",
    "QUEUE_CAPABILITIES",
    "TABLE_LIMIT",
    "AsyncSQLiteInboxBackend",
    "AsyncSQLiteLockBackend",
    "SQLiteInboxBackend",
    "SQLiteLockBackend",
]

_LAZY = {
    "NAMESPACE_LIMIT": "dialect",
    "TABLE_LIMIT": "dialect",
    "SQLiteLockBackend": "locks",
    "AsyncSQLiteLockBackend": "locks_async",
    "SQLiteInboxBackend": "inbox",
    "AsyncSQLiteInboxBackend": "inbox_async",
    "CAPABILITIES": "common",
    "QUEUE_CAPABILITIES": "common",
}


def __getattr__(name: str) -> Any:
    """Import on first use, so that importing one module of this package does not import
    every driver (e.g. the async clients' driver for a sync-only user)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
