"""``memory://``: in-process locks and inbox, for tests and the testing toolkit.

It passes the same conformance suites as the server backends. ``memory://name`` selects a
separate store; sync and async clients of one URL in one process share it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncMemoryInboxBackend",
    "AsyncMemoryLockBackend",
    "MemoryInboxBackend",
    "MemoryInboxStore",
    "MemoryLockBackend",
    "MemoryStore",
    "get_store",
]

#: a namespace is any non-empty str, capped (the memory backend keeps one store per URL)
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
}


def __getattr__(name: str) -> Any:
    """Import on first use, so that importing one module of this package does not import
    every driver (e.g. the async clients' driver for a sync-only user)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
