"""The lock backends the conformance suite runs against, and how to clean up after them.

Every scheme registered in ``jobfence.backends.LOCK_BACKENDS`` must be covered here:
``test_every_registered_backend_is_in_the_suite`` fails otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL, delete_redis_keys


@dataclass(frozen=True)
class Spec:
    id: str
    module: str  # backend module stem in jobfence.backends
    make_url: Callable[[Path], str]
    cleanup: Callable[[str, str], None]  # (url, namespace)


def new_namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _no_cleanup(url: str, namespace: str) -> None:
    pass


def _redis_cleanup(url: str, namespace: str) -> None:
    delete_redis_keys(f"{namespace}:*", url)


def _postgres_cleanup(url: str, namespace: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (namespace + "%",),
        ).fetchall()
        for (table,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')


def _mysql_cleanup(url: str, namespace: str) -> None:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", database="test")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE %s",
                (namespace + "%",),
            )
            for (table,) in cur.fetchall():
                cur.execute(f"DROP TABLE IF EXISTS `{table}`")
        conn.commit()
    finally:
        conn.close()


SPECS: list[Spec] = [
    Spec("memory", "memory", lambda tmp: f"memory://{uuid.uuid4().hex}", _no_cleanup),
    Spec("sqlite", "sqlite", lambda tmp: f"sqlite:///{tmp / 'locks.db'}", _no_cleanup),
    Spec("redis", "redis", lambda tmp: REDIS_URL, _redis_cleanup),
    Spec("postgres", "postgres", lambda tmp: POSTGRES_URL, _postgres_cleanup),
    Spec(
        "postgres-session",
        "postgres",
        lambda tmp: POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + "mode=session",
        _postgres_cleanup,
    ),
    Spec("mysql", "mysql", lambda tmp: MYSQL_URL, _mysql_cleanup),
]
