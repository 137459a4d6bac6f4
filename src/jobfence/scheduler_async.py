"""A distributed scheduler: every slot of every schedule fires exactly once across all the
processes that run it, with no process in charge.

``AsyncScheduler`` lives here; ``Scheduler`` in ``scheduler.py``, generated from it. Every
process computes the same slots (``_core/slots.py``); a slot is an inbox key
(``schedule:<name>@<UTC ISO time>``) claimed with ``ttl=lease`` and renewed while its target
runs. Whoever claims it fires it and completes the claim with a record of what happened; a
duplicate finds it completed and does nothing; a slot in progress elsewhere is claimed again
every half lease, so the slot of a process that died or hung past its lease is taken over,
never lost. See docs/concepts/schedules.md.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import telemetry
from ._core import acompat, forks
from ._core import slots as slotmath
from ._core.clock import get_clock
from ._core.flavour import ASYNC
from ._core.schedule_info import Fire, ScheduleInfo, Slot
from ._core.validate import MAX_NAME_BYTES, MAX_TTL, check_name, check_ttl
from ._guard_spec import current_claim_var
from .backends.base import ClaimState
from .conflicts import is_transient
from .errors import BackendError, ClaimLost, ConfigurationError, JobfenceError
from .inbox_async import AsyncClaim, AsyncInbox
from .locks_async import AsyncLease, AsyncLocks
from .queue_async import AsyncQueue

if ASYNC:
    import asyncio

__all__ = ["AsyncScheduler"]

log = logging.getLogger("jobfence.scheduler")

F = TypeVar("F", bound=Callable[..., Any])

#: defaults of a schedule's timing options (seconds)
DEFAULT_GRACE = 60.0
DEFAULT_CATCH_UP = 3600.0
DEFAULT_LEASE = 30.0
DEFAULT_MAX_SKEW = 1.0
#: the default retention is at least this (seconds), and at least twice the longest catch_up
MIN_RETENTION = 86400.0
#: a window of more slots than this is read in bulk (one listing per hour of slots)
BULK = 8
#: the longest pause of the run loop between passes (seconds): in-progress slots of other
#: processes are looked at again this often
MAX_PAUSE = 1.0
#: the inbox key of a schedule's pause mark
PAUSE_PREFIX = "schedule-paused:"
#: the key prefix of the markers of missed slots (counted by ``info``)
MISSED_PREFIX = "schedule-missed:"
#: the lease held while a schedule's target runs, for ``overlap="skip"`` / ``"queue"``
RUN_PREFIX = "schedule-run:"
#: the longest name of a schedule (bytes in UTF-8): its longest key, a manual slot's
#: ``schedule:<name>@<time>+manual-<8 hex>``, must be a valid inbox key
MAX_SCHEDULE_NAME_BYTES = MAX_NAME_BYTES - len(slotmath.slot_key("", 0) + "+manual-") - 8

_HOST = socket.gethostname()[:64]


def _default_pod() -> str:
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _choice(value: object, allowed: tuple[str, ...], argument: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigurationError(
            f"{argument} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}",
            argument=argument,
        )
    return value


def _takes_slot(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is called with the slot (one positional parameter) or with nothing."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) > 1:
        raise ConfigurationError(
            f"a schedule's function takes no argument or one (the Slot); "
            f"{getattr(fn, '__qualname__', fn)!r} needs {len(positional)}",
            argument="target",
        )
    return bool(positional) or any(p.kind is p.VAR_POSITIONAL for p in params)


def _fire_of(name: str, key: str, record: Any) -> Fire:
    """A :class:`Fire` from a stored slot record (a dict; anything else reads as unknown)."""
    if not isinstance(record, dict):
        return Fire(name, None, key, "unknown", None, None, None, None)
    slot = record.get("slot")
    fired = record.get("fired_at")
    try:
        slot_at = slotmath.parse_iso(slot) if isinstance(slot, str) else None
    except ValueError:
        slot_at = None
    return Fire(
        schedule=name,
        slot_at=slot_at,
        key=key,
        outcome=str(record.get("outcome")),
        pod=record.get("pod"),
        fired_at=None if fired is None else slotmath.slot_datetime_f(float(fired)),
        lag=record.get("lag"),
        error=record.get("error"),
    )


#: seconds before a slot given back after a transient failure is claimed again
TRANSIENT_RETRY = 1.0


@dataclass
class _Schedule:
    """One registered schedule, and what this process knows of its slots."""

    name: str
    spec: slotmath.Spec
    misfire: str
    grace: float
    catch_up: float
    overlap: str
    jitter: float
    fn: Callable[..., Any] | None
    queue: Any
    body: Any
    send: Callable[..., Any] | None
    target: str
    #: how many times a fire may run a failing target
    attempts: int = 1
    #: every slot at or before it was looked at by this process (epoch s; None: not yet)
    cursor: float | None = None
    #: slots in progress elsewhere, or waiting for the run lease, to claim again: slot ->
    #: the clock's ``monotonic()`` from which the next claim is due
    pending: dict[int, float] = field(default_factory=dict)
    #: the newest slot of the schedule found due so far
    latest_due: int | None = None

    def due(self, at: int) -> float:
        return slotmath.due_at(self.name, at, self.jitter)


@dataclass
class _Job:
    """A slot claimed by this process, to fire."""

    schedule: _Schedule
    slot: Slot
    claim: AsyncClaim
    due: float
    lease: AsyncLease | None


class AsyncScheduler:
    """Schedules whose slots fire exactly once across every process running them.

    ``url`` (or ``inbox=`` / ``locks=`` objects of your own) chooses the backend: any backend
    with an inbox (``memory://``, SQLite, PostgreSQL, MySQL/MariaDB, Redis, etcd); without
    one, ``$JOBFENCE_URL`` or the embedded SQLite file, like :class:`AsyncInbox`.

    * ``namespace`` -- the inbox table (and the lock namespace) the scheduler's records use;
      default: the inbox's default table and the locks' default namespace.
    * ``lease`` -- the claim ttl of one fire, renewed while the target runs: how soon another
      process takes over the slot of a process that died or hung (default 30 s; at most
      one year).
    * ``max_skew`` -- the bound on the clock offset between processes this deployment
      promises (default 1 s; ``jobfence doctor`` reports a host's offset).
    * ``retention`` -- how long slot records are kept (default ``max(1 day, 2 * the longest
      catch_up)``, at most one year, the longest an inbox keeps a record); at least
      ``catch_up + max_skew + lease`` of every schedule, else :class:`ConfigurationError`
      naming ``retention``. With an ``inbox=`` of your own, its retention applies.
    * ``pod`` -- this process's id in the records (default ``host:pid:<8 hex>``).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        inbox: AsyncInbox | None = None,
        locks: AsyncLocks | None = None,
        namespace: str | None = None,
        lease: float = DEFAULT_LEASE,
        max_skew: float = DEFAULT_MAX_SKEW,
        retention: float | None = None,
        pod: str | None = None,
    ) -> None:
        self.lease = check_ttl(lease, argument="lease")
        self.max_skew = slotmath.check_seconds(max_skew, argument="max_skew")
        if retention is not None:
            retention = check_ttl(retention, argument="retention")
            if inbox is not None and retention != inbox.retention:
                raise ConfigurationError(
                    f"retention={retention!r} differs from the given inbox's retention "
                    f"({inbox.retention!r}), which is what keeps the records: leave retention "
                    "None or give the inbox that retention",
                    argument="retention",
                )
        if inbox is not None and not isinstance(inbox, AsyncInbox):
            raise ConfigurationError(
                f"inbox must be an AsyncInbox / Inbox of this flavour, got {inbox!r}",
                argument="inbox",
            )
        if locks is not None and not isinstance(locks, AsyncLocks):
            raise ConfigurationError(
                f"locks must be an AsyncLocks / Locks of this flavour, got {locks!r}",
                argument="locks",
            )
        self.pod = _default_pod() if pod is None else check_name(pod, argument="pod")
        self.url = url
        self.namespace = namespace
        self._retention = retention
        self._inbox = inbox
        self._locks = locks
        self._owns_inbox = inbox is None
        self._owns_locks = locks is None
        self._schedules: dict[str, _Schedule] = {}
        self._closed = False
        self._stopping = False
        self._failed = False  # the last pass met a backend error
        if ASYNC:
            self._stop_event: asyncio.Event | None = None
            self._loop: asyncio.AbstractEventLoop | None = None
            self._tasks: set[asyncio.Task[Any]] = set()
        else:
            self._stop_event = threading.Event()
            self._threads: set[threading.Thread] = set()
        self._mutex = threading.Lock()
        forks.register(self)  # a child process forked from here resets it: _after_fork

    def _after_fork(self) -> None:
        """In a child process right after ``fork()`` (``jobfence/_core/forks.py``): the
        fires running in the parent (tasks of the parent's event loop, or its threads) stay
        the parent's, so the child neither waits for them nor stops them, and its ``run()``
        and ``close()`` start afresh (its inbox and locks reset themselves)."""
        self._mutex = threading.Lock()
        self._stopping = False
        if ASYNC:
            self._stop_event = None
            self._loop = None
            self._tasks = set()
        else:
            self._stop_event = threading.Event()
            self._threads = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pod={self.pod!r} schedules={sorted(self._schedules)}>"

    # -- registering schedules ---------------------------------------------------------------
    @property
    def retention(self) -> float:
        """How long slot records are kept (seconds)."""
        if self._inbox is not None:
            return float(self._inbox.retention)
        if self._retention is not None:
            return self._retention
        longest = max((s.catch_up for s in self._schedules.values()), default=DEFAULT_CATCH_UP)
        return min(max(MIN_RETENTION, 2 * longest), float(MAX_TTL))

    def cron(
        self,
        expr: str,
        *,
        tz: str = "UTC",
        name: str | None = None,
        misfire: str = "latest",
        grace: float = DEFAULT_GRACE,
        catch_up: float = DEFAULT_CATCH_UP,
        overlap: str = "allow",
        jitter: float = 0.0,
        queue: Any = None,
        body: Any = None,
        send: Callable[[Slot], Any] | None = None,
        attempts: int = 1,
    ) -> Callable[[F], F]:
        """Decorator: run the function at every slot of the cron expression ``expr`` in time
        zone ``tz``. The function takes no argument or one (the :class:`Slot`). With
        ``queue=`` the slot is published instead (the function makes the body when
        ``body`` is not given); with ``send=`` it is handed to ``send(slot)`` (the function
        only names the schedule). See :meth:`add` for the options."""

        def decorate(fn: F) -> F:
            self.add(
                name,
                cron=expr,
                tz=tz,
                target=fn,
                misfire=misfire,
                grace=grace,
                catch_up=catch_up,
                overlap=overlap,
                jitter=jitter,
                queue=queue,
                body=body,
                send=send,
                attempts=attempts,
            )
            return fn

        return decorate

    def every(
        self,
        seconds: float = 0,
        minutes: float = 0,
        hours: float = 0,
        *,
        name: str | None = None,
        misfire: str = "latest",
        grace: float = DEFAULT_GRACE,
        catch_up: float = DEFAULT_CATCH_UP,
        overlap: str = "allow",
        jitter: float = 0.0,
        queue: Any = None,
        body: Any = None,
        send: Callable[[Slot], Any] | None = None,
        attempts: int = 1,
    ) -> Callable[[F], F]:
        """Decorator: run the function every ``seconds + 60 * minutes + 3600 * hours``
        seconds (a whole number from 1 to 366 days), at the multiples of that period since
        the Unix epoch. Otherwise like :meth:`cron`."""
        for value, argument in ((seconds, "seconds"), (minutes, "minutes"), (hours, "hours")):
            slotmath.check_seconds(value, argument=argument)
        period = seconds + 60 * minutes + 3600 * hours

        def decorate(fn: F) -> F:
            self.add(
                name,
                every=period,
                target=fn,
                misfire=misfire,
                grace=grace,
                catch_up=catch_up,
                overlap=overlap,
                jitter=jitter,
                queue=queue,
                body=body,
                send=send,
                attempts=attempts,
            )
            return fn

        return decorate

    def add(
        self,
        name: str | None,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        target: Callable[..., Any] | None = None,
        misfire: str = "latest",
        grace: float = DEFAULT_GRACE,
        catch_up: float = DEFAULT_CATCH_UP,
        overlap: str = "allow",
        jitter: float = 0.0,
        queue: Any = None,
        body: Any = None,
        send: Callable[[Slot], Any] | None = None,
        attempts: int = 1,
    ) -> str:
        """Register a schedule; return its name.

        Exactly one of ``cron`` (an expression, evaluated in ``tz``) and ``every`` (seconds).
        What a fire does: ``queue`` (publish with the slot key as message id; ``body`` a value
        or ``callable(slot)``, else ``target`` makes it, else the body is the slot's key and
        time), else ``send`` (``send(slot)``), else ``target`` (a function of no argument or
        of the :class:`Slot`, run inside the slot's claim).

        * ``name`` -- default the target's ``module.qualname``; the rules of a lock name,
          without ``@``, and at most :data:`MAX_SCHEDULE_NAME_BYTES` (978) bytes in UTF-8.
        * ``misfire`` -- ``"latest"`` / ``"all"`` / ``"none"``: what a slot found later than
          ``grace`` does (fire it only if it is the newest due slot / fire it / record it
          missed).
        * ``grace`` -- seconds (> 0) after its due time a slot still fires as a normal fire.
        * ``catch_up`` -- how far back (seconds, >= grace) a process looks for slots nobody
          recorded; ``catch_up + max_skew + lease`` at most one year (366 days).
        * ``overlap`` -- ``"allow"`` / ``"skip"`` / ``"queue"``: what a slot does while the
          schedule's previous fire still runs (fire / record it skipped / wait for it, at most
          until the misfire policy takes over).
        * ``jitter`` -- seconds: each slot is due a delay in ``[0, jitter)`` after its time,
          the same on every process (a hash of the name and the slot).
        * ``attempts`` -- how many times a fire may run a target that raises (default 1: a
          failure is recorded ``failed`` and the slot is not retried); each further attempt
          starts at once, inside the same claim, and only while the slot is within ``grace``.
          A transient error (:func:`~jobfence.is_transient`: a server away) uses no attempt:
          the slot is given back and fired again on a later pass while within ``grace``.
        """
        if self._closed:
            raise ConfigurationError("this scheduler is closed", argument="self")
        if (cron is None) == (every is None):
            raise ConfigurationError(
                "give exactly one of cron (an expression) and every (seconds)",
                argument="cron" if cron is None else "every",
            )
        spec: slotmath.Spec
        if cron is not None:
            spec = slotmath.CronSpec(cron, tz)
        else:
            spec = slotmath.EverySpec(every)  # type: ignore[arg-type]
            if tz != "UTC":
                slotmath.CronSpec("* * * * *", tz)  # an unknown tz is an error all the same
        misfire = _choice(misfire, slotmath.MISFIRE, "misfire")
        overlap = _choice(overlap, slotmath.OVERLAP, "overlap")
        grace = slotmath.check_seconds(grace, argument="grace", positive=True)
        catch_up = slotmath.check_seconds(catch_up, argument="catch_up", positive=True)
        jitter = slotmath.check_seconds(jitter, argument="jitter")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(
                f"attempts must be an int >= 1, got {attempts!r}", argument="attempts"
            )
        if catch_up < grace:
            raise ConfigurationError(
                f"catch_up ({catch_up!r} s) must be >= grace ({grace!r} s)", argument="catch_up"
            )
        if target is not None and not callable(target):
            raise ConfigurationError(
                f"target must be a function, got {target!r}", argument="target"
            )
        if send is not None and not callable(send):
            raise ConfigurationError(
                f"send must be a callable send(slot), got {send!r}", argument="send"
            )
        if queue is not None and not isinstance(queue, AsyncQueue):
            raise ConfigurationError(
                f"queue must be a jobfence queue of the scheduler's flavour (an AsyncQueue for "
                f"AsyncScheduler, a Queue for Scheduler), got {queue!r}",
                argument="queue",
            )
        if queue is None and send is None and target is None:
            raise ConfigurationError(
                "a schedule needs something to fire: target, queue or send", argument="target"
            )
        if name is None:
            if target is None:
                raise ConfigurationError("name is needed without a target", argument="name")
            name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
        name = check_name(name, argument="name")
        if "@" in name:
            # the slot keys are ``schedule:<name>@<time>``: a name with "@" would share the
            # key prefix of another schedule's slots
            raise ConfigurationError(
                f"name must not contain '@' (it ends the name in slot keys), got {name!r}",
                argument="name",
            )
        if len(name.encode("utf-8")) > MAX_SCHEDULE_NAME_BYTES:
            raise ConfigurationError(
                f"name must be at most {MAX_SCHEDULE_NAME_BYTES} bytes in UTF-8 (its slot keys "
                f"add up to 46 bytes to it), got {len(name.encode('utf-8'))} bytes",
                argument="name",
            )
        if name in self._schedules:
            raise ConfigurationError(f"a schedule named {name!r} exists already", argument="name")
        fn: Callable[..., Any] | None = None
        if queue is not None:
            what = f"queue {getattr(queue, 'name', queue)!r}"
            if body is None and target is not None:
                body = target
        elif send is not None:
            what = f"send {getattr(send, '__qualname__', None) or repr(send)}"
        else:
            assert target is not None
            if not ASYNC:  # noqa: SIM102 - the async source drops this block whole
                if inspect.iscoroutinefunction(target):
                    raise ConfigurationError(
                        "Scheduler runs plain functions; an async def target needs AsyncScheduler",
                        argument="target",
                    )
            _takes_slot(target)
            fn = target
            what = f"function {target.__module__}.{target.__qualname__}"
        if body is not None and callable(body):
            _takes_slot(body)
        needed = catch_up + self.max_skew + self.lease
        if needed > MAX_TTL and self._retention is None and self._inbox is None:
            raise ConfigurationError(
                f"catch_up + max_skew + lease must be at most {MAX_TTL} s (366 days, the "
                f"longest a slot's record is kept), got {needed!r} s for schedule {name!r}",
                argument="catch_up",
            )
        schedule = _Schedule(
            name, spec, misfire, grace, catch_up, overlap, jitter, fn, queue, body, send, what
        )
        schedule.attempts = attempts
        self._schedules[name] = schedule
        if self.retention < needed:
            del self._schedules[name]
            raise ConfigurationError(
                f"retention ({self.retention!r} s) must be >= catch_up + max_skew + lease "
                f"({needed!r} s for schedule {name!r}): a slot record must outlive the window "
                "in which a process may look for it",
                argument="retention",
            )
        return name

    # -- backends ----------------------------------------------------------------------------
    def _get_inbox(self) -> AsyncInbox:
        if self._closed:
            raise ConfigurationError("this scheduler is closed", argument="self")
        if self._inbox is None:
            options: dict[str, Any] = {"retention": self.retention}
            if self.namespace is not None:
                options["table"] = self.namespace
            self._inbox = AsyncInbox(self.url, **options)
        return self._inbox

    def _get_locks(self) -> AsyncLocks:
        if self._locks is None:
            options: dict[str, Any] = {}
            if self.namespace is not None:
                options["namespace"] = self.namespace
            url = self.url
            if url is None and self._inbox is not None and not self._owns_inbox:
                url = self._inbox.url
            self._locks = AsyncLocks(url, **options)
        return self._locks

    def _get(self, name: str) -> _Schedule:
        schedule = self._schedules.get(name)
        if schedule is None:
            raise ConfigurationError(
                f"no schedule named {name!r}; known: {sorted(self._schedules)}", argument="name"
            )
        return schedule

    # -- one pass ----------------------------------------------------------------------------
    async def tick(self, now: float | None = None) -> list[Fire]:
        """One pass at ``now`` (epoch seconds, default the clock's time): every slot due by
        then is claimed and decided, and the ones this process claimed to fire are run to
        the end (one after the other). Returns the records this pass made: the slots
        recorded missed or skipped, then the fires, each in slot order per schedule."""
        jobs, fires = await self._pass(now)
        for i, job in enumerate(jobs):
            try:
                fire = await self._fire(job)
            except BaseException:
                # interrupted (KeyboardInterrupt, SystemExit, cancellation): the slots not
                # fired yet are given back, not left claimed (and renewed) by nobody
                await self._give_back_jobs(jobs[i + 1 :])
                raise
            if fire is not None:
                fires.append(fire)
        return fires

    async def _give_back_jobs(self, jobs: list[_Job], *, again: bool = True) -> None:
        """Give back the claims (and run leases) of jobs that will not be fired; ``again``:
        look at their slots on the next pass (a slot whose target was interrupted is left
        to the other processes, like the slot of a process that died in it)."""
        for job in jobs:
            await self._give_back(job.claim)
            if job.lease is not None:
                await self._release_lease(job.lease, job.schedule.name)
            if again and not job.slot.manual:
                job.schedule.pending[int(job.slot.at.timestamp())] = 0.0

    async def _pass(self, now: float | None) -> tuple[list[_Job], list[Fire]]:
        if now is None:
            now = get_clock().time()
        inbox = self._get_inbox()
        self._failed = False
        jobs: list[_Job] = []
        fires: list[Fire] = []
        for schedule in list(self._schedules.values()):
            candidates: list[int] = []
            done = 0
            try:
                paused = await self._paused(inbox, schedule.name)
                candidates = await self._candidates(inbox, schedule, now)
                for at in candidates:
                    outcome = await self._take(inbox, schedule, at, now, paused)
                    done += 1
                    if isinstance(outcome, Fire):
                        fires.append(outcome)
                    elif outcome is not None:
                        jobs.append(outcome)
            except JobfenceError as err:
                # the backend did not answer: the slots not decided yet are claimed again on
                # the next pass (a claim granted but not completed expires after its lease)
                schedule.pending.update(dict.fromkeys(candidates[done:], 0.0))
                self._failed = True
                log.warning("schedule %r: this pass failed: %s", schedule.name, err)
            except BaseException:
                # interrupted: the slots claimed in this pass are given back, not left
                # claimed (and renewed) by nobody
                schedule.pending.update(dict.fromkeys(candidates[done:], 0.0))
                await self._give_back_jobs(jobs)
                raise
        return jobs, fires

    async def _paused(self, inbox: AsyncInbox, name: str) -> bool:
        info = await inbox.claim_info(PAUSE_PREFIX + name)
        return info is not None and info.state is ClaimState.COMPLETED

    async def _candidates(self, inbox: AsyncInbox, s: _Schedule, now: float) -> list[int]:
        """The slots to claim in this pass: the pending ones still within catch_up, and the
        slots due since the cursor, minus those already recorded (read in bulk when many)."""
        horizon = now - s.catch_up
        ready = get_clock().monotonic()
        with self._mutex:  # a fire thread may add a slot it lost (``_fire``)
            s.pending = {at: t for at, t in s.pending.items() if s.due(at) >= horizon}
            retry = {at for at, t in s.pending.items() if t <= ready}
        if s.cursor is None:
            s.cursor = await self._first_cursor(inbox, s, now)
        start = max(s.cursor, horizon)
        # slots past the cursor, up to the first that is not due yet; ``after`` never ends
        fresh: list[int] = []
        for at in s.spec.after(start):
            if at > now or s.due(at) > now:
                break
            fresh.append(at)
        if not fresh:
            return sorted(retry)
        newest = fresh[-1]
        if len(fresh) > BULK:
            fresh = await self._unrecorded(inbox, s, fresh)
        # past these slots only once they are read: a failed read leaves them to the next pass
        s.cursor = newest
        s.latest_due = max(newest, s.latest_due or newest)
        return sorted(retry.union(fresh))

    async def _first_cursor(self, inbox: AsyncInbox, s: _Schedule, now: float) -> float:
        """Where this process starts looking at a schedule's slots (exclusive).

        A schedule with records starts at its oldest record (bounded by catch_up): every slot
        since then that nobody recorded is a misfire to decide. A schedule with no record at
        all is new: it starts with its newest due slot if that is within grace (nothing
        older is caught up, nothing is recorded missed), else with the next slot."""
        oldest = await inbox.claims(prefix=slotmath.slot_prefix(s.name), limit=1)
        if oldest:
            prefix = slotmath.slot_prefix(s.name)
            try:
                first = slotmath.parse_iso(oldest[0].key[len(prefix) : len(prefix) + 20])
            except ValueError:
                first = None
            if first is not None:
                return first.timestamp() - 1
        recent = slotmath.window(s.spec, now - s.grace - s.jitter - 1, now)
        due = [at for at in recent if s.due(at) <= now]
        chosen = [at for at in recent if s.due(at) > now]
        if due and now - s.due(due[-1]) <= s.grace:
            chosen.append(due[-1])
        return min(chosen) - 1 if chosen else float(math.floor(now))

    async def _unrecorded(self, inbox: AsyncInbox, s: _Schedule, slots: list[int]) -> list[int]:
        """``slots`` without those already completed, read in bulk (one listing per hour of
        slots) instead of one claim each."""
        states: dict[str, ClaimState] = {}
        hours = sorted({slotmath.slot_prefix(s.name, at, unit="hour") for at in slots})
        for prefix in hours:
            for info in await inbox.claims(prefix=prefix, limit=100_000):
                states[info.key] = info.state
        return [
            at
            for at in slots
            if states.get(slotmath.slot_key(s.name, at)) is not ClaimState.COMPLETED
        ]

    async def _take(
        self, inbox: AsyncInbox, s: _Schedule, at: int, now: float, paused: bool
    ) -> Fire | _Job | None:
        """Claim slot ``at``; if it is ours, record what the policies decide (missed,
        skipped) or return the job that fires it."""
        key = slotmath.slot_key(s.name, at)
        due = s.due(at)
        claim = await inbox.claim(key, ttl=self.lease, renew=True)
        if claim.state is ClaimState.COMPLETED:
            s.pending.pop(at, None)
            return None
        if claim.state is ClaimState.IN_PROGRESS:
            # claimed again half a lease from now: a live holder renews its claim every third
            # of a lease, a dead one's claim has expired at most a lease after its last
            # renewal, so the slot is taken over within 1.5 leases of the holder's death
            s.pending[at] = get_clock().monotonic() + self.lease / 2
            return None
        s.pending.pop(at, None)
        if paused:
            return await self._record(claim, s, at, due, "skipped", "the schedule is paused")
        action = slotmath.misfire_action(
            late=now - due, grace=s.grace, misfire=s.misfire, newest=at == s.latest_due
        )
        if action == "missed":
            late = now - due
            telemetry.schedule_miss(s.name)
            return await self._record(
                claim, s, at, due, "missed", f"{late:.3f} s late (grace {s.grace} s)"
            )
        lease = None
        if s.overlap != "allow":
            try:
                lease = await self._get_locks().try_acquire(RUN_PREFIX + s.name, ttl=self.lease)
            except BaseException:
                await self._give_back(claim)
                raise
            if lease is None:
                if s.overlap == "skip":
                    return await self._record(
                        claim, s, at, due, "skipped", "the previous fire was still running"
                    )
                # queue: give the slot back and claim it again next pass
                await self._give_back(claim)
                s.pending[at] = 0.0
                return None
        slot = Slot(s.name, slotmath.slot_datetime(at), key, False)
        return _Job(s, slot, claim, due, lease)

    async def _give_back(self, claim: AsyncClaim) -> None:
        try:
            await claim.release()
        except JobfenceError as err:
            log.warning("giving back %r failed (it expires after its lease): %s", claim.key, err)

    async def _record(
        self, claim: AsyncClaim, s: _Schedule, at: int, due: float, outcome: str, why: str
    ) -> Fire:
        """Complete the slot's claim with a record that says ``outcome`` (not fired)."""
        if outcome == "skipped":
            telemetry.schedule_skip(s.name)
        iso = slotmath.slot_iso(at)
        log.info("schedule %r slot %s %s: %s", s.name, iso, outcome, why)
        record = self._record_of(s, iso, outcome, None, None, why)
        await self._complete(claim, record)
        if outcome == "missed":
            await self._note_miss(s.name, iso)
        return _fire_of(s.name, claim.key, record)

    async def _note_miss(self, name: str, iso: str) -> None:
        """A record of its own for each missed slot (``schedule-missed:<name>@<iso>``), so
        that :meth:`info` counts the misses with one listing instead of reading every
        slot's record. Best effort: a failure only leaves the count short."""
        try:
            marker = await self._get_inbox().claim(f"{MISSED_PREFIX}{name}@{iso}", ttl=self.lease)
            if marker.state is ClaimState.NEW:
                await marker.complete(None)
        except JobfenceError as err:
            log.debug("noting the miss of %r at %s failed: %s", name, iso, err)

    def _record_of(
        self,
        s: _Schedule,
        iso: str,
        outcome: str,
        fired_at: float | None,
        lag: float | None,
        error: str | None,
    ) -> dict[str, Any]:
        return {
            "schedule": s.name,
            "slot": iso,
            "outcome": outcome,
            "pod": self.pod,
            "fired_at": fired_at,
            "lag": lag,
            "spec": s.spec.describe(),
            "error": error,
        }

    async def _complete(self, claim: AsyncClaim, record: dict[str, Any]) -> None:
        """Store the slot's record. A call that fails (a :class:`BackendError`: connection
        reset, backend down) is tried again every ``lease / 6`` seconds while the claim is
        still ours: the claim stays renewed meanwhile, so giving up would leave the slot
        held (and undecided) as long as this process lives, and fired again once its inbox
        closes and gives it back. Ends when the record is stored or the claim is lost (the
        backend was out of reach past the lease: another process decides the slot)."""
        while True:
            try:
                await claim.complete(record)
                return
            except ClaimLost as err:
                # renewed all along, so it was forgotten or the backend lost it: another
                # process may decide the slot again
                log.warning("the record of %r could not be stored: %s", claim.key, err)
                return
            except BackendError as err:
                if claim.lost:
                    log.warning("the record of %r could not be stored: %s", claim.key, err)
                    return
                log.warning("storing the record of %r failed, trying again: %s", claim.key, err)
            except JobfenceError as err:  # not the backend's failure: trying again is futile
                log.error("the record of %r could not be stored: %s", claim.key, err)
                return
            await get_clock().asleep(self.lease / 6)

    async def _fire(self, job: _Job) -> Fire | None:
        """Run the job's target inside its slot's claim; store the record. A claim already
        lost (this process was paused or starved past its lease since it claimed the slot,
        and another one may have taken the slot over) runs nothing: ``None``."""
        s, slot, claim = job.schedule, job.slot, job.claim
        if claim.lost:
            log.warning(
                "schedule %r: the claim on %s was lost before its target started (this "
                "process was held up past its lease); another process decides the slot",
                s.name,
                slot.key,
            )
            if job.lease is not None:
                await self._release_lease(job.lease, s.name)
            if not slot.manual:
                # claimed again on the next pass: if no other process took the slot over
                # (they were all held up too, or there is none), this one fires it, late
                with self._mutex:  # a fire thread, beside the pass that reads ``pending``
                    s.pending[int(slot.at.timestamp())] = get_clock().monotonic()
            return None
        clock = get_clock()
        fired_at = clock.time()
        lag = max(0.0, fired_at - job.due) if not slot.manual else 0.0
        telemetry.schedule_fire(s.name, lag)
        outcome, error = "fired", None
        retry_later = False
        token = current_claim_var.set(claim)
        interrupted = False
        try:
            await self._attempts(job)
        except Exception as exc:
            if self._retry_later(job, exc):
                retry_later = True
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            log.error(
                "schedule %r slot %s failed: %s",
                s.name,
                slot.key,
                error,
                exc_info=exc,
                extra={"jobfence.schedule": s.name, "jobfence.key": slot.key},
            )
        except BaseException:
            interrupted = True
            raise
        finally:
            current_claim_var.reset(token)
            if job.lease is not None:
                await self._release_lease(job.lease, s.name)
            if interrupted:  # no record: the slot is given back, as if this process died
                await self._give_back_jobs([_Job(s, slot, claim, job.due, None)], again=False)
        if retry_later:
            # the broker or the database is away: the slot is not failed but given back, and
            # the next pass (this process's or another's) fires it again while within grace
            log.warning(
                "schedule %r slot %s: %s; fired again on a later pass (within grace %s s)",
                s.name,
                slot.key,
                error,
                s.grace,
            )
            with self._mutex:  # a fire thread, beside the pass that reads ``pending``
                s.pending[int(slot.at.timestamp())] = get_clock().monotonic() + TRANSIENT_RETRY
            await self._give_back(claim)
            return None
        iso = slotmath.slot_iso(int(slot.at.timestamp()))
        record = self._record_of(s, iso, outcome, fired_at, lag, error)
        if outcome == "fired":
            log.info("schedule %r fired slot %s (lag %.3f s)", s.name, iso, lag)
        await self._complete(claim, record)
        return _fire_of(s.name, claim.key, record)

    @staticmethod
    def _retry_later(job: _Job, exc: Exception) -> bool:
        """Whether a fire that raised ``exc`` gives its slot back instead of recording it
        failed: a transient error (:func:`~jobfence.is_transient`: a connection lost or
        refused, a server restarting, a timeout) of a scheduled slot still within grace, whose
        claim this process still holds. A re-sent slot is the same message id or claim key,
        which the consumer's inbox or ``claim_in`` deduplicates."""
        if job.slot.manual or job.claim.lost or not is_transient(exc):
            return False
        return get_clock().time() - job.due <= job.schedule.grace

    async def _attempts(self, job: _Job) -> None:
        """The job's target, run again after a failure while ``attempts`` allow and the
        slot is within grace (a manual fire: once more per attempt, whatever the time)."""
        s, slot, claim = job.schedule, job.slot, job.claim
        attempt = 1
        while True:
            try:
                await claim._run_work(self._run_target, s, slot)
                return
            except ClaimLost:
                raise
            except Exception as exc:
                late = get_clock().time() - job.due
                if attempt >= s.attempts or (not slot.manual and late > s.grace) or claim.lost:
                    raise
                attempt += 1
                log.warning(
                    "schedule %r slot %s: attempt %d of %d after %s: %s",
                    s.name,
                    slot.key,
                    attempt,
                    s.attempts,
                    type(exc).__name__,
                    exc,
                )

    async def _release_lease(self, lease: AsyncLease, name: str) -> None:
        try:
            await lease.release()
        except JobfenceError as err:
            log.warning("releasing the run lease of %r failed: %s", name, err)

    async def _run_target(self, s: _Schedule, slot: Slot) -> None:
        if s.queue is not None:
            body = s.body
            if callable(body):
                body = await self._call(body, slot)
            elif body is None:
                body = {"schedule": s.name, "slot": slot.at.isoformat(), "key": slot.key}
            await s.queue.publish(body, id=slot.key)
            return
        fn = s.send if s.send is not None else s.fn
        assert fn is not None
        await self._call(fn, slot)

    async def _call(self, fn: Callable[..., Any], slot: Slot) -> Any:
        args = (slot,) if _takes_slot(fn) else ()
        if ASYNC:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args)
            result = await asyncio.to_thread(fn, *args)
            if inspect.isawaitable(result):
                result = await result
            return result
        else:
            return fn(*args)

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Pass after pass until :meth:`stop` (or SIGTERM / SIGINT when called in the main
        thread): each pass claims the due slots and starts their targets in the background
        (a task; ``Scheduler``: a thread each), then waits for the next due slot (at most
        ``MAX_PAUSE`` s). On the way out it waits for the targets still running. A
        :meth:`stop` that came before makes it return at once."""
        restore = self._install_signals()
        try:
            if ASYNC:
                self._stop_event = asyncio.Event()
                self._loop = asyncio.get_running_loop()
            else:
                self._stop_event.clear()
            while not self._stopping:
                jobs, _ = await self._pass(None)
                for job in jobs:
                    self._start(job)
                await self._pause()
        finally:
            restore()
            await self._join()
            self._stopping = False  # ready for another run()

    async def _pause(self) -> None:
        clock = get_clock()
        now = clock.time()
        wake = now + MAX_PAUSE
        for s in self._schedules.values():
            for at in s.spec.after(s.cursor if s.cursor is not None else now):
                wake = min(wake, s.due(at))
                break
        # after a failed pass, the longest pause: a backend that is down is not hammered
        timeout = MAX_PAUSE if self._failed else max(0.0, wake - now)
        if ASYNC:
            assert self._stop_event is not None
            await clock.wait_async(self._stop_event, timeout)
        else:
            clock.wait(self._stop_event, timeout)

    def _start(self, job: _Job) -> None:
        if ASYNC:
            task = asyncio.get_running_loop().create_task(self._fire(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:

            def body() -> None:
                try:
                    self._fire(job)
                finally:
                    with self._mutex:
                        self._threads.discard(thread)

            thread = threading.Thread(target=body, name=f"jobfence-schedule-{job.slot.key}")
            with self._mutex:
                self._threads.add(thread)
            thread.start()

    async def _join(self) -> None:
        if ASYNC:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        else:
            with self._mutex:
                threads = list(self._threads)
            for thread in threads:
                thread.join()

    def _install_signals(self) -> Callable[[], None]:
        """Stop on SIGTERM / SIGINT while :meth:`run` runs in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        signals = (signal.SIGTERM, signal.SIGINT)
        if ASYNC:
            loop = asyncio.get_running_loop()
            done = []
            for sig in signals:
                try:
                    loop.add_signal_handler(sig, self.stop)
                    done.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass

            def restore() -> None:
                for sig in done:
                    loop.remove_signal_handler(sig)

            return restore
        else:
            old = {sig: signal.getsignal(sig) for sig in signals}
            for sig in signals:
                signal.signal(sig, lambda *_: self.stop())

            def restore() -> None:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

            return restore

    def stop(self) -> None:
        """Ask :meth:`run` to return after its current pass (targets running are awaited).
        Safe to call from a signal handler or another thread."""
        self._stopping = True
        if self._stop_event is None:
            return
        if ASYNC:  # from any thread or a signal handler, onto run()'s loop
            acompat.set_event(self._stop_event, self._loop)
        else:
            self._stop_event.set()

    # -- operations --------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names of the registered schedules, sorted."""
        return sorted(self._schedules)

    async def schedules(self) -> list[ScheduleInfo]:
        """:meth:`info` of every registered schedule, by name."""
        return [await self.info(name) for name in self.names()]

    async def info(self, name: str) -> ScheduleInfo:
        """What is known of schedule ``name``: its options, whether it is paused, its next
        slot, its newest record and how many records kept say missed."""
        s = self._get(name)
        inbox = self._get_inbox()
        paused = await self._paused(inbox, name)
        now = get_clock().time()
        nxt = next(iter(s.spec.after(now)), None)
        history = await self.history(name, limit=1)
        missed = await inbox.claims(
            prefix=f"{MISSED_PREFIX}{name}@", state=ClaimState.COMPLETED, limit=100_000
        )
        return ScheduleInfo(
            name=name,
            spec=s.spec.describe(),
            tz=s.spec.tz,
            misfire=s.misfire,
            overlap=s.overlap,
            grace=s.grace,
            jitter=s.jitter,
            paused=paused,
            next_at=None if nxt is None else slotmath.slot_datetime(nxt),
            last=history[0] if history else None,
            misses=len(missed),
            target=s.target,
        )

    async def pause(self, name: str) -> None:
        """Pause schedule ``name`` on every process (a record in the backend): its slots are
        recorded ``skipped`` until :meth:`resume`. Pausing a paused schedule does nothing."""
        self._get(name)
        claim = await self._get_inbox().claim(PAUSE_PREFIX + name, ttl=self.lease)
        if claim.state is ClaimState.NEW:
            await claim.complete({"paused_by": self.pod, "at": get_clock().time()})

    async def resume(self, name: str) -> bool:
        """Resume schedule ``name`` on every process; returns whether it was paused."""
        self._get(name)
        return await self._get_inbox().forget(PAUSE_PREFIX + name)

    async def trigger(self, name: str) -> Fire:
        """Fire schedule ``name`` once now, in this process, under a manual slot key
        (``schedule:<name>@<now>+manual-<hex>``), whatever its pause and overlap; returns the
        record."""
        s = self._get(name)
        now = get_clock().time()
        at = math.floor(now)
        key = f"{slotmath.slot_key(name, at)}+manual-{uuid.uuid4().hex[:8]}"
        claim = await self._get_inbox().claim(key, ttl=self.lease, renew=True)
        slot = Slot(name, slotmath.slot_datetime(at), key, True)
        fire = await self._fire(_Job(s, slot, claim, now, None))
        if fire is None:
            raise ClaimLost(f"the claim on {key!r} was lost before its target started", key=key)
        return fire

    async def history(self, name: str, limit: int | None = 20) -> list[Fire]:
        """The records kept of schedule ``name``, newest slot first (at most ``limit``;
        ``None``: all kept). Reads the listing one day of slots at a time, going back."""
        self._get(name)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ConfigurationError(f"limit must be an int >= 1, got {limit!r}", argument="limit")
        if limit is not None and limit < 1:
            raise ConfigurationError(f"limit must be an int >= 1, got {limit!r}", argument="limit")
        inbox = self._get_inbox()
        now = get_clock().time()
        keys: list[str] = []
        seen: set[str] = set()
        day = 86400
        start = math.floor(now + self.max_skew + 1)
        oldest = now - self.retention - day
        # this hour, then whole days back to the retention: a dense schedule is read in one
        # short listing, a sparse one in one listing per day kept; where each listing visits
        # the whole server (Redis SCAN), this hour then every record of the schedule at once
        prefixes = [slotmath.slot_prefix(name, start, unit="hour")]
        if inbox.capabilities.scanned_listing:
            prefixes.append(slotmath.slot_prefix(name))
        else:
            at = start
            while at >= oldest:
                prefixes.append(slotmath.slot_prefix(name, at, unit="day"))
                at -= day
        for prefix in prefixes:
            if limit is not None and len(keys) >= limit:
                break
            infos = await inbox.claims(prefix=prefix, state=ClaimState.COMPLETED, limit=100_000)
            for k in sorted((i.key for i in infos), reverse=True):
                if k not in seen:
                    seen.add(k)
                    keys.append(k)
        keys.sort(reverse=True)
        if limit is not None:
            keys = keys[:limit]
        fires = []
        for key in keys:
            claim = await inbox.claim(key, ttl=self.lease)
            if claim.state is ClaimState.COMPLETED:
                fires.append(_fire_of(name, key, claim.result))
            elif claim.state is ClaimState.NEW:  # purged meanwhile: give it back at once
                await claim.release()
        return fires

    # -- lifetime ----------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop, wait for the targets running, close the inbox and locks this scheduler
        opened (not the ones given to it)."""
        if self._closed:
            return
        self.stop()
        await self._join()
        self._closed = True
        if self._owns_locks and self._locks is not None:
            await self._locks.close()
        if self._owns_inbox and self._inbox is not None:
            await self._inbox.close()

    async def __aenter__(self) -> AsyncScheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
