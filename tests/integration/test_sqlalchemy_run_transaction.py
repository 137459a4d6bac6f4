"""``run_transaction``: SQLAlchemy's version_id_col + StaleDataError, retried as a whole unit
with a new session per attempt, on real PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, create_engine
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, registry, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

import jobfence
from jobfence.integrations.sqlalchemy import run_transaction, run_transaction_async

SYNC_URLS = {
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
}
ASYNC_URLS = {
    "postgres": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+aiomysql://root@127.0.0.1:3306/test",
}


class Item:
    id: int
    stock: int
    version: int


def _mapped(table_name: str) -> tuple[MetaData, type[Item]]:
    metadata = MetaData()
    table = Table(
        table_name,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("stock", Integer, nullable=False),
        Column("version", Integer, nullable=False),
    )
    cls = type("Item_" + table_name, (Item,), {})
    registry().map_imperatively(cls, table, version_id_col=table.c.version)
    return metadata, cls


@pytest.fixture(params=["postgres", "mysql", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, Any, Any]]:
    kind = request.param
    sync_url = SYNC_URLS.get(kind, f"sqlite:///{tmp_path / 'sa.db'}")
    async_url = ASYNC_URLS.get(kind, f"sqlite+aiosqlite:///{tmp_path / 'sa.db'}")
    name = "sa_inv_" + uuid.uuid4().hex[:10]
    metadata, cls = _mapped(name)
    engine = create_engine(sync_url)
    metadata.create_all(engine)
    with Session(engine) as s, s.begin():
        s.add(cls(id=1, stock=10))
    try:
        yield kind, async_url, engine, cls
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def test_a_stale_version_reruns_the_whole_unit_in_a_new_session(db: Any) -> None:
    """The seed bug with the ORM: job 1 (qty 5) reads 10, job 2 (qty 3) commits 7, job 1's
    flush hits StaleDataError; the re-run reads 7 in a new session and writes 2."""
    _kind, _async_url, engine, cls = db
    factory = sessionmaker(engine)
    seen: list[tuple[int, int, int]] = []  # (session id, stock read, version read)

    def job1(session: Session) -> int:
        item = session.get(cls, 1)
        assert item is not None
        seen.append((id(session), item.stock, item.version))
        if len(seen) == 1:  # job 2 commits between job 1's read and its write
            run_transaction(factory, lambda s: _deduct(s, cls, 3))
        item.stock -= 5
        return item.stock

    retries: list[BaseException] = []
    final = run_transaction(
        factory, job1, attempts=3, backoff=0, on_retry=lambda n, exc, delay: retries.append(exc)
    )
    assert final == 2
    assert len(seen) == 2 and seen[0][0] != seen[1][0]  # a new session per attempt
    assert seen[0][1:] == (10, 1) and seen[1][1:] == (7, 2)  # the re-run read fresh values
    assert len(retries) == 1 and isinstance(retries[0], StaleDataError)
    with Session(engine) as s:
        item = s.get(cls, 1)
        assert item is not None and (item.stock, item.version) == (2, 3)


def _deduct(session: Session, cls: Any, qty: int) -> int:
    item = session.get(cls, 1)
    assert item is not None
    item.stock -= qty
    return int(item.stock)


def test_a_non_retryable_error_rolls_back_and_is_raised_once(db: Any) -> None:
    _kind, _async_url, engine, cls = db
    calls: list[int] = []

    def unit(session: Session) -> None:
        calls.append(1)
        _deduct(session, cls, 4)
        raise ValueError("business rule violated")

    with pytest.raises(ValueError, match="business rule"):
        run_transaction(sessionmaker(engine), unit, attempts=5, backoff=0)
    assert calls == [1]
    with Session(engine) as s:
        item = s.get(cls, 1)
        assert item is not None and item.stock == 10  # rolled back


def test_exhausted_attempts_raise_the_last_stale_data_error(db: Any) -> None:
    _kind, _async_url, engine, cls = db
    factory = sessionmaker(engine)

    def always_raced(session: Session) -> None:
        item = session.get(cls, 1)
        assert item is not None
        run_transaction(factory, lambda s: _deduct(s, cls, 1))  # someone always wins
        item.stock -= 5

    with pytest.raises(StaleDataError):
        run_transaction(factory, always_raced, attempts=2, backoff=0)
    with Session(engine) as s:
        item = s.get(cls, 1)
        assert item is not None and item.stock == 8  # only the two rival writes


async def test_async_sessions(db: Any) -> None:
    _kind, async_url, _engine, cls = db
    aengine = create_async_engine(async_url)
    factory = async_sessionmaker(aengine)
    reads: list[int] = []

    async def job1(session: Any) -> int:
        item = await session.get(cls, 1)
        reads.append(item.stock)
        if len(reads) == 1:

            async def rival(s: Any) -> None:
                other = await s.get(cls, 1)
                other.stock -= 3

            await run_transaction_async(factory, rival)
        item.stock -= 5
        return int(item.stock)

    try:
        assert await run_transaction_async(factory, job1, attempts=3, backoff=0) == 2
    finally:
        await aengine.dispose()
    assert reads == [10, 7]


def test_bad_arguments() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        run_transaction(None, lambda s: None)  # type: ignore[arg-type]
    assert info.value.argument == "session_factory"
    with pytest.raises(jobfence.ConfigurationError) as info:
        run_transaction(sessionmaker(), lambda s: None, tries=3)
    assert info.value.argument == "tries"
