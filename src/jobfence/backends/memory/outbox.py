"""``memory://`` -- an in-process outbox table for the testing toolkit.

An outbox lives in the caller's database: rows are added inside the caller's transaction and
commit or roll back with it. In memory, that transaction is a simulated one
(``jobfence.testing``: ``sim.table(...).transaction()``), which hands its rows to
:meth:`MemoryOutboxStore.add` when it commits, and never if it rolls back. The relays read
them through :class:`AsyncMemoryOutboxBackend` (or the blocking :class:`MemoryOutboxBackend`)
with the semantics of the SQL backends:

* :meth:`~MemoryOutboxStore.claim` holds up to ``limit`` rows in ``seq`` order for ``lease``
  seconds, skipping every row behind an earlier row of its ``key`` that is neither published
  nor dead nor taken by this same claim; every verb runs under one mutex, so claims are
  serialised as the SQL backends serialise them (two relays never hold one row, never split
  a key's run);
* the settling verbs (``failed``, ``release``, ``extend``) only touch rows the calling relay
  still holds; ``published`` also marks a row whose hold ran out while it was being sent,
  unless another relay claimed it since;
* time is the server's: ``get_clock().time()``, so a simulation's virtual clock runs the
  leases out and a test's ``ManualClock`` does too.

Stores are per URL and table, shared by the sync and async backends of one process, and a
commit wakes the relays waiting in :meth:`AsyncMemoryOutboxBackend.wait` at once
(``server_wakeup``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._core.clock import get_clock
from ..._core.options import reject_unknown
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ...errors import ConfigurationError
from ..base import (
    AsyncOutboxBackend,
    OutboxBackend,
    OutboxCapabilities,
    OutboxEntry,
    OutboxRow,
    OutboxStats,
)
from . import TABLE_LIMIT

__all__ = [
    "DEFAULT_TABLE",
    "AsyncMemoryOutboxBackend",
    "MemoryOutboxBackend",
    "MemoryOutboxStore",
    "get_outbox_store",
]

#: the outbox table's name unless told (as ``jobfence.Outbox``'s)
DEFAULT_TABLE = "jobfence_outbox"
STATES = ("pending", "claimed", "published", "dead")


@dataclass
class _Row:
    seq: int
    id: str
    queue: str
    key: str | None
    body: bytes
    headers: dict[str, str]
    created_at: float
    available_at: float
    attempts: int = 0
    claimed_by: str | None = None
    claimed_until: float | None = None
    published_at: float | None = None
    dead: bool = False
    last_error: str | None = None

    def claimed_last_by(self, relay: str) -> bool:
        """``relay`` claimed the row last and has not settled it (its hold may have run out,
        as long as nobody claimed the row since)."""
        return (
            self.claimed_by == relay
            and self.claimed_until is not None
            and self.published_at is None
            and not self.dead
        )

    def held_by(self, relay: str, now: float) -> bool:
        """``relay`` holds the row now: it claimed it last and its hold has not run out."""
        return (
            self.claimed_last_by(relay)
            and self.claimed_until is not None
            and self.claimed_until > now
        )

    def state(self, now: float) -> str:
        if self.published_at is not None:
            return "published"
        if self.dead:
            return "dead"
        if self.claimed_until is not None and self.claimed_until > now:
            return "claimed"
        return "pending"


@dataclass
class MemoryOutboxStore:
    """The rows of one ``memory://`` URL and outbox table."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    rows: dict[int, _Row] = field(default_factory=dict)  # by seq; dict order = seq order
    ids: dict[str, int] = field(default_factory=dict)  # id -> seq, while the row is kept
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _wakers: dict[int, Callable[[], None]] = field(default_factory=dict)
    #: counts the wake-ups: a relay that saw another value before it waits returns at once
    version: int = 0

    # -- adding (a committed transaction) ------------------------------------------------
    def add(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Insert ``rows`` (dicts of ``id``, ``queue``, ``key``, ``body`` bytes,
        ``headers``, ``delay``) as one committed transaction does; an id the table holds
        already (pending, dead or a retained published row) is not added again, as ``ON
        CONFLICT DO NOTHING`` does. Returns the ids added."""
        now = get_clock().time()
        added: list[str] = []
        with self.mutex:
            for row in rows:
                msg_id = str(row["id"])
                if msg_id in self.ids:
                    continue
                seq = next(self._seq)
                self.rows[seq] = _Row(
                    seq=seq,
                    id=msg_id,
                    queue=str(row["queue"]),
                    key=row.get("key"),
                    body=bytes(row["body"]),
                    headers=dict(row.get("headers") or {}),
                    created_at=now,
                    available_at=now + float(row.get("delay") or 0.0),
                )
                self.ids[msg_id] = seq
                added.append(msg_id)
        if added:
            self._wake_all()
        return added

    # -- waiting -----------------------------------------------------------------------
    def add_waker(self, wake: Callable[[], None]) -> int:
        with self.mutex:
            self._wakers[id(wake)] = wake
            return id(wake)

    def remove_waker(self, ticket: int) -> None:
        with self.mutex:
            self._wakers.pop(ticket, None)

    def _wake_all(self) -> None:
        with self.mutex:
            self.version += 1
            wakers = list(self._wakers.values())
        for wake in wakers:
            try:
                wake()
            except RuntimeError:  # its event loop is closed: nobody waits there any more
                pass

    # -- the relay's verbs ---------------------------------------------------------------
    def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None
    ) -> list[OutboxRow]:
        now = get_clock().time()
        wanted = None if queues is None else set(queues)
        out: list[OutboxRow] = []
        blocked: set[str] = set()  # keys with an earlier row neither settled nor taken here
        with self.mutex:
            for row in self.rows.values():
                if len(out) >= limit:
                    break
                if row.dead or row.published_at is not None:
                    continue
                free = (
                    row.key not in blocked
                    and (row.claimed_until is None or row.claimed_until <= now)
                    and row.available_at <= now
                    and (wanted is None or row.queue in wanted)
                )
                if not free:
                    if row.key is not None:
                        blocked.add(row.key)
                    continue
                row.claimed_by = relay
                row.claimed_until = now + lease
                out.append(
                    OutboxRow(
                        seq=row.seq,
                        id=row.id,
                        queue=row.queue,
                        key=row.key,
                        body=row.body,
                        headers=dict(row.headers),
                        attempts=row.attempts,
                        created_at=row.created_at,
                    )
                )
        return out

    def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        now = get_clock().time()
        done = 0
        with self.mutex:
            for seq in dict.fromkeys(seqs):  # a seq given twice is one row, as in SQL
                row = self.rows.get(seq)
                if row is None or not row.claimed_last_by(relay):  # sent: a hold that ran
                    continue  # out counts, unless another relay claimed the row since
                done += 1
                if retention <= 0:
                    del self.rows[seq]
                    self.ids.pop(row.id, None)
                    continue
                row.published_at = now
                row.claimed_until = None
        return done

    def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        now = get_clock().time()
        with self.mutex:
            row = self.rows.get(seq)
            if row is None or not row.held_by(relay, now):
                return False
            row.attempts += 1
            row.last_error = error
            row.claimed_by = row.claimed_until = None
            if retry_in is None:
                row.dead = True
            else:
                row.available_at = now + retry_in
            return True

    def release(self, relay: str, seqs: Sequence[int], retry_in: float) -> int:
        now = get_clock().time()
        done = 0
        with self.mutex:
            for seq in dict.fromkeys(seqs):  # a seq given twice is one row, as in SQL
                row = self.rows.get(seq)
                if row is None or not row.held_by(relay, now):
                    continue
                row.claimed_by = row.claimed_until = None
                row.available_at = now + retry_in
                done += 1
        if done:
            self._wake_all()
        return done

    def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        now = get_clock().time()
        done = 0
        with self.mutex:
            for seq in dict.fromkeys(seqs):  # a seq given twice is one row, as in SQL
                row = self.rows.get(seq)
                if row is not None and row.held_by(relay, now):
                    row.claimed_until = now + lease
                    done += 1
        return done

    # -- the admin views -----------------------------------------------------------------
    def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None
    ) -> list[OutboxEntry]:
        now = get_clock().time()
        out: list[OutboxEntry] = []
        with self.mutex:
            for row in self.rows.values():
                if len(out) >= limit:
                    break
                if after is not None and row.seq <= after:
                    continue
                current = row.state(now)
                if (state is not None and current != state) or (
                    queue is not None and row.queue != queue
                ):
                    continue
                out.append(
                    OutboxEntry(
                        seq=row.seq,
                        id=row.id,
                        queue=row.queue,
                        key=row.key,
                        state=current,
                        attempts=row.attempts,
                        created_at=row.created_at,
                        available_at=row.available_at,
                        claimed_by=row.claimed_by,
                        claimed_until=row.claimed_until,
                        published_at=row.published_at,
                        last_error=row.last_error,
                        body=row.body,
                        headers=dict(row.headers),
                    )
                )
        return out

    def stats(self) -> OutboxStats:
        now = get_clock().time()
        counts = dict.fromkeys(STATES, 0)
        oldest: float | None = None
        with self.mutex:
            for row in self.rows.values():
                current = row.state(now)
                counts[current] += 1
                if current in ("pending", "claimed"):
                    oldest = row.created_at if oldest is None else min(oldest, row.created_at)
        return OutboxStats(
            pending=counts["pending"],
            claimed=counts["claimed"],
            published=counts["published"],
            dead=counts["dead"],
            oldest_pending=None if oldest is None else max(now - oldest, 0.0),
        )

    def retry_dead(self, ids: Sequence[str] | None) -> int:
        now = get_clock().time()
        chosen = None if ids is None else set(ids)
        done = 0
        with self.mutex:
            for row in self.rows.values():
                if row.dead and (chosen is None or row.id in chosen):
                    row.dead = False
                    row.attempts = 0  # last_error kept
                    row.available_at = now
                    row.claimed_by = row.claimed_until = None
                    done += 1
        if done:
            self._wake_all()
        return done

    def purge(self, retention: float) -> int:
        now = get_clock().time()
        with self.mutex:
            old = [
                row
                for row in self.rows.values()
                if row.published_at is not None and row.published_at <= now - retention
            ]
            for row in old:
                del self.rows[row.seq]
                self.ids.pop(row.id, None)
        return len(old)

    def drop(self) -> None:
        with self.mutex:
            self.rows.clear()
            self.ids.clear()


_stores: dict[str, MemoryOutboxStore] = {}
_stores_mutex = threading.Lock()


def _store_key(url: BackendURL, table: str) -> str:
    return f"{url.host or ''}{url.path}\x00{table}"


def get_outbox_store(url: BackendURL, table: str = DEFAULT_TABLE) -> MemoryOutboxStore:
    """The store of the outbox ``table`` of ``url`` (a ``memory://`` URL), created empty on
    first use."""
    key = _store_key(url, table)
    with _stores_mutex:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = MemoryOutboxStore()
        return store


#: options every outbox backend accepts; the memory one has no server to use them on
_OPTIONS = ("pool_size", "connect_timeout", "timeout", "client", "retention")


def _open_store(
    url: BackendURL, table: str, options: Mapping[str, Any]
) -> tuple[str, MemoryOutboxStore]:
    reject_unknown(url.options, ("table",), "memory outbox URL")
    reject_unknown(options, _OPTIONS, "memory outbox")
    if options.get("client") is not None:
        raise ConfigurationError(
            "client: the memory outbox has no connection pool to take", argument="client"
        )
    name = check_namespace(
        url.options.get("table", table), limit=TABLE_LIMIT, backend="memory", argument="table"
    )
    return name, get_outbox_store(url, name)


def _check_state(state: str | None) -> None:
    if state is not None and state not in STATES:
        raise ConfigurationError(
            f"state must be None or one of {', '.join(STATES)}, got {state!r}", argument="state"
        )


_CAPS = OutboxCapabilities(server_wakeup=True)


class AsyncMemoryOutboxBackend(AsyncOutboxBackend):
    """The relay's side of a ``memory://`` outbox table (see the module docs)."""

    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        self.table, self.store = _open_store(url, table, options)
        self._url = url
        #: the store's wake-up count when this relay last looked (its claim, its wait)
        self._seen = self.store.version

    async def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        self._seen = self.store.version  # rows added from here on wake the next wait()
        return self.store.claim(relay, limit, lease, queues)

    async def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        return self.store.published(relay, seqs, retention)

    async def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        return self.store.failed(relay, seq, error, retry_in)

    async def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        return self.store.release(relay, seqs, retry_in)

    async def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        return self.store.extend(relay, seqs, lease)

    async def wait(self, timeout: float) -> bool:
        """Wait until a transaction adds rows (or a relay gives rows back), at most
        ``timeout`` seconds of jobfence's clock; True if woken."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(event.set)

        ticket = self.store.add_waker(wake)
        try:
            if self.store.version == self._seen:  # nothing added since this relay looked
                await get_clock().wait_async(event, max(timeout, 0.0))
            else:
                event.set()
        finally:
            self.store.remove_waker(ticket)
            self._seen = self.store.version
        return event.is_set()

    async def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]:
        _check_state(state)
        return self.store.entries(state, queue, limit, after)

    async def stats(self) -> OutboxStats:
        return self.store.stats()

    async def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        return self.store.retry_dead(ids)

    async def purge(self, retention: float) -> int:
        return self.store.purge(retention)

    async def install(self) -> None:
        pass  # the store exists from the first use of its URL and table

    async def drop(self) -> None:
        self.store.drop()

    async def close(self) -> None:
        pass


class MemoryOutboxBackend(OutboxBackend):
    """The blocking twin of :class:`AsyncMemoryOutboxBackend` (the same store)."""

    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        self.table, self.store = _open_store(url, table, options)
        self._url = url
        self._seen = self.store.version

    def claim(
        self, relay: str, limit: int, lease: float, queues: Sequence[str] | None = None
    ) -> list[OutboxRow]:
        self._seen = self.store.version
        return self.store.claim(relay, limit, lease, queues)

    def published(self, relay: str, seqs: Sequence[int], retention: float) -> int:
        return self.store.published(relay, seqs, retention)

    def failed(self, relay: str, seq: int, error: str, retry_in: float | None) -> bool:
        return self.store.failed(relay, seq, error, retry_in)

    def release(self, relay: str, seqs: Sequence[int], retry_in: float = 0.0) -> int:
        return self.store.release(relay, seqs, retry_in)

    def extend(self, relay: str, seqs: Sequence[int], lease: float) -> int:
        return self.store.extend(relay, seqs, lease)

    def wait(self, timeout: float) -> bool:
        """Wait until a transaction adds rows, at most ``timeout`` seconds; True if woken."""
        event = threading.Event()
        ticket = self.store.add_waker(event.set)
        try:
            if self.store.version == self._seen:
                get_clock().wait(event, max(timeout, 0.0))
            else:
                event.set()
        finally:
            self.store.remove_waker(ticket)
            self._seen = self.store.version
        return event.is_set()

    def entries(
        self, state: str | None, queue: str | None, limit: int, after: int | None = None
    ) -> list[OutboxEntry]:
        _check_state(state)
        return self.store.entries(state, queue, limit, after)

    def stats(self) -> OutboxStats:
        return self.store.stats()

    def retry_dead(self, ids: Sequence[str] | None = None) -> int:
        return self.store.retry_dead(ids)

    def purge(self, retention: float) -> int:
        return self.store.purge(retention)

    def install(self) -> None:
        pass

    def drop(self) -> None:
        self.store.drop()

    def close(self) -> None:
        pass
