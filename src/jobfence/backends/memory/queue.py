"""``memory://`` -- an in-process queue for tests and the testing toolkit.

Every verb runs under one mutex, so it is atomic like the server backends' scripts and
statements. Time comes from jobfence's clock (``get_clock()``), so a virtual clock drives
visibility, delays and waits. Sync and async clients of the same URL and queue name in one
process share a store; a publish wakes the receivers waiting on it at once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._core.clock import get_clock
from ..._core.options import reject_unknown
from ..._core.url import BackendURL
from ..._core.validate import check_queue_name
from ..base import (
    AsyncQueueBackend,
    DeadLetter,
    QueueBackend,
    QueueCapabilities,
    QueuedMessage,
    QueueStats,
    RenewItem,
)

__all__ = ["AsyncMemoryQueueBackend", "MemoryQueueBackend", "MemoryQueueStore"]


@dataclass
class _Message:
    seq: int
    id: str
    body: bytes
    headers: dict[str, str]
    published_at: float
    visible_at: float
    delivery: int = 0
    consumer: str | None = None
    receipt: str | None = None
    last_error: str | None = None
    dead_at: float | None = None  # set: a dead letter


class MemoryQueueStore:
    """The messages of one ``memory://`` URL and queue name."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.messages: dict[int, _Message] = {}  # by seq; dict order = publish order
        self._seq = itertools.count(1)
        self._wakers: dict[int, Callable[[], None]] = {}
        #: ids whose next ack is lost on the way: answered as done, the message stays in
        #: flight and is delivered again when its visibility passes (the testing toolkit's
        #: ``lost_ack`` fault)
        self.lose_acks: set[str] = set()
        #: when a list: the id of every message published, in publish order, repeats
        #: included (the testing toolkit turns it on for a schedule's queues, whose checks
        #: tell a message published twice)
        self.journal: list[str] | None = None

    # -- waiting -----------------------------------------------------------------------
    def add_waker(self, wake: Callable[[], None]) -> int:
        with self.mutex:
            self._wakers[id(wake)] = wake
            return id(wake)

    def remove_waker(self, ticket: int) -> None:
        with self.mutex:
            self._wakers.pop(ticket, None)

    def _wake_all(self) -> None:
        wakers = list(self._wakers.values())
        for wake in wakers:
            try:
                wake()
            except RuntimeError:  # its event loop is closed: nobody waits there any more
                pass

    # -- verbs -------------------------------------------------------------------------
    def publish(self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float) -> None:
        now = get_clock().time()
        with self.mutex:
            for msg_id, body, headers in messages:
                seq = next(self._seq)
                self.messages[seq] = _Message(seq, msg_id, body, dict(headers), now, now + delay)
                if self.journal is not None:
                    self.journal.append(msg_id)
        self._wake_all()

    def receive(
        self, consumer: str, max_messages: int, visibility: float
    ) -> tuple[list[QueuedMessage], float | None]:
        """Deliver what is deliverable now; also the time the next message becomes
        deliverable (``None``: nothing is waiting), to bound the caller's wait."""
        now = get_clock().time()
        out: list[QueuedMessage] = []
        next_due: float | None = None
        with self.mutex:
            candidates = sorted(
                (m for m in self.messages.values() if m.dead_at is None),
                key=lambda m: (m.visible_at, m.seq),
            )
            for msg in candidates:
                if msg.visible_at > now:
                    next_due = msg.visible_at if next_due is None else min(next_due, msg.visible_at)
                    continue
                if len(out) >= max_messages:
                    next_due = now
                    break
                msg.delivery += 1
                msg.consumer = consumer
                msg.receipt = f"{msg.seq}:{uuid.uuid4().hex}"
                msg.visible_at = now + visibility
                out.append(
                    QueuedMessage(
                        id=msg.id,
                        body=msg.body,
                        headers=dict(msg.headers),
                        delivery=msg.delivery,
                        receipt=msg.receipt,
                        published_at=msg.published_at,
                        last_error=msg.last_error,
                    )
                )
        return out, next_due

    def _held(self, receipt: str, consumer: str) -> _Message | None:
        """The message of ``receipt`` if that delivery is still ``consumer``'s (its
        visibility may have passed, as long as nobody received the message since)."""
        try:
            seq = int(receipt.split(":", 1)[0])
        except ValueError:
            return None
        msg = self.messages.get(seq)
        if msg is None or msg.dead_at is not None:
            return None
        if msg.receipt != receipt or msg.consumer != consumer:
            return None
        return msg

    def ack(self, receipt: str, consumer: str) -> bool:
        return self.ack_many([(receipt, consumer)])[0]

    def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        out: list[bool] = []
        with self.mutex:
            for receipt, consumer in items:
                msg = self._held(receipt, consumer)
                if msg is not None:
                    if msg.id in self.lose_acks:
                        self.lose_acks.discard(msg.id)
                    else:
                        del self.messages[msg.seq]
                out.append(msg is not None)
        return out

    def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        return self._give_back(receipt, consumer, delay, counted=True, error=error)

    def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """As :meth:`nack`, but this delivery is not counted and ``last_error`` is kept."""
        return self._give_back(receipt, consumer, delay, counted=False)

    def _give_back(
        self, receipt: str, consumer: str, delay: float, *, counted: bool, error: str | None = None
    ) -> bool:
        now = get_clock().time()
        with self.mutex:
            msg = self._held(receipt, consumer)
            if msg is None:
                return False
            msg.receipt = msg.consumer = None
            msg.visible_at = now + delay
            if counted:
                msg.last_error = error
            else:
                msg.delivery = max(0, msg.delivery - 1)
        self._wake_all()
        return True

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        now = get_clock().time()
        out: list[bool] = []
        with self.mutex:
            for receipt, consumer, visibility in items:
                msg = self._held(receipt, consumer)
                if msg is None or msg.visible_at <= now:
                    out.append(False)
                else:
                    msg.visible_at = now + visibility
                    out.append(True)
        return out

    def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        now = get_clock().time()
        with self.mutex:
            msg = self._held(receipt, consumer)
            if msg is None:
                return False
            msg.receipt = msg.consumer = None
            msg.last_error = error
            msg.dead_at = now
            return True

    def stats(self) -> QueueStats:
        now = get_clock().time()
        ready = delayed = in_flight = dead = 0
        with self.mutex:
            for msg in self.messages.values():
                if msg.dead_at is not None:
                    dead += 1
                elif msg.visible_at <= now:
                    ready += 1
                elif msg.receipt is not None:
                    in_flight += 1
                else:
                    delayed += 1
        return QueueStats(ready=ready, delayed=delayed, in_flight=in_flight, dead=dead)

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        with self.mutex:
            dead = sorted(
                (m for m in self.messages.values() if m.dead_at is not None),
                key=lambda m: (m.dead_at or 0.0, m.seq),
            )[:limit]
            return [
                DeadLetter(m.id, m.body, dict(m.headers), m.delivery, m.last_error, m.dead_at)
                for m in dead
            ]

    def requeue_dead(self, ids: Sequence[str] | None) -> int:
        now = get_clock().time()
        wanted = None if ids is None else set(ids)
        count = 0
        with self.mutex:
            for msg in self.messages.values():
                if msg.dead_at is not None and (wanted is None or msg.id in wanted):
                    msg.dead_at = None
                    msg.delivery = 0
                    msg.visible_at = now
                    count += 1
        if count:
            self._wake_all()
        return count

    def purge(self) -> int:
        with self.mutex:
            count = len(self.messages)
            self.messages.clear()
            return count


_stores: dict[str, MemoryQueueStore] = {}
_stores_mutex = threading.Lock()


def get_queue_store(url: BackendURL, name: str) -> MemoryQueueStore:
    key = f"{url.host or ''}{url.path}\x00{name}"
    with _stores_mutex:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = MemoryQueueStore()
        return store


def queue_names(url: BackendURL, limit: int) -> list[str]:
    """The names of the queues of ``url``'s store that hold messages, sorted."""
    head = f"{url.host or ''}{url.path}\x00"
    with _stores_mutex:
        stores = [(k[len(head) :], s) for k, s in _stores.items() if k.startswith(head)]
    return sorted(name for name, store in stores if store.messages)[:limit]


def _open_store(url: BackendURL, name: str, options: dict[str, Any]) -> MemoryQueueStore:
    reject_unknown(url.options, (), "memory queue URL")
    reject_unknown(options, (), "memory queue")
    return get_queue_store(url, check_queue_name(name))


def _drop(url: BackendURL, name: str) -> None:
    key = f"{url.host or ''}{url.path}\x00{name}"
    with _stores_mutex:
        store = _stores.pop(key, None)
    if store is not None:
        store.purge()


_CAPS = QueueCapabilities(cross_process=False, visibility_timeout=True, server_wakeup=True)


class MemoryQueueBackend(QueueBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, name: str, **options: Any) -> None:
        self.store = _open_store(url, name, options)
        self.name = name
        self._url = url

    def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        self.store.publish(messages, delay)

    def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        clock = get_clock()
        deadline = clock.monotonic() + wait
        while True:
            event = threading.Event()
            ticket = self.store.add_waker(event.set)
            try:
                got, next_due = self.store.receive(consumer, max_messages, visibility)
                left = deadline - clock.monotonic()
                if got or left <= 0:
                    return got
                if next_due is not None:
                    left = min(left, max(next_due - clock.time(), 0.0))
                clock.wait(event, left)
            finally:
                self.store.remove_waker(ticket)

    def ack(self, receipt: str, consumer: str) -> bool:
        return self.store.ack(receipt, consumer)

    def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        return self.store.ack_many(items)

    def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        return self.store.nack(receipt, consumer, delay, error)

    def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        return self.store.defer(receipt, consumer, delay)

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return self.store.renew(items)

    def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        return self.store.dead_letter(receipt, consumer, error)

    def stats(self) -> QueueStats:
        return self.store.stats()

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        return self.store.dead_letters(limit)

    def names(self, limit: int) -> list[str]:
        return queue_names(self._url, limit)

    def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        return self.store.requeue_dead(ids)

    def purge(self) -> int:
        return self.store.purge()

    def drop(self) -> None:
        _drop(self._url, self.name)
        self.store = get_queue_store(self._url, self.name)

    def close(self) -> None:
        pass


class AsyncMemoryQueueBackend(AsyncQueueBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, name: str, **options: Any) -> None:
        self.store = _open_store(url, name, options)
        self.name = name
        self._url = url

    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        self.store.publish(messages, delay)

    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        clock = get_clock()
        loop = asyncio.get_running_loop()
        deadline = clock.monotonic() + wait
        while True:
            event = asyncio.Event()

            def wake(event: asyncio.Event = event) -> None:
                loop.call_soon_threadsafe(event.set)

            ticket = self.store.add_waker(wake)
            try:
                got, next_due = self.store.receive(consumer, max_messages, visibility)
                left = deadline - clock.monotonic()
                if got or left <= 0:
                    return got
                if next_due is not None:
                    left = min(left, max(next_due - clock.time(), 0.0))
                await clock.wait_async(event, left)
            finally:
                self.store.remove_waker(ticket)

    async def ack(self, receipt: str, consumer: str) -> bool:
        return self.store.ack(receipt, consumer)

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        return self.store.ack_many(items)

    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        return self.store.nack(receipt, consumer, delay, error)

    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        return self.store.defer(receipt, consumer, delay)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return self.store.renew(items)

    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        return self.store.dead_letter(receipt, consumer, error)

    async def stats(self) -> QueueStats:
        return self.store.stats()

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        return self.store.dead_letters(limit)

    async def names(self, limit: int) -> list[str]:
        return queue_names(self._url, limit)

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        return self.store.requeue_dead(ids)

    async def purge(self) -> int:
        return self.store.purge()

    async def drop(self) -> None:
        _drop(self._url, self.name)
        self.store = get_queue_store(self._url, self.name)

    async def close(self) -> None:
        pass
