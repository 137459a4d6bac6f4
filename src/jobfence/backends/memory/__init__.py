"""``memory://``: in-process locks, inbox, queues and outbox, for tests and the testing toolkit.

It passes the same conformance suites as the server backends. ``memory://name`` selects a
separate store, and so does each lock ``namespace`` and inbox ``table``; sync and async clients
of one URL (and namespace or table) in one process share it.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = [
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncMemoryInboxBackend",
    "AsyncMemoryLockBackend",
    "AsyncMemoryOutboxBackend",
    "AsyncMemoryQueueBackend",
    "MemoryInboxBackend",
    "MemoryInboxStore",
    "MemoryLockBackend",
    "MemoryOutboxBackend",
    "MemoryOutboxStore",
    "MemoryQueueBackend",
    "MemoryQueueStore",
    "MemoryStore",
    "get_store",
]

#: a namespace is any non-empty str, capped (the memory backend keeps one store per URL and
#: namespace)
NAMESPACE_LIMIT = 64
#: the inbox ``table`` names a store, kept an SQL identifier like on the SQL servers
TABLE_LIMIT = 63

_LAZY = {
    "MemoryLockBackend": "locks",
    "AsyncMemoryLockBackend": "locks",
    "MemoryStore": "locks",
    "get_store": "locks",
    "MemoryInboxBackend": "inbox",
    "AsyncMemoryInboxBackend": "inbox",
    "MemoryInboxStore": "inbox",
    "MemoryQueueBackend": "queue",
    "AsyncMemoryQueueBackend": "queue",
    "MemoryQueueStore": "queue",
    "MemoryOutboxBackend": "outbox",
    "AsyncMemoryOutboxBackend": "outbox",
    "MemoryOutboxStore": "outbox",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
