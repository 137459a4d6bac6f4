"""Bad input is a ConfigurationError naming the argument, and leaves nothing behind.

Fingerprints every backend can store (no lone surrogates, no NUL; bytes never equal to a str),
results the serializer cannot store, ``memory://`` options and namespaces, and the database
number of a Redis URL. Real servers wherever a backend is involved.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

import jobfence
from jobfence import ClaimState, ConfigurationError, FingerprintMismatch
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL, mysql_params

BACKENDS = ["memory", "sqlite", "redis", "postgres", "mysql"]


def _url(backend: str, tmp_path: Path) -> str:
    return {
        "memory": f"memory://{uuid.uuid4().hex}",
        "sqlite": f"sqlite:///{tmp_path}/inbox.db",
        "redis": REDIS_URL,
        "postgres": POSTGRES_URL,
        "mysql": MYSQL_URL,
    }[backend]


@pytest.fixture(params=BACKENDS)
def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[jobfence.Inbox]:
    box = jobfence.Inbox(_url(request.param, tmp_path), table=f"bad_{uuid.uuid4().hex[:12]}")
    try:
        yield box
    finally:
        box.drop()
        box.close()


# ----------------------------------------------------------------------------- fingerprints


@pytest.mark.parametrize(
    "fingerprint",
    ["\ud800", "sha256:\udcff", "a\x00b", "\x00", "bytes:78", b"", ""],
    ids=[
        "surrogate",
        "surrogate-in-digest",
        "nul",
        "only-nul",
        "bytes-prefix",
        "no-bytes",
        "no-str",
    ],
)
def test_a_fingerprint_no_backend_can_store_is_refused_and_leaves_no_claim(
    inbox: jobfence.Inbox, fingerprint: Any
) -> None:
    with pytest.raises(ConfigurationError) as info:
        inbox.claim("order:1", fingerprint=fingerprint)
    assert info.value.argument == "fingerprint"
    claim = inbox.claim("order:1", fingerprint="sha256:ab")  # nothing was claimed
    assert claim.state is ClaimState.NEW and claim.attempt == 1
    claim.complete("done")


def test_bytes_and_str_fingerprints_never_match(inbox: jobfence.Inbox) -> None:
    assert b"x".hex() == "78"
    first = inbox.claim("order:2", fingerprint=b"x")
    assert first.state is ClaimState.NEW and first.fingerprint == "bytes:78"
    first.complete({"charged": 1})
    with pytest.raises(FingerprintMismatch):
        inbox.claim("order:2", fingerprint="78")
    replay = inbox.claim("order:2", fingerprint=bytearray(b"x"))
    assert replay.state is ClaimState.COMPLETED and replay.result == {"charged": 1}

    other = inbox.claim("order:3", fingerprint="78")
    other.complete(None)
    with pytest.raises(FingerprintMismatch):
        inbox.claim("order:3", fingerprint=b"x")


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_claim_in_refuses_the_same_fingerprints(dialect: str, tmp_path: Path) -> None:
    url = _url(dialect, tmp_path)
    inbox = jobfence.Inbox(url, table=f"bad_{uuid.uuid4().hex[:12]}")
    inbox.install()
    conn: Any
    if dialect == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    elif dialect == "postgres":
        import psycopg

        conn = psycopg.connect(POSTGRES_URL)
    else:
        conn = pymysql.connect(**mysql_params())
    try:
        for fingerprint in ("\ud800", "a\x00b", "bytes:00"):
            with pytest.raises(ConfigurationError) as info:
                inbox.claim_in(conn, "order:9", fingerprint=fingerprint)
            assert info.value.argument == "fingerprint"
            conn.rollback()
        assert inbox.claim_in(conn, "order:9", fingerprint=b"\x00") is True
        conn.commit()
        with pytest.raises(FingerprintMismatch):
            inbox.claim_in(conn, "order:9", fingerprint="00")
        conn.rollback()
    finally:
        conn.close()
        inbox.drop()
        inbox.close()


# ------------------------------------------------------------------------------- results


@pytest.mark.parametrize(
    "result",
    [{1, 2}, object(), "\ud800", {"when": float("nan"), "x": b"raw"}],
    ids=["set", "object", "lone-surrogate", "nan-and-bytes"],
)
def test_a_result_that_cannot_be_stored_names_result_and_keeps_the_claim(
    inbox: jobfence.Inbox, result: Any
) -> None:
    claim = inbox.claim("job:1")
    with pytest.raises(ConfigurationError) as info:
        claim.complete(result)
    assert info.value.argument == "result" and "result cannot be stored" in str(info.value)
    assert claim.owned and claim.state is ClaimState.NEW
    assert inbox.claim("job:1").state is ClaimState.IN_PROGRESS  # still ours on the backend
    claim.complete({"stored": True})
    assert inbox.claim("job:1").result == {"stored": True}


async def test_async_complete_names_result_too(tmp_path: Path) -> None:
    inbox = jobfence.AsyncInbox(f"sqlite:///{tmp_path}/a.db")
    claim = await inbox.claim("job:2")
    with pytest.raises(ConfigurationError) as info:
        await claim.complete({1})
    assert info.value.argument == "result" and claim.owned
    await claim.complete([1])
    assert (await inbox.claim("job:2")).result == [1]
    await inbox.close()


def test_a_serializer_that_returns_no_bytes_names_result() -> None:
    class Numbers:
        def dumps(self, obj: Any) -> Any:
            return 42

        def loads(self, data: bytes) -> Any:
            return data

    inbox = jobfence.Inbox(f"memory://{uuid.uuid4().hex}", serializer=Numbers())
    claim = inbox.claim("k")
    with pytest.raises(ConfigurationError) as info:
        claim.complete("x")
    assert info.value.argument == "result" and claim.owned
    inbox.close()


# ---------------------------------------------------------------------------- memory://


def test_memory_namespaces_do_not_see_each_others_locks() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    a1, a2 = jobfence.Locks(url, namespace="a"), jobfence.Locks(url, namespace="a")
    b = jobfence.Locks(url, namespace="b")
    try:
        held = a1.try_acquire("job", ttl=30, renew=False)
        assert held is not None
        assert a2.try_acquire("job", ttl=30, renew=False) is None  # same namespace: held
        other = b.try_acquire("job", ttl=30, renew=False)  # another namespace: free
        assert other is not None
        assert held.release() and other.release()
    finally:
        for locks in (a1, a2, b):
            locks.close()


async def test_memory_sync_and_async_clients_of_one_namespace_share_locks() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    sync = jobfence.Locks(url, namespace="shared")
    other = jobfence.AsyncLocks(url, namespace="other")
    same = jobfence.AsyncLocks(url, namespace="shared")
    try:
        lease = sync.try_acquire("job", ttl=30, renew=False)
        assert lease is not None
        assert await same.try_acquire("job", ttl=30, renew=False) is None
        free = await other.try_acquire("job", ttl=30, renew=False)
        assert free is not None and await free.release()
        assert lease.release()
    finally:
        sync.close()
        await other.close()
        await same.close()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: jobfence.Locks("memory://x", bogus=1), "bogus"),
        (lambda: jobfence.Locks("memory://x?bogus=1"), "bogus"),
        (lambda: jobfence.AsyncLocks("memory://x", pool_size=3), "pool_size"),
        (lambda: jobfence.Inbox("memory://x", bogus=1), "bogus"),
        (lambda: jobfence.Inbox("memory://x?bogus=1"), "bogus"),
        (lambda: jobfence.AsyncInbox("memory://x?namespace=a"), "namespace"),
    ],
)
def test_memory_refuses_unknown_options(make: Any, argument: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert info.value.argument == argument


def test_memory_keeps_accepting_its_own_options() -> None:
    jobfence.Inbox("memory://x?table=t1", retention=60, pool_size=2).close()
    jobfence.Locks("memory://x", namespace="any text: not an identifier").close()


# ------------------------------------------------------------------------------- Redis


@pytest.mark.parametrize("path", ["/notadb", "/0x", "/-1", "/1/2", "/٣"])
def test_a_redis_url_without_a_database_number_is_refused(path: str) -> None:
    base = REDIS_URL.split("/", 3)
    url = f"{base[0]}//{base[2]}{path}"
    for cls in (jobfence.Locks, jobfence.Inbox, jobfence.AsyncLocks, jobfence.AsyncInbox):
        with pytest.raises(ConfigurationError) as info:
            cls(url)
        assert info.value.argument == "url" and "database number" in str(info.value)


@pytest.mark.parametrize("path", ["", "/", "/0", "/3", "/3/"])
def test_a_redis_url_with_a_database_number_or_none_works(path: str) -> None:
    base = REDIS_URL.split("/", 3)
    locks = jobfence.Locks(f"{base[0]}//{base[2]}{path}", namespace=f"db{uuid.uuid4().hex[:8]}")
    try:
        lease = locks.try_acquire("job", ttl=5, renew=False)
        assert lease is not None and lease.release()
    finally:
        locks.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda s: jobfence.Inbox(f"memory://{uuid.uuid4().hex}", serializer=s),
        lambda s: jobfence.AsyncInbox(f"memory://{uuid.uuid4().hex}", serializer=s),
        lambda s: jobfence.Queue(f"memory://{uuid.uuid4().hex}", serializer=s),
        lambda s: jobfence.AsyncQueue(f"memory://{uuid.uuid4().hex}", serializer=s),
    ],
)
def test_a_serializer_without_dumps_and_loads_is_refused(make: Any) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        make(object())
    assert info.value.argument == "serializer" and "dumps(obj)" in str(info.value)
