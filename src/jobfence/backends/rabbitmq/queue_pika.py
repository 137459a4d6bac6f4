"""``amqp://`` / ``amqps://`` -- the blocking RabbitMQ queue backend, on pika's
``BlockingConnection``. The async twin is ``queue_aio.py`` (same protocol steps, described
there); what both decide is in ``common.py``.

Threads. A ``BlockingConnection`` is not thread-safe, and a worker acks from its handler
threads while its main thread waits in ``receive``. So one thread at a time uses the
connection (``_busy``); a call that finds it taken waits for it -- except while the holder is
waiting for a delivery (``receive`` with ``wait``): then the call is handed to the holder
(``add_callback_threadsafe`` wakes its read loop), which runs it between two reads and hands
the result back. An ``ack`` never waits for a ``receive``'s ``wait`` to run out.

Heartbeats. pika answers heartbeats only while some call reads from the connection, so a
daemon thread (``jobfence-rabbitmq-heartbeat``) reads every quarter heartbeat interval when
nobody else is using it; without it the broker would close an idle client's connection after
two missed heartbeats, and hand its unacked messages to other consumers.

Deadlines. Every request is watched by a :mod:`jobfence.backends._deadline` guard: when
``timeout`` (plus the ``wait`` of a waiting receive) passes, the socket is shut down, the
call fails with a ``TimeoutError`` and the connection is replaced on the next call.

Publisher confirms are tracked here rather than by ``BlockingChannel`` (which waits for each
message's confirm in turn), so a batch waits for all its confirms once.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import pika
import pika.exceptions
from pika import spec
from pika.adapters.utils.connection_workflow import (
    AMQPConnectorException,
    AMQPConnectorStackTimeout,
)

from ..._core import forks
from ..._core.options import connect_timed_out, request_timed_out
from ..._core.url import BackendURL
from ..._core.validate import check_queue_name
from ...errors import BackendError, ConfigurationError
from .._deadline import SocketGuard, guard
from ..base import DeadLetter, QueueBackend, QueuedMessage, QueueStats, RenewItem
from .common import (
    CAPABILITIES,
    RABBITMQ_NAMES,
    REDECLARE_AFTER,
    Deliveries,
    Incoming,
    Outgoing,
    Route,
    Settings,
    Topology,
    check_backend_name,
    dead_copy,
    defer_copy,
    fresh,
    parse_incoming,
    read_settings,
    requeue_copy,
    retry_copy,
    unconfirmed_text,
)

__all__ = ["RabbitQueueBackend"]

T = TypeVar("T")

#: the driver's errors that mean the connection or channel is gone (or in an unknown state)
_LINK_ERRORS = (pika.exceptions.AMQPError, OSError)
#: dead letters moved per confirmed batch by requeue_dead
_REQUEUE_BATCH = 256


def _properties(message: Outgoing) -> spec.BasicProperties:
    return spec.BasicProperties(
        message_id=message.message_id,
        headers=message.headers,
        timestamp=message.timestamp,
        delivery_mode=2,
    )


def _parse(method: Any, properties: Any, body: bytes | None) -> Incoming:
    return parse_incoming(
        tag=int(method.delivery_tag),
        body=body or b"",
        message_id=properties.message_id,
        headers=properties.headers,
        timestamp=properties.timestamp,
        redelivered=bool(method.redelivered),
        remaining=getattr(method, "message_count", None),
    )


def _socket_fd(connection: Any) -> int | None:
    """The file descriptor of the connection's socket, for the deadline guards (pika keeps
    it on the transport of the connection it wraps)."""
    try:
        return int(connection._impl._transport._sock.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def _noop() -> None:
    """Posted to wake a read loop: ``process_data_events`` returns once it ran."""


class _Link:
    """One connection, its channel, what was delivered on that channel, and the channel's
    publisher confirms."""

    def __init__(self, connection: Any, channel: Any) -> None:
        self.connection = connection
        self.channel = channel
        self.fd = _socket_fd(connection)
        self.deliveries = Deliveries()
        #: deliveries made to this client that no receive returned yet: returned first
        self.leftovers: list[Incoming] = []
        self.broken = False
        self._next_seq = 1
        self._unconfirmed: set[int] = set()
        #: publish sequence numbers the broker refused (``basic.nack``) since the last publish
        self._nacked: set[int] = set()
        self._returned: list[tuple[Any, bytes]] = []

    @property
    def usable(self) -> bool:
        return not self.broken and self.connection.is_open and self.channel.is_open

    def enable_confirms(self) -> None:
        """Confirm mode on the channel, with this object counting the confirms."""
        impl = self.channel._impl
        selected: list[bool] = []
        impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: selected.append(True)
        )
        impl.add_on_return_callback(self._on_return)
        self.connection._flush_output(lambda: bool(selected) or not self.channel.is_open)
        if not selected:
            raise pika.exceptions.ChannelWrongStateError("the channel closed")

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        done = {s for s in self._unconfirmed if s <= tag} if method.multiple else {tag}
        self._unconfirmed -= done
        if isinstance(method, spec.Basic.Nack):
            self._nacked |= done

    def _on_return(self, _channel: Any, _method: Any, properties: Any, body: bytes) -> None:
        self._returned.append((properties, body))

    def publish(self, queue: str, messages: Sequence[tuple[Any, bytes]]) -> list[Any]:
        """Publish ``(properties, body)`` pairs to ``queue`` (mandatory), all at once, then
        wait for all their confirms together (one wait for the batch, not one per message);
        the pairs the broker returned as unroutable. :class:`BackendError` naming the
        messages the broker refused (``basic.nack``); if the channel closes before every
        confirm came, ``ChannelWrongStateError`` naming the unconfirmed ones."""
        self._returned = []
        self._nacked = set()
        sent: dict[int, Any] = {}
        impl = self.channel._impl
        for properties, body in messages:
            impl.basic_publish("", queue, body, properties, mandatory=True)
            sent[self._next_seq] = properties
            self._unconfirmed.add(self._next_seq)
            self._next_seq += 1
        unconfirmed = self._unconfirmed
        self.connection._flush_output(
            lambda: unconfirmed.isdisjoint(sent) or not self.channel.is_open
        )
        missing = [seq for seq in sent if seq in self._unconfirmed]
        if missing:
            raise pika.exceptions.ChannelWrongStateError(
                unconfirmed_text(queue, [sent[seq].message_id for seq in missing], len(sent))
                + ": the channel closed before confirming them"
            )
        refused = [seq for seq in sent if seq in self._nacked]
        if refused:
            raise BackendError(
                unconfirmed_text(queue, [sent[seq].message_id for seq in refused], len(sent))
                + ": the broker refused them (basic.nack)",
                backend="rabbitmq",
                operation="publish",
            )
        returned, self._returned = self._returned, []
        return returned


class _Call(Generic[T]):
    """A call handed to the thread that holds the connection while it waits."""

    def __init__(self, fn: Callable[[_Link | None], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self, link: _Link | None) -> None:
        try:
            self.value = self.fn(link)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> T:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def _pump(ref: weakref.ref[RabbitQueueBackend], stop: threading.Event, interval: float) -> None:
    """The heartbeat thread: let pika read (and answer heartbeats) every ``interval``."""
    while not stop.wait(interval):
        backend = ref()
        if backend is None:
            return
        backend._service()
        del backend


class RabbitQueueBackend(QueueBackend):
    """The queue ``name`` on RabbitMQ (see ``docs/how-to/queues/rabbitmq.md``); safe to share
    between threads."""

    kind = "rabbitmq"
    capabilities = CAPABILITIES

    def __init__(self, url: BackendURL, *, name: str, **options: Any) -> None:
        self.name = check_backend_name(check_queue_name(name))
        self._settings: Settings = read_settings(url, options, queue=self.name)
        self._timeout = self._settings.timeouts.request
        self._topology = Topology(self.name)
        self._declared: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self._link: _Link | None = None
        self._cond = threading.Condition()
        self._busy = False
        #: the holder waits for a delivery and runs the calls posted to it
        self._waiting = False
        self._posted: deque[_Call[Any]] = deque()
        self._waker: Callable[[], None] | None = None
        self._closing = False
        self._pump: threading.Thread | None = None
        self._pump_stop = threading.Event()

    def __repr__(self) -> str:
        s = self._settings
        return f"<RabbitQueueBackend {self.name!r} at {s.host}:{s.port}{s.vhost}>"

    # -- who uses the connection -----------------------------------------------------------

    def _exclusive(self, fn: Callable[[_Link | None], T], *, connect: bool) -> T:
        """Run ``fn`` with the connection to itself: on the current link (a new one if
        ``connect`` and there is none; None if not ``connect`` and none is usable), or in
        the thread that is waiting on the connection."""
        call: _Call[T] | None = None
        with self._cond:
            while self._busy and not self._waiting:
                self._cond.wait()
            if self._busy:
                call = _Call(fn)
                self._posted.append(call)
                waker = self._waker
            else:
                self._busy = True
        if call is not None:
            if waker is not None:
                try:
                    waker()
                except Exception:  # closed: the holder runs it on its way out
                    pass
            return call.result()
        try:
            return fn(self._connected() if connect else self._live())
        finally:
            self._release()

    def _run(self, fn: Callable[[_Link], T]) -> T:
        def on_link(link: _Link | None) -> T:
            assert link is not None
            return fn(link)

        return self._exclusive(on_link, connect=True)

    def _release(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def _acquire_until(self, deadline: float) -> bool:
        """Take the connection for a wait of our own (never handed to a waiting holder);
        False if it stayed busy until ``deadline``."""
        with self._cond:
            while self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._busy = True
            return True

    def _start_waiting(self, link: _Link) -> None:
        def wake() -> None:
            link.connection.add_callback_threadsafe(_noop)

        with self._cond:
            self._waiting = True
            self._waker = wake
            self._cond.notify_all()  # callers blocked on the connection may now post

    def _stop_waiting(self, link: _Link) -> None:
        with self._cond:
            self._waiting = False
            self._waker = None
        self._run_posted(link)  # posted before the flag went down

    def _run_posted(self, link: _Link) -> None:
        while True:
            with self._cond:
                if not self._posted:
                    return
                call = self._posted.popleft()
            call.run(link)

    # -- connection ------------------------------------------------------------------------

    def _live(self) -> _Link | None:
        link = self._link
        return link if link is not None and link.usable else None

    def _connected(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if link is not None:
            self._break(link)
        self._closing = False
        self._link = link = self._open()
        self._start_pump()
        return link

    def _open(self) -> _Link:
        s = self._settings
        params = pika.ConnectionParameters(
            host=s.host,
            port=s.port,
            virtual_host=s.vhost,
            credentials=pika.PlainCredentials(s.username, s.password),
            heartbeat=s.heartbeat,
            socket_timeout=s.timeouts.connect,
            stack_timeout=s.timeouts.connect,
            connection_attempts=1,
            ssl_options=pika.SSLOptions(s.tls, s.host) if s.tls is not None else None,
            client_properties={"connection_name": s.connection_name},
        )
        started = time.monotonic()
        try:
            connection = pika.BlockingConnection(params)
        except (pika.exceptions.AMQPConnectionError, AMQPConnectorException) as exc:
            if isinstance(exc, AMQPConnectorStackTimeout) or (
                time.monotonic() - started >= s.timeouts.connect
            ):
                raise connect_timed_out(s.timeouts.connect) from exc
            raise
        link = _Link(connection, None)
        try:
            with self._deadline(link):
                link.channel = connection.channel()
                link.enable_confirms()
                link.channel.basic_qos(prefetch_count=1)
            for route in self._topology.installed():
                self._declare(link, route)
        except BaseException:
            self._discard(link)
            raise
        return link

    @contextmanager
    def _deadline(self, link: _Link, extra: float = 0.0) -> Iterator[None]:
        """Bound the requests of the block by ``timeout`` + ``extra`` seconds: past that the
        socket is shut down (the call fails at once) and the link is broken. A lost
        connection or channel breaks the link too."""
        watch: SocketGuard | None = (
            guard(link.fd, self._timeout + extra) if link.fd is not None else None
        )
        try:
            yield
        except _LINK_ERRORS as exc:
            fired = watch.done() if watch is not None else False
            self._break(link)
            if fired:
                raise request_timed_out(self._timeout) from exc
            raise
        except BaseException:
            if watch is not None and watch.done():
                self._break(link)
            raise
        else:
            if watch is not None and watch.done():
                self._break(link)

    def _break(self, link: _Link) -> None:
        """Stop using ``link``: its deliveries go back to the queue when it closes."""
        if link.broken:
            return
        link.broken = True
        if self._link is link:
            self._link = None
        self._discard(link)

    def _discard(self, link: _Link) -> None:
        """Close ``link``'s connection, bounded by ``timeout``; errors are ignored."""
        link.broken = True
        if not link.connection.is_open:
            return
        watch = guard(link.fd, self._timeout) if link.fd is not None else None
        try:
            link.connection.close()
        except Exception:  # a connection being discarded
            pass
        finally:
            if watch is not None:
                watch.done()

    def _declare(self, link: _Link, route: Route) -> Any:
        with self._deadline(link):
            frame = link.channel.queue_declare(route.queue, durable=True, arguments=route.arguments)
        self._declared[route.queue] = time.monotonic()
        return frame.method

    def install(self) -> None:
        self._run(lambda _link: None)

    # -- heartbeats ------------------------------------------------------------------------

    def _start_pump(self) -> None:
        if self._settings.heartbeat <= 0 or (self._pump is not None and self._pump.is_alive()):
            return
        self._pump_stop = threading.Event()
        self._pump = threading.Thread(
            target=_pump,
            args=(weakref.ref(self), self._pump_stop, max(1.0, self._settings.heartbeat / 4)),
            name="jobfence-rabbitmq-heartbeat",
            daemon=True,
        )
        self._pump.start()

    def _service(self) -> None:
        """Read from an idle connection (answers heartbeats, notices a closed one)."""
        with self._cond:
            if self._busy:
                return  # whoever holds it is reading
            self._busy = True
        try:
            link = self._live()
            if link is not None:
                try:
                    with self._deadline(link):
                        link.connection.process_data_events(0)
                except Exception:  # the link is broken; the next call reconnects
                    pass
        finally:
            self._release()

    # -- publishing ------------------------------------------------------------------------

    def _publish(self, link: _Link, route: Route, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` to ``route`` and wait for every confirm; messages returned as
        unroutable (the queue was deleted, a delay queue expired) are published once more
        after declaring the queue."""
        if route.delay_ms is not None:
            declared = self._declared.get(route.queue)
            if declared is None or time.monotonic() - declared > REDECLARE_AFTER:
                self._declare(link, route)  # renews the delay queue's lease
        pending: list[tuple[Any, bytes]] = [(_properties(m), m.body) for m in messages]
        for attempt in range(2):
            with self._deadline(link):
                pending = link.publish(route.queue, pending)
            if not pending:
                return
            if attempt == 0:
                self._declare(link, route)
        raise BackendError(
            f"RabbitMQ could not route {len(pending)} message(s) to queue {route.queue!r}",
            backend="rabbitmq",
            operation="publish",
        )

    def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        if not messages:
            return
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        now = time.time()
        outgoing = [fresh(id_, body, headers, now) for id_, body, headers in messages]
        self._run(lambda link: self._publish(link, route, outgoing))

    # -- receiving -------------------------------------------------------------------------

    def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        deadline = time.monotonic() + wait
        got = self._run(
            lambda link: self._hand_out(link, self._take(link, [], max_messages), consumer)
        )
        if got or wait <= 0:
            return got
        if not self._acquire_until(deadline):
            return []
        try:
            link = self._connected()
            found = self._take(link, [], max_messages)  # something may have come meanwhile
            remaining = deadline - time.monotonic()
            if not found and remaining > 0:
                found = self._wait_one(link, remaining)
                if found:
                    self._take(link, found, max_messages)
            return self._hand_out(link, found, consumer)
        finally:
            self._release()

    def _hand_out(self, link: _Link, found: list[Incoming], consumer: str) -> list[QueuedMessage]:
        return [link.deliveries.hand_out(m, consumer) for m in found]

    def _take(self, link: _Link, got: list[Incoming], max_messages: int) -> list[Incoming]:
        """Fill ``got`` up to ``max_messages``: this client's leftovers, then ``basic.get``
        until the queue is empty. What was taken before a failure is kept for the next
        receive."""
        kept = link.leftovers[: max(0, max_messages - len(got))]
        del link.leftovers[: len(kept)]
        got.extend(kept)
        try:
            while len(got) < max_messages:
                with self._deadline(link):
                    method, properties, body = link.channel.basic_get(self.name, auto_ack=False)
                if method is None:
                    break
                got.append(_parse(method, properties, body))
                if method.message_count == 0:
                    break
        except BaseException:
            if link.usable:
                link.leftovers[:0] = got
            raise
        return got

    def _wait_one(self, link: _Link, seconds: float) -> list[Incoming]:
        """Wait up to ``seconds`` for the broker to push one message to a consumer of
        prefetch 1, running the calls other threads post meanwhile. However the wait ends,
        the consumer is cancelled; a message pushed to it that this receive does not return
        (it failed, or was interrupted) is kept for the next one."""
        got: list[Incoming] = []
        sink = [got]  # where pushes go: ``got`` while this receive may still return them

        def on_message(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
            sink[0].append(_parse(method, properties, body))

        with self._deadline(link):
            tag = link.channel.basic_consume(self.name, on_message, auto_ack=False)
        until = time.monotonic() + seconds
        try:
            self._start_waiting(link)
            try:
                with self._deadline(link, extra=seconds):
                    while not got and not self._closing and link.usable:
                        remaining = until - time.monotonic()
                        if remaining <= 0:
                            break
                        link.connection.process_data_events(time_limit=remaining)
                        self._run_posted(link)
            finally:
                self._stop_waiting(link)
            if link.usable:
                with self._deadline(link):
                    # deliver what a posted call read, so that the cancel does not requeue it
                    link.connection.process_data_events(0)
                    link.channel.basic_cancel(tag)
        except _LINK_ERRORS:
            if self._closing:
                return []
            raise
        except BaseException:  # interrupted: the consumer must not live on
            if link.usable:
                sink[0] = link.leftovers
                link.leftovers[:0] = got
                try:
                    with self._deadline(link):
                        link.channel.basic_cancel(tag)
                except Exception:  # the link is broken; the original error wins
                    pass
            raise
        if not link.usable:  # what it delivered went back to the queue with the channel
            if self._closing:
                return []
            raise ConnectionError("the connection to RabbitMQ was lost during the wait")
        return got

    # -- settling --------------------------------------------------------------------------

    def _settle(self, link: _Link, send: Callable[[], object]) -> bool:
        """Send a settlement, then one channel round trip (``basic.qos``): the broker handles
        a channel's frames in order, so the reply proves it arrived. False if the link
        failed meanwhile."""
        try:
            with self._deadline(link):
                send()
                link.channel.basic_qos(prefetch_count=1)
        except (TimeoutError, *_LINK_ERRORS):
            return False
        return True

    def _settle_as(
        self, receipt: str, consumer: str, settle: Callable[[_Link, Incoming], bool]
    ) -> bool:
        def on_link(link: _Link | None) -> bool:
            if link is None or not link.usable:
                return False
            message = link.deliveries.take(receipt, consumer)
            return message is not None and settle(link, message)

        return self._exclusive(on_link, connect=False)

    def ack(self, receipt: str, consumer: str) -> bool:
        return self._settle_as(
            receipt,
            consumer,
            lambda link, m: self._settle(link, lambda: link.channel.basic_ack(m.tag)),
        )

    def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        if delay <= 0 and error is None:  # the broker requeues it in place and counts it
            return self._settle_as(
                receipt,
                consumer,
                lambda link, m: self._settle(
                    link, lambda: link.channel.basic_nack(m.tag, requeue=True)
                ),
            )
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        return self._settle_as(
            receipt,
            consumer,
            lambda link, m: self._republish(link, m, consumer, route, retry_copy(m, error)),
        )

    def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """Republish the message (to the delay queue of ``delay``, or the queue) with the
        deliveries before this one, then ack this delivery: not counted."""
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        return self._settle_as(
            receipt,
            consumer,
            lambda link, m: self._republish(link, m, consumer, route, defer_copy(m)),
        )

    def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        route = self._topology.dead_route
        return self._settle_as(
            receipt,
            consumer,
            lambda link, m: self._republish(
                link, m, consumer, route, dead_copy(m, error, time.time())
            ),
        )

    def _republish(
        self, link: _Link, message: Incoming, consumer: str, route: Route, copy: Outgoing
    ) -> bool:
        """Publish ``copy`` to ``route`` (confirmed), then ack the delivery ``message``."""
        try:
            self._publish(link, route, [copy])
        except BaseException:
            if link.usable:
                link.deliveries.put_back(message, consumer)
            raise
        return self._settle(link, lambda: link.channel.basic_ack(message.tag))

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        def on_link(link: _Link | None) -> list[bool]:
            if link is None or not link.usable:
                return [False] * len(items)
            try:  # one round trip: is the channel that holds the deliveries still there?
                with self._deadline(link):
                    link.channel.basic_qos(prefetch_count=1)
            except (TimeoutError, *_LINK_ERRORS):
                return [False] * len(items)
            return [link.deliveries.holds(receipt, consumer) for receipt, consumer, _ in items]

        return self._exclusive(on_link, connect=False)

    # -- dead letters, stats, maintenance ---------------------------------------------------

    def stats(self) -> QueueStats:
        def on_link(link: _Link) -> QueueStats:
            ready = self._declare(link, self._topology.main)
            dead = self._declare(link, self._topology.dead_route)
            return QueueStats(
                ready=ready.message_count, delayed=None, in_flight=None, dead=dead.message_count
            )

        return self._run(on_link)

    def _get_dead(self, link: _Link) -> Incoming | None:
        with self._deadline(link):
            method, properties, body = link.channel.basic_get(self._topology.dead, auto_ack=False)
        return None if method is None else _parse(method, properties, body)

    def _requeue_tags(self, link: _Link, tags: list[int]) -> None:
        """Give peeked messages back (to their places) and wait until the broker has them:
        without the round trip, a count or a get right after could miss them."""
        if link.usable and tags:
            with self._deadline(link):
                for tag in tags:
                    link.channel.basic_nack(tag, requeue=True)
                link.channel.basic_qos(prefetch_count=1)

    def names(self, limit: int) -> list[str]:
        raise ConfigurationError(RABBITMQ_NAMES, argument="url")

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        def on_link(link: _Link) -> list[DeadLetter]:
            found: list[Incoming] = []
            try:
                while len(found) < limit:
                    message = self._get_dead(link)
                    if message is None:
                        break
                    found.append(message)
            finally:  # a peek: every one goes back, in its place
                self._requeue_tags(link, [m.tag for m in found])
            return [m.dead_letter() for m in found]

        return self._run(on_link)

    def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        wanted = None if ids is None else set(ids)

        def on_link(link: _Link) -> int:
            kept: list[int] = []
            batch: list[Incoming] = []
            moved = 0
            try:
                # every dead letter is got once: moved ones are acked, kept ones stay unacked
                # until the end, so the loop ends when the dead letters are exhausted
                while (message := self._get_dead(link)) is not None:
                    if wanted is None or message.id in wanted:
                        batch.append(message)
                    else:
                        kept.append(message.tag)
                    if len(batch) >= _REQUEUE_BATCH:
                        moved += self._move(link, batch)
                moved += self._move(link, batch)
            finally:
                self._requeue_tags(link, kept + [m.tag for m in batch])
            return moved

        return self._run(on_link)

    def _move(self, link: _Link, batch: list[Incoming]) -> int:
        """Publish the dead letters ``batch`` to the queue (confirmed), then ack them."""
        if not batch:
            return 0
        now = time.time()
        self._publish(link, self._topology.main, [requeue_copy(m, now) for m in batch])
        with self._deadline(link):
            for message in batch:
                link.channel.basic_ack(message.tag)
            link.channel.basic_qos(prefetch_count=1)
        moved = len(batch)
        batch.clear()
        return moved

    def purge(self) -> int:
        def on_link(link: _Link) -> int:
            count = 0
            with self._deadline(link):
                # this client's own deliveries are part of the queue: settle them as deleted
                for tag in [*link.deliveries.take_all(), *(m.tag for m in link.leftovers)]:
                    link.channel.basic_ack(tag)
                    count += 1
                link.leftovers.clear()
                for queue in (self.name, self._topology.dead):
                    count += link.channel.queue_purge(queue).method.message_count
            count += self._delete_delay_queues(link)
            return count

        return self._run(on_link)

    def _delete_delay_queues(self, link: _Link) -> int:
        """Delete every delay queue of this queue (deleting a missing queue is a no-op; a
        publish into a deleted one is returned and declares it again)."""
        count = 0
        for queue in self._topology.delay_queues():
            with self._deadline(link):
                count += link.channel.queue_delete(queue).method.message_count
            self._declared.pop(queue, None)
        return count

    def drop(self) -> None:
        def on_link(link: _Link) -> None:
            self._delete_delay_queues(link)
            with self._deadline(link):
                for queue in (self.name, self._topology.dead):
                    link.channel.queue_delete(queue)
            self._declared.clear()
            self._break(link)  # the next call connects again and declares the queue anew

        self._run(on_link)

    def close(self) -> None:
        self._closing = True
        self._pump_stop.set()
        pump = self._pump
        if pump is not None and pump is not threading.current_thread():
            pump.join(self._timeout)
        self._pump = None

        def on_link(link: _Link | None) -> None:
            link = self._link
            self._link = None
            if link is not None:
                self._discard(link)

        self._exclusive(on_link, connect=False)

    def after_fork(self) -> None:
        link = self._link
        if link is not None:
            forks.keep(link.connection)  # the parent's: neither used nor closed here
        self._reset()
