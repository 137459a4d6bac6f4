"""The scheduler's slot arithmetic (``jobfence._core.slots``): cron and interval slots, DST
days, keys, jitter and the misfire decision."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence import ConfigurationError
from jobfence._core import slots

UTC = timezone.utc


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def isos(spec: slots.Spec, start: str, end: str) -> list[str]:
    return [slots.slot_iso(at) for at in slots.window(spec, ts(start), ts(end))]


# -- cron, and the four DST days ----------------------------------------------------------------


def test_a_cron_slot_in_the_skipped_hour_fires_once_after_the_gap() -> None:
    paris = slots.CronSpec("30 2 * * *", "Europe/Paris")  # 2027-03-28: 02:00 -> 03:00
    assert isos(paris, "2027-03-27T00:00:00", "2027-03-30T00:00:00") == [
        "2027-03-27T01:30:00Z",  # 02:30 CET
        "2027-03-28T01:00:00Z",  # 03:00 CEST: the first local time after the gap
        "2027-03-29T00:30:00Z",  # 02:30 CEST
    ]
    ny = slots.CronSpec("15,45 2 * * *", "America/New_York")  # 2027-03-14: 02:00 -> 03:00
    assert isos(ny, "2027-03-14T00:00:00", "2027-03-15T12:00:00") == [
        "2027-03-14T07:00:00Z",  # both slots of the missing hour: once, at 03:00 EDT
        "2027-03-15T06:15:00Z",
        "2027-03-15T06:45:00Z",
    ]


def test_a_cron_slot_in_the_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    ny = slots.CronSpec("30 1 * * *", "America/New_York")  # 2027-11-07: 02:00 -> 01:00
    assert isos(ny, "2027-11-06T00:00:00", "2027-11-09T00:00:00") == [
        "2027-11-06T05:30:00Z",
        "2027-11-07T05:30:00Z",  # 01:30 EDT; not again at 01:30 EST
        "2027-11-08T06:30:00Z",
    ]
    paris = slots.CronSpec("30 2 * * *", "Europe/Paris")  # 2027-10-31: 03:00 -> 02:00
    assert isos(paris, "2027-10-30T00:00:00", "2027-11-02T00:00:00") == [
        "2027-10-30T00:30:00Z",
        "2027-10-31T00:30:00Z",  # 02:30 CEST only
        "2027-11-01T01:30:00Z",
    ]


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Europe/Paris", "2027-03-28"),
        ("Europe/Paris", "2027-10-31"),
        ("America/New_York", "2027-03-14"),
        ("America/New_York", "2027-11-07"),
    ],
)
def test_a_wildcard_hour_runs_on_elapsed_time_through_a_dst_change(tz: str, day: str) -> None:
    spec = slots.CronSpec("*/30 * * * *", tz)
    start = ts(day + "T00:00:00") - 86400
    got = slots.window(spec, start, start + 3 * 86400)
    assert got == [int(start) + 1800 * i for i in range(1, 3 * 48 + 1)]


def test_every_is_aligned_on_the_epoch() -> None:
    spec = slots.EverySpec(30)
    assert list(slots.window(spec, 1_000_000_007, 1_000_000_100)) == [
        1_000_000_020,
        1_000_000_050,
        1_000_000_080,
    ]
    assert spec.describe() == "every 30"
    # where a process starts does not change the slots
    assert next(iter(spec.after(1_000_000_019.9))) == next(iter(spec.after(1_000_000_000)))


def test_six_field_cron_has_seconds() -> None:
    spec = slots.CronSpec("*/20 * * * * *")
    assert isos(spec, "2026-12-04T15:00:00", "2026-12-04T15:01:00") == [
        "2026-12-04T15:00:20Z",
        "2026-12-04T15:00:40Z",
        "2026-12-04T15:01:00Z",
    ]
    assert spec.describe() == "cron */20 * * * * * UTC"


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: slots.CronSpec("61 * * * *"), "cron"),
        (lambda: slots.CronSpec("* * *"), "cron"),
        (lambda: slots.CronSpec(""), "cron"),
        (lambda: slots.CronSpec("0 0 31 2 *"), "cron"),  # never matches
        (lambda: slots.CronSpec("* * * * *", "Nowhere/City"), "tz"),
        (lambda: slots.CronSpec("* * * * *", ""), "tz"),
        (lambda: slots.EverySpec(0), "seconds"),
        (lambda: slots.EverySpec(-30), "seconds"),
        (lambda: slots.EverySpec(2.5), "seconds"),
        (lambda: slots.EverySpec(float("nan")), "seconds"),
        (lambda: slots.EverySpec(True), "seconds"),
    ],
)
def test_bad_specs_name_their_argument(make: object, argument: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()  # type: ignore[operator]
    assert info.value.argument == argument


# -- keys, jitter, misfire ----------------------------------------------------------------


def test_slot_keys_and_prefixes() -> None:
    at = int(ts("2026-12-04T15:30:00"))
    assert slots.slot_key("report", at) == "schedule:report@2026-12-04T15:30:00Z"
    assert slots.slot_prefix("report") == "schedule:report@"
    assert slots.slot_prefix("report", at, unit="hour") == "schedule:report@2026-12-04T15"
    assert slots.slot_prefix("report", at, unit="day") == "schedule:report@2026-12-04"
    assert slots.parse_iso(slots.slot_iso(at)) == slots.slot_datetime(at)


def test_jitter_is_deterministic_and_within_bounds() -> None:
    delays = [slots.jitter_delay("a", 1_800_000_000 + 60 * i, 30) for i in range(200)]
    assert all(0 <= d < 30 for d in delays)
    assert delays == [slots.jitter_delay("a", 1_800_000_000 + 60 * i, 30) for i in range(200)]
    assert len(set(delays)) == 200  # spread, not one value
    assert slots.jitter_delay("a", 1_800_000_000, 0) == 0.0
    assert slots.jitter_delay("b", 1_800_000_000, 30) != delays[0]


@pytest.mark.parametrize(
    ("late", "misfire", "newest", "action"),
    [
        (0.0, "none", False, "fire"),
        (60.0, "none", False, "fire"),  # at grace exactly: on time
        (61.0, "none", True, "missed"),
        (61.0, "all", False, "fire"),
        (61.0, "latest", True, "fire"),
        (61.0, "latest", False, "missed"),
    ],
)
def test_misfire_action(late: float, misfire: str, newest: bool, action: str) -> None:
    assert slots.misfire_action(late=late, grace=60, misfire=misfire, newest=newest) == action


# -- properties ---------------------------------------------------------------------------

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
EXPRESSIONS = [
    "*/5 * * * *",
    "30 2 * * *",
    "0 1,2,3 * * *",
    "15,45 * * * *",
    "0 */2 * * *",
    "59 23 * * *",
    "0 0 * * 0",
    # seconds first: three a minute at 01:30 and 02:30, in a DST gap or fold in most zones
    # above (every 20 s all day long would be 13,000 slots per window to walk)
    "*/20 30 1,2 * * *",
]
#: instants around the DST changes of 2026-2028 in the zones above, and random ones
DST_STARTS = [
    ts(day + "T00:00:00")
    for day in (
        "2026-03-08",
        "2026-03-29",
        "2026-10-25",
        "2026-11-01",
        "2027-04-04",
        "2027-10-03",
    )
]


@settings(max_examples=150, deadline=None)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    tz=st.sampled_from(ZONES),
    start=st.one_of(
        st.sampled_from(DST_STARTS).map(lambda t: t - 86400),
        st.floats(min_value=1.6e9, max_value=2.0e9),
    ),
)
def test_cron_slots_increase_strictly_and_every_local_day_has_its_fixed_slots(
    expr: str, tz: str, start: float
) -> None:
    spec = slots.CronSpec(expr, tz)
    got = slots.window(spec, start, start + 3 * 86400)
    assert got == sorted(set(got))  # monotone, no duplicates
    assert all(at > start for at in got)
    keys = [slots.slot_key("s", at) for at in got]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # the window's slots are what a walk from any slot inside it finds (no process that
    # started in between sees another sequence)
    if len(got) > 2:
        assert slots.window(spec, got[1], start + 3 * 86400) == got[2:]
    if expr == "30 2 * * *":
        zone = ZoneInfo(tz)
        days = [datetime.fromtimestamp(at, UTC).astimezone(zone).date() for at in got]
        assert len(days) == len(set(days))  # never twice on one local day
        first = datetime.fromtimestamp(start, UTC).astimezone(zone).date()
        full = [first + timedelta(days=i) for i in range(1, 3)]
        assert all(day in days for day in full)  # and on every whole local day


@settings(max_examples=100, deadline=None)
@given(
    period=st.integers(min_value=1, max_value=86400 * 2),
    start=st.floats(min_value=0, max_value=4e9),
)
def test_every_slots_are_the_multiples_of_the_period(period: int, start: float) -> None:
    spec = slots.EverySpec(period)
    got = slots.window(spec, start, start + 10 * period)
    assert len(got) == 10
    assert all(at % period == 0 and at > start for at in got)
    assert all(b - a == period for a, b in itertools.pairwise(got))
