"""``jobfence.versioned_update`` / ``versioned_update_async`` on every dialect and driver."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, StaleVersion

from ._sqldrivers import FLAVOUR_IDS, FLAVOURS, Flavour, admin, query, unique


@pytest.fixture(params=FLAVOURS, ids=FLAVOUR_IDS)
def flavour(request: pytest.FixtureRequest, tmp_path: Path) -> Flavour:
    cls: type[Flavour] = request.param
    return cls(tmp_path / "app.db")


@pytest.fixture
def table(flavour: Flavour) -> Iterator[str]:
    """A business table with a version column: row (1, 'a') stock 10 at version 1."""
    name = unique("jf_inv")
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(
            a,
            f"CREATE TABLE {name} (id INTEGER NOT NULL, region VARCHAR(10) NOT NULL, "
            "stock INTEGER NOT NULL, note VARCHAR(50), version INTEGER NOT NULL, "
            "PRIMARY KEY (id, region))",
        )
        query(a, f"INSERT INTO {name} VALUES (1, 'a', 10, 'x', 1)")
        query(a, f"INSERT INTO {name} VALUES (2, 'a', 20, 'y', 7)")
    yield name
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
async def conn(flavour: Flavour) -> AsyncIterator[Any]:
    c = await flavour.connect()
    try:
        yield c
    finally:
        try:
            await flavour.rollback(c)
        finally:
            await flavour.close(c)


def row(flavour: Flavour, table: str, id_: int) -> tuple[Any, ...] | None:
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        rows = query(a, f"SELECT stock, note, version FROM {table} WHERE id = ?", (id_,))
    return rows[0] if rows else None


KEY = {"id": 1, "region": "a"}


async def test_success_bumps_the_version(flavour: Flavour, table: str, conn: Any) -> None:
    new = await flavour.versioned_update(conn, table, KEY, 1, {"stock": 9, "note": "sold"})
    assert new == 2
    await flavour.commit(conn)
    assert row(flavour, table, 1) == (9, "sold", 2)
    assert row(flavour, table, 2) == (20, "y", 7)  # only the keyed row changed

    # values equal to the current ones still match (the version bump changes the row; on
    # MySQL affected-rows would otherwise be 0 without CLIENT_FOUND_ROWS)
    assert await flavour.versioned_update(conn, table, KEY, 2, {"stock": 9}) == 3
    # empty values: only the version moves
    assert await flavour.versioned_update(conn, table, KEY, 3, {}) == 4
    await flavour.commit(conn)
    assert row(flavour, table, 1) == (9, "sold", 4)


async def test_stale_version_carries_the_current_row(
    flavour: Flavour, table: str, conn: Any
) -> None:
    # another writer moved the row on since "we" read version 1
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"UPDATE {table} SET stock = 3, version = 5 WHERE id = 1")
    with pytest.raises(StaleVersion) as info:
        await flavour.versioned_update(conn, table, KEY, 1, {"stock": 9})
    err = info.value
    assert isinstance(err, jobfence.ConflictError)
    assert err.table == table and err.key == KEY and err.expected == 1
    assert err.current == {"id": 1, "region": "a", "stock": 3, "note": "x", "version": 5}
    assert "expected version = 1" in str(err) and "5" in str(err)
    await flavour.rollback(conn)
    assert row(flavour, table, 1) == (3, "x", 5)  # the stale write changed nothing


async def test_missing_row_has_current_none(flavour: Flavour, table: str, conn: Any) -> None:
    with pytest.raises(StaleVersion) as info:
        await flavour.versioned_update(conn, table, {"id": 99, "region": "a"}, 1, {"stock": 1})
    assert info.value.current is None and info.value.expected == 1
    assert "gone" in str(info.value)


async def test_custom_version_column_and_rollback(flavour: Flavour, conn: Any) -> None:
    name = unique("jf_doc")
    with admin(flavour.dialect, flavour.sqlite_path) as a:
        query(a, f"CREATE TABLE {name} (doc_id INTEGER PRIMARY KEY, body VARCHAR(20), rev INTEGER)")
        query(a, f"INSERT INTO {name} VALUES (1, 'v1', 10)")
    try:
        new = await flavour.versioned_update(
            conn, name, {"doc_id": 1}, 10, {"body": "v2"}, version_column="rev"
        )
        assert new == 11
        await flavour.rollback(conn)  # runs inside the caller's transaction
        with admin(flavour.dialect, flavour.sqlite_path) as a:
            assert query(a, f"SELECT body, rev FROM {name}") == [("v1", 10)]
    finally:
        await flavour.rollback(conn)
        with admin(flavour.dialect, flavour.sqlite_path) as a:
            query(a, f"DROP TABLE IF EXISTS {name}")


BAD = [
    ({"table": "inv; DROP TABLE inv"}, "table"),
    ({"table": 'inv" --'}, "table"),
    ({"key": {"id = 1 OR 1=1 --": 1}}, "key"),
    ({"key": {}}, "key"),
    ({"key": {"id": None}}, "key"),
    ({"key": [("id", 1)]}, "key"),
    ({"values": {"stock = 0, version": 1}}, "values"),
    ({"values": {"version": 3}}, "values"),
    ({"key": {"version": 3}}, "key"),
    ({"version_column": "version = 0 --"}, "version_column"),
    ({"version": "1"}, "version"),
    ({"version": True}, "version"),
]


@pytest.mark.parametrize(("change", "argument"), BAD)
async def test_bad_identifiers_and_arguments(
    change: dict[str, Any], argument: str, tmp_path: Path
) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE inv (id INTEGER PRIMARY KEY, stock INTEGER, version INTEGER)")
    conn.execute("INSERT INTO inv VALUES (1, 5, 1)")
    conn.commit()
    kw: dict[str, Any] = {"table": "inv", "key": {"id": 1}, "version": 1, "values": {"stock": 0}}
    kw.update(change)
    with pytest.raises(ConfigurationError) as info:
        jobfence.versioned_update(conn, **kw)
    assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:  # arguments are checked before the driver
        await jobfence.versioned_update_async(conn, **kw)
    assert info.value.argument == argument
    assert conn.execute("SELECT id, stock, version FROM inv").fetchall() == [(1, 5, 1)]
    conn.close()
