"""Every backend keeps (namespace, name) pairs apart: names and namespaces that would meet if
they were only joined with a separator (``N`` + ``zz:lock:{k`` and ``N:lock:{zz`` + ``k``; ``a``
+ ``b_c`` and ``a_b`` + ``c``) are distinct locks, and an inbox key shaped like a lock's key is
an inbox key, on the inbox whose table is the lock namespace. On the SQL backends the
namespace and the name are separate (the table, a column; PostgreSQL's session mode hashes
them with a NUL between, which no SQL identifier holds); Redis encodes them
(``backends/redis/keys.py``); memory keeps a store per namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

import jobfence
from jobfence import ClaimState, ConfigurationError
from tests.conformance.specs import INBOX, LOCKS, Spec, new_namespace, spec_params

pytestmark = pytest.mark.timeout(120)

NAMES = [
    "k",
    "zz",
    "zz:lock:{k",
    "zz_lock_k",
    "lock_k",
    "lock:{k}",
    "lock:{k}:tok",
    "{k}",
    "k}",
    "%7Bk%7D",
    "q:{x}:s",
    "ü:名",
]


def _namespaces(spec: Spec, base: str) -> list[str]:
    """Namespaces that spell one another's start: SQL identifiers on the SQL backends, any
    text on Redis and memory."""
    if spec.backend in ("postgres", "mysql", "sqlite"):
        return [base, base + "_zz", base + "_lock", base + "_lock_zz"]
    return [base, base + ":lock:{zz", base + ":lock", base + "_zz", base + "%7B", base + "{"]


@pytest.mark.parametrize("spec", spec_params(LOCKS))
def test_names_and_namespaces_never_meet(spec: Spec, tmp_path: Path) -> None:
    url, base = spec.make_url(tmp_path), new_namespace()
    namespaces = _namespaces(spec, base)
    clients = [jobfence.Locks(url, namespace=ns) for ns in namespaces]
    try:
        leases = [c.try_acquire(name, ttl=60) for c in clients for name in NAMES]
        assert all(lease is not None for lease in leases)
        for c in clients:
            try:
                held = [name for name, _ in c.holders()]
            except ConfigurationError:  # PostgreSQL session mode lists no names
                continue
            assert held == sorted(NAMES)
        for lease in leases:
            assert lease is not None and lease.release() is True
    finally:
        for c in clients:
            c.close()
        spec.cleanup(url, base)


@pytest.mark.parametrize("spec", spec_params(INBOX))
def test_an_inbox_key_shaped_like_a_lock_key_is_an_inbox_key(spec: Spec, tmp_path: Path) -> None:
    url, base = spec.make_url(tmp_path), new_namespace()
    table = base + "_inbox"
    locks = jobfence.Locks(url, namespace=table)
    inbox = jobfence.Inbox(url, table=table)
    try:
        lease = locks.try_acquire("k", ttl=60)
        assert lease is not None
        claims = [inbox.claim(key, ttl=60) for key in NAMES]
        assert [c.state for c in claims] == [ClaimState.NEW] * len(NAMES)
        assert sorted(info.key for info in inbox.claims()) == sorted(NAMES)
        assert inbox.forget("lock:{k}") is True
        assert inbox.forget("lock:{k}") is False
        assert locks.holder("k") is not None
        lease.extend(60)  # still held: LockLost otherwise
        assert lease.release() is True
    finally:
        inbox.close()
        locks.close()
        spec.cleanup(url, base)
