"""``jobfence.integrations.celery_beat``: how beat entries become jobfence schedules (a crontab
matches the same minutes as Celery's own), and the scheduler's ticks on a ``memory://``
backend with Celery's in-memory broker (the messages published are read from Celery's
``before_task_publish`` signal)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import celery
import pytest
from celery.schedules import BaseSchedule, crontab, schedule, solar
from celery.signals import before_task_publish

from jobfence import ConfigurationError
from jobfence._core import slots as slotmath
from jobfence.integrations.celery_beat import Scheduler, entry_schedule
from jobfence.testing import ManualClock, clocked


class Sunset(solar):  # type: ignore[misc]
    """A solar schedule made without the ephem library (only its type matters here)."""

    def __init__(self) -> None:
        BaseSchedule.__init__(self)


CRONTABS = [
    crontab(),
    crontab(minute=0, hour="*/3"),
    crontab(minute="*/15", day_of_week="mon-fri"),
    crontab(minute=30, hour="8-17", day_of_week="sun,sat"),
    crontab(minute="5,35", hour=2, day_of_month="1-7,15"),
    crontab(minute=0, hour=0, day_of_month=1, month_of_year="*/3"),
    crontab(minute=59, hour=23, day_of_week=0),
]


def _celery_minutes(spec: crontab, start: datetime, end: datetime) -> set[int]:
    """The minutes in [start, end) Celery's crontab matches, in the crontab's own fields."""
    found = set()
    at = start
    while at < end:
        if (
            at.minute in spec.minute
            and at.hour in spec.hour
            and at.day in spec.day_of_month
            and at.month in spec.month_of_year
            and at.isoweekday() % 7 in spec.day_of_week
        ):
            found.add(int(at.timestamp()))
        at += timedelta(minutes=1)
    return found


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris"])
@pytest.mark.parametrize("spec", CRONTABS, ids=repr)
def test_a_crontab_fires_at_the_minutes_celery_would(spec: crontab, tz: str) -> None:
    timing = entry_schedule("entry", spec, tz)
    assert timing["tz"] == tz
    zone = ZoneInfo(tz)
    # 100 days from the start of a month, inside summer time (no clock change)
    start, end = datetime(2026, 4, 1, tzinfo=zone), datetime(2026, 7, 10, tzinfo=zone)
    cron = slotmath.CronSpec(timing["cron"], tz)
    ours = set(slotmath.window(cron, start.timestamp() - 1, end.timestamp() - 1))
    assert ours == _celery_minutes(spec, start, end)
    assert ours  # every crontab of the list fires in the window


def test_intervals_become_every_seconds() -> None:
    assert entry_schedule("a", 30) == {"every": 30}
    assert entry_schedule("a", 30.0) == {"every": 30}
    assert entry_schedule("a", timedelta(minutes=5)) == {"every": 300}
    assert entry_schedule("a", schedule(timedelta(hours=1))) == {"every": 3600}
    assert entry_schedule("a", crontab(minute=0, hour="*/3")) == {
        "cron": "0 0,3,6,9,12,15,18,21 * * *",
        "tz": "UTC",
    }


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (Sunset(), "solar"),
        (0.5, "whole number of seconds"),
        (timedelta(seconds=1.5), "whole number of seconds"),
        (crontab(day_of_month="1-7", day_of_week="mon"), "both day_of_month and day_of_week"),
        (object(), "not supported"),
    ],
)
def test_unsupported_schedules_name_the_entry(spec: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words) as info:
        entry_schedule("nightly", spec)
    assert "'nightly'" in str(info.value)
    assert info.value.argument == "beat_schedule"


# -- the scheduler ------------------------------------------------------------------------------


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """What the apps of a test publish: task id, task name, args, kwargs, routing key."""
    seen: list[dict[str, Any]] = []

    def record(
        sender: str | None = None,
        body: Any = None,
        headers: dict[str, Any] | None = None,
        routing_key: str | None = None,
        **_: Any,
    ) -> None:
        assert headers is not None
        seen.append(
            {
                "id": headers["id"],
                "task": sender,
                "args": list(body[0]),
                "kwargs": body[1],
                "routing_key": routing_key,
                "beat": headers.get("celery_beat_task"),
                "ignore_result": headers.get("ignore_result"),
            }
        )

    before_task_publish.connect(record, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(record)


def _app(entries: dict[str, Any], **conf: Any) -> celery.Celery:
    app = celery.Celery("jf_beat_unit", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule=entries,
        jobfence_url=f"memory://beat-{uuid.uuid4().hex}",
        result_expires=None,  # no celery.backend_cleanup entry
        **conf,
    )
    return app


EVERY_HOUR = {"hourly": {"task": "jf.hourly", "schedule": 3600, "args": (1,), "kwargs": {"x": 2}}}


def test_two_beats_on_one_backend_send_each_slot_once(published: list[dict[str, Any]]) -> None:
    every_second = {
        "tick": {"task": "jf.tick", "schedule": 1, "args": (1,), "options": {"queue": "q1"}}
    }
    app = _app(every_second)
    epoch = 1_796_400_000.0  # 2026-12-04T16:00:00Z
    # jobfence's clock stands still between the two beats' ticks
    with clocked(ManualClock(start=0.25, epoch=epoch)) as clock:
        first, second = Scheduler(app=app, max_interval=5), Scheduler(app=app, max_interval=5)
        try:
            assert [first.tick(), second.tick()] == [0.75, 0.75]  # until the next slot
            clock.advance(1)
            assert [second.tick(), first.tick()] == [0.75, 0.75]
        finally:
            first.close()
            second.close()
    assert [m["id"] for m in published] == [
        "schedule:tick@2026-12-04T16:00:00Z",
        "schedule:tick@2026-12-04T16:00:01Z",
    ]
    for message in published:
        assert message == {**message, "task": "jf.tick", "args": [1], "kwargs": {}}
        assert message["routing_key"] == "q1" and message["beat"] is True


def test_a_task_registered_in_beat_is_sent_through_it(published: list[dict[str, Any]]) -> None:
    app = _app({"own": {"task": "jf.own", "schedule": 1, "kwargs": {"n": 1}}})

    @app.task(name="jf.own", ignore_result=True, shared=False)
    def own(n: int) -> None: ...

    beat = Scheduler(app=app)
    try:
        beat.tick()
    finally:
        beat.close()
    (message,) = published
    assert message["id"].startswith("schedule:own@") and message["kwargs"] == {"n": 1}
    assert message["ignore_result"] is True  # the task's own option (app default: False)


def test_a_far_slot_waits_at_most_max_interval_and_entries_added_later_are_sent(
    published: list[dict[str, Any]],
) -> None:
    app = _app(EVERY_HOUR)
    beat = Scheduler(app=app, max_interval=5)
    try:
        assert beat.tick() <= 5
        before = len(published)  # the hour's slot, if it is within its grace now
        beat.add(name="later", task="jf.later", schedule=1.0)
        beat.tick()
        later = [m for m in published[before:] if m["task"] == "jf.later"]
        assert len(later) == 1 and later[0]["id"].startswith("schedule:later@")
    finally:
        beat.close()


def test_settings_and_bad_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBFENCE_URL", "memory://from-env")
    app = celery.Celery("jf_beat_unit", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {}
    app.conf.result_expires = None
    assert Scheduler(app=app, lazy=True).jobfence_url == "memory://from-env"
    app.conf.beat_jobfence_url = "memory://beat-setting"
    assert Scheduler(app=app, lazy=True).jobfence_url == "memory://beat-setting"
    app.conf.jobfence_url = "memory://setting"
    assert Scheduler(app=app, lazy=True).jobfence_url == "memory://setting"
    assert Scheduler(app=app, lazy=True).timezone == "UTC"
    app.conf.timezone = "Europe/Paris"
    assert Scheduler(app=app, lazy=True).timezone == "Europe/Paris"

    # a bad entry stops beat as it starts, naming the entry (lazy: only introspection)
    app.conf.beat_schedule = {"sunset": {"task": "jf.t", "schedule": Sunset()}}
    Scheduler(app=app, lazy=True)
    with pytest.raises(ConfigurationError, match="'sunset'"):
        Scheduler(app=app)
    app.conf.beat_schedule = {"own-id": {**EVERY_HOUR["hourly"], "options": {"task_id": "x"}}}
    beat = Scheduler(app=app)
    try:
        with pytest.raises(ConfigurationError, match="task_id") as info:
            beat.tick()
        assert info.value.argument == "beat_schedule"
    finally:
        beat.close()
