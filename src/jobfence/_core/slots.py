"""Slot arithmetic of the scheduler: which instants a schedule fires at, their keys, jitter
and the misfire decision. Pure functions of their arguments (no clock, no I/O), so that
every process computes the same slots from the same spec.

A *slot* is an instant, kept as whole seconds since the Unix epoch (UTC). Two kinds of spec:

* :class:`CronSpec` -- a cron expression (5 fields, or 6 with seconds first) evaluated in an
  IANA time zone by ``cronsim``. Around a daylight-saving change it follows Debian cron:

  - an expression with a fixed minute and hour (``30 2 * * *``) whose local time does not
    exist on the day the clocks go forward fires once, at the first local time after the
    gap (03:00 for 02:30 in Europe/Paris); on the day the clocks go back, its local time
    occurs twice and it fires once, at the first occurrence;
  - an expression with ``*`` in the minute or hour field (``*/5 * * * *``) runs on elapsed
    time through the change: its slots stay evenly spaced in UTC, none is skipped in the
    shortened day and none is doubled in the repeated hour (each real instant is one slot).

  In every case the slots are strictly increasing in UTC: no slot is skipped and none fires
  twice.
* :class:`EverySpec` -- every ``period`` seconds, at the multiples of ``period`` since the Unix
  epoch (``every 30``: :00 and :30 of each minute), whatever the time zone or the moment a
  process started, so every process computes the same slots.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .root_errors import ConfigurationError

__all__ = [
    "MAX_PERIOD",
    "MISFIRE",
    "OVERLAP",
    "CronSpec",
    "EverySpec",
    "Spec",
    "check_seconds",
    "due_at",
    "jitter_delay",
    "misfire_action",
    "parse_iso",
    "slot_datetime",
    "slot_datetime_f",
    "slot_iso",
    "slot_key",
    "slot_prefix",
    "window",
]

#: the misfire policies: what happens to slots found later than ``grace``
MISFIRE = ("latest", "all", "none")
#: the overlap policies: what a slot does while the schedule's previous fire still runs
OVERLAP = ("allow", "skip", "queue")

_UTC = timezone.utc
#: the longest period of an ``every`` schedule (seconds): 366 days, the longest a slot's
#: record can be kept
MAX_PERIOD = 366 * 86400
#: cron looks this far (in years) for the next match before it gives up
_CRON_HORIZON = 50


def check_seconds(value: object, *, argument: str, positive: bool = False) -> float:
    """A finite number of seconds >= 0 (> 0 with ``positive``), else ConfigurationError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(
            f"{argument} must be a finite number of seconds, got {value!r}", argument=argument
        )
    if value < 0 or (positive and value == 0):
        allowed = "> 0" if positive else ">= 0"
        raise ConfigurationError(
            f"{argument} must be {allowed} seconds, got {value!r}", argument=argument
        )
    return float(value)


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(
            f"tz must be an IANA time zone name such as 'UTC' or 'Europe/Paris', got {tz!r}",
            argument="tz",
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"tz must be an IANA time zone name such as 'UTC' or 'Europe/Paris' (the zoneinfo "
            f"database, or the tzdata package, must know it); {tz!r} is unknown",
            argument="tz",
        ) from exc


class CronSpec:
    """A cron expression in a time zone. ``expr``: 5 fields (minute hour day month weekday)
    or 6 (seconds first), as ``cronsim`` reads them; ``tz``: an IANA zone name."""

    kind = "cron"

    def __init__(self, expr: str, tz: str = "UTC") -> None:
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigurationError(
                f"cron must be a cron expression such as '*/5 * * * *', got {expr!r}",
                argument="cron",
            )
        self.expr = " ".join(expr.split())
        self.tz = tz
        self.zone = _zone(tz)
        try:
            probe = CronSim(self.expr, datetime(2000, 1, 1, tzinfo=self.zone))
            next(probe)
        except (CronSimError, StopIteration) as exc:
            raise ConfigurationError(
                f"cron must be a valid cron expression (5 fields: minute hour day month "
                f"weekday, or 6 with seconds first) that matches some time; {expr!r}: {exc}",
                argument="cron",
            ) from exc

    def describe(self) -> str:
        """``cron <expr> <tz>``, as slot records store it."""
        return f"cron {self.expr} {self.tz}"

    def after(self, t: float) -> Iterator[int]:
        """The slots strictly after ``t`` (epoch seconds), increasing, forever."""
        start = datetime.fromtimestamp(math.floor(t), _UTC).astimezone(self.zone)
        last = math.floor(t)
        try:
            for local in CronSim(self.expr, start):
                at = int(local.timestamp())
                # cronsim's local-time arithmetic can land on an instant at or before the
                # previous one around a DST change (a repeated hour): never twice, never back
                if at > last:
                    last = at
                    yield at
        except StopIteration:  # no match within cronsim's horizon
            return


class EverySpec:
    """Every ``period`` seconds, on the multiples of ``period`` since the Unix epoch."""

    kind = "every"
    tz = "UTC"

    def __init__(self, period: float) -> None:
        seconds = check_seconds(period, argument="seconds", positive=True)
        if seconds != int(seconds) or seconds > MAX_PERIOD:
            raise ConfigurationError(
                f"seconds + minutes*60 + hours*3600 must be a whole number of seconds from 1 "
                f"to {MAX_PERIOD} (366 days), got {period!r}",
                argument="seconds",
            )
        self.period = int(seconds)

    def describe(self) -> str:
        """``every <seconds>``, as slot records store it."""
        return f"every {self.period}"

    def after(self, t: float) -> Iterator[int]:
        """The slots strictly after ``t`` (epoch seconds), increasing, forever."""
        at = (math.floor(t) // self.period + 1) * self.period
        while True:
            yield at
            at += self.period


Spec = CronSpec | EverySpec


def slot_datetime(at: int) -> datetime:
    """The slot as an aware UTC datetime."""
    return datetime.fromtimestamp(at, _UTC)


def slot_datetime_f(t: float) -> datetime:
    """An epoch time (seconds, fractional) as an aware UTC datetime."""
    return datetime.fromtimestamp(t, _UTC)


def slot_iso(at: int) -> str:
    """``2026-12-04T15:30:00Z``: the slot in UTC, to the second (fixed width, so that the
    keys of one schedule sort by time)."""
    return slot_datetime(at).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_key(name: str, at: int) -> str:
    """The inbox key of a slot: ``schedule:<name>@<slot_iso>``."""
    return f"schedule:{name}@{slot_iso(at)}"


def slot_prefix(name: str, at: int | None = None, *, unit: str = "") -> str:
    """The key prefix of a schedule's slots (``schedule:<name>@``), narrowed to the day
    (``unit="day"``) or the hour (``unit="hour"``) of ``at``."""
    base = f"schedule:{name}@"
    if at is None or not unit:
        return base
    iso = slot_iso(at)
    return base + (iso[:10] if unit == "day" else iso[:13])


def jitter_delay(name: str, at: int, jitter: float) -> float:
    """The delay of slot ``at`` of schedule ``name``, in ``[0, jitter)``: a hash of both, so
    every process computes the same one."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{name}@{at}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 * jitter


def due_at(name: str, at: int, jitter: float) -> float:
    """When slot ``at`` is due: its time plus its jitter delay."""
    return at + jitter_delay(name, at, jitter)


def misfire_action(*, late: float, grace: float, misfire: str, newest: bool) -> str:
    """``"fire"`` or ``"missed"`` for a due slot ``late`` seconds after its due time.

    On time (``late <= grace``): fire. Later (a misfire): ``"all"`` fires it; ``"latest"``
    fires it only if it is the newest due slot of its schedule (``newest``), else records it
    missed; ``"none"`` records it missed.
    """
    if late <= grace or misfire == "all":
        return "fire"
    if misfire == "latest" and newest:
        return "fire"
    return "missed"


def window(spec: Spec, start: float, end: float, *, limit: int | None = None) -> list[int]:
    """The slots in ``(start, end]``, increasing (at most ``limit`` of the newest)."""
    out: list[int] = []
    for at in spec.after(start):
        if at > end:
            break
        out.append(at)
        if limit is not None and len(out) > limit:
            del out[0]
    return out


def parse_iso(text: str) -> datetime:
    """The datetime of a :func:`slot_iso` string."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_UTC)
