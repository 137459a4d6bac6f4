"""jobfence.testing's faults are classified, and reacted to, as the driver errors they stand for.

A connection of PostgreSQL is terminated (``pg_terminate_backend``) under a real psycopg
transaction: while its COMMIT is in flight, and before a statement in autocommit mode or
inside a transaction. The simulated faults at the points that stand for those moments must
give errors that ``is_transient`` / ``is_conflict`` / ``is_commit_outcome_unknown`` see the
same way, and ``retry_unit`` must do the same with them: retry a failed statement, refuse an
unprotected retry after a commit whose outcome is unknown (``UnprotectedRetryWarning``, the
error raised), and retry it when ``claim_in`` protects the unit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Fault, Simulation, faults
from tests.servers import POSTGRES_URL

from ._sqldrivers import unique

Verdict = tuple[bool, bool, bool]


def verdict(exc: BaseException) -> Verdict:
    """How jobfence classifies ``exc``: (transient, conflict, commit outcome unknown)."""
    return (
        jobfence.is_transient(exc),
        jobfence.is_conflict(exc),
        jobfence.is_commit_outcome_unknown(exc),
    )


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        yield conn


@pytest.fixture
def table(admin: psycopg.Connection[Any]) -> Iterator[str]:
    name = unique("jffault")
    admin.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, stock int NOT NULL)")
    admin.execute(f"INSERT INTO {name} VALUES (1, 10)")
    try:
        yield name
    finally:
        admin.execute(f"DROP TABLE IF EXISTS {name}")


def terminate(admin: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s server process, and wait until it is gone."""
    pid = conn.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall():
        assert time.monotonic() < deadline, "the terminated backend did not exit"


def real_error(admin: psycopg.Connection[Any], table: str, moment: str) -> BaseException:
    """The error psycopg raises when the connection dies at ``moment``."""
    conn = psycopg.connect(POSTGRES_URL, autocommit=moment == "autocommit statement")
    try:
        if moment == "commit":
            conn.execute(f"UPDATE {table} SET stock = stock - 5 WHERE id = 1")
            terminate(admin, conn)
            conn.commit()
        elif moment == "statement in a transaction":
            conn.execute(f"SELECT stock FROM {table} WHERE id = 1")
            terminate(admin, conn)
            conn.execute(f"UPDATE {table} SET stock = stock - 5 WHERE id = 1")
        else:
            terminate(admin, conn)
            conn.execute(f"UPDATE {table} SET stock = stock - 5 WHERE id = 1")
    except psycopg.OperationalError as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError(f"no error at {moment}")


def simulated_error(fault: Fault, in_transaction: bool) -> BaseException:
    """The error a job of a simulation gets from ``fault`` (at a write, or the commit)."""
    errors: list[BaseException] = []

    async def job(db: testing.SimTable) -> None:
        try:
            if in_transaction:
                async with db.transaction() as tx:
                    row = await tx.read(1)
                    assert row is not None
                    await tx.update(1, row["version"], stock=row["stock"] - 5)
            else:
                await db.write(1, stock=5)
        except Exception as exc:
            errors.append(exc)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim.table("inventory", {1: {"stock": 10}}))
        await sim.join()

    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    (error,) = errors
    assert isinstance(error, testing.InjectedFault) and error.fault == fault
    return error


@pytest.mark.parametrize(
    ("fault", "in_transaction", "moment"),
    [
        # applied, then the caller hears the connection failed: at a transaction's commit
        (faults.commit_unknown("db.commit"), True, "commit"),
        # not applied, but nobody can tell: the connection failed while COMMIT was in flight
        (faults.transient("db.commit"), True, "commit"),
        # a write outside a transaction commits on its own, as in autocommit mode: applied,
        # then the answer lost, is not recognisable as a commit's failure there either
        (faults.commit_unknown("db.write"), False, "autocommit statement"),
        (faults.transient("db.write"), False, "autocommit statement"),
        (faults.transient("db.write"), True, "statement in a transaction"),
        (faults.transient("db.read"), True, "statement in a transaction"),
    ],
    ids=str,
)
def test_a_simulated_fault_is_classified_as_the_driver_error_it_stands_for(
    admin: psycopg.Connection[Any], table: str, fault: Fault, in_transaction: bool, moment: str
) -> None:
    real = verdict(real_error(admin, table, moment))
    assert real[0] and not real[1]  # a dead connection is transient, never a conflict
    assert real[2] == (moment == "commit")
    assert verdict(simulated_error(fault, in_transaction)) == real


# -- retry_unit's reaction: the seed article's jobs, a commit applied and reported failed --------


def test_retry_unit_refuses_to_rerun_after_a_simulated_unknown_commit_as_after_a_real_one(
    admin: psycopg.Connection[Any], table: str
) -> None:
    """The same unit (a transaction: read the stock, write it back lower), the connection
    lost at its commit: production's retry_unit does not run it again and warns; neither
    does the simulation's, which so reports no double deduction that production would not
    make (stock 10, orders of 5 and 3: 2)."""
    attempts: list[str] = []

    @jobfence.retry_unit(attempts=5, backoff=0)
    def real_unit() -> None:
        attempts.append("real")
        with psycopg.connect(POSTGRES_URL) as conn:
            stock = conn.execute(f"SELECT stock FROM {table} WHERE id = 1").fetchall()[0][0]
            conn.execute(f"UPDATE {table} SET stock = %s WHERE id = 1", (stock - 5,))
            terminate(admin, conn)
            conn.commit()

    with (
        pytest.warns(jobfence.UnprotectedRetryWarning),
        pytest.raises(psycopg.OperationalError) as real,
    ):
        real_unit()
    assert attempts == ["real"]
    assert jobfence.is_commit_outcome_unknown(real.value)

    ended: dict[str, Any] = {}

    async def order(sim: Simulation, db: testing.SimTable, qty: int) -> None:
        @jobfence.retry_unit(attempts=5)
        async def unit() -> None:
            attempts.append(sim.current().name)  # type: ignore[union-attr]
            async with db.transaction() as tx:
                row = await tx.read("stock")
                assert row is not None
                new = {"stock": row["stock"] - qty}
                await jobfence.versioned_update_async(
                    tx, "inventory", {"id": "stock"}, row["version"], new
                )

        try:
            await unit()
        except Exception as exc:
            ended[sim.current().name] = exc  # type: ignore[union-attr]

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"stock": 10}})
        sim.spawn(order, sim, db, 5)
        await sim.join()  # (a task hitting a fault gives way: t2 after t1, so t1's applies)
        sim.spawn(order, sim, db, 3)
        await sim.join()
        sim.check(db.get("stock") == {"stock": 2, "version": 3}, f"stock {db.get('stock')}")

    attempts.clear()
    with pytest.warns(jobfence.UnprotectedRetryWarning) as caught:
        report = testing.explore(scenario, schedules=1, faults=[faults.commit_unknown("db.commit")])
    report.assert_ok()
    assert attempts == ["t1", "t2"]  # t1's unit ran once: not retried
    assert isinstance(ended.pop("t1"), testing.InjectedFault) and not ended
    assert "commit outcome is unknown" in str(caught[0].message)
