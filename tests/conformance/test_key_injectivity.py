"""Every backend keeps (namespace, name) pairs apart: names and namespaces that would meet if
they were only joined with a separator (``N`` + ``zz:lock:{k`` and ``N:lock:{zz`` + ``k``; ``a``
+ ``b_c`` and ``a_b`` + ``c``) are distinct locks, and an inbox key shaped like a lock's key is
an inbox key, on the inbox whose table is the lock namespace. On the SQL backends the
namespace and the name are separate (the table, a column; PostgreSQL's session mode hashes
them with a NUL between, which no SQL identifier holds); Redis encodes them
(``backends/redis/keys.py``); memory keeps a store per namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    if spec.id == "postgres-session":
        # it hashes the namespace with the name, and holds a connection per lease: two
        # namespaces (24 connections at once, not 48, beside the other tests' on a server
        # that allows 100)
        namespaces = [namespaces[0], namespaces[-1]]
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


_PIECES = [":", "_", "{", "}", "%", "%7B", "lock", "q", "\x00", "ü", "名"]
_names = (
    st.lists(
        st.one_of(st.sampled_from(_PIECES), st.text(alphabet="ab:_{}", max_size=2)),
        min_size=1,
        max_size=6,
    )
    .map("".join)
    .filter(bool)
)


@pytest.fixture(params=spec_params(LOCKS))
def three_namespaces(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[jobfence.Locks]]:
    """Lock clients of one backend on three namespaces that spell one another's start."""
    spec: Spec = request.param
    url, base = spec.make_url(tmp_path_factory.mktemp("keys")), new_namespace()
    clients = [jobfence.Locks(url, namespace=ns) for ns in _namespaces(spec, base)[:3]]
    yield clients
    for c in clients:
        c.close()
    spec.cleanup(url, base)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pairs=st.lists(st.tuples(st.integers(0, 2), _names), min_size=1, max_size=6, unique=True))
def test_generated_names_never_meet(
    three_namespaces: list[jobfence.Locks], pairs: list[tuple[int, str]]
) -> None:
    leases = [three_namespaces[i].try_acquire(name, ttl=60) for i, name in pairs]
    try:
        assert all(lease is not None for lease in leases), pairs
        for i, c in enumerate(three_namespaces):
            try:
                held = [name for name, _ in c.holders()]
            except ConfigurationError:  # PostgreSQL session mode lists no names
                continue
            assert held == sorted({name for j, name in pairs if j == i})
    finally:
        for lease in leases:
            if lease is not None:
                lease.release()
