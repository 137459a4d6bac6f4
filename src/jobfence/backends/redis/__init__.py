"""``redis://`` / ``rediss://``: locks and inbox on Redis (redis-py), one Lua script per verb.

Modules: ``locks`` / ``locks_async``, ``inbox`` / ``inbox_async``, ``client`` /
``client_async`` (the one client builder both parts use), ``lua/`` (one file per script).
``pip install 'jobfence[redis]'``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncRedisInboxBackend",
    "AsyncRedisLockBackend",
    "RedisInboxBackend",
    "RedisLockBackend",
]

#: a namespace is a key prefix (``<namespace>:lock:{name}``): any non-empty str, capped
NAMESPACE_LIMIT = 64
#: the inbox ``table`` is a key prefix too, kept an SQL identifier like on the SQL servers
TABLE_LIMIT = 63

_LAZY = {
    "RedisLockBackend": "locks",
    "AsyncRedisLockBackend": "locks_async",
    "RedisInboxBackend": "inbox",
    "AsyncRedisInboxBackend": "inbox_async",
}


def __getattr__(name: str) -> Any:
    """Import on first use, so that importing one module of this package does not import
    every driver (e.g. the async clients' driver for a sync-only user)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
