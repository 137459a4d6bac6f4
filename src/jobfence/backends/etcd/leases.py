"""The length of an etcd lease, shared by both parts (locks and inbox).

etcd counts leases in whole seconds, and a server never keeps one shorter than its minimum
(1.5 election timeouts rounded up: 2 s with etcd's default 1 s election timeout). A lock's
ttl and an inbox claim's ttl become a lease of :func:`lease_seconds`: rounded UP, at least
:data:`MIN_LEASE_SECONDS`. The holder still counts its own ttl, from before its request, on
its monotonic clock, so it considers its lease or claim lost before the server frees it.
"""

from __future__ import annotations

import math

__all__ = ["MIN_LEASE_SECONDS", "lease_seconds"]

#: the shortest lease jobfence asks etcd for: a 1 s lease can end before the transaction
#: that attaches the key to it is committed on a loaded server (and etcd's own minimum is
#: 2 s with its default 1 s election timeout)
MIN_LEASE_SECONDS = 2


def lease_seconds(ttl: float) -> int:
    """``ttl`` seconds as the whole seconds of an etcd lease: rounded up (float noise as in
    ``2.0000000001`` does not add a second), at least :data:`MIN_LEASE_SECONDS`."""
    return max(MIN_LEASE_SECONDS, math.ceil(round(ttl, 6)))
