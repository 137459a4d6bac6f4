"""``ManualClock.at``: a manual clock set to a wall time in a time zone, advanced across the
daylight saving changes of Europe/Paris and America/New_York. ``time()`` goes on second by
second (UTC epoch seconds); ``now()`` shows the wall time jump as zoneinfo says."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

import jobfence
from jobfence.testing import ManualClock

# (zone, a wall time one minute before the change, the wall time one minute later, the UTC
# offsets before and after)
CHANGES = [
    ("Europe/Paris", "2026-03-29T01:59:00", "2026-03-29T03:00:00", 1, 2),  # spring: 02:00 skipped
    ("Europe/Paris", "2026-10-25T02:59:00", "2026-10-25T02:00:00", 2, 1),  # autumn: 02:00 twice
    ("America/New_York", "2026-03-08T01:59:00", "2026-03-08T03:00:00", -5, -4),
    ("America/New_York", "2026-11-01T01:59:00", "2026-11-01T01:00:00", -4, -5),
]


@pytest.mark.parametrize(("zone", "before", "after", "was", "becomes"), CHANGES)
def test_the_wall_time_jumps_while_time_goes_on(
    zone: str, before: str, after: str, was: int, becomes: int
) -> None:
    clock = ManualClock.at(before, tz=zone)
    start = clock.time()
    # the instant is the wall time at the offset in force before the change
    expected = datetime.fromisoformat(before).replace(tzinfo=timezone(timedelta(hours=was)))
    assert start == expected.timestamp() and clock.monotonic() == 0
    assert clock.now().utcoffset() == timedelta(hours=was)
    assert clock.now().replace(tzinfo=None) == datetime.fromisoformat(before)
    clock.advance(60)
    assert clock.time() == start + 60  # continuous epoch seconds
    assert clock.now().replace(tzinfo=None) == datetime.fromisoformat(after)
    assert clock.now().utcoffset() == timedelta(hours=becomes)
    assert clock.now("UTC") == datetime.fromtimestamp(start + 60, timezone.utc)
    # across the next three hours, minute by minute, the wall time is zoneinfo's
    for _ in range(180):
        clock.advance(60)
        assert clock.now() == datetime.fromtimestamp(clock.time(), ZoneInfo(zone))
    assert clock.time() == start + 60 * 181


def test_a_repeated_wall_time_is_its_first_occurrence_unless_fold_asks_otherwise() -> None:
    first = ManualClock.at("2026-10-25T02:30:00", tz="Europe/Paris")
    second = ManualClock.at(datetime(2026, 10, 25, 2, 30, fold=1), tz="Europe/Paris")
    assert second.time() - first.time() == 3600
    assert first.now().utcoffset() == timedelta(hours=2)
    assert second.now().utcoffset() == timedelta(hours=1)


def test_an_aware_moment_or_an_instant_sets_the_zone_and_the_epoch() -> None:
    paris = ZoneInfo("Europe/Paris")
    clock = ManualClock.at(datetime(2026, 3, 29, 1, 59, tzinfo=paris))
    assert clock.tz is paris and clock.now() == datetime(2026, 3, 29, 1, 59, tzinfo=paris)
    utc = ManualClock.at("2026-03-29T00:59:00Z", tz="Europe/Paris")
    assert utc.time() == clock.time() and str(utc.tz) == "Europe/Paris"
    assert ManualClock.at("2026-03-29T00:59:00").now().tzinfo is timezone.utc
    assert ManualClock(tz="Asia/Tokyo").now().utcoffset() == timedelta(hours=9)


def test_the_clock_set_at_a_wall_time_drives_jobfence() -> None:
    with ManualClock.at("2026-03-29T01:59:30", tz="Europe/Paris") as clock:
        locks = jobfence.Locks("memory://dst-clock")
        lease = locks.try_acquire("report", ttl=60, renew=False)
        assert lease is not None
        clock.advance(60)  # 03:00:30 on the wall, 60 s later: the lease has run out
        assert lease.lost and clock.now().hour == 3
        locks.close()


@pytest.mark.parametrize(
    ("when", "tz", "argument"),
    [
        ("2026-03-29T02:30:00", "Europe/Paris", "when"),  # skipped by the spring change
        ("2026-03-08T02:15:00", "America/New_York", "when"),
        ("yesterday", None, "when"),
        (1_774_745_940, None, "when"),
        ("2026-03-29T01:59:00", "Mars/Olympus", "tz"),
        ("2026-03-29T01:59:00", 5, "tz"),
    ],
)
def test_bad_input_names_the_argument(when: object, tz: object, argument: str) -> None:
    with pytest.raises(jobfence.ConfigurationError) as exc:
        ManualClock.at(when, tz=tz)  # type: ignore[arg-type]
    assert exc.value.argument == argument
