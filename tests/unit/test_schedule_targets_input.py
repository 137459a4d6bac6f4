"""``jobfence.integrations.schedule_targets``: the RQ job id of a slot key, and bad input.
(The targets against real workers: ``tests/frameworks/test_schedule_targets.py``.)"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import pytest

from jobfence import ConfigurationError, Slot
from jobfence.integrations import schedule_targets as st


def test_rq_job_ids_are_what_rq_allows_readable_and_distinct() -> None:
    key = "schedule:report@2026-12-04T15:30:00Z"
    job_id = st.rq_job_id(key)
    assert re.fullmatch(r"schedule_report_2026-12-04T15_30_00Z-[0-9a-f]{16}", job_id)
    assert st.rq_job_id(key) == job_id  # the same on every process
    # keys that differ only where RQ's characters are replaced keep distinct ids
    assert st.rq_job_id("schedule:a.b@2026-12-04T15:30:00Z") != st.rq_job_id(
        "schedule:a/b@2026-12-04T15:30:00Z"
    )
    long = st.rq_job_id("schedule:" + "é" * 2000 + "@2026-12-04T15:30:00Z")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", long) and len(long) == 100 + 1 + 16


def test_slot_time_is_the_slot_in_utc_to_the_second() -> None:
    at = datetime(2026, 12, 4, 15, 30, tzinfo=timezone.utc)
    assert st.slot_time(Slot("r", at, "schedule:r@2026-12-04T15:30:00Z", False)) == (
        "2026-12-04T15:30:00Z"
    )


class _Task:
    name = "t"

    def apply_async(self, *args: Any, **kwargs: Any) -> None: ...


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: st.celery(object()), "task"),
        (lambda: st.celery(_Task(), slot_kwarg="not a name"), "slot_kwarg"),
        (lambda: st.celery(_Task(), slot_kwarg=3), "slot_kwarg"),
        (lambda: st.celery(_Task(), options={"task_id": "x"}), "options"),
        (lambda: st.celery(_Task(), options=[("queue", "q")]), "options"),
        (lambda: st.rq(object(), "m.f"), "queue"),
        (lambda: st.dramatiq(object()), "actor"),
        (lambda: st.arq(object(), "f"), "pool_or_redis_settings"),
    ],
)
def test_bad_input_names_the_argument(make: Any, argument: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert info.value.argument == argument


def test_a_celery_target_passes_the_slot_when_asked() -> None:
    calls: list[tuple[Any, ...]] = []

    class Task(_Task):
        def apply_async(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))

    at = datetime(2026, 12, 4, 15, 30, tzinfo=timezone.utc)
    slot = Slot("r", at, "schedule:r@2026-12-04T15:30:00Z", False)
    send = st.celery(Task(), "eu", slot_kwarg="slot", options={"queue": "q"}, n=1)
    send(slot)
    st.celery(Task(), "eu")(slot)
    assert calls == [
        ((("eu",), {"n": 1, "slot": "2026-12-04T15:30:00Z"}), {"task_id": slot.key, "queue": "q"}),
        ((("eu",), {}), {"task_id": slot.key}),
    ]
    assert send.__qualname__ == "celery(t)"
