"""The scheduler and real I/O: no decision while a real statement is in flight.

A task whose statement waits for a real PostgreSQL server is at no point. If another task
reached a point meanwhile and the decision there were made at once, that task could send its
own statement while the first is still on the server: which one the server runs first would
depend on timing, and a seed would not replay. The scheduler waits for the answer of every
statement in flight (``sim.real_io()``) before a decision, so repeated runs of the same
seeds give the same tapes and the same order of rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobfence import testing
from jobfence.testing import Simulation
from tests.servers import POSTGRES_URL


@pytest.fixture
def table() -> Iterator[str]:
    name = f"jf_speed_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (n serial PRIMARY KEY, who text NOT NULL)")
    try:
        yield name
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


def _scenario(table: str, runs: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> Any:
    """t1 and t2 wake at the same virtual instant. t1 sends a slow statement at once (the
    server sleeps 50 ms, then inserts its row); t2 first reaches a point, then inserts its
    row. Each schedule appends its picks and the order of the rows the server wrote."""

    async def slow(sim: Simulation, conn: Any) -> None:
        await sim.sleep(1)
        with sim.real_io():
            await conn.execute(f"SELECT pg_sleep(0.05); INSERT INTO {table} (who) VALUES ('t1')")
        await testing.point("slow.done")

    async def quick(sim: Simulation, conn: Any) -> None:
        await sim.sleep(1)
        await testing.point("quick")  # reached while t1's statement is on the server
        with sim.real_io():
            await conn.execute(f"INSERT INTO {table} (who) VALUES ('t2')")
        await testing.point("quick.done")

    async def scenario(sim: Simulation) -> None:
        first = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
        second = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
        try:
            await first.execute(f"TRUNCATE {table}")
            sim.spawn(slow, sim, first)
            sim.spawn(quick, sim, second)
            await sim.join()
            cur = await first.execute(f"SELECT who FROM {table} ORDER BY n")
            rows = tuple(who for (who,) in await cur.fetchall())
        finally:
            await first.close()
            await second.close()
        runs.append((tuple(sim.picks), rows))

    return scenario


def test_a_decision_waits_for_the_answer_of_a_statement_in_flight(table: str) -> None:
    runs: list[Any] = []
    assert testing.explore(_scenario(table, runs), schedules=1).ok
    # FIFO: t2 waited at its point for t1's answer, so t1's row is first
    [(_picks, rows)] = runs
    assert rows == ("t1", "t2")


def test_repeated_runs_with_real_postgresql_connections_give_identical_tapes(table: str) -> None:
    results = []
    for _ in range(3):
        runs: list[Any] = []
        report = testing.explore(_scenario(table, runs), schedules=6, seed=3)
        assert report.ok, report
        assert len(runs) == 6
        results.append(runs)
    assert results[1] == results[0] and results[2] == results[0]
    # whatever the picks, t1's statement was answered before t2 sent its own
    assert all(rows == ("t1", "t2") for _, rows in results[0])
