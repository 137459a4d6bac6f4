"""fence_async, versioned_update_async and claim_in on simulated tables and transactions.

Each works there as on a database connection: the work belongs to the transaction (it
commits or rolls back with it), a stale token is refused, a stale version raises
StaleVersion, a key is applied once; and claim_in protects a retried unit, so that the
commit reported failed but applied is not deducted twice under every fault.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults


def _orders(claim: bool) -> Callable[[Simulation], Any]:
    """Two orders on one stock, each a unit retried by retry_unit and, when it fails for
    good, delivered again (at least once); with ``claim``, ``claim_in`` marks the order in
    the unit's transaction."""

    async def order(db: testing.SimTable, inbox: Any, number: int, qty: int) -> None:
        @jobfence.retry_unit(attempts=10)
        async def unit() -> None:
            async with db.transaction() as tx:
                if claim and not await inbox.claim_in(tx, f"order:{number}"):
                    return  # applied already: only its commit was reported failed
                row = await tx.read("stock")
                assert row is not None
                new = {"stock": row["stock"] - qty}
                await jobfence.versioned_update_async(
                    tx, "inventory", {"id": "stock"}, row["version"], new
                )

        for _delivery in range(5):
            try:
                await unit()
                return
            except Exception:
                continue  # the queue delivers the order again

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"stock": 10}})
        inbox = sim.inbox()
        sim.spawn(order, db, inbox, 1, 5)
        sim.spawn(order, db, inbox, 2, 3)
        await sim.join()
        stock = db.get("stock")["stock"]  # type: ignore[index]
        sim.check(stock == 2, f"stock {stock}, not 2")

    return scenario


def test_claim_in_on_a_simulated_table_leaves_no_double_deduction_under_every_fault() -> None:
    """Without claim_in, faults="auto" finds the double deduction: a commit reported failed
    is not retried (its outcome is unknown), the order is delivered again and deducted
    twice. With it, retry_unit retries the protected unit, whose claim_in then returns
    False: none, under every single and double fault and interleaving tried."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jobfence.UnprotectedRetryWarning)
        plain = testing.explore(_orders(claim=False), schedules=500, faults="auto")
    assert not plain.ok
    failure = plain.failures[0]
    assert failure.check == "check" and failure.message.endswith(", not 2")
    assert [(f.kind, f.point) for f in failure.tape.faults] == [("commit_unknown", "db.commit")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", jobfence.UnprotectedRetryWarning)  # never refused
        testing.explore(_orders(claim=True), schedules=500, faults="auto").assert_ok()


def test_claim_in_commits_and_rolls_back_with_the_transaction() -> None:
    seen: list[Any] = []

    async def job(db: testing.SimTable, inbox: Any) -> None:
        with pytest.raises(RuntimeError):  # a marker of a transaction that rolls back ...
            async with db.transaction() as tx:
                seen.append(await inbox.claim_in(tx, "k"))
                seen.append(await inbox.claim_in(tx, "k"))  # (its own marker: seen)
                raise RuntimeError("rolled back")
        async with db.transaction() as tx:  # ... is gone
            seen.append(await inbox.claim_in(tx, "k", fingerprint="f1"))
        async with db.transaction() as tx:  # a committed one stays
            seen.append(await inbox.claim_in(tx, "k", fingerprint="f1"))
        with pytest.raises(jobfence.FingerprintMismatch):
            await inbox.claim_in(db, "k", fingerprint="f2")
        seen.append(await inbox.claim_in(db, "other"))  # on the table: committed at once
        seen.append(await inbox.claim_in(db, "other"))

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim.table("inventory"), sim.inbox())
        await sim.join()

    testing.explore(scenario, schedules=1).assert_ok()
    assert seen == [True, False, True, False, True, False]


def test_a_key_two_open_transactions_claim_is_applied_by_the_first_to_commit() -> None:
    """Both see the key free; the second to commit fails with a conflict, retry_unit re-runs
    it, and its claim_in finds the key applied: one charge, whatever the interleaving."""

    async def job(db: testing.SimTable, inbox: Any) -> None:
        @jobfence.retry_unit(attempts=5)
        async def unit() -> None:
            async with db.transaction() as tx:
                if await inbox.claim_in(tx, "order:1"):
                    row = await tx.read("charges")
                    assert row is not None
                    await tx.update("charges", row["version"], n=row["n"] + 1)

        await unit()

    async def scenario(sim: Simulation) -> None:
        db, inbox = sim.table("ledger", {"charges": {"n": 0}}), sim.inbox()
        sim.spawn(job, db, inbox)
        sim.spawn(job, db, inbox)
        await sim.join()
        n = db.get("charges")["n"]  # type: ignore[index]
        sim.check(n == 1, f"charged {n} times")

    report = testing.explore(scenario, strategy="exhaustive", schedules=2000)
    report.assert_ok()
    assert report.exhausted


def test_fence_refuses_a_stale_token_and_belongs_to_its_transaction() -> None:
    outcomes: list[Any] = []

    async def write(db: testing.SimTable, token: int, fail: bool = False) -> None:
        try:
            async with db.transaction() as tx:
                await jobfence.fence_async(tx, "stock:1", token)
                await tx.write("stock", token=token, by=token)
                if fail:
                    raise RuntimeError("rolled back")
            outcomes.append(token)
        except (jobfence.StaleToken, RuntimeError) as exc:
            outcomes.append(exc)

    async def scenario(sim: Simulation) -> None:
        db = sim.table("inventory", {"stock": {"by": 0}})
        for token, fail in ((5, False), (9, True), (7, False), (6, False)):
            sim.spawn(write, db, token, fail)
            await sim.join()
        await jobfence.fence_async(db, "stock:2", 3)  # on the table: committed at once
        with pytest.raises(jobfence.StaleToken):
            await jobfence.fence_async(db, "stock:2", 2)
        sim.check(db.get("stock") == {"by": 7, "version": 3}, f"{db.get('stock')}")

    testing.explore(scenario, schedules=1).assert_ok()
    five, rolled_back, seven, stale = outcomes
    assert (five, seven) == (5, 7)  # 9 rolled back with its transaction: 7 passes
    assert isinstance(rolled_back, RuntimeError)
    assert isinstance(stale, jobfence.StaleToken)
    assert (stale.token, stale.newest) == (6, 7)


def test_a_paused_holder_is_fenced_off_by_the_next_one() -> None:
    """The lease of a holder paused past its ttl goes to another worker; when it wakes,
    fence() in its transaction refuses its token, so its write never lands."""
    ends: dict[str, Any] = {}

    async def worker(sim: Simulation, db: testing.SimTable, locks: Any) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        lease = await locks.acquire("stock", ttl=10, timeout=600)
        try:
            await testing.point("work")
            async with db.transaction() as tx:
                await jobfence.fence_async(tx, "stock", lease.token)
                await tx.write("stock", by=name, token=lease.token)
            ends[name] = "wrote"
        except (jobfence.StaleToken, jobfence.LockLost) as exc:
            ends[name] = type(exc).__name__

    async def scenario(sim: Simulation) -> None:
        db, locks = sim.table("inventory", {"stock": {"by": None}}), sim.locks()
        sim.spawn(worker, sim, db, locks)
        sim.spawn(worker, sim, db, locks)
        await sim.join()

    pause = faults.pause_past_ttl("work", task="t1")
    report = testing.explore(
        scenario, schedules=1, faults=[pause], checks=[testing.fencing_monotonic()]
    )
    report.assert_ok()
    assert ends == {"t2": "wrote", "t1": "StaleToken"}


def test_versioned_update_raises_stale_version_on_a_table_and_a_transaction() -> None:
    errors: list[jobfence.StaleVersion] = []

    async def job(db: testing.SimTable) -> None:
        assert await jobfence.versioned_update_async(db, "t", {"id": "k"}, 1, {"n": 1}) == 2
        for target in ("table", "transaction"):
            try:
                if target == "table":
                    await jobfence.versioned_update_async(db, "t", {"id": "k"}, 1, {"n": 2})
                else:
                    async with db.transaction() as tx:
                        await jobfence.versioned_update_async(tx, "t", {"id": "k"}, 1, {"n": 3})
            except jobfence.StaleVersion as exc:
                errors.append(exc)

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {"k": {"n": 0}})
        sim.spawn(job, db)
        await sim.join()
        sim.check(db.get("k") == {"n": 1, "version": 2}, f"{db.get('k')}")

    testing.explore(scenario, schedules=1).assert_ok()
    assert [(e.expected, e.current) for e in errors] == [(1, {"n": 1, "version": 2})] * 2
    assert all(jobfence.is_conflict(e) for e in errors)


def test_retry_unit_refuses_to_rerun_a_unit_inside_an_open_simulated_transaction() -> None:
    """As inside a connection's open transaction: a unit given the transaction re-run after
    a statement in it failed would go on in a transaction production has aborted, so
    retry_unit refuses (a ConfigurationError naming the argument: a failure of the
    schedule). A unit given the table, whose writes commit on their own, is re-run."""
    runs: list[str] = []

    async def job(db: testing.SimTable) -> None:
        @jobfence.retry_unit(attempts=3)
        async def unit(target: Any) -> None:
            runs.append("table" if target is db else "tx")
            row = await target.read("stock")
            await target.update("stock", row["version"], stock=row["stock"] - 1)

        await unit(db)
        async with db.transaction() as tx:
            await unit(tx)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim.table("inventory", {"stock": {"stock": 10}}))
        await sim.join()

    transient = [faults.transient("db.write", nth=1), faults.transient("db.write", nth=3)]
    report = testing.explore(scenario, schedules=1, faults=transient, shrink=False)
    (failure,) = report.failures
    error = failure.error
    assert isinstance(error, jobfence.ConfigurationError), failure
    assert error.argument == "argument 'target'" and "refuses to retry" in str(error)
    assert isinstance(error.__cause__, testing.InjectedFault)
    assert runs == ["table", "table", "tx"]
