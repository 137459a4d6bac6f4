"""What a schedule's fire runs (a function of either kind, ``queue=``, ``send=``) and the
``run()`` loop on the real clock, on the backends with both an inbox and a queue: memory,
SQLite, Redis."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobfence
from jobfence import AsyncScheduler, ConfigurationError, Scheduler, Slot
from jobfence.testing import ManualClock
from tests.conformance.specs import SPECS, Spec, inbox_table, new_namespace

pytestmark = pytest.mark.timeout(60)

#: 2026-12-04T15:00:00Z
START = 1_796_396_400.0


class Where:
    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        self.spec = spec
        self.url = spec.make_url(tmp_path)
        self.namespace = new_namespace()
        self.table = inbox_table(self.namespace)

    def cleanup(self) -> None:
        self.spec.cleanup(self.url, self.namespace)


@pytest.fixture(
    params=[s for s in SPECS if s.id in ("memory", "sqlite", "redis")], ids=lambda s: s.id
)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    made = Where(request.param, tmp_path)
    yield made
    made.cleanup()


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    with ManualClock(epoch=START) as manual:
        yield manual


def test_queue_target_publishes_each_slot_once_with_its_key_as_id(
    where: Where, clock: ManualClock
) -> None:
    queue = jobfence.Queue(where.url, where.namespace)
    made = [Scheduler(where.url, namespace=where.table, pod=p) for p in "ab"]
    try:
        for sched in made:
            sched.add("export", every=60, queue=queue, body=lambda slot: {"at": slot.key})
            sched.add("plain", every=60, queue=queue)
        for _ in range(3):
            for sched in made:
                sched.tick()
            clock.advance(60)
        messages = queue.receive(20)
        ids = sorted(m.id for m in messages)
        expected = sorted(
            f"schedule:{name}@2026-12-04T15:0{minute}:00Z"
            for name in ("export", "plain")
            for minute in range(3)
        )
        assert ids == expected
        bodies = {m.id: m.body for m in messages}
        first = "schedule:export@2026-12-04T15:00:00Z"
        assert bodies[first] == {"at": first}
        plain = "schedule:plain@2026-12-04T15:01:00Z"
        assert bodies[plain] == {
            "schedule": "plain",
            "slot": "2026-12-04T15:01:00+00:00",
            "key": plain,
        }
        info = made[0].info("export")
        assert info.target == f"queue {where.namespace!r}"
    finally:
        for sched in made:
            sched.close()
        queue.drop()
        queue.close()


def test_send_target_gets_the_slot(where: Where, clock: ManualClock) -> None:
    sent: list[Slot] = []
    with Scheduler(where.url, namespace=where.table) as sched:
        sched.add("handoff", cron="*/5 * * * *", send=sent.append)

        @sched.every(minutes=10, name="decorated", send=sent.append)
        def only_names_the_schedule() -> None:
            raise AssertionError("with send=, the function is not run")

        sched.tick()
        assert [(s.schedule, s.key, s.manual) for s in sent] == [
            ("handoff", "schedule:handoff@2026-12-04T15:00:00Z", False),
            ("decorated", "schedule:decorated@2026-12-04T15:00:00Z", False),
        ]
        assert sched.info("handoff").target.startswith("send ")


async def test_async_scheduler_runs_both_kinds_of_function_inside_the_claim(
    where: Where, clock: ManualClock
) -> None:
    seen: dict[str, tuple[str, bool]] = {}

    def blocking(slot: Slot) -> None:  # run in a thread
        claim = jobfence.current_claim()
        seen["blocking"] = (claim.key, threading.current_thread() is threading.main_thread())

    async def native(slot: Slot) -> None:
        claim = jobfence.current_claim()
        seen["native"] = (claim.key, threading.current_thread() is threading.main_thread())

    async with AsyncScheduler(where.url, namespace=where.table) as sched:
        sched.add("blocking", every=60, target=blocking)
        sched.add("native", every=60, target=native)
        fires = await sched.tick()
        assert sorted(f.outcome for f in fires) == ["fired", "fired"]
    assert seen == {
        "blocking": ("schedule:blocking@2026-12-04T15:00:00Z", False),
        "native": ("schedule:native@2026-12-04T15:00:00Z", True),
    }


def test_scheduler_refuses_an_async_target(where: Where) -> None:
    async def job() -> None:
        pass

    with Scheduler(where.url, namespace=where.table) as sched:
        with pytest.raises(ConfigurationError) as info:
            sched.add("job", every=60, target=job)
        assert info.value.argument == "target"
        with pytest.raises(ConfigurationError) as info:
            sched.add("two", every=60, target=lambda a, b: None)
        assert info.value.argument == "target"
        with pytest.raises(ConfigurationError) as info:
            sched.add("q", every=60, queue=object())
        assert info.value.argument == "queue"
        with pytest.raises(ConfigurationError) as info:
            sched.add("s", every=60, send="not callable")  # type: ignore[arg-type]
        assert info.value.argument == "send"


def test_run_fires_in_the_background_until_stopped_from_another_thread(where: Where) -> None:
    fired = threading.Event()
    keys: list[str] = []

    with Scheduler(where.url, namespace=where.table) as sched:

        @sched.every(seconds=1, name="beat")
        def beat(slot: Slot) -> None:
            keys.append(slot.key)
            fired.set()

        runner = threading.Thread(target=sched.run)
        runner.start()
        assert fired.wait(10)
        sched.stop()
        runner.join(10)
        assert not runner.is_alive()
    assert keys and len(keys) == len(set(keys))


async def test_async_run_stops_from_its_target(where: Where) -> None:
    keys: list[str] = []
    async with AsyncScheduler(where.url, namespace=where.table) as sched:

        @sched.every(seconds=1, name="once")
        async def once(slot: Slot) -> None:
            keys.append(slot.key)
            sched.stop()

        await asyncio.wait_for(sched.run(), 10)
        assert len(keys) == 1
        history = await sched.history("once")
        assert [f.key for f in history] == keys


def test_retention_of_a_given_inbox(where: Where) -> None:
    inbox = jobfence.Inbox(where.url, table=where.table, retention=600)
    try:
        with pytest.raises(ConfigurationError) as info:
            Scheduler(inbox=inbox, retention=700)
        assert info.value.argument == "retention"
        sched = Scheduler(inbox=inbox)
        assert sched.retention == 600
        with pytest.raises(ConfigurationError) as info:
            sched.add("long", every=60, catch_up=3600, target=lambda: None)
        assert info.value.argument == "retention"
        sched.close()
        with pytest.raises(ConfigurationError) as info:
            Scheduler(inbox=object())  # type: ignore[arg-type]
        assert info.value.argument == "inbox"
    finally:
        inbox.close()
