"""The dashboard's schedules panel: what a :class:`~jobfence.Scheduler` (or
:class:`~jobfence.AsyncScheduler`) reports of its schedules, and its pause, resume and trigger.

Each scheduler is a :class:`SchedulerSource`, read one call at a time (one mutex each, like a
backend URL's :class:`~jobfence.dashboard.state.Target`). A ``Scheduler`` is called in the
dashboard's threads; an ``AsyncScheduler`` gets an event loop of its own, in a thread of its
own, for as long as the dashboard runs: its clients belong to that loop, so every call goes
there (a new loop per call, as ``asyncio.run`` makes, would find them bound to a closed one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from .._core.clock import get_clock
from .._core.schedule_info import OUTCOMES, Fire, ScheduleInfo
from .._core.url import mask_url
from ..cli._common import user
from ..errors import BackendError, ConfigurationError
from ..scheduler import Scheduler
from ..scheduler_async import AsyncScheduler

__all__ = ["HISTORY_READ", "HISTORY_SHOWN", "SchedulerSource", "fire_dict", "who"]

log = logging.getLogger("jobfence.cli")

#: the newest records read per schedule at each refresh (their outcomes are counted)
HISTORY_READ = 20
#: how many of them the page lists
HISTORY_SHOWN = 5


def who() -> str:
    """Who acted from the dashboard, for the log: user, host and process."""
    return f"{user()}@{socket.gethostname()} (pid {os.getpid()})"


def _iso(value: datetime | None) -> str | None:
    """``2026-12-04T15:30:00Z`` (UTC, to the second), or ``None``."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fire_dict(fire: Fire) -> dict[str, Any]:
    """A :class:`Fire` as the page shows it."""
    return {
        "key": fire.key,
        "slot": _iso(fire.slot_at),
        "outcome": fire.outcome,
        "pod": fire.pod,
        "fired_at": _iso(fire.fired_at),
        "lag": None if fire.lag is None else round(float(fire.lag), 3),
        "error": fire.error,
        "manual": "+manual-" in fire.key,
    }


class _Loop:
    """An event loop running in a daemon thread; :meth:`call` runs a coroutine there and
    waits for its result."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SchedulerSource:
    """One scheduler of the dashboard, shown under ``label`` (the ``MODULE:OBJ`` it was
    loaded from). The dashboard closes it when it closes."""

    def __init__(
        self, index: int, label: str, scheduler: Scheduler | AsyncScheduler, timeout: float
    ) -> None:
        if not isinstance(scheduler, (Scheduler, AsyncScheduler)):
            raise ConfigurationError(
                f"{label}: a jobfence Scheduler or AsyncScheduler is needed, got "
                f"{type(scheduler).__name__}",
                argument="schedulers",
            )
        self.index = index
        self.label = label
        self.scheduler = scheduler
        self.timeout = timeout
        self.url = scheduler.url
        self.masked = mask_url(scheduler.url) if scheduler.url else None
        self._mutex = threading.Lock()
        self._closed = False
        #: the gathering of this scheduler's state still running, if any (one at a time)
        self.pending: Future[dict[str, Any]] | None = None
        self._loop = (
            _Loop(f"jobfence-dashboard-scheduler-{index}")
            if isinstance(scheduler, AsyncScheduler)
            else None
        )

    # -- calling the scheduler ----------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        """``scheduler.method(*args)``; an ``AsyncScheduler``'s, on its loop."""
        bound: Callable[..., Any] = getattr(self.scheduler, method)
        if self._loop is not None:
            return self._loop.call(bound(*args))
        return bound(*args)

    @contextmanager
    def _acting(self) -> Iterator[None]:
        """Hold the mutex for an action; BackendError when the calls before it hang longer
        than the dashboard's answer timeout."""
        if not self._mutex.acquire(timeout=self.timeout):
            raise BackendError(
                f"scheduler {self.label}: the backend has not answered the previous call "
                f"within {self.timeout:g} s",
                backend="scheduler",
                operation="dashboard",
            )
        try:
            yield
        finally:
            self._mutex.release()

    def _known(self, name: object) -> str:
        """``name`` if it names one of the scheduler's schedules, else ConfigurationError."""
        names = self.scheduler.names()
        if not isinstance(name, str) or name not in names:
            raise ConfigurationError(
                f"no schedule named {name!r} in scheduler {self.label}; known: {names}",
                argument="name",
            )
        return name

    # -- reading ------------------------------------------------------------------------------

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "label": self.label,
            "url": self.masked,
            "pod": self.scheduler.pod,
        }

    def not_answering(self, waited: float) -> dict[str, Any]:
        """The state of a scheduler whose backend has not answered within ``waited`` s."""
        return {
            **self._head(),
            "status": "error",
            "error": f"no answer from the backend within {waited:g} s (still waiting)",
            "schedules": [],
        }

    def state(self, mask: Callable[[BaseException], str]) -> dict[str, Any]:
        """Every schedule: :meth:`Scheduler.info` and its newest records. A failure is the
        panel's ``error`` (text from ``mask``)."""
        with self._mutex:
            try:
                infos: list[ScheduleInfo] = self._call("schedules")
                schedules = [self._schedule(info) for info in infos]
            except Exception as exc:  # shown on the page; the other panels go on
                return {**self._head(), "status": "error", "error": mask(exc), "schedules": []}
        return {**self._head(), "status": "ok", "schedules": schedules}

    def _schedule(self, info: ScheduleInfo) -> dict[str, Any]:
        history: list[Fire] = self._call("history", info.name, HISTORY_READ)
        outcomes = dict.fromkeys(OUTCOMES, 0)
        for fire in history:
            outcomes[fire.outcome] = outcomes.get(fire.outcome, 0) + 1
        return {
            "name": info.name,
            "spec": info.spec,
            "tz": info.tz,
            "misfire": info.misfire,
            "overlap": info.overlap,
            "grace": info.grace,
            "jitter": info.jitter,
            "target": info.target,
            "paused": info.paused,
            "next_at": _iso(info.next_at),
            "next_in": (
                None
                if info.next_at is None
                else round(info.next_at.timestamp() - get_clock().time(), 3)
            ),
            "last": None if info.last is None else fire_dict(info.last),
            "misses": info.misses,
            "read": len(history),
            "outcomes": outcomes,
            "history": [fire_dict(f) for f in history[:HISTORY_SHOWN]],
        }

    # -- actions ------------------------------------------------------------------------------

    def pause(self, name: object) -> dict[str, Any]:
        """Pause schedule ``name`` on every process."""
        name = self._known(name)
        with self._acting():
            was = self._call("info", name).paused
            self._call("pause", name)
        log.warning(
            "schedule %r of scheduler %s paused from the dashboard by %s%s",
            name,
            self.label,
            who(),
            " (it was paused already)" if was else "",
        )
        return {"schedule": name, "paused": True, "was_paused": was}

    def resume(self, name: object) -> dict[str, Any]:
        """Resume schedule ``name`` on every process."""
        name = self._known(name)
        with self._acting():
            was = bool(self._call("resume", name))
        log.warning(
            "schedule %r of scheduler %s resumed from the dashboard by %s%s",
            name,
            self.label,
            who(),
            "" if was else " (it was not paused)",
        )
        return {"schedule": name, "paused": False, "was_paused": was}

    def trigger(self, name: object) -> dict[str, Any]:
        """Fire schedule ``name`` once now, in the dashboard's process (the answer comes
        when its target has returned). Not under the mutex: the page keeps refreshing while
        the target runs."""
        name = self._known(name)
        log.warning(
            "schedule %r of scheduler %s triggered from the dashboard by %s",
            name,
            self.label,
            who(),
        )
        fire: Fire = self._call("trigger", name)
        return {"schedule": name, **fire_dict(fire)}

    def close(self) -> None:
        """Close the scheduler (and stop its loop); once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call("close")
        except Exception as exc:
            log.debug("closing scheduler %s failed: %r", self.label, exc)
        self.stop_loop()

    def stop_loop(self) -> None:
        """Stop the event loop of an ``AsyncScheduler`` (nothing for a ``Scheduler``)."""
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
