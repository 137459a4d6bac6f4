"""Scheduled jobs in a simulation: ``once_per_slot`` and ``at_most_holders`` find their
violation and pass a correct scenario; ``sim.skew`` gives a task's process its own wall
clock, under which a cron loop deduplicated by a lock fires a slot twice and one keyed on
the slot does not."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults

# -- cron loops -------------------------------------------------------------------------------


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _to_next_minute(sim: Simulation) -> str:
    """Sleep to the next minute by this task's wall clock; that minute's slot."""
    now = testing.get_clock().time()
    await sim.sleep((now // 60 + 1) * 60 - now)
    return _iso(testing.get_clock().time() // 60 * 60)


async def lock_pod(sim: Simulation, locks: Any, minutes: int) -> None:
    """Each pod wakes at its own minute and fires unless another pod holds the job's lock:
    pods whose clocks differ by more than the job's run time both fire the minute."""
    for _ in range(minutes):
        slot = await _to_next_minute(sim)
        lease = await locks.try_acquire("cron:report", ttl=10, renew=False)
        if lease is None:
            continue  # another pod runs it now
        async with lease:
            await sim.effect("fire", ("report", slot))
            await sim.sleep(1)  # the job's work


async def slot_pod(sim: Simulation, inbox: Any, minutes: int) -> None:
    """Each pod claims the slot's key: the first claim of a slot fires it, whenever it comes."""
    for _ in range(minutes):
        slot = await _to_next_minute(sim)
        claim = await inbox.claim(f"schedule:report@{slot}", ttl=30)
        if claim.state is not jobfence.ClaimState.NEW:
            continue  # fired, or being fired, by another pod
        await sim.effect("fire", ("report", slot))
        await sim.sleep(1)
        await claim.complete("fired")


EXPECTED = [("report", _iso(1_767_225_600 + 60 * m)) for m in (1, 2, 3)]


def _cron(pod: Any, skew: float) -> Any:
    async def scenario(sim: Simulation) -> None:
        store = sim.locks() if pod is lock_pod else sim.inbox()
        sim.spawn(pod, sim, store, 3, name="pod-a")
        other = sim.spawn(pod, sim, store, 3, name="pod-b")
        if skew:
            sim.skew(other, skew)

    return scenario


def test_a_lock_deduplicated_cron_loop_fires_each_slot_once_while_clocks_agree() -> None:
    checks = [testing.once_per_slot("fire", expected=EXPECTED)]
    testing.explore(_cron(lock_pod, 0), schedules=200, checks=checks).assert_ok()


@pytest.mark.parametrize("skew", [-5.0, 5.0])
def test_under_skew_the_lock_deduplicated_loop_fires_a_slot_twice(skew: float) -> None:
    checks = [testing.once_per_slot("fire")]
    report = testing.explore(_cron(lock_pod, skew), schedules=50, checks=checks)
    failure = report.failures[0]
    assert failure.check == "once_per_slot"
    assert failure.message == f"schedule 'report' fired slot {EXPECTED[0][1]!r} 2 times"


@pytest.mark.parametrize("skew", [-5.0, 5.0, -50.0])
def test_under_skew_the_slot_keyed_loop_fires_each_slot_once(skew: float) -> None:
    checks = [testing.once_per_slot("fire", expected=EXPECTED)]
    testing.explore(_cron(slot_pod, skew), schedules=300, checks=checks).assert_ok()


@pytest.mark.parametrize("skew", [-5.0, 5.0])
def test_a_skew_below_the_claims_ttl_survives_any_single_fault(skew: float) -> None:
    # a single fault may lose a slot (a crash before its fire) but never fires one twice;
    # two can: a fire whose record is never stored (complete fails) leaves the claim to
    # expire, and a pod stopped past its ttl right before claiming the same slot then takes
    # it over: the window an effect closes only in the claim's transaction (claim_in)
    once = [testing.once_per_slot("fire")]
    single = faults.auto(depth=1)
    testing.explore(_cron(slot_pod, skew), schedules=300, faults=single, checks=once).assert_ok()


def test_a_skew_beyond_the_claims_ttl_fires_a_slot_twice_when_its_pod_stalls() -> None:
    # pod-b, 50 s behind, claims a slot 50 s after pod-a: past the 30 s ttl of pod-a's claim,
    # which a pod stopped in the middle of its fire no longer holds
    once = [testing.once_per_slot("fire")]
    report = testing.explore(_cron(slot_pod, -50.0), schedules=300, faults="auto", checks=once)
    failure = report.failures[0]
    [fault] = failure.tape.faults
    assert (fault.kind, fault.point) == ("pause_past_ttl", "effect.fire")
    assert failure.message.startswith("schedule 'report' fired slot '2026-01-01T00:0")
    assert failure.message.endswith("' 2 times")


# -- what skew changes -----------------------------------------------------------------------


def test_skew_moves_the_wall_clock_of_a_process_only() -> None:
    seen: dict[str, tuple[float, float]] = {}

    async def look(sim: Simulation) -> None:
        await sim.sleep(10)
        clock = testing.get_clock()
        seen[sim.current().name] = (clock.time(), clock.monotonic())  # type: ignore[union-attr]

    def look_in_a_thread() -> None:
        clock = testing.get_clock()
        seen["thread"] = (clock.time(), clock.monotonic())

    async def scenario(sim: Simulation) -> None:
        sim.spawn(look, sim, name="ahead")
        sim.spawn(look, sim, name="behind")
        sim.spawn(look, sim)
        sim.spawn(look_in_a_thread, name="thread")
        sim.skew("ahead", 2.5)
        sim.skew("behind", -90)
        sim.skew("thread", 7)
        await sim.join()
        seen["scenario"] = (testing.get_clock().time(), testing.get_clock().monotonic())

    testing.explore(scenario, schedules=1).assert_ok()
    true = 1_767_225_600.0 + 10
    assert seen["ahead"] == (true + 2.5, 10.0)
    assert seen["behind"] == (true - 90, 10.0)
    assert seen["t3"] == (true, 10.0)
    assert seen["thread"] == (1_767_225_600.0 + 7, 0.0)
    assert seen["scenario"] == (true, 10.0)


def test_the_memory_stores_keep_the_true_time_under_skew() -> None:
    """A claim taken by a process whose clock is ahead does not look expired to the others,
    nor live longer: the in-memory inbox stands for a server with one clock."""
    states: list[str] = []

    async def claimer(sim: Simulation, inbox: Any) -> None:
        claim = await inbox.claim("job:1", ttl=30)
        states.append(claim.state.name)
        await sim.sleep(20)

    async def other(sim: Simulation, inbox: Any) -> None:
        await sim.sleep(10)
        states.append((await inbox.claim("job:1", ttl=30)).state.name)  # t=10: in progress
        await sim.sleep(25)
        states.append((await inbox.claim("job:1", ttl=30)).state.name)  # t=35: expired

    async def scenario(sim: Simulation) -> None:
        inbox = sim.inbox()
        sim.skew(sim.spawn(claimer, sim, inbox), -3600)
        sim.skew(sim.spawn(other, sim, inbox), 3600)
        await sim.join()

    testing.explore(scenario, schedules=1).assert_ok()
    assert states == ["NEW", "IN_PROGRESS", "NEW"]


def test_skew_validates_its_arguments() -> None:
    errors: list[str | None] = []

    async def scenario(sim: Simulation) -> None:
        task = sim.spawn(sim.sleep, 1)
        for who, seconds in ((task, float("nan")), ("nobody", 1), (3, 1), (task, True)):
            try:
                sim.skew(who, seconds)  # type: ignore[arg-type]
            except jobfence.ConfigurationError as exc:
                errors.append(exc.argument)

    testing.explore(scenario, schedules=1).assert_ok()
    assert errors == ["seconds", "task", "task", "seconds"]


# -- once_per_slot ----------------------------------------------------------------------------


def test_once_per_slot_reads_a_list_and_names_the_slot_and_the_count() -> None:
    fires: list[Any] = []

    async def fire(sim: Simulation, slot: datetime) -> None:
        await testing.point("due")
        fires.append(("nightly", slot))

    midnight = datetime(2026, 3, 29, 0, 0, tzinfo=timezone.utc)

    async def scenario(sim: Simulation) -> None:
        fires.clear()
        for _ in range(3):
            sim.spawn(fire, sim, midnight)

    report = testing.explore(scenario, schedules=2, checks=[testing.once_per_slot(fires)])
    assert report.failures[0].message == f"schedule 'nightly' fired slot {midnight!r} 2 times"


def test_once_per_slot_at_the_end_names_the_slots_that_never_fired() -> None:
    async def scenario(sim: Simulation) -> None:
        async def fire() -> None:
            await sim.effect("fire", ("a", 1))

        sim.spawn(fire)

    checks = [testing.once_per_slot("fire", expected=[("a", 1), ["b", 2]])]
    report = testing.explore(scenario, schedules=1, checks=checks)
    assert report.failures[0].message == "schedule 'b' never fired slot 2"


def test_once_per_slot_refuses_what_is_no_pair() -> None:
    async def scenario(sim: Simulation) -> None:
        async def fire() -> None:
            await sim.effect("fire", "not-a-pair")

        sim.spawn(fire)

    report = testing.explore(scenario, schedules=1, checks=[testing.once_per_slot("fire")])
    assert report.failures[0].message == "fires must hold (schedule, slot) pairs, got 'not-a-pair'"
    for bad in ("", 3, None):
        with pytest.raises(jobfence.ConfigurationError) as exc:
            testing.once_per_slot(bad)  # type: ignore[arg-type]
        assert exc.value.argument == "fires"
    for expected in ("ab", [("a", 1, 2)], 5):
        with pytest.raises(jobfence.ConfigurationError) as exc:
            testing.once_per_slot("fire", expected=expected)  # type: ignore[arg-type]
        assert exc.value.argument == "expected"


# -- at_most_holders --------------------------------------------------------------------------


def _pool(permits: int, workers: int) -> Any:
    """Workers share ``permits`` names (a semaphore made of locks); each that gets one
    enters the section ``pool`` with its lease."""

    async def worker(sim: Simulation, locks: Any) -> None:
        for i in range(permits):
            lease = await locks.try_acquire(f"pool:{i}", ttl=30)
            if lease is not None:
                break
        else:
            return
        async with lease, sim.critical("pool", lease=lease):
            await testing.point("work")

    async def scenario(sim: Simulation) -> None:
        locks = sim.locks()
        for _ in range(workers):
            sim.spawn(worker, sim, locks)

    return scenario


def test_at_most_holders_passes_a_semaphore_and_counts_only_valid_leases() -> None:
    checks = [testing.at_most_holders(2, "pool")]
    testing.explore(_pool(2, 4), schedules=300, checks=checks).assert_ok()
    # a holder paused past its lease no longer counts, so its successor is no violation
    pause = [faults.pause_past_ttl("work")]
    testing.explore(_pool(2, 4), schedules=100, faults=pause, checks=checks).assert_ok()


def test_at_most_holders_finds_one_holder_too_many() -> None:
    report = testing.explore(_pool(3, 4), schedules=50, checks=[testing.at_most_holders(2)])
    failure = report.failures[0]
    assert failure.check == "at_most_holders"
    who, _, rest = failure.message.partition(" are inside ")
    names = who.split(", ")  # in the order they entered
    assert len(set(names)) == 3 and set(names) <= {"t1", "t2", "t3", "t4"}
    assert rest == "the critical section 'pool' at once: 3 holders, more than 2"


def test_at_most_holders_validates_its_arguments() -> None:
    for n in (0, -1, True, 1.5):
        with pytest.raises(jobfence.ConfigurationError) as exc:
            testing.at_most_holders(n)  # type: ignore[arg-type]
        assert exc.value.argument == "n"
    with pytest.raises(jobfence.ConfigurationError) as exc:
        testing.at_most_holders(2, "")
    assert exc.value.argument == "name"
