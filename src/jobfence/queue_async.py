"""Queues: publish, receive, ack, nack with a delay, renew a delivery, dead letters.

``AsyncQueue``/``AsyncMessage`` live in ``queue_async.py``; ``Queue``/``Message`` in
``queue.py``, generated from it. The backend is chosen by URL: Redis Streams (``redis://``),
a PostgreSQL table (``postgresql://``), a SQLite table (``sqlite:///file.db``), RabbitMQ
(``amqp://``) or in-process (``memory://``).

Delivery is at least once on every backend: a message is delivered until it is acked, and a
delivery that is neither acked nor renewed within its ``visibility`` is delivered again
(RabbitMQ: when its consumer's connection closes). The message ``id`` given at publish time
is the same on every delivery: it is what :func:`jobfence.guarded` and ``Inbox.claim_in`` key
on by default inside a :class:`~jobfence.Worker`'s handler, so a redelivery is a duplicate.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from . import telemetry
from ._core import forks
from ._core.clock import get_clock
from ._core.flavour import ASYNC
from ._core.hooks import ahook, get_hook
from ._core.inbox_support import Serializer, check_serializer
from ._core.lease_state import LeaseState
from ._core.renewable import Renewable, RenewableHandle
from ._core.renewer_async import AsyncRenewer
from ._core.validate import check_name, check_queue_name, check_ttl
from .backends import open_queue_backend
from .backends.base import AsyncQueueBackend, DeadLetter, QueuedMessage, QueueStats
from .backends.clients import Client, describe_target
from .errors import BackendError, ConfigurationError, JobfenceError, MessageLost

if ASYNC:
    from ._core.groupcommit import GroupCommit

__all__ = ["DEFAULT_QUEUE_URL", "DEFAULT_VISIBILITY", "AsyncMessage", "AsyncQueue"]

log = logging.getLogger("jobfence.queue")

T = TypeVar("T")

#: the embedded default queue, used when no URL is given and JOBFENCE_URL is not set
DEFAULT_QUEUE_URL = "sqlite:///jobfence.db"
#: seconds a delivery stays hidden from other consumers unless acked or renewed
DEFAULT_VISIBILITY = 30.0
#: the most messages one receive may ask for
MAX_RECEIVE = 1000
#: the most header entries, and bytes of one header name or value
MAX_HEADERS = 64
MAX_HEADER_BYTES = 4096

_HOST = socket.gethostname()[:64]


def _new_consumer() -> str:
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex}"


def _check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigurationError(
            f"headers must be a mapping of str to str, got {type(headers).__name__}",
            argument="headers",
        )
    if len(headers) > MAX_HEADERS:
        raise ConfigurationError(
            f"headers may have at most {MAX_HEADERS} entries, got {len(headers)}",
            argument="headers",
        )
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name:
            raise ConfigurationError(
                f"headers must map non-empty str names to str values, got {name!r}: {value!r}",
                argument="headers",
            )
        if max(len(name.encode("utf-8", "replace")), len(value.encode("utf-8", "replace"))) > (
            MAX_HEADER_BYTES
        ):
            raise ConfigurationError(
                f"header {name!r}: names and values may have at most {MAX_HEADER_BYTES} bytes",
                argument="headers",
            )
        out[name] = value
    return out


#: uuid4's version (4) and variant (RFC 4122) bits, and the mask of the bits they replace
_UUID4_BITS = (0x4000 << 64) | (0x8000 << 48)
_UUID4_MASK = ((1 << 128) - 1) ^ ((0xF000 << 64) | (0xC000 << 48))


def _new_id() -> str:
    """A new random message id: ``uuid.uuid4().hex`` without building a ``UUID``."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _UUID4_MASK | _UUID4_BITS:032x}"


def _check_delay(delay: object, argument: str = "delay") -> float:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (0 <= delay < 1e9):
        raise ConfigurationError(
            f"{argument} must be a number of seconds >= 0, got {delay!r}", argument=argument
        )
    return float(delay)


class AsyncMessage:
    """One delivery of a message, from :meth:`AsyncQueue.receive` / :meth:`Queue.receive`.

    * ``id`` -- the message id (the same on every delivery of the message);
    * ``body`` -- the decoded body (JSON by default), ``raw`` the bytes as stored;
    * ``delivery`` -- 1 for the first delivery, 2, 3... for redeliveries;
    * ``headers`` (dict of str), ``queue`` (the queue's name), ``published_at`` (seconds since
      the epoch, where the backend records it), ``last_error`` (the error of the last nack).

    Finish each delivery with exactly one of :meth:`ack` (done: remove it), :meth:`nack` (give
    it back, redelivered after ``delay``), :meth:`defer` (give it back for later without
    counting the delivery: "not now") or :meth:`dead_letter`. A delivery received with
    ``renew=True`` is kept hidden by the queue's renewer until it is finished; if a renewal
    fails or its visibility passes first, it is *lost*: :attr:`lost` turns true,
    :meth:`on_lost` callbacks run, :meth:`check` raises :class:`MessageLost`, and
    :meth:`ack` raises :class:`MessageLost` (another consumer may have the message now).
    """

    def __init__(
        self,
        queue: AsyncQueue,
        raw: QueuedMessage,
        *,
        visibility: float,
        started: float,
        renew: bool,
    ) -> None:
        self._queue = queue
        self.id = raw.id
        self.raw = raw.body
        self.headers = raw.headers
        self.delivery = raw.delivery
        self.receipt = raw.receipt
        self.published_at = raw.published_at
        self.last_error = raw.last_error
        self.queue = queue.name
        self.visibility = visibility
        self._body: Any = _UNDECODED
        self._finished: str | None = None
        self._lost_reason: str | None = None
        self._callbacks: list[Callable[[AsyncMessage], Any]] = []
        self._mutex = threading.Lock()
        self._lease = RenewableHandle(
            self.receipt,
            queue.consumer,
            LeaseState(visibility, started, renews=renew),
            label=f"message {self.id!r} (delivery {self.delivery}) of queue {self.queue!r}",
            released=self._is_finished,
            lost=self._mark_lost,
        )

    def __repr__(self) -> str:
        state = self._finished or ("lost" if self._lost_reason else "held")
        return f"<{type(self).__name__} {self.queue}:{self.id!r} delivery={self.delivery} {state}>"

    @property
    def body(self) -> Any:
        """The body, decoded by the queue's serializer (JSON by default) on first use."""
        if self._body is _UNDECODED:
            try:
                self._body = self._queue.serializer.loads(self.raw)
            except Exception as exc:
                raise ConfigurationError(
                    f"message {self.id!r} of queue {self.queue!r}: its body cannot be decoded "
                    f"by the queue's serializer ({type(exc).__name__}: {exc}); read .raw",
                    argument="serializer",
                ) from exc
        return self._body

    @property
    def lost(self) -> bool:
        """Whether this delivery is known to be no longer this consumer's."""
        return self._lost_reason is not None

    @property
    def finished(self) -> str | None:
        """``"acked"``, ``"nacked"``, ``"deferred"`` or ``"dead"`` once finished, else
        ``None``."""
        return self._finished

    def check(self) -> None:
        """Raise :class:`MessageLost` if the delivery is lost."""
        if self._lost_reason is not None:
            raise MessageLost(
                f"message {self.id!r} (delivery {self.delivery}) of queue {self.queue!r} was "
                f"lost: {self._lost_reason}",
                queue=self.queue,
                message_id=self.id,
            )

    def on_lost(self, callback: Callable[[AsyncMessage], Any]) -> None:
        """Call ``callback(message)`` when the delivery is found lost (at once if it is)."""
        with self._mutex:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def _run_callback(self, callback: Callable[[AsyncMessage], Any]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("on_lost callback of message %r raised", self.id)

    @property
    def renewal(self) -> Renewable:
        """Internal (used by its queue): what the queue's renewer renews for this delivery."""
        return self._lease

    def _is_finished(self) -> bool:
        return self._finished is not None

    def _mark_lost(self, reason: str) -> None:
        with self._mutex:
            if self._lost_reason is not None or self._finished is not None:
                return
            self._lost_reason = reason
            callbacks, self._callbacks = self._callbacks, []
        kind = self._queue.backend.kind
        telemetry.lost("queue", kind)
        log.warning(
            "message %r (delivery %s) of queue %r lost: %s",
            self.id,
            self.delivery,
            self.queue,
            reason,
            extra={"jobfence.message.id": self.id, "jobfence.backend": kind},
        )
        for callback in callbacks:
            self._run_callback(callback)

    def _start_finishing(self) -> None:
        if self._finished is not None:
            raise ConfigurationError(
                f"message {self.id!r} was already {self._finished}", argument="self"
            )
        self._queue.stop_renewing(self._lease)

    def _finished_as(self, state: str, ok: bool) -> bool:
        if ok:
            self._finished = state
        else:
            self._mark_lost("the backend no longer holds this delivery for this consumer")
        return ok

    async def ack(self) -> None:
        """Remove the message: it was processed. Raises :class:`MessageLost` if the delivery
        is no longer this consumer's (it may be delivered again, or be with another consumer
        now)."""
        self._start_finishing()
        ok = await self._queue.ack_message(self)
        if not self._finished_as("acked", ok):
            self.check()

    async def nack(self, delay: float = 0.0, error: str | BaseException | None = None) -> bool:
        """Give the message back: delivered again after ``delay`` seconds (``0``: at once),
        with ``error`` recorded as its ``last_error``. Returns False if the delivery was no
        longer this consumer's (then it comes back by itself)."""
        delay = _check_delay(delay)
        text = _error_text(error)
        self._start_finishing()
        q = self._queue
        ok = await q.message_call(
            "queue.nack", self, q.backend.nack, self.receipt, q.consumer, delay, text
        )
        return self._finished_as("nacked", ok)

    async def defer(self, delay: float = 0.0) -> bool:
        """Give the message back for later WITHOUT using up a delivery: it is delivered again
        after ``delay`` seconds with the same :attr:`delivery` number as now, and its
        ``last_error`` unchanged. For a handler that was refused for "not now"
        (:class:`~jobfence.errors.NotNow`: another worker holds its claim or lease), which is
        not a failure of the message; a :class:`~jobfence.Worker` does this by itself.
        Returns False if the delivery was no longer this consumer's (then it comes back by
        itself, counted)."""
        delay = _check_delay(delay)
        self._start_finishing()
        q = self._queue
        ok = await q.message_call(
            "queue.defer", self, q.backend.defer, self.receipt, q.consumer, delay
        )
        return self._finished_as("deferred", ok)

    async def dead_letter(self, error: str | BaseException | None = None) -> bool:
        """Move the message to the queue's dead letters, with ``error``. Returns False if the
        delivery was no longer this consumer's."""
        text = _error_text(error)
        self._start_finishing()
        q = self._queue
        ok = await q.message_call(
            "queue.dead_letter", self, q.backend.dead_letter, self.receipt, q.consumer, text
        )
        return self._finished_as("dead", ok)

    async def extend(self, visibility: float | None = None) -> None:
        """Keep the delivery hidden for ``visibility`` more seconds (default: the ttl its
        renewals carry); a new value also becomes what renewals carry. Raises
        :class:`MessageLost` if the delivery is no longer this consumer's."""
        new = None if visibility is None else check_ttl(visibility, argument="visibility")
        self.check()
        state = self._lease.state
        if new is None:
            new = state.ttl
        sent = state.now()
        state.extend_started()
        try:
            ok = await self._queue.message_call(
                "queue.extend",
                self,
                self._queue.backend.renew,
                [(self.receipt, self._queue.consumer, new)],
            )
        except BaseException:
            state.extend_done(None)
            raise
        if not (ok and ok[0]):
            state.extend_done(None)
            self._queue.stop_renewing(self._lease)
            self._mark_lost("extend found the delivery gone or given to another consumer")
            self.check()
        state.extend_done(sent, new)


_UNDECODED: Any = object()


def _error_text(error: str | BaseException | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    if not isinstance(error, str):
        raise ConfigurationError(
            f"error must be a str, an exception or None, got {type(error).__name__}",
            argument="error",
        )
    return error[:8192]


class AsyncQueue:
    """A named queue on one backend, chosen by URL.

    ``url``: ``"redis://..."`` (Redis Streams), ``"postgresql://..."``, ``"sqlite:///f.db"``,
    ``"amqp://..."`` (RabbitMQ) or ``"memory://"``; without one, ``$JOBFENCE_URL`` or the
    embedded SQLite file ``jobfence.db``; or a client of your own (a redis-py client, a
    ``psycopg_pool`` pool or connection factory, a SQLAlchemy engine on PostgreSQL or SQLite),
    used as configured and never closed by :meth:`close` (blocking for ``Queue``, asyncio for
    ``AsyncQueue``). ``name``: 1 to 128 characters of ``A-Z a-z 0-9 _ .
    : -``. ``visibility``: default seconds a delivery stays hidden from other consumers
    (30). ``serializer``: ``dumps``/``loads`` for bodies (default JSON). Other keyword
    options (``**options``) go to the backend (see the backend's page in the docs).
    """

    def __init__(
        self,
        url: str | AsyncQueueBackend | Client | None = None,
        name: str = "default",
        *,
        visibility: float = DEFAULT_VISIBILITY,
        serializer: Serializer | None = None,
        **options: Any,
    ) -> None:
        self.name = check_queue_name(name)
        self.visibility = check_ttl(visibility, argument="visibility")
        self.serializer: Serializer = check_serializer(serializer)
        #: the URL and options of the backend, when it was opened from a URL
        self._opened_from: tuple[str, dict[str, Any]] | None = None
        if isinstance(url, AsyncQueueBackend):
            self.backend = url
            self.url = f"{url.kind}://"
        else:
            if url is None:
                url = os.environ.get("JOBFENCE_URL") or DEFAULT_QUEUE_URL
            self.backend = open_queue_backend(url, self.name, asynchronous=True, **options)
            self.url = describe_target(url)
            if isinstance(url, str):
                # what opens this queue's backend again (a worker of the blocking API opens
                # the asyncio backend of the same queue for its event loop)
                self._opened_from = (url, dict(options))
        #: this client's consumer id (``host:pid:uuid``), the owner of its deliveries
        self.consumer = _new_consumer()
        if ASYNC:
            self._acks = self._new_acks()
        self._closed = False
        self._renewer = self._new_renewer()
        forks.register(self)

    @classmethod
    async def names(cls, url: str | None = None, *, limit: int = 100, **options: Any) -> list[str]:
        """Up to ``limit`` names of the queues at ``url`` that hold messages, sorted: the
        queue names of the table (``postgresql://``, ``sqlite:///``; option ``table``), of the
        namespace (``redis://``, found by SCAN; option ``namespace``), or of the process
        (``memory://``). ``options`` are those a queue at ``url`` takes. RabbitMQ cannot list
        queues over AMQP: it raises :class:`~jobfence.errors.ConfigurationError` (listing needs
        the management API; pass the names)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigurationError(
                f"limit must be an int from 1 to 100000, got {limit!r}", argument="limit"
            )
        if url is None:
            url = os.environ.get("JOBFENCE_URL") or DEFAULT_QUEUE_URL
        # a backend is opened for one queue; listing reads the whole table or namespace
        backend = open_queue_backend(url, "default", asynchronous=True, **options)
        try:
            return list(await backend.names(limit))
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{backend.kind} queues ({describe_target(url)}): listing the queue names "
                f"failed: {type(exc).__name__}: {exc}",
                backend=backend.kind,
                operation="queue.names",
            ) from exc
        finally:
            await backend.close()

    def _new_renewer(self) -> AsyncRenewer:
        """The renewer of this client's deliveries (one task or thread per client, one
        batched backend call per tick), announcing each batch at ``queue.renew``."""
        name = self.name
        return AsyncRenewer(
            self.backend.renew,
            name="jobfence-queue-renewer",
            counted=("queue", self.backend.kind),
            announce=lambda receipts: ahook("queue.renew", queue=name, receipts=receipts),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} name={self.name}>"

    @property
    def capabilities(self) -> Any:
        return self.backend.capabilities

    async def _io(
        self,
        point: str,
        announce: Callable[[], Awaitable[Any]],
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        what: str = "",
    ) -> T:
        """``announce()`` (the I/O hook's call at ``point``), then ``fn(*args)``; wrap driver
        errors -- and faults a hook injects, which stand for them -- in BackendError."""
        self._check_open()
        try:
            if get_hook() is not None:  # its keywords are built only when a hook listens
                await announce()
            return await fn(*args)
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{self.backend.kind} queue {self.name!r} ({self.url}): {what or point} "
                f"failed: {type(exc).__name__}: {exc}",
                backend=self.backend.kind,
                operation=point,
            ) from exc

    async def message_call(
        self, point: str, message: AsyncMessage, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """Internal (used by its messages): ``fn(*args)``, a verb on the delivery
        ``message``, announced to the I/O hook at ``point`` with the message's id."""
        return await self._io(
            point,
            lambda: ahook(
                point,
                queue=self.name,
                id=message.id,
                delivery=message.delivery,
                backend=self.backend.kind,
            ),
            fn,
            *args,
            what=f"{point} of message {message.id!r}",
        )

    async def ack_message(self, message: AsyncMessage) -> bool:
        """Internal (used by its messages): ack the delivery ``message`` (``AsyncQueue``:
        acks finishing together share one round trip, the queue's ack batcher)."""
        if ASYNC:
            return await self.message_call("queue.ack", message, self._ack_batched, message.receipt)
        else:
            return await self.message_call(
                "queue.ack", message, self.backend.ack, message.receipt, self.consumer
            )

    async def _manage(self, operation: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """An administrative verb, announced at ``queue.manage``."""
        return await self._io(
            "queue.manage",
            lambda: ahook(
                "queue.manage", queue=self.name, operation=operation, backend=self.backend.kind
            ),
            fn,
            *args,
            what=operation,
        )

    if ASYNC:

        def _new_acks(self) -> GroupCommit[str, bool]:
            """Acks made while one ``ack_many`` round trip is under way go together in the
            next (group commit); a cancelled ack is still sent."""
            return GroupCommit(self._flush_acks, withdraw=False, name="jobfence-queue-acks")

        async def _ack_batched(self, receipt: str) -> bool:
            """Ack ``receipt`` in the next ``ack_many`` round trip: while one is under way,
            the acks that come in wait for it to end and go together in the next (group
            commit), so concurrent handlers pay one round trip per batch, and a lone ack
            pays one round trip as before."""
            return await self._acks.submit(receipt)

        async def _flush_acks(self, receipts: list[str]) -> list[bool]:
            results = await self.backend.ack_many([(r, self.consumer) for r in receipts])
            return [bool(ok) for ok in results]

        async def _unstream(self) -> list[AsyncMessage]:
            """Internal (used by the worker as it stops): end the subscription its
            ``backend.stream`` started and return the deliveries pushed to this client that no
            receive returned yet, for the caller to give back."""
            started = get_clock().monotonic()
            raws = await self._io(
                "queue.receive",
                lambda: ahook("queue.receive", queue=self.name, backend=self.backend.kind),
                self.backend.unstream,
                self.consumer,
            )
            return [
                AsyncMessage(self, raw, visibility=self.visibility, started=started, renew=False)
                for raw in raws
            ]

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this Queue is closed", argument="self")

    def _encode(self, body: Any) -> bytes:
        try:
            data = self.serializer.dumps(body)
        except Exception as exc:
            raise ConfigurationError(
                f"body cannot be published: the serializer failed on a {type(body).__name__} "
                f"({type(exc).__name__}: {exc}); pass a JSON value, or give the Queue another "
                "serializer",
                argument="body",
            ) from exc
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(
                f"the serializer returned {type(data).__name__}, not bytes or str",
                argument="serializer",
            )
        return bytes(data)

    async def publish(
        self,
        body: Any,
        *,
        id: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> str:
        """Append one message and return its id (``id``, or a new random one). ``body`` is
        serialised (JSON by default); ``delay`` seconds before it may be delivered. The same
        id published twice is delivered twice: ids make redeliveries recognisable, they do
        not deduplicate publishing."""
        message_id = _new_id() if id is None else check_name(id, argument="id")
        head = _check_headers(headers)
        delay = _check_delay(delay)
        await self._publish_encoded([(message_id, self._encode(body), head)], delay)
        return message_id

    async def publish_many(
        self,
        bodies: Iterable[Any],
        *,
        ids: Iterable[str] | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> list[str]:
        """Append many messages in one round trip where the backend can; return their ids.
        ``ids`` (as many as ``bodies``) defaults to new random ids; ``headers`` go on every
        message."""
        bodies = list(bodies)
        if ids is None:
            id_list = [_new_id() for _ in bodies]
        else:
            id_list = [check_name(i, argument="id") for i in ids]
            if len(id_list) != len(bodies):
                raise ConfigurationError(
                    f"ids must have one id per body: {len(id_list)} ids for {len(bodies)} bodies",
                    argument="ids",
                )
        head = _check_headers(headers)
        delay = _check_delay(delay)
        batch = [(i, self._encode(b), dict(head)) for i, b in zip(id_list, bodies, strict=True)]
        await self._publish_encoded(batch, delay)
        return id_list

    async def _publish_encoded(
        self, batch: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        """Internal (``publish_many``, and the outbox relay, whose rows hold bodies encoded
        already): append ``batch`` -- ``(id, encoded body, headers)`` per message, each with
        headers of its own -- in one round trip where the backend can, announced at
        ``queue.publish``. Nothing is checked or encoded again here: the caller did it."""
        if not batch:
            return
        ids = [message[0] for message in batch]
        await self._io(
            "queue.publish",
            lambda: ahook("queue.publish", queue=self.name, ids=ids, backend=self.backend.kind),
            self.backend.publish,
            batch,
            delay,
        )

    async def receive(
        self,
        max_messages: int = 1,
        *,
        visibility: float | None = None,
        wait: float = 0.0,
        renew: bool = False,
    ) -> list[AsyncMessage]:
        """Up to ``max_messages`` deliveries, each hidden from other consumers for
        ``visibility`` seconds (default: the queue's); waits up to ``wait`` seconds for the
        first (``0``: returns at once). ``renew=True``: the queue's renewer keeps each delivery
        hidden (one batched round trip per tick) until it is finished, so a handler may run
        longer than ``visibility`` while a dead consumer's messages still come back
        ``visibility`` after its last renewal."""
        if (
            isinstance(max_messages, bool)
            or not isinstance(max_messages, int)
            or not 1 <= max_messages <= MAX_RECEIVE
        ):
            raise ConfigurationError(
                f"max_messages must be an int from 1 to {MAX_RECEIVE}, got {max_messages!r}",
                argument="max_messages",
            )
        vis = (
            self.visibility if visibility is None else check_ttl(visibility, argument="visibility")
        )
        wait = _check_delay(wait, "wait")
        started = get_clock().monotonic()
        raws = await self._io(
            "queue.receive",
            lambda: ahook("queue.receive", queue=self.name, backend=self.backend.kind),
            self.backend.receive,
            self.consumer,
            max_messages,
            vis,
            wait,
        )
        messages = [
            AsyncMessage(self, raw, visibility=vis, started=started, renew=renew) for raw in raws
        ]
        if renew:
            for message in messages:
                self._renewer.add(message.renewal)
        return messages

    def stop_renewing(self, renewal: Renewable) -> None:
        """Internal (used by its messages): forget the ``renewal`` of a delivery that was
        finished or found lost, so the renewer no longer renews it."""
        self._renewer.discard(renewal)

    async def stats(self) -> QueueStats:
        """Message counts: ready, delayed, in flight, dead (``None`` where the backend cannot
        tell)."""
        return await self._manage("stats", self.backend.stats)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigurationError(
                f"limit must be an int from 1 to 100000, got {limit!r}", argument="limit"
            )
        return await self._manage("dead_letters", self.backend.dead_letters, limit)

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        """Publish dead letters again (those with ``ids``, or all), delivery count reset;
        returns how many."""
        if ids is not None:
            ids = [check_name(i, argument="ids") for i in ids]
        return await self._manage("requeue_dead", self.backend.requeue_dead, ids)

    async def purge(self) -> int:
        """Delete every message of the queue (ready, delayed, in flight, dead)."""
        return await self._manage("purge", self.backend.purge)

    async def install(self) -> None:
        """Create the queue's tables or server objects now (they are also created on first
        use)."""
        await self._manage("install", self.backend.install)

    async def drop(self) -> None:
        """Delete the queue and everything stored for it (tests, uninstall)."""
        await self._manage("drop", self.backend.drop)

    async def close(self) -> None:
        """Stop renewing, give back (nack) the deliveries still renewed so they are
        redelivered at once, and close the backend's connections."""
        if self._closed:
            return
        self._closed = True
        for receipt, consumer in await self._renewer.close():
            try:
                # no error: a give-back is not a failure (and RabbitMQ requeues it in place)
                await self.backend.nack(receipt, consumer, 0.0, None)
            except Exception as exc:
                log.warning("giving back a delivery on close failed (it comes back): %r", exc)
        await self.backend.close()

    def _after_fork(self) -> None:
        """In a child process right after ``fork()``: a consumer id and renewer of its own,
        and a backend that opens its own connections."""
        forks.keep(self._renewer)
        self.consumer = _new_consumer()
        self._renewer = self._new_renewer()
        if ASYNC:  # acks the parent had under way stay the parent's
            forks.keep(self._acks)
            self._acks = self._new_acks()
        self.backend.after_fork()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
