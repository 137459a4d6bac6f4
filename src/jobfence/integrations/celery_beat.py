"""A Celery beat scheduler that several beat processes can run at once: each slot is sent once.

```
celery -A proj beat -S jobfence.integrations.celery_beat:Scheduler
```

:class:`Scheduler` reads the app's ``beat_schedule`` (and the entries added later with
``add``), turns every entry into a schedule of a :class:`jobfence.Scheduler` and, on each beat
tick, runs one pass of it: every slot due is claimed in the jobfence backend by exactly one beat
process, which sends the entry's task as Celery's own beat does, with the slot key as task id:
``task.apply_async(args, kwargs, task_id=<the slot key>, **entry.options)`` when the task is
registered in the beat process, else ``app.send_task(entry.task, args, kwargs, task_id=...,
**entry.options)``. Any number of beats may run; a beat that dies is
replaced by the others within ``lease`` seconds, without a missed slot (within ``grace``). No
shelve file is written.

* ``crontab(...)`` becomes a cron expression evaluated in the app's time zone
  (``app.conf.timezone``, default UTC), e.g. ``crontab(minute=0, hour="*/3")`` ->
  ``0 0,3,6,9,12,15,18,21 * * *``. A crontab that restricts both ``day_of_month`` and
  ``day_of_week`` is refused: Celery requires both to match, cron either.
* ``schedule(run_every)``, a ``timedelta`` or a number of seconds becomes a jobfence interval
  (a whole number of seconds >= 1), whose slots are the multiples of the period since the Unix
  epoch (Celery counts from the last run instead).
* ``solar(...)`` and other schedule classes are refused (:class:`~jobfence.ConfigurationError`
  naming the entry).

The task id of a slot is its key, ``schedule:<entry name>@<UTC ISO time>``, the same on every
beat: a task guarded with :func:`jobfence.integrations.celery.guarded` without ``key=`` runs
once per slot even in the rare case where a beat sent it and died before it recorded the slot.

Configuration (``app.conf``; each setting also read as ``beat_<name>``):

* ``jobfence_url`` -- the jobfence backend (any backend with an inbox); default
  ``$JOBFENCE_URL``, else the embedded SQLite file (one host only);
* ``jobfence_namespace`` -- the inbox table of the slot records (default: the inbox's); give
  each Celery app sharing a backend its own, or its own entry names;
* ``jobfence_lease`` -- seconds (default 30): how soon another beat takes over the slot of
  a beat that died while sending it;
* ``jobfence_grace`` -- seconds (default 60): how late a slot may still be sent; later ones
  follow ``misfire="latest"`` (the newest is sent, the older recorded missed).

Importing this module imports Celery; ``import jobfence`` does not.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from celery import beat
from celery.schedules import crontab, maybe_schedule, schedule, solar

from .._core.clock import get_clock
from .._core.schedule_info import Slot
from ..errors import ConfigurationError, JobfenceError
from ..inbox import Inbox
from ..scheduler import MAX_PAUSE
from ..scheduler import Scheduler as JobfenceScheduler

__all__ = ["Scheduler", "entry_schedule"]

log = logging.getLogger("jobfence.integrations.celery_beat")

#: how long the slot records are kept (the scheduler's default retention)
RETENTION = 86400.0
#: the shortest wait a tick returns, so that beat never spins
MIN_WAIT = 0.01

_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
    ("day_of_week", 0, 6),
)


def _field(values: Iterable[int], low: int, high: int) -> str:
    """A cron field of a set of values: ``*`` when it is every value, else a list of values
    and ranges (``1-5,10``)."""
    chosen = sorted(set(values))
    if chosen == list(range(low, high + 1)):
        return "*"
    parts: list[str] = []
    start = prev = chosen[0]
    for value in [*chosen[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def _crontab_expression(name: str, spec: crontab) -> str:
    fields = {attr: _field(getattr(spec, attr), low, high) for attr, low, high in _FIELDS}
    if fields["day_of_month"] != "*" and fields["day_of_week"] != "*":
        raise ConfigurationError(
            f"beat entry {name!r}: a crontab that restricts both day_of_month and day_of_week "
            "is not supported (Celery runs it when both match, cron when either does); "
            "restrict one of them",
            argument="beat_schedule",
        )
    return " ".join(fields[attr] for attr, _, _ in _FIELDS)


def entry_schedule(name: str, spec: Any, timezone: str = "UTC") -> dict[str, Any]:
    """The jobfence schedule of beat entry ``name`` whose schedule is ``spec``: ``{"cron":
    <expression>, "tz": timezone}`` for a ``crontab`` (its hours and minutes read in
    ``timezone``, the app's time zone), ``{"every": <seconds>}`` for a
    ``schedule`` (or a ``timedelta`` / number of seconds). Anything else, a ``solar`` above
    all, and an interval that is not a whole number of seconds >= 1 raise
    :class:`~jobfence.ConfigurationError` naming the entry."""
    if isinstance(spec, (int, float, timedelta)) and not isinstance(spec, bool):
        spec = maybe_schedule(spec)
    if isinstance(spec, crontab):
        return {"cron": _crontab_expression(name, spec), "tz": timezone}
    if isinstance(spec, solar):
        raise ConfigurationError(
            f"beat entry {name!r}: solar schedules are not supported by the jobfence beat "
            "scheduler (use a crontab or an interval)",
            argument="beat_schedule",
        )
    if isinstance(spec, schedule):
        seconds = spec.run_every.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise ConfigurationError(
                f"beat entry {name!r}: an interval must be a whole number of seconds >= 1 for "
                f"the jobfence beat scheduler, got {seconds!r}",
                argument="beat_schedule",
            )
        return {"every": int(seconds)}
    raise ConfigurationError(
        f"beat entry {name!r}: the schedule {spec!r} is not supported by the jobfence beat "
        "scheduler (use a crontab, a celery.schedules.schedule, a timedelta or seconds)",
        argument="beat_schedule",
    )


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """``celery beat -S jobfence.integrations.celery_beat:Scheduler``: the app's beat
    entries as jobfence schedules, each slot sent by exactly one of the beat processes
    running. See the module's description for the settings (``jobfence_url``, ...).

    Args:
        app: the Celery app (beat passes it).
        args: the positional arguments of ``celery.beat.Scheduler`` (beat passes them).
        kwargs: the keyword arguments of ``celery.beat.Scheduler`` (``max_interval``,
            ``lazy``, ...; ``schedule_filename`` is ignored: nothing is stored in a file).
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._jobfence: JobfenceScheduler | None = None
        self._inbox: Inbox | None = None
        self._registered: dict[str, tuple[str, ...]] | None = None
        super().__init__(app, *args, **kwargs)

    # -- settings -------------------------------------------------------------------------
    def _setting(self, name: str) -> Any:
        for key in (f"jobfence_{name}", f"beat_jobfence_{name}"):
            value = self.app.conf.get(key)
            if value is not None:
                return value
        return None

    @property
    def jobfence_url(self) -> str | None:
        """The jobfence backend URL: ``jobfence_url`` / ``beat_jobfence_url``, else
        ``$JOBFENCE_URL`` (``None``: the embedded SQLite file)."""
        url = self._setting("url")
        return str(url) if url is not None else os.environ.get("JOBFENCE_URL")

    @property
    def timezone(self) -> str:
        """The time zone crontab entries are evaluated in: ``app.conf.timezone``, or UTC."""
        return str(self.app.conf.timezone or "UTC")

    # -- the jobfence scheduler -------------------------------------------------------------
    def setup_schedule(self) -> None:
        super().setup_schedule()
        for name, entry in self.schedule.items():  # a bad entry stops beat at start-up
            entry_schedule(name, entry.schedule, self.timezone)

    def _sender(self, entry: Any) -> Callable[[Slot], Any]:
        options = dict(entry.options)
        if "task_id" in options:
            raise ConfigurationError(
                f"beat entry {entry.name!r}: options must not set task_id, which is the slot's",
                argument="beat_schedule",
            )

        def send(slot: Slot) -> Any:
            args = beat._evaluate_entry_args(entry.args)
            kwargs = beat._evaluate_entry_kwargs(entry.kwargs)
            sent = dict(options)
            sent["headers"] = {**(sent.get("headers") or {}), "celery_beat_task": True}
            log.info("Scheduler: Sending due task %s (%s) as %s", entry.name, entry.task, slot.key)
            # as Celery's own beat sends: through the task when it is registered here (its own
            # routing and options apply), else by name
            task = self.app.tasks.get(entry.task)
            if task is not None:
                return task.apply_async(args, kwargs, task_id=slot.key, **sent)
            return self.app.send_task(entry.task, args, kwargs, task_id=slot.key, **sent)

        send.__qualname__ = send.__name__ = f"celery.send_task({entry.task})"
        return send

    def _build(self) -> JobfenceScheduler:
        """A jobfence scheduler of the current entries (again when they changed: the slot
        records in the backend carry on)."""
        if self._inbox is None:
            options: dict[str, Any] = {"retention": RETENTION}
            namespace = self._setting("namespace")
            if namespace is not None:
                options["table"] = namespace
            self._inbox = Inbox(self.jobfence_url, **options)
        lease = self._setting("lease")
        grace = self._setting("grace")
        scheduler = JobfenceScheduler(
            inbox=self._inbox, **({} if lease is None else {"lease": lease})
        )
        try:
            for name, entry in self.schedule.items():
                timing = entry_schedule(name, entry.schedule, self.timezone)
                scheduler.add(
                    name,
                    send=self._sender(entry),
                    **timing,
                    **({} if grace is None else {"grace": grace}),
                )
        except BaseException:
            scheduler.close()
            raise
        return scheduler

    def _entries(self) -> dict[str, tuple[str, ...]]:
        """What the jobfence schedules are made of, to notice a change of the entries."""
        return {
            name: tuple(repr(x) for x in (e.task, e.schedule, e.args, e.kwargs, e.options))
            for name, e in self.schedule.items()
        }

    def _current(self) -> JobfenceScheduler:
        entries = self._entries()
        if self._jobfence is None or entries != self._registered:
            if self._jobfence is not None:
                self._jobfence.close()
                self._jobfence = None
            self._jobfence = self._build()
            self._registered = entries
        return self._jobfence

    def _wait(self, scheduler: JobfenceScheduler) -> float:
        """Seconds until the next slot of any entry is due; at most ``MAX_PAUSE`` while a
        slot is in progress in another beat (it is claimed again once its claim expired)."""
        now = get_clock().time()
        wait = float(self.max_interval)
        try:
            for s in scheduler._schedules.values():
                if s.pending:
                    wait = min(wait, MAX_PAUSE)
                for at in s.spec.after(s.cursor if s.cursor is not None else now):
                    wait = min(wait, s.due(at) - now)
                    break
        except AttributeError:  # pragma: no cover - look again soon rather than late
            wait = min(wait, MAX_PAUSE)
        return max(wait, MIN_WAIT)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One jobfence pass: every due slot claimed by this beat is sent. Returns the
        seconds until the next slot is due (at most ``max_interval``)."""
        scheduler = self._current()
        try:
            scheduler.tick()
        except JobfenceError as err:
            log.warning("beat: the jobfence pass failed (%s); trying again", err)
            return min(MAX_PAUSE, float(self.max_interval))
        return min(self._wait(scheduler), float(self.max_interval))

    def sync(self) -> None:
        """Nothing to store: the slot records are in the jobfence backend."""

    def close(self) -> None:
        try:
            if self._jobfence is not None:
                self._jobfence.close()
                self._jobfence = None
            if self._inbox is not None:
                self._inbox.close()
                self._inbox = None
        finally:
            super().close()

    @property
    def info(self) -> str:
        """What ``celery beat`` prints at start-up."""
        url = self.jobfence_url
        backend = url.split("://", 1)[0] if url and "://" in url else "sqlite"
        return f"jobfence ({backend}): one send per slot across every beat"
