"""jobfence.testing with sync code: ``point()`` in thread tasks, the blocking clients of
``sim.locks(sync=True)``..., and the threads jobfence starts (renewers) as tasks."""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import sys
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


# -- the threads jobfence starts in a task are tasks too ------------------------------------


def _recording(sim: Simulation, seen: list[tuple[str, str, float]]) -> None:
    """Note every point a spawned task reaches: (task, point, virtual time)."""
    original = sim.on_point

    def recording(point: str, info: dict[str, Any]) -> Any:
        task = sim.current()
        if task is not None and task.process is not sim.main:
            seen.append((task.name, point, sim.now()))
        return original(point, info)

    sim.on_point = recording  # type: ignore[method-assign]


def test_a_sync_renewer_is_a_background_task_on_virtual_time() -> None:
    seen: list[tuple[str, str, float]] = []
    out: dict[str, Any] = {}

    def job(sim: Simulation, locks: jobfence.Locks) -> None:
        with locks.acquire("res", ttl=9) as lease:  # renew=True: the renewer's thread
            testing.get_clock().sleep(100)  # eleven ttls: only renewals keep it
            out["lost"] = lease.lost
            out["left"] = lease.expires_in

    async def scenario(sim: Simulation) -> None:
        _recording(sim, seen)
        sim.spawn(job, sim, sim.locks(sync=True))
        await sim.join()

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert out["lost"] is False and out["left"] > 0
    renewals = [(task, at) for task, point, at in seen if point == "lock.renew"]
    # renewed by t1's background task t1.1, about every ttl/3 of virtual time, never late
    assert renewals and {task for task, _ in renewals} == {"t1.1"}
    times = [at for _, at in renewals]
    assert 25 <= len(times) <= 40 and all(0 < at < 100 for at in times)
    assert all(0 < b - a <= 4.5 for a, b in itertools.pairwise(times))  # about every ttl/3


def _holder_and_taker(
    fault: faults.Fault | None,
    out: dict[str, Any],
    seen: list[tuple[str, str, float]],
    own: bool = False,
) -> Any:
    """A holder takes ``res`` (renewed), reaches ``work``, sleeps 60 s and releases; a
    taker waits for ``res``. ``own``: the scenario's own ``jobfence.Locks`` on the schedule's
    store instead of ``sim.locks(sync=True)`` (the renewer is a task all the same)."""

    def holder(sim: Simulation, locks: jobfence.Locks) -> None:
        lease = locks.acquire("res", ttl=10)
        testing.point("work")
        testing.get_clock().sleep(60)
        out["holder_lost"] = lease.lost
        out["holder_token"] = lease.token
        lease.release()

    def taker(sim: Simulation, locks: jobfence.Locks) -> None:
        testing.get_clock().sleep(1)  # the holder takes it first
        lease = locks.acquire("res", ttl=10, timeout=500, renew=False)
        out["taken_at"] = sim.now()
        out["taker_token"] = lease.token
        lease.release()

    async def scenario(sim: Simulation) -> None:
        _recording(sim, seen)
        locks = jobfence.Locks(f"memory://{sim.namespace}") if own else sim.locks(sync=True)
        sim.spawn(holder, sim, locks)
        sim.spawn(taker, sim, locks)
        await sim.join()
        if own:
            locks.close()

    return scenario


@pytest.mark.parametrize("own", [False, True], ids=["sim.locks", "own-client"])
def test_a_crashed_process_s_renewer_never_renews_again(own: bool) -> None:
    out: dict[str, Any] = {}
    seen: list[tuple[str, str, float]] = []
    fault = faults.crash("work")
    scenario = _holder_and_taker(fault, out, seen, own)
    report = testing.explore(scenario, schedules=1, faults=[fault])
    assert report.ok, report
    assert "holder_lost" not in out  # the holder never ran again
    assert [p for p in seen if p[:2] == ("t1.1", "lock.renew")] == []  # nor did its renewer
    assert 10 <= out["taken_at"] < 60  # once the lease ran out, not before


@pytest.mark.parametrize("own", [False, True], ids=["sim.locks", "own-client"])
def test_a_paused_process_s_renewer_does_not_renew_so_its_lease_is_taken(own: bool) -> None:
    out: dict[str, Any] = {}
    seen: list[tuple[str, str, float]] = []
    fault = faults.pause_past_ttl("work", seconds=200)
    scenario = _holder_and_taker(fault, out, seen, own)
    report = testing.explore(scenario, schedules=1, faults=[fault])
    assert report.ok, report
    renewals = [at for task, point, at in seen if task == "t1.1" and point == "lock.renew"]
    assert not [at for at in renewals if 0 < at < 200]  # none during the pause
    assert 10 <= out["taken_at"] < 200  # taken while the holder was paused
    assert out["holder_lost"] is True  # the holder finds out when it wakes
    assert out["taker_token"] > out["holder_token"]


@pytest.mark.parametrize("own", [False, True], ids=["sim.locks", "own-client"])
def test_without_a_fault_the_renewed_lease_is_held_until_released(own: bool) -> None:
    out: dict[str, Any] = {}
    seen: list[tuple[str, str, float]] = []
    scenario = _holder_and_taker(None, out, seen, own)
    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert out["holder_lost"] is False and out["taken_at"] >= 60
    renewals = [at for task, point, at in seen if task == "t1.1" and point == "lock.renew"]
    assert len(renewals) >= 15  # every ttl/3 of the minute it held the lease


def test_sync_inbox_and_queue_renewers_are_background_tasks_too() -> None:
    seen: list[tuple[str, str, float]] = []
    out: dict[str, Any] = {}

    def job(sim: Simulation, inbox: jobfence.Inbox, queue: jobfence.Queue) -> None:
        queue.publish("hello", id="m1")
        [message] = queue.receive(visibility=10, renew=True)
        claim = inbox.claim("order:1", ttl=10, renew=True)
        testing.get_clock().sleep(50)
        out["claim"] = claim.lost
        claim.complete("done")
        message.ack()

    async def scenario(sim: Simulation) -> None:
        _recording(sim, seen)
        sim.spawn(job, sim, sim.inbox(sync=True), sim.queue(sync=True))
        await sim.join()
        out["left"] = await sim.queue().receive()  # acked: nothing comes back

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert out["claim"] is False and out["left"] == []
    renewers = {task for task, point, _ in seen if point in ("inbox.renew", "queue.renew")}
    assert renewers == {"t1.1", "t1.2"}  # one per client, both of t1's process


def test_on_lost_callbacks_of_a_sync_lease_run_in_a_background_task() -> None:
    out: dict[str, Any] = {}

    def job(sim: Simulation, locks: jobfence.Locks) -> None:
        lease = locks.acquire("res", ttl=10)
        lease.on_lost(lambda lost: out.setdefault("callback", sim.current().name))  # type: ignore[union-attr]
        testing.point("work")
        testing.get_clock().sleep(30)
        out["lost"] = lease.lost

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, sim.locks(sync=True))
        await sim.join()

    fault = faults.pause_past_ttl("work", seconds=100)
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert out["lost"] is True
    assert out["callback"].startswith("t1.")  # a task of the holder's process


# -- determinism ------------------------------------------------------------------------------


def _stale_holder(runs: list[Any]) -> Any:
    """Two sync workers add 1 to a total under a renewed lock; the store is plain Python
    with points at its read and write (what a thread task's own data looks like)."""

    def worker(sim: Simulation, locks: jobfence.Locks, db: dict[str, Any], log: list[Any]) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        lease = locks.acquire("order:1", ttl=10, timeout=1_000)
        try:
            testing.point("db.read", target="orders")
            total = db["total"]
            testing.point("work")
            testing.get_clock().sleep(2)
            testing.point("db.write", target="orders")
            db["total"] = total + 1
            log.append((name, "wrote", total + 1, lease.lost, sim.now()))
        finally:
            if not lease.lost:
                lease.release()

    async def scenario(sim: Simulation) -> None:
        db = {"total": 0}
        log: list[Any] = []
        # a client per worker: a client's renewer belongs to the process that started it
        sim.spawn(worker, sim, sim.locks(sync=True), db, log)
        sim.spawn(worker, sim, sim.locks(sync=True), db, log)
        results = await sim.join()
        runs.append((tuple(sim.picks), tuple(log), tuple(type(r).__name__ for r in results)))
        # every worker that wrote added 1: fewer is a lost update
        sim.check(db["total"] == len(log), f"lost update: total {db['total']}, log {log}")

    return scenario


def test_repeated_explores_of_a_sync_scenario_are_identical() -> None:
    outcomes = []
    for _ in range(2):
        runs: list[Any] = []
        report = testing.explore(
            _stale_holder(runs), schedules=60, seed=11, faults="auto", shrink=False
        )
        failure = report.failures[0]
        outcomes.append((runs, failure.index, failure.check, failure.message, str(failure.tape)))
    assert outcomes[0] == outcomes[1]
    runs, _, check, message, tape = outcomes[0]
    assert check == "check" and "lost update" in message
    assert "pause_past_ttl" in tape  # the paused holder's lease was taken: a stale write
    # the renewers were scheduled like the workers
    assert any("t1.1" in picks and "t2.1" in picks for picks, _, _ in runs)


def test_a_failing_seed_of_a_sync_scenario_replays_identically_100_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[Any] = []
    report = testing.explore(_stale_holder(runs), schedules=60, seed=11, faults="auto")
    failure = report.failures[0]
    explore_module = sys.modules["jobfence.testing.explore"]
    by_seed, by_tape = set(), set()
    for _ in range(100):
        runs.clear()  # the seed alone, as ``pytest --jobfence-seed=N`` runs it
        monkeypatch.setattr(explore_module, "_REPLAY_SEED", failure.seed)
        again = testing.explore(
            _stale_holder(runs), schedules=60, seed=11, faults="auto", shrink=False
        ).failures[0]
        monkeypatch.setattr(explore_module, "_REPLAY_SEED", None)
        by_seed.add((runs[-1], again.index, again.message, str(again.original)))
        runs.clear()  # and its shrunk tape
        replayed = failure.replay().failures[0]
        by_tape.add((runs[-1], replayed.message, str(replayed.tape)))
    assert len(by_seed) == 1 and len(by_tape) == 1
    [(_, index, message, _)] = by_seed
    assert index == failure.index and "lost update" in message


# -- the end of a schedule ------------------------------------------------------------------


def _no_new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_a_schedule_ending_with_threads_alive_tears_them_down() -> None:
    """Ended by a failed check, a budget and a crash, with thread tasks parked, sleeping
    and never started, and renewers (of tasks, and one of the scenario's own) running."""

    def holder(sim: Simulation, locks: jobfence.Locks, forever: threading.Event) -> None:
        lease = locks.acquire(f"res:{sim.current().name}", ttl=10)  # type: ignore[union-attr]
        testing.point("work")
        testing.get_clock().wait(forever, 1e9)  # never set: a wait the end interrupts
        lease.release()

    def scenario_of(how: str) -> Any:
        async def scenario(sim: Simulation) -> None:
            forever = threading.Event()
            locks = sim.locks(sync=True)
            mine = locks.try_acquire("scenario's own", ttl=10)  # a renewer of the scenario
            assert mine is not None
            for _ in range(3):
                sim.spawn(holder, sim, locks, forever)
            if how == "check":
                await sim.sleep(25)
                sim.check(False, "ended early")
            await sim.join()

        return scenario

    before = set(threading.enumerate())
    for how, fault_list in (
        ("check", None),
        ("budget", None),
        ("crash", [faults.crash("work", task="t2")]),
    ):
        report = testing.explore(scenario_of(how), schedules=2, faults=fault_list, max_time=500)
        assert not report.ok, how
        assert report.failures[0].check in ("check", "budget"), report
        assert _no_new_threads(before) == [], how


def test_a_sync_relay_s_lease_keeper_is_a_background_task() -> None:
    """Relay.run_once holds its batch with a keeper thread while it sends: a task of the
    relay's process, extending the rows' lease every lease/2 of virtual time."""
    seen: list[tuple[str, str, float]] = []
    out: dict[str, Any] = {}

    def relay_job(outbox: jobfence.Outbox) -> None:
        def send(rows: list[Any]) -> None:
            testing.get_clock().sleep(40)  # longer than the lease: only the keeper holds it
            out.setdefault("sent", []).extend(row.id for row in rows)

        relay = jobfence.Relay(outbox, send, lease=30, handle_signals=False)
        out["relayed"] = relay.run_once()

    async def scenario(sim: Simulation) -> None:
        _recording(sim, seen)
        outbox = sim.outbox(sync=True)
        row = {"queue": "orders", "key": None, "body": b"{}", "headers": {}, "delay": 0.0}
        outbox.backend.store.add([{**row, "id": "a"}, {**row, "id": "b"}])  # type: ignore[attr-defined]
        sim.spawn(relay_job, outbox)
        await sim.join()

    assert testing.explore(scenario, schedules=1, faults=None).ok
    assert out == {"relayed": 2, "sent": ["a", "b"]}
    kept = [at for task, point, at in seen if task == "t1.1" and point == "outbox.settle"]
    assert kept == [15.0, 30.0]  # extended at lease/2 and lease, while send() slept


def test_effects_and_critical_sections_work_in_thread_tasks_as_in_async_ones() -> None:
    """``sim.effect`` called without ``await`` in a thread task records the effect (after its
    point: a transient fault there records nothing), and ``with sim.critical(...)`` marks a
    thread's section, so the checkers see plain functions as they see async ones."""

    def charge(sim: Simulation) -> None:
        with sim.critical("payments"):
            testing.point("inside")
            sim.effect("charge", "order-1")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(charge, sim)
        sim.spawn(charge, sim)

    report = testing.explore(
        scenario, schedules=20, checks=[testing.single_holder(), testing.exactly_once("charge")]
    )
    assert not report.ok
    assert report.failures[0].check in ("single_holder", "exactly_once"), report

    seen: dict[str, Any] = {}

    def faulted(sim: Simulation) -> None:
        try:
            sim.effect("charge", "order-1")
        finally:
            seen["effects"] = dict(sim.effects)

    async def one(sim: Simulation) -> None:
        sim.spawn(faulted, sim)

    report = testing.explore(one, schedules=1, faults=[faults.transient("effect.charge")])
    assert report.ok, report
    assert seen["effects"] == {}  # the fault hit before the effect was recorded


def test_the_blocking_view_of_a_table_has_its_name() -> None:
    async def scenario(sim: Simulation) -> None:
        db = sim.table("counters", {"c": {"n": 0}})
        sim.check(db.sync.name == "counters", f"name {db.sync.name!r}")

    testing.explore(scenario, schedules=1).assert_ok()
