"""The scheduler's public records: :class:`Slot`, :class:`Fire` and :class:`ScheduleInfo`
(exported from ``jobfence``), shared by ``AsyncScheduler`` and ``Scheduler``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["OUTCOMES", "Fire", "ScheduleInfo", "Slot"]

#: what a slot's record says happened to it
OUTCOMES = ("fired", "missed", "skipped", "failed")


@dataclass(frozen=True)
class Slot:
    """One firing of a schedule: what a target receives.

    * ``schedule`` -- the schedule's name.
    * ``at`` -- the slot's time (aware UTC datetime); for a manual fire (:meth:`trigger`) the
      time it was triggered.
    * ``key`` -- the inbox key of the slot, ``schedule:<name>@<UTC ISO time>`` (a manual fire
      adds ``+manual-<hex>``): the same on every process, so a target can use it as an
      idempotency key (the ``queue=`` target publishes with it as message id).
    * ``manual`` -- fired by :meth:`trigger`, not by the schedule.
    """

    schedule: str
    at: datetime
    key: str
    manual: bool = False


@dataclass(frozen=True)
class Fire:
    """The record of one slot, as the process that claimed it stored it.

    * ``schedule`` -- the schedule's name.
    * ``key`` -- the slot's inbox key (see :class:`Slot`).
    * ``outcome`` -- ``"fired"`` (the target returned), ``"failed"`` (it raised: ``error``
      says what), ``"missed"`` (a misfire the misfire policy did not fire) or ``"skipped"``
      (the schedule was paused, or ``overlap="skip"`` found the previous fire still running).
    * ``slot_at`` -- the slot's time (``None`` only for a record that cannot be read).
    * ``pod`` -- the process that decided it (the scheduler's ``pod``).
    * ``fired_at`` -- when the target was started (``None`` unless fired or failed).
    * ``lag`` -- seconds from the slot's due time (its time plus its jitter delay) to the
      start of the target (``None`` unless fired or failed).
    """

    schedule: str
    slot_at: datetime | None
    key: str
    outcome: str
    pod: str | None
    fired_at: datetime | None
    lag: float | None
    error: str | None = None


@dataclass(frozen=True)
class ScheduleInfo:
    """What ``Scheduler.schedules()`` / ``Scheduler.info()`` report about one schedule.

    * ``name`` -- the schedule's name.
    * ``spec`` -- ``"cron <expr> <tz>"`` or ``"every <seconds>"``.
    * ``tz`` -- the time zone of a cron schedule (``"UTC"`` for ``every``).
    * ``misfire``, ``overlap``, ``grace``, ``jitter`` -- the schedule's options.
    * ``paused`` -- paused on every process (``pause()``), as the backend says now.
    * ``next_at`` -- the next slot after now (aware UTC), ``None`` if cron finds none.
    * ``last`` -- the newest record kept (``None``: none).
    * ``misses`` -- how many slots were recorded ``missed`` within the retention.
    * ``target`` -- what a fire runs: ``"function <module.qualname>"``, ``"queue <name>"``
      or ``"send <callable>"``.
    """

    name: str
    spec: str
    tz: str
    misfire: str
    overlap: str
    grace: float
    jitter: float
    paused: bool
    next_at: datetime | None
    last: Fire | None
    misses: int
    target: str
