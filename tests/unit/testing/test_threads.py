"""jobfence.testing: plain functions in threads, deadlocks, budgets, what fails a schedule."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults


def _sync_worker(sim: Simulation, url: str, log: list[Any], pause: float) -> None:
    """A plain function with jobfence's sync client: runs in a thread of its own."""
    locks = jobfence.Locks(url)
    try:
        name = sim.current().name  # type: ignore[union-attr]
        lease = locks.try_acquire("res", ttl=30, renew=False)
        log.append((name, "acquire", lease is not None, sim.now()))
        testing.get_clock().sleep(pause)  # a sleep point, in virtual time
        log.append((name, "woke", sim.now()))
        if lease is not None:
            lease.release()
    finally:
        locks.close()


def _threads_scenario(runs: list[Any], pauses: tuple[float, ...] = (20.0, 5.0)) -> Any:
    async def scenario(sim: Simulation) -> None:
        log: list[Any] = []
        url = f"memory://{sim.namespace}/sync"
        for pause in pauses:
            sim.spawn(_sync_worker, sim, url, log, pause)
        await sim.join()
        runs.append((tuple(sim.picks), tuple(log)))

    return scenario


def test_a_thread_task_is_controlled_at_jobfence_points_and_sleeps() -> None:
    runs: list[Any] = []
    report = testing.explore(_threads_scenario(runs), schedules=40, seed=1)
    assert report.ok and report.schedules == 40
    winners = set()
    for _picks, log in runs:
        got = [entry[0] for entry in log if entry[1] == "acquire" and entry[2]]
        assert len(got) == 1  # the lock is the memory store's, shared by the threads
        winners.add(got[0])
        woke = {entry[0]: entry[2] for entry in log if entry[1] == "woke"}
        assert woke == {"t1": 20.0, "t2": 5.0}  # virtual sleeps, from time 0
        # sleeping threads wake in deadline order: t2 (5 s) before t1 (20 s)
        assert [e[0] for e in log if e[1] == "woke"] == ["t2", "t1"]
    assert winners == {"t1", "t2"}  # the decision at lock.acquire went both ways
    fifo = runs[0][1]
    assert fifo[0] == ("t1", "acquire", True, 0.0)


def test_thread_schedules_are_reproducible() -> None:
    first: list[Any] = []
    testing.explore(_threads_scenario(first), schedules=15, seed=9)
    again: list[Any] = []
    testing.explore(_threads_scenario(again), schedules=15, seed=9)
    assert again == first


def test_a_deadlock_fails_the_schedule_naming_the_stuck_tasks() -> None:
    async def stuck(event: asyncio.Event) -> None:
        await testing.point("before")
        await event.wait()  # nobody ever sets it

    async def scenario(sim: Simulation) -> None:
        event = asyncio.Event()
        sim.spawn(stuck, event)
        sim.spawn(stuck, event)
        await sim.join()

    report = testing.explore(scenario, schedules=3)
    failure = report.failures[0]
    assert failure.check == "deadlock" and failure.index == 0
    assert "t1, t2" in failure.message


def test_a_thread_waiting_forever_is_a_deadlock_too() -> None:
    import threading

    def wait_forever(event: threading.Event) -> None:
        testing.get_clock().wait(event, 1e9)  # a wait in virtual time, never set
        testing.get_clock().sleep(1)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(wait_forever, threading.Event())
        await sim.join()

    report = testing.explore(scenario, schedules=2, max_time=1e6)
    assert report.failures[0].check == "budget"
    assert "max_time" in report.failures[0].message


def _spinner(catch: bool) -> Any:
    async def spin() -> None:
        while True:
            if not catch:
                await testing.point("spin")
                continue
            try:
                await testing.point("spin")
            except Exception:  # a job that logs and carries on
                pass

    return spin


def test_max_steps_ends_a_livelock() -> None:
    ran: list[int] = []

    def scenario_of(catch: bool) -> Any:
        async def scenario(sim: Simulation) -> None:
            ran.append(1)
            sim.spawn(_spinner(catch))
            sim.spawn(_spinner(catch))
            await sim.join()

        return scenario

    for catch in (False, True):  # a job's own ``except Exception`` must not swallow it
        ran.clear()
        report = testing.explore(scenario_of(catch), schedules=5, max_steps=200)
        failure = report.failures[0]
        assert failure.check == "budget", (catch, failure)
        assert "max_steps=200" in failure.message
        assert failure.error is None
        assert failure.index == 0 and failure.deviations == 0
        assert len(ran) == 1  # found under FIFO with no fault: nothing to shrink, no re-run


def test_max_steps_ends_a_lone_task_looping_over_points() -> None:
    """Alone, a task passes its points without any decision: the points count too (a
    polling loop without a pause would otherwise never end)."""

    async def scenario(sim: Simulation) -> None:
        sim.spawn(_spinner(catch=True))
        await sim.join()

    failure = testing.explore(scenario, schedules=2, max_steps=500).failures[0]
    assert failure.check == "budget" and "max_steps=500" in failure.message


def test_a_task_spinning_without_points_or_time_fails_the_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Simulation, "max_spins", 20_000)

    async def busy() -> None:
        while True:
            await asyncio.sleep(0)  # neither a point nor any time: only the loop turns

    async def scenario(sim: Simulation) -> None:
        sim.spawn(busy)
        await sim.join()

    failure = testing.explore(scenario, schedules=2).failures[0]
    assert failure.check == "budget" and "20000 loop iterations" in failure.message


def test_max_time_ends_a_task_that_sleeps_forever() -> None:
    async def forever() -> None:
        while True:
            await asyncio.sleep(100)  # no point at all: only virtual time moves

    async def scenario(sim: Simulation) -> None:
        sim.spawn(forever)
        await sim.join()

    report = testing.explore(scenario, schedules=3, max_time=50_000)
    failure = report.failures[0]
    assert failure.check == "budget" and "max_time=50000" in failure.message


def test_an_unexpected_exception_in_a_task_fails_the_schedule() -> None:
    async def job(sim: Simulation) -> None:
        await testing.point("x")
        raise TypeError("a bug in the job")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, name="buggy")
        results = await sim.join()
        assert isinstance(results[0], TypeError)

    report = testing.explore(scenario, schedules=3)
    failure = report.failures[0]
    assert failure.check == "exception" and isinstance(failure.error, TypeError)
    assert failure.message == "buggy raised TypeError('a bug in the job')"


def test_an_unexpected_exception_in_a_thread_fails_the_schedule() -> None:
    def job() -> None:
        testing.get_clock().sleep(1)
        raise TypeError("a bug in the thread")

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job)
        await sim.join()

    failure = testing.explore(scenario, schedules=2).failures[0]
    assert failure.check == "exception" and isinstance(failure.error, TypeError)


def test_an_injected_fault_or_a_jobfence_error_ending_a_job_is_not_a_failure() -> None:
    seen: list[Any] = []

    async def faulted() -> None:
        await testing.point("x")  # the injected fault ends this job

    async def locked_out(sim: Simulation) -> None:
        locks = sim.locks()
        await locks.acquire("res", ttl=30, timeout=1)  # held by main: LockTimeout

    async def wrapped() -> None:  # a job error caused by an injected fault
        try:
            await testing.point("y")
        except ConnectionError as exc:
            raise RuntimeError("gave up") from exc

    async def scenario(sim: Simulation) -> None:
        holder = sim.locks()
        lease = await holder.acquire("res", ttl=30)
        sim.spawn(faulted)
        sim.spawn(locked_out, sim)
        sim.spawn(wrapped)
        seen.append([type(r).__name__ for r in await sim.join()])
        await lease.release()

    report = testing.explore(
        scenario, schedules=1, faults=[faults.transient("x"), faults.transient("y")]
    )
    assert report.ok, report
    assert seen == [["InjectedFault", "LockTimeout", "RuntimeError"]]


# -- isolation of schedules -----------------------------------------------------------------


def test_a_memory_store_a_schedule_creates_does_not_outlive_it() -> None:
    """A job's own memory:// client (here an inbox on a fixed URL, as a sync job in a thread
    would make one) starts every schedule empty: what one schedule stored must not change
    the next one, or a schedule would not replay alone."""
    url = f"memory://jftest-{uuid.uuid4().hex}"
    states: list[str] = []

    def job() -> None:
        inbox = jobfence.Inbox(url)
        try:
            claim = inbox.claim("order:1", ttl=60)
            states.append(claim.state.value)
            if claim.state is jobfence.ClaimState.NEW:
                claim.complete("charged")
        finally:
            inbox.close()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job)
        await sim.join()

    assert testing.explore(scenario, schedules=3).ok
    assert states == ["new", "new", "new"]


def test_many_schedules_leave_no_memory_store_behind() -> None:
    from jobfence.backends.memory import inbox, locks, queue

    async def job(sim: Simulation, n: int) -> None:
        async with await sim.locks().acquire("res", ttl=30):
            claim = await sim.inbox().claim(f"job:{n}")
            await testing.point("work")
            await claim.complete(n)
        await sim.queue().publish(n)
        sync = jobfence.Locks(f"memory://{sim.namespace}-sync")  # a job's own client
        sync.close()

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, 1)
        sim.spawn(job, sim, 2)
        await sim.join()

    before = [len(m._stores) for m in (locks, inbox, queue)]
    assert testing.explore(scenario, schedules=300).ok
    assert [len(m._stores) for m in (locks, inbox, queue)] == before


def test_a_scenario_that_raises_fails_the_schedule_with_its_exception() -> None:
    async def scenario(sim: Simulation) -> None:
        sim.spawn(testing.point, "x")
        raise KeyError("boom")

    failure = testing.explore(scenario, schedules=3).failures[0]
    assert failure.check == "exception" and isinstance(failure.error, KeyError)
    assert failure.message == "the scenario raised KeyError('boom')"


def test_checks_run_at_the_points_of_thread_tasks_too() -> None:
    sent: list[str] = []
    after: list[str] = []

    def mailer(sim: Simulation) -> None:
        name = sim.current().name  # type: ignore[union-attr]
        locks = jobfence.Locks(f"memory://{sim.namespace}/mail")
        try:
            testing.get_clock().sleep(1)
            sent.append("mail:1")  # no deduplication: the second thread sends it again
            # the next point (a lock operation, no wait): the check stops this thread here
            locks.try_acquire(f"lock:{name}", ttl=30, renew=False)
            after.append(name)
        finally:
            locks.close()

    async def scenario(sim: Simulation) -> None:
        sent.clear()
        after.clear()
        sim.spawn(mailer, sim)
        sim.spawn(mailer, sim)
        await sim.join()

    checks = [testing.exactly_once(sent)]
    report = testing.explore(scenario, schedules=3, checks=checks, shrink=False)
    assert report.failures[0].check == "exactly_once"
    assert len(after) < 2  # the thread that sent it twice never went past its next point


def test_an_error_raised_while_handling_an_injected_fault_is_a_failure() -> None:
    """``raise Gave_up() from exc`` ends a job as an outcome; a TypeError in the ``except``
    block is a bug the fault revealed."""

    log: list[str] = []

    async def job() -> None:
        try:
            await testing.point("x")
        except ConnectionError as exc:
            log.append("failed: %d" % exc)  # noqa: UP031  (the bug: %d of an exception)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job)
        await sim.join()

    report = testing.explore(scenario, schedules=2, faults=[faults.transient("x")])
    failure = report.failures[0]
    assert failure.check == "exception" and isinstance(failure.error, TypeError)
    assert isinstance(failure.error.__context__, testing.InjectedFault)


class _Abort(BaseException):
    """A job's own BaseException (not an Exception)."""


def test_a_job_ending_in_a_base_exception_of_its_own_fails_the_schedule() -> None:
    async def job() -> None:
        await testing.point("a")
        raise _Abort("gone")

    def thread_job() -> None:
        testing.get_clock().sleep(1)
        raise _Abort("gone too")

    for spawned in (job, thread_job):

        async def scenario(sim: Simulation, spawned: Any = spawned) -> None:
            sim.spawn(spawned)
            await sim.join()

        failure = testing.explore(scenario, schedules=2).failures[0]
        assert failure.check == "exception" and isinstance(failure.error, _Abort), spawned
