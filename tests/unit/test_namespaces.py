"""One namespace check (``jobfence._core.validate.check_namespace``) with each backend's limits,
for the lock ``namespace`` and the inbox ``table`` of every backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence._core.validate import check_namespace
from jobfence.backends import (
    BACKENDS,
    etcd,
    memory,
    mysql,
    open_inbox_backend,
    open_lock_backend,
    postgres,
    redis,
    sqlite,
)
from jobfence.backends.mysql import dialect as mysql_dialect
from jobfence.backends.postgres import dialect as postgres_dialect
from jobfence.errors import ConfigurationError
from tests.etcd_cluster import etcd_url

#: backend -> (its package, is the namespace an SQL identifier?)
PACKAGES: dict[str, tuple[Any, bool]] = {
    "memory": (memory, False),
    "sqlite": (sqlite, True),
    "redis": (redis, False),
    "postgres": (postgres, True),
    "mysql": (mysql, True),
    "etcd": (etcd, False),
}
#: the limits as documented in docs/concepts/namespaces.md
LIMITS = {
    "memory": (64, 63),
    "sqlite": (63, 63),
    "redis": (64, 63),
    "postgres": (51, 63),
    "mysql": (48, 64),
    "etcd": (64, 63),
}


def _url(name: str, tmp_path: Path) -> str:
    return {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/n.db",
        "redis": "redis://127.0.0.1:6379/0",
        "postgres": "postgresql://127.0.0.1:5432/postgres",
        "mysql": "mysql://root@127.0.0.1:3306/test",
        "etcd": etcd_url() if name == "etcd" else "",
    }[name]


def test_every_backend_declares_its_limits() -> None:
    with_tables = {n for n, info in BACKENDS.items() if {"locks", "inbox"} & set(info.parts)}
    assert set(PACKAGES) == with_tables
    for name, (package, _identifier) in PACKAGES.items():
        assert LIMITS[name] == (package.NAMESPACE_LIMIT, package.TABLE_LIMIT)


def test_sql_limits_come_from_the_longest_table_name() -> None:
    pg = postgres_dialect
    assert pg.IDENTIFIER_LIMIT - len("_lock_tokens") == pg.NAMESPACE_LIMIT
    for d in (pg, mysql_dialect):
        for suffix in d.LOCK_TABLES:
            assert d.NAMESPACE_LIMIT + len(suffix) <= d.IDENTIFIER_LIMIT
        assert d.TABLE_LIMIT == d.IDENTIFIER_LIMIT


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_the_lock_namespace_limit(name: str, tmp_path: Path) -> None:
    limit, _table = LIMITS[name]
    url = _url(name, tmp_path)
    backend = open_lock_backend(url, asynchronous=False, namespace="n" * limit)
    backend.close()
    with pytest.raises(ConfigurationError) as info:
        open_lock_backend(url, asynchronous=False, namespace="n" * (limit + 1))
    assert info.value.argument == "namespace"
    assert f"at most {limit} characters" in str(info.value)


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_the_inbox_table_limit(name: str, tmp_path: Path) -> None:
    _namespace, limit = LIMITS[name]
    url = _url(name, tmp_path)
    backend = open_inbox_backend(url, asynchronous=False, table="t" * limit)
    assert backend.table == "t" * limit
    backend.close()
    for bad in ("t" * (limit + 1), "a-b", "1abc", "", None):
        with pytest.raises(ConfigurationError) as info:
            open_inbox_backend(url, asynchronous=False, table=bad)
        assert info.value.argument == "table"


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_sql_namespaces_are_identifiers_and_key_prefixes_are_any_text(
    name: str, tmp_path: Path
) -> None:
    _package, identifier = PACKAGES[name]
    url = _url(name, tmp_path)
    for value in ("my-app:prod", "a b", "1abc", "ünï"):
        if identifier:
            with pytest.raises(ConfigurationError):
                open_lock_backend(url, asynchronous=False, namespace=value)
        else:
            open_lock_backend(url, asynchronous=False, namespace=value).close()
    for value in ("", 5, None):
        with pytest.raises(ConfigurationError):
            open_lock_backend(url, asynchronous=False, namespace=value)


def test_check_namespace_names_the_argument_and_the_backend() -> None:
    assert check_namespace("Ab_1", limit=4, backend="x") == "Ab_1"
    with pytest.raises(ConfigurationError) as info:
        check_namespace("abcde", limit=4, backend="mysql", argument="table")
    assert info.value.argument == "table"
    assert "mysql backend" in str(info.value) and "at most 4" in str(info.value)
    assert check_namespace("a:b-c", limit=5, backend="redis", identifier=False) == "a:b-c"
    with pytest.raises(ConfigurationError, match="non-empty str"):
        check_namespace("", limit=5, backend="redis", identifier=False)


def test_claim_in_checks_the_table_against_the_connections_server(tmp_path: Path) -> None:
    import sqlite3

    inbox = jobfence.Inbox("memory://", table="t" * 63)
    conn = sqlite3.connect(tmp_path / "c.db")
    try:
        inbox.install(conn)
        assert inbox.claim_in(conn, "k") is True
    finally:
        conn.close()
        inbox.close()
