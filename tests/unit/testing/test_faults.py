"""jobfence.testing faults: each kind, faults="auto" and its limits, the text form."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults
from jobfence.testing.faults import Fault, parse


def _two_hitters(log: list[Any]) -> Any:
    async def job(sim: Simulation) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        for i in range(2):
            try:
                await testing.point("x")
                log.append((name, i, None))
            except testing.InjectedFault as exc:
                log.append((name, i, exc.fault))

    async def scenario(sim: Simulation) -> None:
        log.clear()
        sim.spawn(job, sim)
        sim.spawn(job, sim)
        await sim.join()

    return scenario


def test_transient_fails_exactly_the_nth_hit_over_every_task() -> None:
    log: list[Any] = []
    fault = faults.transient("x", nth=2)
    assert testing.explore(_two_hitters(log), schedules=1, faults=[fault]).ok
    # FIFO: t1 hits x first (hit 1) and waits there while t2 starts and hits it (hit 2,
    # the fault: t2 gives way); t1 goes on to its end (hit 3), then t2 (hit 4)
    assert log == [("t1", 0, None), ("t1", 1, None), ("t2", 0, fault), ("t2", 1, None)]
    fault = faults.transient("x", nth=3, task="t1")
    assert testing.explore(_two_hitters(log), schedules=1, faults=[fault]).ok
    assert [entry for entry in log if entry[2] is not None] == [("t1", 1, fault)]


def test_an_injected_fault_at_a_jobfence_point_is_a_transient_backend_error() -> None:
    errors: list[BaseException] = []

    async def job(sim: Simulation) -> None:
        try:
            await sim.locks().try_acquire("res", ttl=30)
        except jobfence.BackendError as exc:
            errors.append(exc)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()

    fault = faults.transient("lock.acquire")
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    (error,) = errors
    assert isinstance(error.__cause__, testing.InjectedFault)
    assert error.__cause__.fault == fault and isinstance(error.__cause__, ConnectionResetError)
    assert jobfence.is_transient(error)


def _writer_scenario(out: dict[str, Any]) -> Any:
    async def writer(db: testing.SimTable) -> None:
        try:
            await db.write("k", n=1)
        except testing.InjectedFault as exc:
            out["write"] = exc.fault
        try:
            async with db.transaction() as tx:
                await tx.write("k", n=2)
                await tx.write("j", n=2)
        except testing.InjectedFault as exc:
            out["commit"] = exc.fault

    async def scenario(sim: Simulation) -> None:
        db = sim.table("t", {"k": {"n": 0}})
        sim.spawn(writer, db)
        await sim.join()
        out["rows"] = db.rows()
        out["history"] = [(w.key, w.values) for w in db.history]

    return scenario


def test_commit_unknown_on_a_write_applies_it_then_raises() -> None:
    out: dict[str, Any] = {}
    fault = faults.commit_unknown("db.write")
    assert testing.explore(_writer_scenario(out), schedules=1, faults=[fault]).ok
    assert out["write"] == fault and "commit" not in out
    assert out["history"][0] == ("k", {"n": 1})  # it happened, though its writer heard not
    assert out["rows"]["k"] == {"n": 2, "version": 3}


def test_commit_unknown_on_a_commit_applies_every_write_then_raises() -> None:
    out: dict[str, Any] = {}
    fault = faults.commit_unknown("db.commit")
    assert testing.explore(_writer_scenario(out), schedules=1, faults=[fault]).ok
    assert out["commit"] == fault and "write" not in out
    assert out["rows"] == {"k": {"n": 2, "version": 3}, "j": {"n": 2, "version": 1}}
    # a transient fault at the same commit applies nothing
    out.clear()
    fault = faults.transient("db.commit")
    assert testing.explore(_writer_scenario(out), schedules=1, faults=[fault]).ok
    assert out["commit"] == fault and out["rows"] == {"k": {"n": 1, "version": 2}}


def test_lost_ack_redelivers_the_same_message_once_its_visibility_passes() -> None:
    deliveries: list[Any] = []

    async def consumer(sim: Simulation, queue: Any) -> None:
        for _ in range(3):
            for message in await queue.receive(wait=7200, visibility=60):
                deliveries.append((message.id, message.delivery, message.body, sim.now()))
                await message.ack()

    def scenario_with(ids: list[str]) -> Any:
        async def scenario(sim: Simulation) -> None:
            queue = sim.queue("jobs")
            ids.append(await queue.publish({"order": 7}))
            sim.spawn(consumer, sim, queue)
            await sim.join()

        return scenario

    ids: list[str] = []
    assert testing.explore(scenario_with(ids), schedules=1, faults=[faults.lost_ack()]).ok
    assert [(d[0], d[1], d[2]) for d in deliveries] == [
        (ids[0], 1, {"order": 7}),
        (ids[0], 2, {"order": 7}),  # the same message again, as a redelivery
    ]
    assert deliveries[1][3] == 60.0  # when its visibility ran out, in virtual time
    deliveries.clear()
    assert testing.explore(scenario_with(ids), schedules=1).ok
    assert [d[1] for d in deliveries] == [1]  # without the fault: once


def _lease_scenario(log: list[Any]) -> Any:
    """Two processes, each with its own client, take the same lock (ttl 10) in turn."""

    async def holder(sim: Simulation) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        locks = sim.locks()
        lease = await locks.acquire("res", ttl=10)
        log.append((name, "got", sim.now(), lease.token))
        await testing.point("work")
        log.append((name, "resumed", sim.now(), lease.lost))
        log.append((name, "released", await lease.release()))

    async def scenario(sim: Simulation) -> None:
        log.clear()
        sim.spawn(holder, sim)
        sim.spawn(holder, sim)
        results = await sim.join()
        log.append(("results", *results))

    return scenario


def test_without_a_fault_the_lease_passes_on_at_its_release() -> None:
    log: list[Any] = []
    assert testing.explore(_lease_scenario(log), schedules=1).ok
    assert [e[:3] for e in log if e[1] in ("got", "resumed")] == [
        ("t1", "got", 0.0),
        ("t1", "resumed", 0.0),
        ("t2", "got", 0.0),
        ("t2", "resumed", 0.0),
    ]


def test_pause_past_ttl_lets_another_process_take_the_lease() -> None:
    log: list[Any] = []
    fault = faults.pause_past_ttl("work", seconds=50)
    assert testing.explore(_lease_scenario(log), schedules=1, faults=[fault]).ok
    got = [e for e in log if e[1] == "got"]
    # t1 stopped at work; its renewer stopped with it, so the lease expired after its ttl
    assert got[0][:3] == ("t1", "got", 0.0) and got[1][:3] == ("t2", "got", 10.0)
    assert got[1][3] > got[0][3]
    assert ("t1", "resumed", 50.0, True) in log  # back after the pause: the lease is lost
    assert ("t1", "released", False) in log and ("t2", "released", True) in log


def test_pause_past_ttl_stops_the_process_s_renewer() -> None:
    """The holder keeps its 9 s lease for 30 s through its renewer; paused, it does not: the
    other process, trying every second, gets the lock the moment the ttl runs out."""
    taken: list[float] = []

    async def holder(sim: Simulation) -> None:
        async with await sim.locks().acquire("res", ttl=9):
            await testing.point("work")
            await sim.sleep(30)

    async def prober(sim: Simulation) -> None:
        locks = sim.locks()
        while True:
            await sim.sleep(1)
            lease = await locks.try_acquire("res", ttl=9)
            if lease is not None:
                taken.append(sim.now())
                await lease.release()
                return

    async def scenario(sim: Simulation) -> None:
        sim.spawn(holder, sim)
        sim.spawn(prober, sim)
        await sim.join()
        taken.append(sim.hits["lock.renew"])

    assert testing.explore(scenario, schedules=1).ok
    assert taken[0] == 30.0 and taken[1] >= 9  # renewed about every 3 s until released
    taken.clear()
    fault = faults.pause_past_ttl("work", seconds=100)
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert taken[0] == 9.0  # never renewed while the process was stopped


def test_crash_kills_the_process_and_its_lease_expires_for_others() -> None:
    log: list[Any] = []
    fault = faults.crash("work")
    assert testing.explore(_lease_scenario(log), schedules=1, faults=[fault]).ok
    assert [e[:3] for e in log if e[0] == "t1"] == [("t1", "got", 0.0)]  # never ran again
    t2 = [e[:3] for e in log if e[0] == "t2"][:2]
    assert t2 == [("t2", "got", 10.0), ("t2", "resumed", 10.0)]  # once t1's ttl ran out
    assert log[-1] == ("results", None, None)  # a crashed task counts as done, no result


def test_faults_only_hit_spawned_tasks() -> None:
    async def scenario(sim: Simulation) -> None:
        lease = await sim.locks().acquire("res", ttl=3)  # the scenario's own, renewed
        sim.spawn(sim.sleep, 20)
        await sim.join()
        sim.check(not lease.lost, "the scenario's lease was lost")
        sim.check(sim.hits.get("lock.renew", 0) == 0, "counted the scenario's renewals")
        await lease.release()

    report = testing.explore(scenario, schedules=1, faults=[faults.crash("lock.renew")])
    assert report.ok, report


def _auto_runs(runs: list[tuple[Fault, ...]]) -> Any:
    async def job(sim: Simulation) -> None:
        async with await sim.locks().acquire("res", ttl=30):
            await testing.point("work")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        sim.spawn(job, sim)
        await sim.join()
        runs.append(sim.faults)

    return scenario


@pytest.mark.parametrize("depth", [1, 2])
def test_auto_limits_kinds_and_depth(depth: int) -> None:
    every: list[tuple[Fault, ...]] = []
    spec = faults.auto(kinds=["transient", "crash"], depth=depth)
    report = testing.explore(_auto_runs(every), schedules=300, faults=spec)
    assert report.schedules == 300 and report.faults == "auto"
    assert every[0] == ()  # schedule 0: no fault
    # the plan (no fault, each single, then each pair), then round it again
    assert {len(f) for f in every} == ({0, 1} if depth == 1 else {0, 1, 2})
    assert all(len(f) == 1 for f in every[1:4])
    kinds = {fault.kind for run in every for fault in run}
    assert kinds == {"transient", "crash"}
    # crash only where the process holds the lease (after its acquire), never at acquire
    assert {f.point for run in every for f in run if f.kind == "crash"} >= {"work"}
    assert all(f.point != "lock.acquire" or f.kind == "transient" for r in every for f in r)


def test_auto_tries_every_kind_by_default() -> None:
    every: list[tuple[Fault, ...]] = []
    testing.explore(_auto_runs(every), schedules=200, faults="auto")
    kinds = {fault.kind for run in every for fault in run}
    assert kinds == {"transient", "pause_past_ttl", "crash"}  # no table, no queue here


@pytest.mark.parametrize(
    "fault",
    [
        faults.transient("db.write", 3),
        faults.transient("lock.acquire", task="worker-2"),
        faults.commit_unknown(),
        faults.commit_unknown("db.write", 2, task="t1"),
        faults.lost_ack(4),
        faults.pause_past_ttl("effect.charge"),
        faults.pause_past_ttl("inbox.claim", 2, seconds=12.5, task="t3"),
        faults.pause_past_ttl("x", seconds=1e-3),
        faults.crash("inbox.complete", 7),
        Fault("crash", "my.point:with-colons", 12, "t1.1"),
    ],
)
def test_parse_reads_back_str_of_every_fault(fault: Fault) -> None:
    assert parse(str(fault)) == fault
    assert parse(f"  {fault}  ") == fault


def test_a_paused_process_runs_no_code_until_its_pause_ends() -> None:
    """A timeout that runs out while the process is stopped interrupts it only once it runs
    again: it is not woken to run its clean-up in the middle of the pause."""
    seen: list[Any] = []

    async def job(sim: Simulation) -> None:
        try:
            async with asyncio.timeout(5):
                await testing.point("work")
        except TimeoutError:
            seen.append(("timed out", sim.now()))

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim)
        await sim.join()

    fault = faults.pause_past_ttl("work", seconds=60)
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert seen == [("timed out", 60.0)]


def test_a_crashed_process_runs_no_code_even_when_cancelled() -> None:
    seen: list[Any] = []

    async def victim(sim: Simulation, log: list[str]) -> None:
        try:
            await testing.point("work")
        finally:
            log.append("clean-up")  # a killed process cleans nothing up

    async def killer(sim: Simulation, target: Any) -> None:
        await sim.sleep(1)
        target.atask.cancel()
        await sim.sleep(1)

    async def scenario(sim: Simulation) -> None:
        log: list[str] = []
        target = sim.spawn(victim, sim, log)
        sim.spawn(killer, sim, target)
        await sim.join()
        seen.append(list(log))

    assert testing.explore(scenario, schedules=1, faults=[faults.crash("work")]).ok
    assert seen == [[]]
