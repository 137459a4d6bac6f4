"""``redis://`` / ``rediss://``: locks, inbox and queues on Redis (redis-py), one Lua script per
verb (queues on Redis Streams).

Modules: ``locks`` / ``locks_async``, ``inbox`` / ``inbox_async``, ``queue`` /
``queue_async``, ``client`` /
``client_async`` (the one client builder both parts use), ``keys`` (every key of every part,
built and read back), ``migrate`` (moves keys of an earlier layout), ``lua/`` (one file per
script).
``pip install 'jobfence[redis]'``.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = [
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncRedisInboxBackend",
    "AsyncRedisLockBackend",
    "AsyncRedisQueueBackend",
    "RedisInboxBackend",
    "RedisLockBackend",
    "RedisQueueBackend",
]

#: a namespace is a key prefix (``<namespace>:lock:{name}``, encoded when it holds a brace:
#: see ``keys.py``): any non-empty str, capped
NAMESPACE_LIMIT = 64
#: the inbox ``table`` is a key prefix too, kept an SQL identifier like on the SQL servers
TABLE_LIMIT = 63

_LAZY = {
    "RedisLockBackend": "locks",
    "AsyncRedisLockBackend": "locks_async",
    "RedisInboxBackend": "inbox",
    "AsyncRedisInboxBackend": "inbox_async",
    "RedisQueueBackend": "queue",
    "AsyncRedisQueueBackend": "queue_async",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
