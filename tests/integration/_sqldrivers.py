"""Every caller-connection flavour jobfence supports, behind one async test interface.

A :class:`Flavour` opens the kind of connection an application would hand to ``fence()`` /
``versioned_update()`` (psycopg, asyncpg, PyMySQL, aiomysql, sqlite3, aiosqlite, SQLAlchemy
Connection/Session, sync and async) and drives its transaction the way that driver's users
do. Test bodies are ``async def`` and call ``await flavour.fence(conn, ...)`` whether the
flavour is sync (the blocking call just runs) or async.

:func:`admin` gives an autocommit connection per dialect for setup, checks and teardown.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jobfence
from jobfence._core.sqlconn import adapt
from jobfence.fencing import install
from jobfence.fencing_async import install_async
from tests.servers import MYSQL_URL, POSTGRES_URL

PG_DSN = POSTGRES_URL
_my = urlsplit(MYSQL_URL)
MYSQL_KW: dict[str, Any] = {
    "host": _my.hostname or "127.0.0.1",
    "port": _my.port or 3306,
    "user": _my.username or "root",
    "password": _my.password or "",
}
MYSQL_DB = _my.path.lstrip("/") or "test"
_PG_REST = POSTGRES_URL.split("://", 1)[1]
_MY_REST = MYSQL_URL.split("://", 1)[1]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# -- admin connections (autocommit) ---------------------------------------------------------


@contextmanager
def admin(dialect: str, sqlite_path: Path | None = None) -> Iterator[Any]:
    """An autocommit connection for setup and checks."""
    if dialect == "postgresql":
        import psycopg

        conn: Any = psycopg.connect(PG_DSN, autocommit=True)
    elif dialect == "mysql":
        import pymysql

        conn = pymysql.connect(**MYSQL_KW, database=MYSQL_DB, autocommit=True)
    else:
        assert sqlite_path is not None
        conn = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def query(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``?``-placeholder SQL on a sync connection through the adapter; return rows."""
    return adapt(conn).execute(sql, params).rows


# -- flavours -------------------------------------------------------------------------------


class Flavour:
    """One driver/connection kind; subclasses implement connect/begin/commit/rollback/close."""

    id = ""
    dialect = ""
    is_async = False

    def __init__(self, sqlite_path: Path) -> None:
        self.sqlite_path = sqlite_path
        self._cleanup: list[Any] = []

    def __repr__(self) -> str:
        return self.id

    async def connect(self) -> Any:  # returns a connection with a transaction ready to use
        raise NotImplementedError

    async def commit(self, conn: Any) -> None:
        raise NotImplementedError

    async def rollback(self, conn: Any) -> None:
        raise NotImplementedError

    async def close(self, conn: Any) -> None:
        raise NotImplementedError

    async def fence(self, conn: Any, resource: str, token: int, **kw: Any) -> None:
        if self.is_async:
            await jobfence.fence_async(conn, resource, token, **kw)
        else:
            jobfence.fence(conn, resource, token, **kw)

    async def install(self, conn: Any, **kw: Any) -> None:
        if self.is_async:
            await install_async(conn, **kw)
        else:
            install(conn, **kw)

    async def versioned_update(self, conn: Any, *args: Any, **kw: Any) -> int:
        if self.is_async:
            return await jobfence.versioned_update_async(conn, *args, **kw)
        return jobfence.versioned_update(conn, *args, **kw)

    async def execute(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
        from jobfence._core.sqlconn import adapt_async

        if self.is_async:
            return await adapt_async(conn).execute(sql, params)
        return adapt(conn).execute(sql, params)


# sync drivers: transactions begin implicitly on the first statement (PEP 249 style)


class _Dbapi(Flavour):
    async def commit(self, conn: Any) -> None:
        conn.commit()

    async def rollback(self, conn: Any) -> None:
        conn.rollback()

    async def close(self, conn: Any) -> None:
        conn.close()


class Psycopg(_Dbapi):
    id, dialect = "psycopg", "postgresql"

    async def connect(self) -> Any:
        import psycopg
        from psycopg.rows import dict_row

        return psycopg.connect(PG_DSN, row_factory=dict_row)  # a row factory callers often use


class PyMySQL(_Dbapi):
    id, dialect = "pymysql", "mysql"

    async def connect(self) -> Any:
        import pymysql

        return pymysql.connect(
            **MYSQL_KW, database=MYSQL_DB, cursorclass=pymysql.cursors.DictCursor
        )


class Sqlite3(_Dbapi):
    id, dialect = "sqlite3", "sqlite"

    async def connect(self) -> Any:
        conn = sqlite3.connect(self.sqlite_path, timeout=10, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        return conn


class _SaSync(Flavour):
    url = ""
    session = False

    async def connect(self) -> Any:
        import sqlalchemy as sa
        from sqlalchemy.orm import Session
        from sqlalchemy.pool import NullPool

        engine = sa.create_engine(self.url.format(path=self.sqlite_path), poolclass=NullPool)
        self._cleanup.append(engine)
        return Session(engine) if self.session else engine.connect()

    async def commit(self, conn: Any) -> None:
        conn.commit()

    async def rollback(self, conn: Any) -> None:
        conn.rollback()

    async def close(self, conn: Any) -> None:
        conn.close()
        while self._cleanup:
            self._cleanup.pop().dispose()


class _SaAsync(Flavour):
    url = ""
    session = False
    is_async = True

    async def connect(self) -> Any:
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
        from sqlalchemy.pool import NullPool

        engine = create_async_engine(self.url.format(path=self.sqlite_path), poolclass=NullPool)
        self._cleanup.append(engine)
        if self.session:
            return AsyncSession(engine)
        return await engine.connect()

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()

    async def close(self, conn: Any) -> None:
        await conn.close()
        while self._cleanup:
            await self._cleanup.pop().dispose()


def _sa(kind: type[Flavour], fid: str, dialect: str, url: str, session: bool) -> type[Flavour]:
    return type(fid, (kind,), {"id": fid, "dialect": dialect, "url": url, "session": session})


class PsycopgAsync(Flavour):
    id, dialect, is_async = "psycopg-async", "postgresql", True

    async def connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(PG_DSN)

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()

    async def close(self, conn: Any) -> None:
        await conn.close()


class Asyncpg(Flavour):
    """asyncpg has no implicit transactions: begin one explicitly, like ``conn.transaction()``."""

    id, dialect, is_async = "asyncpg", "postgresql", True

    async def connect(self) -> Any:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        await conn.execute("BEGIN")
        return conn

    async def commit(self, conn: Any) -> None:
        await conn.execute("COMMIT")
        await conn.execute("BEGIN")

    async def rollback(self, conn: Any) -> None:
        await conn.execute("ROLLBACK")
        await conn.execute("BEGIN")

    async def close(self, conn: Any) -> None:
        await conn.close()


class Aiomysql(Flavour):
    id, dialect, is_async = "aiomysql", "mysql", True

    async def connect(self) -> Any:
        import aiomysql

        return await aiomysql.connect(
            host=MYSQL_KW["host"],
            port=MYSQL_KW["port"],
            user=MYSQL_KW["user"],
            password=MYSQL_KW["password"],
            db=MYSQL_DB,
            cursorclass=aiomysql.DictCursor,
        )

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()

    async def close(self, conn: Any) -> None:
        conn.close()


class Aiosqlite(Flavour):
    id, dialect, is_async = "aiosqlite", "sqlite", True

    async def connect(self) -> Any:
        import aiosqlite

        conn = await aiosqlite.connect(self.sqlite_path, timeout=10)
        conn.row_factory = aiosqlite.Row
        return conn

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()

    async def close(self, conn: Any) -> None:
        await conn.close()


FLAVOURS: list[type[Flavour]] = [
    Psycopg,
    PsycopgAsync,
    Asyncpg,
    _sa(_SaSync, "sa-psycopg-conn", "postgresql", f"postgresql+psycopg://{_PG_REST}", False),
    _sa(_SaSync, "sa-psycopg-session", "postgresql", f"postgresql+psycopg://{_PG_REST}", True),
    _sa(_SaAsync, "sa-asyncpg-conn", "postgresql", f"postgresql+asyncpg://{_PG_REST}", False),
    _sa(_SaAsync, "sa-asyncpg-session", "postgresql", f"postgresql+asyncpg://{_PG_REST}", True),
    PyMySQL,
    Aiomysql,
    _sa(_SaSync, "sa-pymysql-conn", "mysql", f"mysql+pymysql://{_MY_REST}", False),
    _sa(_SaSync, "sa-pymysql-session", "mysql", f"mysql+pymysql://{_MY_REST}", True),
    _sa(_SaAsync, "sa-aiomysql-conn", "mysql", f"mysql+aiomysql://{_MY_REST}", False),
    _sa(_SaAsync, "sa-aiomysql-session", "mysql", f"mysql+aiomysql://{_MY_REST}", True),
    Sqlite3,
    Aiosqlite,
    _sa(_SaSync, "sa-sqlite-conn", "sqlite", "sqlite:///{path}", False),
    _sa(_SaSync, "sa-sqlite-session", "sqlite", "sqlite:///{path}", True),
    _sa(_SaAsync, "sa-aiosqlite-conn", "sqlite", "sqlite+aiosqlite:///{path}", False),
    _sa(_SaAsync, "sa-aiosqlite-session", "sqlite", "sqlite+aiosqlite:///{path}", True),
]
FLAVOUR_IDS = [f.id for f in FLAVOURS]
