"""``etcd://`` / ``etcds://``: locks and inbox on etcd v3 (3.4 or later), through its JSON
gRPC gateway over httpx.

Modules: ``locks`` / ``locks_async``, ``inbox`` / ``inbox_async``, ``client`` /
``client_async`` (the HTTP client both parts use: endpoints, failover, timeouts, errors),
``keys`` (every key of both parts, built and read back), ``doctor`` (the server checks).
``pip install 'jobfence[etcd]'``.

Why the JSON gateway and httpx: one async source gives both flavours (the sync modules are
generated from it, as for every other backend), with no gRPC or protobuf dependency.
python-etcd3 is unmaintained and pins an old protobuf; aetcd is async only.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = [
    "NAMESPACE_LIMIT",
    "TABLE_LIMIT",
    "AsyncEtcdInboxBackend",
    "AsyncEtcdLockBackend",
    "EtcdInboxBackend",
    "EtcdLockBackend",
]

#: a namespace is a key prefix (percent-encoded, so any text): any non-empty str, capped
NAMESPACE_LIMIT = 64
#: the inbox ``table`` is a key prefix too
TABLE_LIMIT = 63

_LAZY = {
    "EtcdLockBackend": "locks",
    "AsyncEtcdLockBackend": "locks_async",
    "EtcdInboxBackend": "inbox",
    "AsyncEtcdInboxBackend": "inbox_async",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
