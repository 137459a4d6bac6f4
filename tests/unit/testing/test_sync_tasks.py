"""jobfence.testing with sync code: ``point()`` in thread tasks, the blocking clients of
``sim.locks(sync=True)``..., and the threads jobfence starts (renewers) as tasks."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import warnings
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults

# -- point(): one function for async tasks, thread tasks and no simulation ----------------


def test_point_outside_a_simulation_is_a_no_op_in_both_forms() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "never awaited" RuntimeWarning fails the test
        done = testing.point("x")
        assert not inspect.iscoroutine(done)
        assert testing.point("x", target="orders") is done

        async def awaited() -> str:
            await testing.point("x")
            await testing.point("y", target=("orders", 1))
            return "went on"

        assert asyncio.run(awaited()) == "went on"
        del done
        gc.collect()


def test_point_checks_its_name_in_both_forms() -> None:
    for bad in ("", "a#b", 3):
        with pytest.raises(jobfence.ConfigurationError) as caught:
            testing.point(bad)  # type: ignore[arg-type]
        assert caught.value.argument == "name"


def _two_threads_at_a_point(runs: list[tuple[str, ...]]) -> Any:
    def job(sim: Simulation, log: list[str]) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        log.append(f"{name}:before")
        testing.point("step")  # blocks here until the scheduler lets it go
        log.append(f"{name}:after")

    async def scenario(sim: Simulation) -> None:
        log: list[str] = []
        sim.spawn(job, sim, log)
        sim.spawn(job, sim, log)
        await sim.join()
        runs.append(tuple(log))

    return scenario


def test_point_in_a_thread_task_is_a_decision_without_any_warning() -> None:
    runs: list[tuple[str, ...]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = testing.explore(_two_threads_at_a_point(runs), schedules=30, seed=2)
        gc.collect()
    assert report.ok, report
    # the first thread stops at its point, so the second gets past "before" first in some
    # schedules: the point is where the scheduler switched tasks
    assert ("t1:before", "t2:before", "t1:after", "t2:after") in runs or (
        "t1:before",
        "t2:before",
        "t2:after",
        "t1:after",
    ) in runs
    assert ("t1:before", "t1:after", "t2:before", "t2:after") in runs


def test_point_passes_its_target_to_the_simulation() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def thread_job() -> None:
        testing.point("charge", target="orders")
        testing.point("plain")

    async def async_job() -> None:
        await testing.point("charge", target=("orders", 7))

    async def scenario(sim: Simulation) -> None:
        original = sim.on_point

        def recording(point: str, info: dict[str, Any]) -> Any:
            seen.append((point, dict(info)))
            return original(point, info)

        sim.on_point = recording  # type: ignore[method-assign]
        sim.spawn(thread_job)
        await sim.join()
        sim.spawn(async_job)
        await sim.join()

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert seen == [
        ("charge", {"target": "orders"}),
        ("plain", {}),
        ("charge", {"target": ("orders", 7)}),
    ]


def _faulted_thread(fault: faults.Fault, out: dict[str, Any]) -> Any:
    def job(sim: Simulation) -> None:
        out["before"] = sim.now()
        testing.point("charge")
        out["after"] = sim.now()

    async def scenario(sim: Simulation) -> None:
        task = sim.spawn(job, sim)
        other = sim.spawn(testing.point, "other")
        await sim.join()
        out["error"] = task.error
        out["done"] = task.done and other.done

    return scenario


def test_a_transient_fault_at_a_user_point_raises_in_the_thread_task() -> None:
    out: dict[str, Any] = {}
    report = testing.explore(
        _faulted_thread(faults.transient("charge"), out),
        schedules=1,
        faults=[faults.transient("charge")],
    )
    assert report.ok, report  # an injected fault ending a job is an outcome, not a bug
    assert isinstance(out["error"], testing.InjectedFault)
    assert "after" not in out


def test_a_crash_at_a_user_point_kills_the_thread_tasks_process() -> None:
    out: dict[str, Any] = {}
    report = testing.explore(
        _faulted_thread(faults.crash("charge"), out), schedules=1, faults=[faults.crash("charge")]
    )
    assert report.ok, report
    assert "after" not in out and out["error"] is None and out["done"]


def test_a_pause_at_a_user_point_stops_the_thread_task_for_that_long() -> None:
    out: dict[str, Any] = {}
    fault = faults.pause_past_ttl("charge", seconds=120)
    report = testing.explore(_faulted_thread(fault, out), schedules=1, faults=[fault])
    assert report.ok, report
    assert out["before"] == 0.0 and out["after"] >= 120.0 and out["error"] is None


# -- sim.locks(sync=True) and the other blocking clients ------------------------------------


def test_the_sync_clients_are_the_blocking_ones_on_the_schedules_store() -> None:
    made: dict[str, Any] = {}

    def job(sim: Simulation) -> None:
        locks, inbox, queue = made["locks"], made["inbox"], made["queue"]
        with locks.acquire("res", ttl=30, renew=False) as lease:
            made["token"] = lease.token
        claim = inbox.claim("order:1", ttl=30, renew=False)
        claim.complete("done")
        queue.publish({"n": 1}, id="m1")
        [message] = queue.receive()
        message.ack()

    async def scenario(sim: Simulation) -> None:
        made["locks"] = sim.locks(sync=True)
        made["inbox"] = sim.inbox(sync=True)
        made["queue"] = sim.queue("work", sync=True)
        made["outbox"] = sim.outbox(sync=True)
        made["async"] = sim.locks()
        sim.spawn(job, sim)
        await sim.join()
        # the same memory:// store as the async clients': the inbox record is there
        info = await sim.inbox().claim_info("order:1")
        made["state"] = info.state.value if info is not None else None
        made["published"] = sim.published("work")

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert isinstance(made["locks"], jobfence.Locks)
    assert isinstance(made["inbox"], jobfence.Inbox)
    assert isinstance(made["queue"], jobfence.Queue)
    assert isinstance(made["outbox"], jobfence.Outbox)
    assert made["state"] == "completed" and made["published"] == ["m1"]
    for kind in ("locks", "inbox", "outbox", "async"):
        assert made[kind].closed, kind  # closed when the schedule ended
    assert made["queue"]._closed


def test_sync_must_be_a_bool() -> None:
    errors: list[BaseException] = []

    async def scenario(sim: Simulation) -> None:
        for make in (sim.locks, sim.inbox, sim.queue, sim.outbox):
            try:
                make(sync="yes")  # type: ignore[call-overload]
            except jobfence.ConfigurationError as exc:
                errors.append(exc)

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert len(errors) == 4 and all(e.argument == "sync" for e in errors)  # type: ignore[attr-defined]


def test_a_blocking_wait_in_async_code_is_refused_not_a_hang() -> None:
    async def scenario(sim: Simulation) -> None:
        locks = sim.locks(sync=True)
        held = locks.acquire("res", ttl=30, renew=False)  # no wait: fine on the loop
        try:
            locks.acquire("res", ttl=30, timeout=5, renew=False)  # would block the loop
        finally:
            held.release()

    failure = testing.explore(scenario, schedules=1, faults=None).failures[0]
    assert failure.check == "exception"
    assert isinstance(failure.error, jobfence.ConfigurationError)
    assert failure.error.argument == "sync"


def _sim_threads() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(("jobfence-sim", "jobfence-renewer", "jobfence-inbox", "jobfence-q"))
        or "renewer" in t.name
    ]
