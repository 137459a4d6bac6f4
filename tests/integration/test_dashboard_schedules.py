"""The dashboard's schedules panel, read in process against real SQLite and Redis: a
scheduler standing for a worker fires, misses and skips slots on a
:class:`~jobfence.testing.ManualClock`; the dashboard reads them through a scheduler object
of its own (as ``--scheduler MODULE:OBJ`` loads one), ``Scheduler`` or ``AsyncScheduler``,
and pauses, resumes and triggers through it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

import jobfence
from jobfence import AsyncScheduler, ConfigurationError, Scheduler, Slot
from jobfence.dashboard import Dashboard, DashboardConfig
from jobfence.testing import ManualClock
from tests.conformance.specs import SPECS, Spec, inbox_table, new_namespace

pytestmark = pytest.mark.timeout(90)

#: the clock starts at 2026-12-04T15:00:00Z
START = datetime(2026, 12, 4, 15, tzinfo=timezone.utc).timestamp()
LABEL = "app.schedules:sched"


class Where:
    """A backend of one test: its URL and the inbox table (and lock namespace) of its
    schedulers."""

    def __init__(self, spec: Spec, tmp_path: Path) -> None:
        self.spec = spec
        self.url = spec.make_url(tmp_path)
        self.namespace = new_namespace()
        self.table = inbox_table(self.namespace)

    def inbox(self) -> jobfence.Inbox:
        return jobfence.Inbox(self.url, table=self.table)


@pytest.fixture(params=[s for s in SPECS if s.id in ("sqlite", "redis")], ids=lambda s: s.id)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    made = Where(request.param, tmp_path)
    yield made
    made.spec.cleanup(made.url, made.namespace)


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    with ManualClock(epoch=START) as manual:
        yield manual


def broken() -> None:
    raise RuntimeError("disk full")


def app(where: Where, pod: str, ran: list[tuple[str, str]]) -> Scheduler:
    """The application's scheduler, as each process builds it: ``beat`` every minute (a
    grace of 5 s), ``broken`` at 03:30 Paris time, failing."""
    sched = Scheduler(where.url, namespace=where.table, lease=5, pod=pod)

    def beat(slot: Slot) -> None:
        ran.append((pod, slot.key))

    sched.add("beat", every=60, grace=5, target=beat)
    sched.add("broken", cron="30 3 * * *", tz="Europe/Paris", target=broken)
    return sched


def fire_some(worker: Scheduler, clock: ManualClock) -> None:
    """15:00 fired; 15:01 and 15:02 missed and 15:03 fired 2 s late (the worker was away);
    then ``beat`` paused and 15:04 skipped."""
    assert [f.outcome for f in worker.tick()] == ["fired"]
    clock.advance(182)
    assert sorted(f.outcome for f in worker.tick()) == ["fired", "missed", "missed"]
    worker.pause("beat")
    clock.advance(60)
    assert [f.outcome for f in worker.tick()] == ["skipped"]


def key(at: str) -> str:
    return f"schedule:beat@2026-12-04T{at}Z"


def test_the_panel_shows_each_schedule_with_its_last_fires_and_counts(
    where: Where, clock: ManualClock
) -> None:
    ran: list[tuple[str, str]] = []
    with app(where, "worker-1", ran) as worker:
        fire_some(worker, clock)
    board = Dashboard(DashboardConfig(urls=(where.url,)), {LABEL: app(where, "dash", ran)})
    try:
        state = board.state()
    finally:
        board.close()
    [source] = state["schedulers"]
    assert (source["id"], source["label"], source["pod"]) == (0, LABEL, "dash")
    assert source["status"] == "ok"
    beat, nightly = source["schedules"]
    assert (beat["name"], beat["spec"], beat["tz"]) == ("beat", "every 60", "UTC")
    assert beat["paused"] is True
    assert beat["next_at"] == "2026-12-04T15:05:00Z"
    assert beat["next_in"] == 58.0  # the clock stands at 15:04:02
    assert beat["last"] == {
        "key": key("15:04:00"),
        "slot": "2026-12-04T15:04:00Z",
        "outcome": "skipped",
        "pod": "worker-1",
        "fired_at": None,
        "lag": None,
        "error": "the schedule is paused",
        "manual": False,
    }
    assert beat["misses"] == 2
    assert beat["read"] == 5
    assert beat["outcomes"] == {"fired": 2, "missed": 2, "skipped": 1, "failed": 0}
    shown = [(f["slot"][11:19], f["outcome"], f["pod"], f["lag"]) for f in beat["history"]]
    assert shown == [
        ("15:04:00", "skipped", "worker-1", None),
        ("15:03:00", "fired", "worker-1", 2.0),
        ("15:02:00", "missed", "worker-1", None),
        ("15:01:00", "missed", "worker-1", None),
        ("15:00:00", "fired", "worker-1", 0.0),
    ]
    assert beat["history"][1]["fired_at"] == "2026-12-04T15:03:02Z"
    assert (nightly["spec"], nightly["tz"]) == ("cron 30 3 * * * Europe/Paris", "Europe/Paris")
    assert nightly["next_at"] == "2026-12-05T02:30:00Z"  # 03:30 in Paris, UTC+1 in December
    assert (nightly["paused"], nightly["last"], nightly["misses"]) == (False, None, 0)
    assert (nightly["read"], nightly["history"]) == (0, [])
    assert ran == [("worker-1", key("15:00:00")), ("worker-1", key("15:03:00"))]


def test_pause_resume_and_trigger_act_on_every_process(where: Where, clock: ManualClock) -> None:
    ran: list[tuple[str, str]] = []
    worker = app(where, "worker-1", ran)
    board = Dashboard(DashboardConfig(urls=(where.url,)), {LABEL: app(where, "dash", ran)})
    try:
        fire_some(worker, clock)
        source = board.scheduler(0)
        assert source.resume("beat") == {"schedule": "beat", "paused": False, "was_paused": True}
        assert worker.info("beat").paused is False  # the worker sees it
        clock.advance(60)
        assert [(f.key, f.outcome) for f in worker.tick()] == [(key("15:05:00"), "fired")]

        assert source.pause("beat") == {"schedule": "beat", "paused": True, "was_paused": False}
        assert worker.info("beat").paused is True
        assert source.pause("beat")["was_paused"] is True
        [beat, _] = board.state()["schedulers"][0]["schedules"]
        assert beat["paused"] is True

        # a trigger fires in the dashboard's process, whatever the pause
        fired = source.trigger("beat")
        assert fired["outcome"] == "fired" and fired["pod"] == "dash" and fired["manual"]
        assert fired["key"].startswith(key("15:05:02") + "+manual-")
        assert ran[-1] == ("dash", fired["key"])
        failed = source.trigger("broken")
        assert failed["outcome"] == "failed" and failed["error"] == "RuntimeError: disk full"
        [last] = worker.history("broken")
        assert (last.key, last.outcome, last.pod) == (failed["key"], "failed", "dash")
        [beat, broken_] = board.state()["schedulers"][0]["schedules"]
        assert beat["last"]["key"] == fired["key"] and beat["last"]["manual"] is True
        assert broken_["outcomes"]["failed"] == 1
    finally:
        board.close()
        worker.close()


def test_an_unknown_schedule_or_scheduler_changes_nothing(where: Where, clock: ManualClock) -> None:
    ran: list[tuple[str, str]] = []
    board = Dashboard(DashboardConfig(urls=(where.url,)), {LABEL: app(where, "dash", ran)})
    plain = Dashboard(DashboardConfig(urls=(where.url,)))
    try:
        source = board.scheduler(0)
        before = board.state()["schedulers"]
        for action in (source.pause, source.resume, source.trigger):
            for name in ("nosuch", "", None, 7, "beat "):
                with pytest.raises(ConfigurationError) as caught:
                    action(name)
                assert caught.value.argument == "name"
                assert f"no schedule named {name!r} in scheduler {LABEL}" in str(caught.value)
                assert "known: ['beat', 'broken']" in str(caught.value)
        for index in (1, -1, "0", True, None):
            with pytest.raises(ConfigurationError) as caught:
                board.scheduler(index)
            assert caught.value.argument == "scheduler"
        with pytest.raises(ConfigurationError) as caught:
            plain.scheduler(0)
        assert "--scheduler" in str(caught.value)
        assert plain.state()["schedulers"] == []
        assert board.state()["schedulers"] == before
        with where.inbox() as inbox:
            assert inbox.claims(prefix="schedule", limit=100) == []  # no record, no mark
        assert ran == []
    finally:
        board.close()
        plain.close()


def test_an_async_scheduler_is_read_and_acted_on_in_a_loop_of_its_own(
    where: Where, clock: ManualClock
) -> None:
    ran: list[tuple[str, str]] = []
    looped: list[str] = []
    sched = AsyncScheduler(where.url, namespace=where.table, lease=5, pod="dash-async")

    async def beat(slot: Slot) -> None:
        looped.append(slot.key)

    sched.add("beat", every=60, grace=5, target=beat)
    board = Dashboard(DashboardConfig(urls=(where.url,)), {LABEL: sched})
    try:
        with app(where, "worker-1", ran) as worker:
            fire_some(worker, clock)
            for _ in range(3):  # the clients opened on the first read serve the next ones
                [source_state] = board.state()["schedulers"]
                assert source_state["status"] == "ok", source_state
                [row] = source_state["schedules"]
                assert (row["paused"], row["misses"], row["read"]) == (True, 2, 5)
            source = board.scheduler(0)
            assert source.resume("beat")["was_paused"] is True
            assert worker.info("beat").paused is False
            fired = source.trigger("beat")
            assert (fired["outcome"], fired["pod"]) == ("fired", "dash-async")
            assert looped == [fired["key"]]
            assert source.pause("beat")["was_paused"] is False
            assert worker.info("beat").paused is True
    finally:
        board.close()
    thread_names = [t.name for t in threading.enumerate()]
    assert "jobfence-dashboard-scheduler-0" not in thread_names  # its loop stopped


def test_a_scheduler_whose_backend_is_down_shows_its_error_masked(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a local port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = Scheduler(f"redis://:s3cret-pw@127.0.0.1:{port}/0", pod="dash")
    down.add("beat", every=60, target=broken)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    board = Dashboard(DashboardConfig(urls=(url,)), {LABEL: down, "other": app_for(url)})
    try:
        state = board.state()
    finally:
        board.close()
    failing, working = state["schedulers"]
    assert failing["status"] == "error" and failing["schedules"] == []
    assert "Connection" in failing["error"] and "s3cret-pw" not in failing["error"]
    assert failing["url"] == f"redis://:***@127.0.0.1:{port}/0"
    assert working["status"] == "ok" and [s["name"] for s in working["schedules"]] == ["beat"]
    assert state["targets"][0]["locks"]["status"] == "ok"  # the other panels go on


def app_for(url: str) -> Scheduler:
    sched = Scheduler(url, pod="dash")
    sched.add("beat", every=60, target=broken)
    return sched


def test_only_schedulers_are_taken() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Dashboard(DashboardConfig(urls=("memory://",)), {"app:sched": object()})  # type: ignore[dict-item]
    assert caught.value.argument == "schedulers" and "app:sched" in str(caught.value)
