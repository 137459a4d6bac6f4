"""The dashboard's outbox panel: what a transactional outbox holds (counts by state, the age
of its oldest unpublished row, the unpublished rows by queue, the dead rows with their error
and attempts), and putting dead rows back (:meth:`OutboxSource.retry`).

Each outbox URL is an :class:`OutboxSource` with its own :class:`~jobfence.Outbox` client,
opened when first needed (a database that is down when the dashboard starts is retried at the
next refresh) and used one call at a time (one mutex each, like a backend URL's
:class:`~jobfence.dashboard.state.Target`), so a slow database holds up its own panel only.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._core.clock import get_clock
from .._core.url import mask_url
from ..errors import BackendError, ConfigurationError, JobfenceError
from .schedules import who

if TYPE_CHECKING:
    from ..backends.base import OutboxEntry

__all__ = ["DEAD_READ", "DEAD_SHOWN", "QUEUE_READ", "OutboxSource", "check_ids"]

log = logging.getLogger("jobfence.cli")

#: the most unpublished rows (per state) read at each refresh to count them by queue
QUEUE_READ = 5000
#: the most dead rows read at each refresh; the newest DEAD_SHOWN of them are listed
DEAD_READ = 1000
DEAD_SHOWN = 50
#: the most characters of a dead row's error sent to the page
ERROR_SHOWN = 2000


def check_ids(ids: object) -> list[str] | None:
    """The ``ids`` of a retry: a non-empty list of non-empty strings, or None for every dead
    row; ConfigurationError otherwise."""
    if ids is None:
        return None
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) and i for i in ids)):
        raise ConfigurationError(
            "ids must be a non-empty list of message ids, or null for every dead row",
            argument="ids",
        )
    return list(dict.fromkeys(ids))


class OutboxSource:
    """One outbox of the dashboard: the table ``table`` at ``url``, shown as number
    ``index``. The dashboard closes it when it closes."""

    def __init__(self, index: int, url: str, table: str, timeout: float) -> None:
        self.index = index
        self.url = url
        self.table = table
        self.timeout = timeout
        self.masked = mask_url(url)
        self._mutex = threading.Lock()
        self._outbox: Any = None
        #: the gathering of this outbox's state still running, if any (one at a time)
        self.pending: Future[dict[str, Any]] | None = None

    def _client(self) -> Any:
        if self._outbox is None:
            from .. import Outbox

            self._outbox = Outbox(self.url, table=self.table)
        return self._outbox

    def check(self) -> None:
        """Open the client once, so that a bad URL or table is found at start; a database
        that is down is not an error here."""
        with self._mutex:
            try:
                self._client()
            except ConfigurationError as exc:
                option = "--outbox-table" if exc.argument == "table" else "--outbox"
                raise ConfigurationError(
                    f"{option}: outbox {self.table!r} at {self.masked}: {exc}",
                    argument="outbox_table" if exc.argument == "table" else "outboxes",
                ) from exc
            except JobfenceError:
                pass

    # -- reading ------------------------------------------------------------------------------

    def _head(self) -> dict[str, Any]:
        return {"id": self.index, "url": self.masked, "table": self.table}

    def not_answering(self, waited: float) -> dict[str, Any]:
        """The state of an outbox whose database has not answered within ``waited`` s."""
        return {
            **self._head(),
            "status": "error",
            "error": f"no answer from the database within {waited:g} s (still waiting)",
        }

    def state(self, mask: Callable[[BaseException], str]) -> dict[str, Any]:
        """Counts by state, the oldest unpublished row's age, unpublished rows by queue and
        the newest dead rows. A failure is the panel's ``error`` (text from ``mask``)."""
        with self._mutex:
            try:
                gathered = self._gather()
            except Exception as exc:  # shown on the page; the other panels go on
                return {**self._head(), "status": "error", "error": mask(exc)}
        return {**self._head(), "status": "ok", **gathered}

    def _gather(self) -> dict[str, Any]:
        outbox = self._client()
        stats = outbox.stats()
        pending: list[OutboxEntry] = outbox.entries(state="pending", limit=QUEUE_READ)
        claimed: list[OutboxEntry] = outbox.entries(state="claimed", limit=QUEUE_READ)
        dead: list[OutboxEntry] = (
            outbox.entries(state="dead", limit=DEAD_READ) if stats.dead else []
        )
        by_pending = Counter(e.queue for e in pending)
        by_claimed = Counter(e.queue for e in claimed)
        names = sorted(set(by_pending) | set(by_claimed))
        now = get_clock().time()
        newest = dead[::-1][:DEAD_SHOWN]
        return {
            "counts": {
                "pending": stats.pending,
                "claimed": stats.claimed,
                "published": stats.published,
                "dead": stats.dead,
            },
            "oldest_pending": (
                None if stats.oldest_pending is None else round(stats.oldest_pending, 3)
            ),
            "queues": [
                {"name": name, "pending": by_pending[name], "claimed": by_claimed[name]}
                for name in names
            ],
            "queues_truncated": len(pending) >= QUEUE_READ or len(claimed) >= QUEUE_READ,
            "dead": [
                {
                    "seq": e.seq,
                    "id": e.id,
                    "queue": e.queue,
                    "key": e.key,
                    "attempts": e.attempts,
                    "error": None if e.last_error is None else e.last_error[:ERROR_SHOWN],
                    "age": round(now - e.created_at, 3),
                }
                for e in newest
            ],
            "dead_truncated": len(dead) >= DEAD_READ or len(newest) < stats.dead,
        }

    # -- actions ------------------------------------------------------------------------------

    @contextmanager
    def _acting(self) -> Iterator[None]:
        """Hold the mutex for an action; BackendError when the calls before it hang longer
        than the dashboard's answer timeout."""
        if not self._mutex.acquire(timeout=self.timeout):
            raise BackendError(
                f"outbox {self.table} at {self.masked}: the database has not answered the "
                f"previous call within {self.timeout:g} s",
                backend="outbox",
                operation="dashboard",
            )
        try:
            yield
        finally:
            self._mutex.release()

    def retry(self, ids: object) -> dict[str, Any]:
        """Make the dead rows ``ids`` (every dead row when None) pending again, their
        attempts reset (:meth:`Outbox.retry_dead`); logs who did it."""
        wanted = check_ids(ids)
        with self._acting():
            count = int(self._client().retry_dead(wanted))
        log.warning(
            "outbox %s at %s: %s retried from the dashboard by %s: %d made pending",
            self.table,
            self.masked,
            "every dead row" if wanted is None else "dead row(s) " + ", ".join(map(repr, wanted)),
            who(),
            count,
        )
        return {"retried": count}

    def close(self) -> None:
        """Close the client (without waiting more than the answer timeout for a call that
        hangs)."""
        held = self._mutex.acquire(timeout=self.timeout)
        try:
            outbox, self._outbox = self._outbox, None
        finally:
            if held:
                self._mutex.release()
        if outbox is not None:
            try:
                outbox.close()
            except Exception as exc:
                log.debug("closing a dashboard outbox client failed: %r", exc)
