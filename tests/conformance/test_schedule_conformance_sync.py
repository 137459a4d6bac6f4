# Generated from test_schedule_conformance.py by tools/conformance_twins.py: do not edit.
# Edit the async specs and run: python tools/conformance_twins.py
"""The scheduler's conformance suite: every backend with an inbox, sync and async.

Each test runs on every spec of ``specs_for("inbox")`` (memory, sqlite, redis, postgres,
mysql, etcd) with schedulers standing for separate processes: each has an inbox and a lock
client of its own, and all read one :class:`~jobfence.testing.ManualClock`, which the test
moves by hand and each scheduler's ``tick()`` reads. The slots' claims end by the server's
clock (the memory backend's by the manual one): where a test needs a claim to have ended, it
waits for that state (:func:`wait_until_ended`). Written once over ``AsyncScheduler``;
``test_schedule_conformance_sync.py`` is generated from it by ``tools/conformance_twins.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, Scheduler, Slot
from jobfence._core import slots as slotmath
from jobfence._core.hooks import set_hook
from jobfence.testing import ManualClock
from tests.conformance import flow
from tests.conformance.conftest import InboxEnv

#: the scenarios' clocks start at 2026-12-04T15:00:00Z
START = datetime(2026, 12, 4, 15, tzinfo=timezone.utc).timestamp()
#: the claim ttl of a fire (etcd ends a claim after 2 s at the earliest)
LEASE = 2.0


class Pods:
    """Schedulers standing for separate processes: an inbox and a lock client each."""

    def __init__(self, ienv: InboxEnv) -> None:
        self.ienv = ienv
        self.locks: list[jobfence.Locks] = []
        self.schedulers: list[Scheduler] = []

    def new(self, pod: str, **options: Any) -> Scheduler:
        locks = jobfence.Locks(self.ienv.url, namespace=self.ienv.namespace)
        self.locks.append(locks)
        options.setdefault("lease", LEASE)
        scheduler = Scheduler(inbox=self.ienv.inbox(), locks=locks, pod=pod, **options)
        self.schedulers.append(scheduler)
        return scheduler

    def close(self) -> None:
        for scheduler in self.schedulers:
            try:
                scheduler.close()
            except Exception:  # closing after a failed test must not hide the failure
                pass
        for locks in self.locks:
            try:
                locks.close()
            except Exception:
                pass


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    with ManualClock(epoch=START) as manual:
        yield manual


@pytest.fixture
def pods(clock: ManualClock, ienv: InboxEnv) -> Iterator[Pods]:
    made = Pods(ienv)
    try:
        yield made
    finally:
        made.close()


def key(name: str, at: float) -> str:
    return slotmath.slot_key(name, int(at))


def move_to(clock: ManualClock, at: float) -> None:
    """Set the manual clock to the epoch time ``at``."""
    clock.set(at - clock.epoch)


def wait_until_ended(inbox: Any, claim_key: str, *, within: float = 20.0) -> None:
    """Read the record of ``claim_key`` until its first claim has ended: its deadline has
    passed by the server's clock, or a later attempt took it over."""
    deadline = time.monotonic() + within
    while True:
        info = inbox.claim_info(claim_key)
        assert info is not None
        if info.stuck or info.attempt > 1:
            return
        assert time.monotonic() < deadline, f"{claim_key!r} never expired: {info}"
        flow.sleep(0.05)


def counter(fired: dict[str, list[str]], pod: str) -> Any:
    """A target that notes which pod fired which slot, and that it ran inside the claim."""

    def beat(slot: Slot) -> None:
        claim = jobfence.current_claim()
        assert claim is not None and claim.key == slot.key
        fired.setdefault(slot.key, []).append(pod)

    return beat


def test_every_slot_fires_exactly_once_with_a_dead_and_a_paused_scheduler(
    pods: Pods, clock: ManualClock, ienv: InboxEnv
) -> None:
    fired: dict[str, list[str]] = {}
    a, b, c = pods.new("a"), pods.new("b"), pods.new("c")
    for scheduler in (a, b, c):
        scheduler.add("beat", every=1, target=counter(fired, scheduler.pod))
    steps = 60
    alive = [a, b, c]
    dead_key = frozen_key = ""
    frozen: list[Any] = []
    frozen_keys: set[str] = set()

    def freeze(point: str, **info: Any) -> None:
        if point == "inbox.renew" and frozen_keys.intersection(info.get("keys", ())):
            raise ConnectionError("the process is frozen")

    for step in range(steps):
        now = clock.time()
        if step == 20:
            # c claims this slot the way a fire does, then dies: it never ticks again
            dead_key = key("beat", now)
            held = ienv.inbox().claim(dead_key, ttl=LEASE)
            assert held.state is jobfence.ClaimState.NEW
            alive = [a, b]
        if step == 30:  # by now the dead claim has ended: the next pass takes the slot over
            wait_until_ended(ienv.inbox(), dead_key)
        if step == 40:
            # b claims this slot, then is frozen before its target starts (a process paused
            # by SIGSTOP or a VM suspended): no renewal of it gets through
            jobs, _ = b._pass(None)
            assert len(jobs) == 1
            frozen = jobs
            frozen_key = jobs[0].slot.key
            frozen_keys.add(frozen_key)
            set_hook(freeze)
            alive = [a]
        if step == 46:
            wait_until_ended(ienv.inbox(), frozen_key)
        if step == 50:
            set_hook(None)
            # b goes on where it stopped: its claim was lost meanwhile, so it runs nothing
            assert b._fire(frozen[0]) is None
            alive = [b, a]
        order = alive[step % len(alive) :] + alive[: step % len(alive)]
        for scheduler in order:
            scheduler.tick()
        clock.advance(1)
    expected = [key("beat", START + i) for i in range(steps)]
    assert sorted(fired) == expected
    twice = {k: pods_ for k, pods_ in fired.items() if len(pods_) != 1}
    assert twice == {}
    assert fired[dead_key][0] in ("a", "b")
    assert fired[frozen_key] == ["a"]
    assert {p for ps in fired.values() for p in ps} == {"a", "b", "c"}
    history = a.history("beat", limit=steps)
    assert [f.key for f in history] == expected[::-1]
    assert {f.outcome for f in history} == {"fired"}
    late = {f.key: f.lag for f in history if f.lag}
    assert set(late) == {dead_key, frozen_key}  # every other slot fired at its time


def test_misfire_latest_all_none_after_a_gap(pods: Pods, clock: ManualClock) -> None:
    fired: dict[str, list[str]] = {}
    a = pods.new("a")
    for policy in ("latest", "all", "none"):
        a.add(policy, every=10, grace=5, misfire=policy, target=counter(fired, policy))
    a.tick()  # each new schedule fires its first slot, START
    assert sorted(fired) == sorted(key(p, START) for p in ("latest", "all", "none"))
    fired.clear()
    clock.advance(108)  # the process was away: slots +10 .. +100 unrecorded, +100 is 8 s late
    fires = a.tick()
    late = [START + i for i in range(10, 101, 10)]
    assert sorted(fired) == sorted([key("latest", late[-1])] + [key("all", t) for t in late])
    outcomes = {(f.schedule, f.outcome): 0 for f in fires}
    for f in fires:
        outcomes[(f.schedule, f.outcome)] += 1
    assert outcomes == {
        ("latest", "fired"): 1,
        ("latest", "missed"): 9,
        ("all", "fired"): 10,
        ("none", "missed"): 10,
    }
    all_fired = [f.slot_at for f in fires if f.schedule == "all"]
    assert all_fired == sorted(all_fired)  # oldest first
    info = a.info("latest")
    assert info.misses == 9 and info.last is not None and info.last.outcome == "fired"
    assert (a.info("none")).misses == 10
    # another process starting now finds every slot recorded: nothing fires twice
    b = pods.new("b")
    for policy in ("latest", "all", "none"):
        b.add(policy, every=10, grace=5, misfire=policy, target=counter(fired, "b"))
    fired.clear()
    assert b.tick() == []
    assert fired == {}


@pytest.mark.parametrize("overlap", ["skip", "queue", "allow"])
def test_overlap_skip_queue_and_allow(pods: Pods, clock: ManualClock, overlap: str) -> None:
    started = threading.Event()
    finish = threading.Event()
    runs: list[str] = []

    def slow(slot: Slot) -> None:
        runs.append(slot.key)
        if len(runs) == 1:
            started.set()
            assert flow.wait_event(finish, 20)

    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        scheduler.add(overlap, every=1, overlap=overlap, target=slow)
    first = clock.time()
    running = flow.spawn(lambda: a.tick())
    assert flow.wait_event(started, 20)
    clock.advance(1)
    fires = b.tick()  # the next slot, while the first still runs
    if overlap == "skip":
        assert [(f.key, f.outcome) for f in fires] == [(key(overlap, first + 1), "skipped")]
        assert (b.info(overlap)).last.outcome == "skipped"  # type: ignore[union-attr]
    elif overlap == "queue":
        assert fires == []
    else:
        assert [(f.key, f.outcome) for f in fires] == [(key(overlap, first + 1), "fired")]
    finish.set()
    assert [f.outcome for f in flow.result(running, 20)] == ["fired"]
    clock.advance(1)
    fires = b.tick()
    if overlap == "queue":
        # the queued slot fires late, once the first is done; the next one waits for it
        assert [(f.key, f.outcome) for f in fires] == [(key(overlap, first + 1), "fired")]
        assert fires[0].lag is not None and fires[0].lag >= 1
        fires = b.tick()
    assert [(f.key, f.outcome) for f in fires] == [(key(overlap, first + 2), "fired")]
    expected = [key(overlap, first), key(overlap, first + 2)]
    if overlap != "skip":
        expected.insert(1, key(overlap, first + 1))
    assert sorted(runs) == expected


def test_pause_and_resume_are_seen_by_another_scheduler(pods: Pods, clock: ManualClock) -> None:
    fired: dict[str, list[str]] = {}
    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        scheduler.add("job", every=1, target=counter(fired, scheduler.pod))
    a.tick()
    a.pause("job")
    a.pause("job")  # pausing twice changes nothing
    assert (b.info("job")).paused
    clock.advance(1)
    fires = b.tick()
    assert [(f.key, f.outcome) for f in fires] == [(key("job", clock.time()), "skipped")]
    assert sorted(fired) == [key("job", START)]
    assert a.resume("job") is True
    assert a.resume("job") is False
    assert not (b.info("job")).paused
    clock.advance(1)
    fires = b.tick()
    assert [(f.outcome, f.pod) for f in fires] == [("fired", "b")]
    assert sorted(fired) == [key("job", START), key("job", clock.time())]


def test_jitter_is_the_same_on_every_scheduler(pods: Pods, clock: ManualClock) -> None:
    fired: dict[str, list[str]] = {}
    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        scheduler.add("spread", every=60, jitter=30, target=counter(fired, scheduler.pod))
    slot = START + 60
    delay = slotmath.jitter_delay("spread", int(slot), 30)
    assert 0 <= delay < 30 and delay == slotmath.jitter_delay("spread", int(slot), 30)
    move_to(clock, START + 31)
    a.tick()
    b.tick()
    assert list(fired) == [key("spread", START)]  # the first slot, on first sight
    fired.clear()
    move_to(clock, slot + delay - 0.001)
    assert a.tick() == [] and b.tick() == []
    move_to(clock, slot + delay)
    fires = b.tick() + a.tick()
    assert [(f.key, f.slot_at) for f in fires] == [
        (key("spread", slot), slotmath.slot_datetime(int(slot)))
    ]
    assert fires[0].lag is not None and fires[0].lag < 0.001
    assert list(fired) == [key("spread", slot)]


@pytest.mark.parametrize(
    ("day", "schedules", "expected"),
    [
        pytest.param(
            "2027-03-28",  # Europe/Paris 02:00 -> 03:00 (01:00Z)
            {"paris": ("30 2 * * *", "Europe/Paris")},
            {"paris": ["2027-03-27T01:30:00Z", "2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"]},
            id="forward",
        ),
        pytest.param(
            "2027-11-07",  # America/New_York 02:00 -> 01:00 (06:00Z)
            {
                "ny": ("30 1 * * *", "America/New_York"),
                "half": ("*/30 * * * *", "America/New_York"),
            },
            {"ny": ["2027-11-06T05:30:00Z", "2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]},
            id="back",
        ),
    ],
)
def test_a_dst_day_neither_skips_nor_doubles_a_slot(
    pods: Pods,
    clock: ManualClock,
    day: str,
    schedules: dict[str, tuple[str, str]],
    expected: dict[str, list[str]],
) -> None:
    fired: dict[str, list[str]] = {}
    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        for name, (expr, tz) in schedules.items():
            scheduler.add(name, cron=expr, tz=tz, grace=1200, target=counter(fired, "x"))
    first = datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp() - 86400
    move_to(clock, first)
    step = 0
    while clock.time() < first + 3 * 86400:
        (a if step % 2 else b).tick()
        clock.advance(900)
        step += 1
    for name, slots in expected.items():
        assert sorted(k for k in fired if k.startswith(f"schedule:{name}@")) == [
            f"schedule:{name}@{iso}" for iso in slots
        ]
    if "half" in schedules:  # every half hour of elapsed time, through the repeated hour
        halves = sorted(k for k in fired if k.startswith("schedule:half@"))
        times = [slotmath.parse_iso(k.split("@", 1)[1]).timestamp() for k in halves]
        assert times == [first + 1800 * i for i in range(3 * 48)]
    assert all(len(by) == 1 for by in fired.values())


def test_a_failing_target_is_recorded_failed_and_not_retried(
    pods: Pods, clock: ManualClock
) -> None:
    calls: list[str] = []

    def broken(slot: Slot) -> None:
        calls.append(slot.key)
        raise RuntimeError("disk full")

    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        scheduler.add("broken", every=60, target=broken)
    fires = a.tick()
    assert [(f.outcome, f.error) for f in fires] == [("failed", "RuntimeError: disk full")]
    assert b.tick() == [] and a.tick() == []
    assert calls == [key("broken", START)]
    manual = b.trigger("broken")
    assert manual.outcome == "failed" and manual.key.startswith(key("broken", START) + "+manual-")
    history = a.history("broken")
    assert [f.key for f in history] == [manual.key, key("broken", START)]


def test_attempts_retry_a_failing_target_inside_the_slot(pods: Pods, clock: ManualClock) -> None:
    calls: list[str] = []

    def flaky(slot: Slot) -> None:
        calls.append(slot.key)
        if len(calls) % 3:
            raise RuntimeError(f"try {len(calls)}")

    a = pods.new("a")
    a.add("thrice", every=60, attempts=3, target=flaky)
    a.add("twice", every=60, attempts=2, target=flaky)
    fires = {f.schedule: f for f in a.tick()}
    assert (fires["thrice"].outcome, fires["thrice"].error) == ("fired", None)
    assert (fires["twice"].outcome, fires["twice"].error) == ("failed", "RuntimeError: try 5")
    assert calls == [key("thrice", START)] * 3 + [key("twice", START)] * 2
    with pytest.raises(ConfigurationError) as info:
        a.add("never", every=60, attempts=0, target=flaky)
    assert info.value.argument == "attempts"


def test_a_transient_failure_gives_the_slot_back_until_grace(
    pods: Pods, clock: ManualClock
) -> None:
    """A broker or database away (a transient error) does not fail the slot: it is given back
    and fired on a later pass, by this process or another; once later than grace it is
    recorded failed."""
    down = {"outage": True, "gone": True}
    calls: list[tuple[str, str]] = []

    def publish(slot: Slot) -> None:
        calls.append((slot.schedule, slot.key))
        if down["gone"] if slot.schedule == "gone" else down["outage"]:
            raise ConnectionError("connection refused")

    a, b = pods.new("a"), pods.new("b")
    for scheduler in (a, b):
        scheduler.add("outage", every=60, target=publish)
        scheduler.add("gone", every=60, grace=5, target=publish)
    assert a.tick() == []  # both slots given back, none recorded
    assert b.tick() == []  # the other process takes them, fails and gives them back too
    clock.advance(2)
    down["outage"] = False
    fires = {f.schedule: f for f in b.tick()}  # a later pass fires it
    assert (fires["outage"].outcome, fires["outage"].key) == ("fired", key("outage", START))
    assert "gone" not in fires
    clock.advance(4)  # "gone" is now 6 s late, past its grace of 5 s
    fires = {f.schedule: f for f in a.tick() + b.tick()}
    assert (fires["gone"].outcome, fires["gone"].error) == (
        "failed",
        "ConnectionError: connection refused",
    )
    assert calls.count(("outage", key("outage", START))) == 3  # a and b failed, b fired
    assert [f.outcome for f in a.history("outage")] == ["fired"]
    assert [f.outcome for f in a.history("gone")] == ["failed"]


def test_trigger_fires_now_with_a_manual_slot(pods: Pods, clock: ManualClock) -> None:
    seen: list[Slot] = []

    def job(slot: Slot) -> None:
        seen.append(slot)

    a = pods.new("a")
    a.add("job", cron="0 3 * * *", target=job)
    clock.advance(12.5)
    fire = a.trigger("job")
    assert fire.outcome == "fired" and fire.pod == "a"
    assert [(s.manual, s.at.timestamp(), s.key) for s in seen] == [(True, START + 12, fire.key)]
    info = (a.schedules())[0]
    assert info.name == "job" and info.spec == "cron 0 3 * * * UTC" and info.last == fire
    assert info.next_at == datetime(2026, 12, 5, 3, tzinfo=timezone.utc)


def test_bad_input_names_the_argument(pods: Pods, ienv: InboxEnv) -> None:
    a = pods.new("a")

    def job() -> None:
        pass

    bad: list[tuple[dict[str, Any], str]] = [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "not cron"}, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"every": -1}, "seconds"),
        ({"every": 0}, "seconds"),
        ({"every": 1.5}, "seconds"),
        ({"every": 1, "misfire": "sometimes"}, "misfire"),
        ({"every": 1, "overlap": "stack"}, "overlap"),
        ({"every": 1, "grace": 0}, "grace"),
        ({"every": 1, "grace": -1}, "grace"),
        ({"every": 1, "jitter": -1}, "jitter"),
        ({"every": 1, "grace": 120, "catch_up": 60}, "catch_up"),
        ({}, "cron"),
        ({"cron": "* * * * *", "every": 1}, "every"),
        ({"every": 1, "target": None}, "target"),
    ]
    for options, argument in bad:
        options.setdefault("target", job)
        with pytest.raises(ConfigurationError) as info:
            a.add("bad", **options)
        assert info.value.argument == argument, options
    with pytest.raises(ConfigurationError) as info:
        a.every(seconds=-5)(job)
    assert info.value.argument == "seconds"
    for name in ("", "a@b"):
        with pytest.raises(ConfigurationError) as info:
            a.add(name, every=1, target=job)
        assert info.value.argument == "name"
    a.add("ok", every=1, target=job)
    with pytest.raises(ConfigurationError) as info:
        a.add("ok", every=1, target=job)
    assert info.value.argument == "name"
    with pytest.raises(ConfigurationError) as info:
        a.info("unknown")
    assert info.value.argument == "name"
    for options, argument in [
        ({"lease": -1}, "lease"),
        ({"lease": 0}, "lease"),
        ({"max_skew": -1}, "max_skew"),
        ({"retention": -5}, "retention"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            Scheduler(ienv.url, namespace=ienv.table, **options)
        assert info.value.argument == argument
    # records must outlive the window a process looks back over
    short = Scheduler(ienv.url, namespace=ienv.table, retention=3600)
    try:
        with pytest.raises(ConfigurationError) as info:
            short.add("x", every=1, catch_up=3600, target=job)
        assert info.value.argument == "retention" and "catch_up + max_skew + lease" in str(
            info.value
        )
        assert short.add("x", every=1, catch_up=3000, target=job) == "x"
    finally:
        short.close()
