"""What the dashboard shows and does, for each backend URL, as plain JSON-ready dicts.

Each URL is a :class:`Target` with its own lock, inbox and queue clients, opened when first
needed (a backend that is down when the dashboard starts is retried at the next refresh) and
used one call at a time (one mutex per URL), so a slow or broken backend holds up only its
own panels. A failure becomes an ``"error"`` entry of that panel, its text masked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from .._core.inbox_support import DEFAULT_TABLE
from .._core.url import mask_url
from .._core.validate import check_listing, check_name, check_queue_name
from ..backends import parse_backend_url, registered
from ..backends.base import ClaimInfo, ClaimState
from ..errors import BackendError, ConfigurationError, JobfenceError
from ..inbox import Inbox
from ..locks import Locks
from ..queue import Queue
from ..scheduler import Scheduler
from ..scheduler_async import AsyncScheduler
from .outbox import OutboxSource
from .schedules import SchedulerSource, who

__all__ = ["Dashboard", "DashboardConfig", "Target", "masked_error"]

log = logging.getLogger("jobfence.cli")

T = TypeVar("T")

#: the most dead letters listed per queue
DEAD_LETTERS_SHOWN = 50
#: seconds a listing of a URL's queue names is reused before the backend is asked again
NAMES_EVERY = 10.0
#: seconds the state waits for one URL's answer before reporting it as not answering
ANSWER_TIMEOUT = 5.0


@dataclass(frozen=True)
class DashboardConfig:
    """What the dashboard looks at: the backend ``urls``; the lock ``namespace`` and the
    names starting with ``lock_prefix``; the ``queues`` by name, and (``discover_queues``)
    the queues that hold messages where the backend can list them (not RabbitMQ); the inbox
    ``inbox_table``; at most ``limit`` rows per listing; the transactional outboxes whose
    table ``outbox_table`` lives at each of the ``outboxes`` URLs."""

    urls: tuple[str, ...]
    namespace: str = "jobfence"
    queues: tuple[str, ...] = ()
    inbox_table: str = DEFAULT_TABLE
    lock_prefix: str = ""
    limit: int = 100
    discover_queues: bool = True
    outboxes: tuple[str, ...] = ()
    outbox_table: str = "jobfence_outbox"

    def __post_init__(self) -> None:
        if not self.urls and not self.outboxes:
            raise ConfigurationError("give at least one backend URL", argument="urls")
        check_listing(self.lock_prefix, self.limit)
        for name in self.queues:
            check_queue_name(name)


def masked_error(exc: BaseException, urls: Sequence[str] = (), *, typed: bool = True) -> str:
    """The text of ``exc`` for the page: its type (unless not ``typed``) and message, with
    every URL of ``urls`` that appears in it replaced by its masked form."""
    text = f"{type(exc).__name__}: {exc}" if typed else str(exc)
    for url in urls:
        if url and url in text:
            text = text.replace(url, mask_url(url))
    return text


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


class Target:
    """One backend URL of the dashboard: its clients and what it can show."""

    def __init__(self, index: int, url: str, config: DashboardConfig) -> None:
        self.index = index
        self.url = url
        self.config = config
        self.masked = mask_url(url)
        parsed = parse_backend_url(url)
        info = registered().get(parsed.scheme)
        if info is None:
            raise ConfigurationError(
                f"{self.masked}: no backend serves {parsed.scheme}://", argument="urls"
            )
        self.backend = info.name
        self.parts = frozenset(info.parts)
        self._mutex = threading.Lock()
        #: the gathering of this URL's state still running, if any (one at a time)
        self.pending: Future[dict[str, Any]] | None = None
        self._locks: Locks | None = None
        self._inbox: Inbox | None = None
        self._queues: dict[str, Queue] = {}
        #: the queue names found by the last listing, and when (monotonic)
        self._found: tuple[str, ...] = ()
        self._found_at = -NAMES_EVERY

    # -- clients, opened on first use -------------------------------------------------------

    def _locks_client(self) -> Locks:
        if self._locks is None:
            self._locks = Locks(self.url, namespace=self.config.namespace)
        return self._locks

    def _inbox_client(self) -> Inbox:
        if self._inbox is None:
            self._inbox = Inbox(self.url, table=self.config.inbox_table)
        return self._inbox

    def _queue_client(self, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = Queue(self.url, name)
        return queue

    def check(self) -> None:
        """Open the clients once, so that bad options (a namespace, a table or a queue name
        the backend refuses) are found at start; a backend that is down is not an error
        here."""
        with self._mutex:
            for part, opener in (
                ("locks", self._locks_client),
                ("inbox", self._inbox_client),
            ):
                if part in self.parts:
                    try:
                        opener()
                    except ConfigurationError:
                        raise
                    except JobfenceError:
                        pass
            if "queue" in self.parts:
                for name in self.config.queues:
                    try:
                        self._queue_client(name)
                    except ConfigurationError:
                        raise
                    except JobfenceError:
                        pass

    def _panel(self, part: str, gather: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if part not in self.parts:
            return {"status": "unsupported"}
        try:
            return {"status": "ok", **gather()}
        except Exception as exc:  # shown on the page; the other panels go on
            return {"status": "error", "error": masked_error(exc, [self.url])}

    # -- reading ------------------------------------------------------------------------------

    def not_answering(self, waited: float) -> dict[str, Any]:
        """The state of a URL whose backend has not answered within ``waited`` seconds (a
        link that hangs without closing): an error on each of its panels."""
        error = {
            "status": "error",
            "error": f"no answer from the backend within {waited:g} s (still waiting)",
        }
        return {
            "id": self.index,
            "url": self.masked,
            "backend": self.backend,
            "locks": error if "locks" in self.parts else {"status": "unsupported"},
            "inbox": error if "inbox" in self.parts else {"status": "unsupported"},
            "queues": [
                {"name": name, **(error if "queue" in self.parts else {"status": "unsupported"})}
                for name in self._known_queues()
            ],
        }

    def state(self) -> dict[str, Any]:
        """Everything the page shows for this URL."""
        with self._mutex:
            return {
                "id": self.index,
                "url": self.masked,
                "backend": self.backend,
                "locks": self._panel("locks", self._gather_locks),
                "inbox": self._panel("inbox", self._gather_inbox),
                "queues": [self._queue_panel(name) for name in self._queue_names()],
            }

    def _queue_names(self) -> list[str]:
        """The queues named in the options, then those the backend lists (every
        ``NAMES_EVERY`` seconds; a backend that cannot list, or is down, adds none)."""
        if "queue" in self.parts and self.config.discover_queues:
            now = time.monotonic()
            if now - self._found_at >= NAMES_EVERY:
                try:
                    self._found = tuple(Queue.names(self.url, limit=self.config.limit))
                except JobfenceError:  # RabbitMQ cannot list; a down backend shows elsewhere
                    self._found = ()
                self._found_at = now
        return self._known_queues()

    def _known_queues(self) -> list[str]:
        """The queues named in the options, then those the last listing found."""
        names = list(self.config.queues)
        names.extend(name for name in self._found if name not in names)
        return names

    def _gather_locks(self) -> dict[str, Any]:
        limit = self.config.limit
        held = self._locks_client().holders(self.config.lock_prefix, limit)
        return {
            "namespace": self.config.namespace,
            "items": [
                {
                    "name": name,
                    "owner": holder.owner,
                    "token": holder.token,
                    "expires_in": _seconds(holder.expires_in),
                }
                for name, holder in held
            ],
            "truncated": len(held) >= limit,
        }

    def _gather_inbox(self) -> dict[str, Any]:
        inbox = self._inbox_client()
        limit = self.config.limit
        try:
            # one listing per state, so that many completed records never hide a stuck claim
            by_state = {
                state.value: inbox.claims(state=state, limit=limit)
                for state in (ClaimState.IN_PROGRESS, ClaimState.COMPLETED)
            }
        except NotImplementedError:  # a third-party backend that cannot list its records
            return {"table": inbox.table, "available": False}
        in_progress = by_state[ClaimState.IN_PROGRESS.value]
        return {
            "table": inbox.table,
            "available": True,
            "counts": {state: len(listed) for state, listed in by_state.items()},
            "truncated": {state: len(listed) >= limit for state, listed in by_state.items()},
            "items": [self._claim(info) for info in in_progress if info.stuck],
            "in_progress": [self._claim(info) for info in in_progress if not info.stuck],
        }

    @staticmethod
    def _claim(info: ClaimInfo) -> dict[str, Any]:
        return {
            "key": info.key,
            "state": info.state.value,
            "owner": info.owner,
            "attempt": info.attempt,
            "claimed_at": _when(info.claimed_at),
            "age": _seconds(info.age),
            "expires_in": _seconds(info.expires_in),
            "stuck": info.stuck,
        }

    def _queue_panel(self, name: str) -> dict[str, Any]:
        panel = self._panel("queue", lambda: self._gather_queue(name))
        return {"name": name, **panel}

    def _gather_queue(self, name: str) -> dict[str, Any]:
        queue = self._queue_client(name)
        counts = queue.stats()
        dead = queue.dead_letters(min(self.config.limit, DEAD_LETTERS_SHOWN))
        return {
            "ready": counts.ready,
            "delayed": counts.delayed,
            "in_flight": counts.in_flight,
            "dead": counts.dead,
            "dead_letters": [
                {
                    "id": d.id,
                    "deliveries": d.deliveries,
                    "error": d.error,
                    "dead_at": d.dead_at,
                }
                for d in dead
            ],
        }

    # -- actions ------------------------------------------------------------------------------

    def _require(self, part: str) -> None:
        if part not in self.parts:
            raise ConfigurationError(
                f"{self.masked}: the {self.backend} backend has no {part}", argument="target"
            )

    @contextmanager
    def _acting(self) -> Iterator[None]:
        """Hold the URL's mutex for an action; BackendError when the calls before it hang
        longer than ANSWER_TIMEOUT (a link that stopped answering)."""
        if not self._mutex.acquire(timeout=ANSWER_TIMEOUT):
            raise BackendError(
                f"{self.masked}: the backend has not answered the previous call within "
                f"{ANSWER_TIMEOUT:g} s",
                backend=self.backend,
                operation="dashboard",
            )
        try:
            yield
        finally:
            self._mutex.release()

    def break_lock(self, name: str) -> dict[str, Any]:
        """Drop the lease on ``name`` whoever holds it; logs who broke what."""
        self._require("locks")
        name = check_name(name)
        with self._acting():
            locks = self._locks_client()
            holder = locks.holder(name)
            dropped = locks.force_release(name)
        if dropped:
            was = (
                "held (holder unknown)"
                if holder is None
                else f"held by {holder.owner or '(unknown owner)'} token {holder.token}"
            )
            log.warning(
                "lock %r in namespace %r at %s broken from the dashboard by %s: it was %s",
                name,
                self.config.namespace,
                self.masked,
                who(),
                was,
            )
        return {
            "broken": dropped,
            "owner": None if holder is None else holder.owner,
            "token": None if holder is None else holder.token,
        }

    def forget(self, key: str) -> dict[str, Any]:
        """Delete the inbox record of ``key`` (a stuck claim, or a result not to replay)."""
        self._require("inbox")
        key = check_name(key, argument="key")
        with self._acting():
            forgotten = self._inbox_client().forget(key)
        if forgotten:
            log.warning(
                "inbox key %r of table %r at %s forgotten from the dashboard by %s",
                key,
                self.config.inbox_table,
                self.masked,
                who(),
            )
        return {"forgotten": forgotten}

    def purge_inbox(self) -> dict[str, Any]:
        """Delete the inbox's expired records (:meth:`Inbox.purge`)."""
        self._require("inbox")
        with self._acting():
            purged = self._inbox_client().purge()
        log.warning(
            "inbox table %r at %s purged from the dashboard by %s: %d expired record(s) deleted",
            self.config.inbox_table,
            self.masked,
            who(),
            purged,
        )
        return {"purged": purged}

    def requeue(self, queue: str, ids: list[str] | None) -> dict[str, Any]:
        """Publish the dead letters of ``queue`` again: all, or those of ``ids``."""
        self._require("queue")
        if queue not in self.config.queues and queue not in self._found:
            raise ConfigurationError(
                f"queue {queue!r} is not one the dashboard shows", argument="queue"
            )
        with self._acting():
            count = self._queue_client(queue).requeue_dead(ids)
        log.warning(
            "%s dead letter(s) of queue %r at %s requeued from the dashboard by %s: %d requeued",
            "all" if ids is None else f"{len(ids)}",
            queue,
            self.masked,
            who(),
            count,
        )
        return {"requeued": count}

    def close(self) -> None:
        """Close the clients (without waiting more than ANSWER_TIMEOUT for a call that
        hangs)."""
        held = self._mutex.acquire(timeout=ANSWER_TIMEOUT)
        try:
            clients: list[Any] = [self._locks, self._inbox, *self._queues.values()]
            self._locks, self._inbox, self._queues = None, None, {}
        finally:
            if held:
                self._mutex.release()
        for client in clients:
            if client is not None:
                try:
                    client.close()
                except Exception as exc:
                    log.debug("closing a dashboard client failed: %r", exc)


class Dashboard:
    """The targets of a :class:`DashboardConfig`, read together, and the ``schedulers``
    (label -> ``Scheduler`` / ``AsyncScheduler``, e.g. ``{"app.schedules:sched": sched}``)
    whose schedules the page shows; :meth:`close` closes those schedulers too."""

    def __init__(
        self,
        config: DashboardConfig,
        schedulers: Mapping[str, Scheduler | AsyncScheduler] | None = None,
    ) -> None:
        self.config = config
        self.targets = [Target(i, url, config) for i, url in enumerate(config.urls)]
        self.outboxes = [
            OutboxSource(i, url, config.outbox_table, ANSWER_TIMEOUT)
            for i, url in enumerate(dict.fromkeys(config.outboxes))
        ]
        self.schedulers: list[SchedulerSource] = []
        try:
            for i, (label, scheduler) in enumerate((schedulers or {}).items()):
                self.schedulers.append(SchedulerSource(i, label, scheduler, ANSWER_TIMEOUT))
        except BaseException:
            for made in self.schedulers:  # the loops started for the ones before
                made.stop_loop()
            raise
        # one worker per URL, per scheduler and per outbox: each has at most one gathering
        # running (its ``pending``)
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, len(self.targets) + len(self.schedulers) + len(self.outboxes)),
            thread_name_prefix="jobfence-dashboard",
        )
        self._submitting = threading.Lock()

    def check(self) -> None:
        """Open every client once (see :meth:`Target.check`); ``ConfigurationError`` on bad
        options, closing what was opened."""
        try:
            for target in self.targets:
                target.check()
            for outbox in self.outboxes:
                outbox.check()
        except BaseException:
            self.close()
            raise

    def target(self, index: object) -> Target:
        """The target numbered ``index`` (as ``"id"`` in :meth:`state`)."""
        return self.targets[_index(index, len(self.targets), "target")]

    def scheduler(self, index: object) -> SchedulerSource:
        """The scheduler numbered ``index`` (as ``"id"`` in the state's ``"schedulers"``)."""
        if not self.schedulers:
            raise ConfigurationError(
                "the dashboard shows no scheduler (start it with --scheduler MODULE:OBJ)",
                argument="scheduler",
            )
        return self.schedulers[_index(index, len(self.schedulers), "scheduler")]

    def outbox(self, index: object) -> OutboxSource:
        """The outbox numbered ``index`` (as ``"id"`` in the state's ``"outboxes"``)."""
        if not self.outboxes:
            raise ConfigurationError(
                "the dashboard shows no outbox (start it with --outbox URL)", argument="outbox"
            )
        return self.outboxes[_index(index, len(self.outboxes), "outbox")]

    def mask(self, exc: BaseException, *, typed: bool = True) -> str:
        """The text of ``exc`` (:func:`masked_error`) with every URL the dashboard knows
        masked."""
        urls = [
            *self.config.urls,
            *self.config.outboxes,
            *(s.url for s in self.schedulers if s.url),
        ]
        return masked_error(exc, urls, typed=typed)

    def state(self) -> dict[str, Any]:
        """Every target's and scheduler's state, gathered in parallel: a slow backend delays
        the answer by its own time only, not the sum, and one that does not answer within
        ANSWER_TIMEOUT is reported as such (its gathering goes on; the next call waits for
        it rather than start another)."""
        sources: list[Target | SchedulerSource | OutboxSource] = [
            *self.targets,
            *self.schedulers,
            *self.outboxes,
        ]
        with self._submitting:
            futures = []
            for source in sources:
                if source.pending is None or source.pending.done():
                    if isinstance(source, Target):
                        source.pending = self._pool.submit(source.state)
                    else:
                        source.pending = self._pool.submit(source.state, self.mask)
                futures.append(source.pending)
        wait_for(futures, timeout=ANSWER_TIMEOUT)
        states = [
            future.result() if future.done() else source.not_answering(ANSWER_TIMEOUT)
            for source, future in zip(sources, futures, strict=True)
        ]
        first_outbox = len(self.targets) + len(self.schedulers)
        return {
            "generated_at": time.time(),
            "targets": states[: len(self.targets)],
            "schedulers": states[len(self.targets) : first_outbox],
            "outboxes": states[first_outbox:],
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for target in self.targets:
            target.close()
        for source in self.schedulers:
            source.close()
        for outbox in self.outboxes:
            outbox.close()


def _index(index: object, count: int, argument: str) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigurationError(
            f"{argument} must be an int, got {type(index).__name__}", argument=argument
        )
    if not 0 <= index < count:
        raise ConfigurationError(
            f"{argument} must be from 0 to {count - 1}, got {index}", argument=argument
        )
    return index
