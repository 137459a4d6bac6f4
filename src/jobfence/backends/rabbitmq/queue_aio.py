"""``amqp://`` / ``amqps://`` -- the async RabbitMQ queue backend, on aio-pika (and its
protocol layer aiormq). The blocking twin is ``queue_pika.py``; what both decide (names,
arguments, headers, delivery counts, receipts) is in ``common.py``.

One connection and one channel per client, opened on first use and again on the first call
after it was lost; publisher confirms on, ``prefetch_count`` 1 for the consumers it starts.

* ``receive``: ``basic.get`` up to ``max_messages`` times (it stops when the broker says the
  queue is empty). If none came and ``wait`` > 0, a consumer with prefetch 1 waits for the
  next message (the broker pushes it: no polling), is cancelled as soon as one arrived (with
  prefetch 1 nothing else can be in flight to it), and ``basic.get`` takes the rest. So a
  client holds exactly the deliveries it returned -- never a prefetched backlog that other
  consumers cannot have.
* ``ack`` / ``nack`` / ``dead_letter`` settle a delivery on the channel that delivered it,
  then wait for one channel round trip (a ``basic.qos``, coalesced between concurrent
  calls): the broker handles a channel's frames in order, so the reply proves the settlement
  arrived before the connection could drop. A delivery of a lost channel answers False.
  ``ack_many`` (the queue client's batched acks) sends one ``basic.ack`` with ``multiple``
  for the acks that no other unsettled delivery of the channel precedes (``Unsettled``),
  one frame each for the others, and then the one round trip for all of them.
* Every request has the ``timeout`` deadline; a request that misses it breaks the connection
  (closed in the background, never reused in an unknown state).
* A cancelled call never cancels its request (aiormq would close the channel, and with it
  every delivery on it): the request finishes in the background (``_request``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import partial
from typing import Any

import aio_pika
import aiormq
from aiormq.abc import ChannelFrame, DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader
from yarl import URL

from ..._core import forks
from ..._core.acompat import wait_event
from ..._core.options import connect_timed_out, request_timed_out
from ..._core.url import BackendURL
from ..._core.validate import check_queue_name
from ...errors import BackendError, ConfigurationError
from ..base import AsyncQueueBackend, DeadLetter, QueuedMessage, QueueStats, RenewItem
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
    Unsettled,
    check_backend_name,
    dead_copy,
    defer_copy,
    fresh,
    parse_incoming,
    read_settings,
    requeue_copy,
    retry_copy,
    unconfirmed_text,
    unique_waves,
)

__all__ = ["AsyncRabbitQueueBackend"]

#: the driver's errors that mean the connection or channel is gone (or in an unknown state)
_LINK_ERRORS = (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, OSError)
#: dead letters moved per confirmed batch by requeue_dead
_REQUEUE_BATCH = 256
#: a publish awaits its confirm only, not also the write of its frame (aiormq's ``wait``,
#: where the installed version has it): the confirm cannot come before the write
_NO_DRAIN: dict[str, Any] = (
    {"wait": False} if "wait" in inspect.signature(aiormq.Channel.basic_publish).parameters else {}
)


def _properties(message: Outgoing) -> spec.Basic.Properties:
    return spec.Basic.Properties(
        message_id=message.message_id,
        headers=message.headers,
        timestamp=datetime.fromtimestamp(message.timestamp, tz=timezone.utc),
        delivery_mode=2,
    )


def _batched(channel: Any) -> bool:
    """Whether ``channel`` (an aiormq channel) has what :func:`_publish_batch` uses."""
    return all(hasattr(channel, name) for name in _BATCH_NEEDS) and bool(
        getattr(channel, "publisher_confirms", False)
    )


#: the parts of aiormq's ``Channel`` that :func:`_publish_batch` uses (those its own
#: ``basic_publish`` uses per message); without one of them, waves go message by message
_BATCH_NEEDS = (
    "lock",
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "number",
    "create_future",
    "_split_body",
)


def _forget(ids: dict[str, int], message_id: str, tag: int, _future: Any) -> None:
    if ids.get(message_id) == tag:
        del ids[message_id]


async def _publish_batch(channel: Any, queue: str, wave: list[Outgoing]) -> list[Any]:
    """Publish ``wave`` to ``queue`` (mandatory) as ONE write of all its frames, and return
    the confirmation future of each message, in order: what aiormq's ``basic_publish`` does
    for one message (a delivery tag, a confirmation future the channel resolves with the
    broker's ack, nack or return, or rejects when it closes), done for the whole wave under
    the channel's lock, so the messages go out back to back in one socket write rather than
    one write and one task per message."""
    confirms: list[Any] = []
    frames: list[Any] = []
    async with channel.lock:
        first = channel.delivery_tag + 1
        try:
            _register(channel, queue, wave, confirms, frames)
            await channel.write_queue.put(
                ChannelFrame.marshall(channel_number=channel.number, frames=frames)
            )
        except BaseException:
            # nothing was sent: the broker numbers the next publish ``first`` again
            channel.delivery_tag = first - 1
            for offset, confirm in enumerate(confirms):
                channel.confirmations.pop(first + offset, None)
                confirm.cancel()
            raise
    return confirms


def _register(
    channel: Any, queue: str, wave: list[Outgoing], confirms: list[Any], frames: list[Any]
) -> None:
    """A delivery tag and a confirmation future per message of ``wave`` (appended to
    ``confirms``), and its frames (appended to ``frames``)."""
    for message in wave:
        properties = _properties(message)
        channel.delivery_tag += 1
        tag = channel.delivery_tag
        confirm = channel.create_future()
        channel.confirmations[tag] = confirm
        if message.message_id is not None:
            channel.message_id_delivery_tag[message.message_id] = tag
            confirm.add_done_callback(
                partial(_forget, channel.message_id_delivery_tag, message.message_id, tag)
            )
        frames.append(spec.Basic.Publish(exchange="", routing_key=queue, mandatory=True))
        frames.append(ContentHeader(properties=properties, body_size=len(message.body)))
        frames.extend(channel._split_body(message.body))
        confirms.append(confirm)


def _parse(message: DeliveredMessage) -> Incoming:
    delivery = message.delivery
    props = message.header.properties
    return parse_incoming(
        tag=int(getattr(delivery, "delivery_tag", 0) or 0),
        body=message.body,
        message_id=props.message_id,
        headers=props.headers,
        timestamp=props.timestamp,
        redelivered=bool(getattr(delivery, "redelivered", False)),
        remaining=getattr(delivery, "message_count", None),
    )


class _Barrier:
    """One ``basic.qos`` round trip on the channel for every settlement sent before it;
    concurrent callers share one round trip (a caller that arrives while one is on the wire
    waits for the next, which starts as soon as that one ends)."""

    def __init__(self, channel: aiormq.abc.AbstractChannel, timeout: float) -> None:
        self._channel = channel
        self._timeout = timeout
        #: the callers waiting for the next round trip, one future each (a caller that is
        #: cancelled cancels only its own)
        self._next: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._next.append(future)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._next:
            waiting, self._next = self._next, []
            # The deadline is one timer that cancels the request, as ``wait_for`` would; the
            # driver's own ``timeout`` costs three more tasks and timers per round trip.
            request = asyncio.ensure_future(self._channel.basic_qos(prefetch_count=1))
            expired: list[bool] = []
            timer = loop.call_later(self._timeout, _expire, request, expired)
            try:
                try:
                    await request
                finally:
                    timer.cancel()
            except asyncio.CancelledError as exc:
                if not expired:  # this task itself was cancelled
                    _settle(waiting, RuntimeError(exc))
                    raise
                _settle(waiting, asyncio.TimeoutError())
            except Exception as exc:
                _settle(waiting, exc)
            else:
                _settle(waiting, None)


def _settle(waiting: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in waiting:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


def _expire(request: asyncio.Future[Any], expired: list[bool]) -> None:
    if not request.done():
        expired.append(True)
        request.cancel()


class _Link:
    """One connection, its channel and what was delivered on that channel."""

    def __init__(
        self,
        connection: aio_pika.abc.AbstractConnection,
        channel: aiormq.abc.AbstractChannel,
        timeout: float,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.deliveries = Deliveries()
        #: the channel's delivery tags not settled yet (for ``multiple`` acks)
        self.unsettled = Unsettled()
        #: deliveries made to this client that no receive returned yet (a receive that was
        #: cancelled, a push that came after its consumer's receive ended): returned first
        self.leftovers: list[Incoming] = []
        self.barrier = _Barrier(channel, timeout)
        #: one batch of confirms in flight at a time (see common.unique_waves)
        self.publishing = asyncio.Lock()
        self.broken = False
        #: the events of the receives waiting on this link: set when it closes or breaks,
        #: so that a wait ends at once instead of running out on a dead connection
        self.waiters: set[asyncio.Event] = set()
        #: subscribed for a worker (``stream``): pushes land in ``leftovers`` and set ``pushed``
        self.streaming = False
        self.pushed = asyncio.Event()
        #: the consumer tag of that subscription
        self.stream_tag: str | None = None

    def read(self, message: DeliveredMessage) -> Incoming:
        """Parse a delivery of this channel (pushed or got) and note its tag."""
        incoming = _parse(message)
        self.unsettled.seen(incoming.tag)
        return incoming

    async def send_acks(self, tags: Sequence[int]) -> None:
        """Queue the acks of ``tags`` (deliveries of this channel that the caller took):
        one ``basic.ack`` with ``multiple`` for those no other unsettled delivery precedes,
        one each for the rest. Nothing waits for the writer: the barrier round trip after
        them proves that they arrived (a channel's frames are sent and handled in order)."""
        last, rest = self.unsettled.split(tags)
        if last is not None:
            await self.channel.basic_ack(last, multiple=True, wait=False)
            self.unsettled.sent([tag for tag in tags if tag <= last])
        for tag in rest:
            await self.channel.basic_ack(tag, wait=False)
            self.unsettled.sent((tag,))

    async def send_requeue(self, tag: int) -> None:
        """Queue a ``basic.nack`` with requeue of ``tag`` (see :meth:`send_acks`)."""
        await self.channel.basic_nack(tag, requeue=True, wait=False)
        self.unsettled.sent((tag,))

    def wake_all(self, _sender: object = None, _exc: BaseException | None = None) -> None:
        for event in self.waiters:
            event.set()

    @property
    def usable(self) -> bool:
        return not (self.broken or self.connection.is_closed or self.channel.is_closed)


class AsyncRabbitQueueBackend(AsyncQueueBackend):
    """The queue ``name`` on RabbitMQ (see ``docs/how-to/queues/rabbitmq.md``)."""

    kind = "rabbitmq"
    capabilities = CAPABILITIES

    def __init__(self, url: BackendURL, *, name: str, **options: Any) -> None:
        self.name = check_backend_name(check_queue_name(name))
        self._settings: Settings = read_settings(url, options, queue=self.name)
        self._timeout = self._settings.timeouts.request
        self._topology = Topology(self.name)
        self._link: _Link | None = None
        self._connecting: asyncio.Lock | None = None
        self._declared: dict[str, float] = {}
        #: requests and clean-ups that outlived their caller (see _request), closing connections
        self._background: set[asyncio.Future[Any]] = set()
        #: close() was called (a receive it interrupts returns [] rather than failing)
        self._closing = False
        #: > 0 once a worker asked to stream (see stream())
        self._stream_prefetch = 0

    def __repr__(self) -> str:
        s = self._settings
        return f"<AsyncRabbitQueueBackend {self.name!r} at {s.host}:{s.port}{s.vhost}>"

    # -- connection -----------------------------------------------------------------------

    def _url(self) -> URL:
        s = self._settings
        return URL.build(
            scheme="amqps" if s.tls else "amqp",
            host=s.host,
            port=s.port,
            user=s.username,
            password=s.password,
            path="/" if s.vhost == "/" else "/" + s.vhost,
            query={"heartbeat": str(s.heartbeat)},
        )

    async def _connected(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            link = self._link
            if link is not None and link.usable:
                return link
            if link is not None:
                self._break(link)
            self._closing = False
            self._link = link = await self._open()
            return link

    async def _open(self) -> _Link:
        s = self._settings
        try:
            connection = await aio_pika.connect(
                self._url(),
                ssl_context=s.tls,
                timeout=s.timeouts.connect,
                client_properties={"connection_name": s.connection_name},
            )
        except asyncio.TimeoutError:
            raise connect_timed_out(s.timeouts.connect) from None
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            raw = await channel.get_underlay_channel()
            link = _Link(connection, raw, self._timeout)
            channel.close_callbacks.add(link.wake_all)
            await raw.basic_qos(prefetch_count=1, timeout=self._timeout)
            for route in self._topology.installed():
                await self._declare(link, route)
        except BaseException:
            await self._close_quietly(connection)
            raise
        return link

    def _break(self, link: _Link) -> None:
        """Stop using ``link`` (lost, or in an unknown state after a missed deadline): its
        connection is closed in the background and its deliveries go back to the queue."""
        link.broken = True
        link.wake_all()
        if self._link is link:
            self._link = None
        if not link.connection.is_closed:
            self._keep(asyncio.ensure_future(self._close_quietly(link.connection)))

    def _keep(self, task: asyncio.Future[Any]) -> None:
        """Hold a background task until it is done (and retrieve its failure)."""
        self._background.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()

    async def _close_quietly(self, connection: aio_pika.abc.AbstractConnection) -> None:
        try:
            await asyncio.wait_for(connection.close(), self._timeout)
        except Exception:  # a connection being discarded
            pass

    async def _request(
        self, link: _Link, request: Any, orphan: Callable[[Any], None] | None = None
    ) -> Any:
        """Await one request of ``link``: a missed deadline or a lost connection breaks the
        link (and raises).

        A caller that is cancelled does not cancel the request: aiormq closes the channel
        when a request waiting for its reply is cancelled (the reply would come later), and
        with the channel every delivery on it. The request goes on in the background and
        ``orphan`` gets its result (a message it got is kept for the next receive)."""
        task = asyncio.ensure_future(request)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the request itself was cancelled: the link is unusable
                self._break(link)
                raise ConnectionError("a request to RabbitMQ was cancelled") from None
            task.add_done_callback(lambda done: self._orphaned(link, done, orphan))
            self._keep(task)
            raise
        except asyncio.TimeoutError:
            self._break(link)
            raise request_timed_out(self._timeout) from None
        except _LINK_ERRORS:
            self._break(link)
            raise

    def _orphaned(
        self, link: _Link, task: asyncio.Future[Any], orphan: Callable[[Any], None] | None
    ) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            self._break(link)
        elif orphan is not None:
            orphan(task.result())

    async def _declare(self, link: _Link, route: Route) -> spec.Queue.DeclareOk:
        ok = await self._request(
            link,
            link.channel.queue_declare(
                route.queue, durable=True, arguments=route.arguments, timeout=self._timeout
            ),
        )
        self._declared[route.queue] = time.monotonic()
        return ok  # type: ignore[no-any-return]

    async def install(self) -> None:
        await self._connected()

    # -- publishing -----------------------------------------------------------------------

    async def _publish(self, link: _Link, route: Route, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` to ``route`` and wait for every confirm; a message returned
        as unroutable (its queue was deleted, or a delay queue expired) is published again
        once after declaring the queue."""
        async with link.publishing:
            if route.delay_ms is not None:
                declared = self._declared.get(route.queue)
                if declared is None or time.monotonic() - declared > REDECLARE_AFTER:
                    await self._declare(link, route)  # renews the delay queue's lease
            pending = list(messages)
            for attempt in range(2):
                returned: list[Outgoing] = []
                for wave in unique_waves(pending):
                    returned += await self._publish_wave(link, route, wave)
                if not returned:
                    return
                if attempt == 0:
                    await self._declare(link, route)
                pending = returned
            raise BackendError(
                f"RabbitMQ could not route {len(pending)} message(s) to queue {route.queue!r}",
                backend="rabbitmq",
                operation="publish",
            )

    async def _publish_wave(
        self, link: _Link, route: Route, wave: list[Outgoing]
    ) -> list[Outgoing]:
        """Publish every message of ``wave`` at once, then wait for all their confirms
        together, within one ``timeout`` for the wave (no timer per message, and no wait for
        each frame's write: its confirm comes after it anyway); the messages returned as
        unroutable. :class:`BackendError` naming the messages the broker refused; a lost
        link: ``ConnectionError`` naming the messages left unconfirmed."""
        try:
            if _batched(link.channel):
                confirms = await _publish_batch(link.channel, route.queue, wave)
                pending: Any = asyncio.gather(*confirms, return_exceptions=True)
            else:
                pending = asyncio.gather(
                    *(
                        link.channel.basic_publish(
                            m.body,
                            exchange="",
                            routing_key=route.queue,
                            properties=_properties(m),
                            mandatory=True,
                            **_NO_DRAIN,
                        )
                        for m in wave
                    ),
                    return_exceptions=True,
                )
            results = await asyncio.wait_for(pending, self._timeout)
        except asyncio.TimeoutError:
            self._break(link)
            raise request_timed_out(self._timeout) from None
        returned: list[Outgoing] = []
        refused: list[Outgoing] = []
        failure: BaseException | None = None
        for message, result in zip(wave, results, strict=True):
            if isinstance(result, aiormq.exceptions.PublishError):
                returned.append(message)
            elif isinstance(result, aiormq.exceptions.DeliveryError):
                refused.append(message)
            elif isinstance(result, asyncio.TimeoutError):
                self._break(link)
                raise request_timed_out(self._timeout)
            elif isinstance(result, BaseException) and failure is None:
                failure = result
        if failure is not None:
            if not isinstance(failure, _LINK_ERRORS):
                raise failure
            self._break(link)
            lost = [
                m.message_id
                for m, r in zip(wave, results, strict=True)
                if isinstance(r, _LINK_ERRORS)
                and not isinstance(r, aiormq.exceptions.DeliveryError)
            ]
            raise ConnectionError(
                unconfirmed_text(route.queue, lost, len(wave))
                + f": {type(failure).__name__}: {failure}"
            ) from failure
        if refused:
            raise BackendError(
                unconfirmed_text(route.queue, [m.message_id for m in refused], len(wave))
                + ": the broker refused them (basic.nack)",
                backend="rabbitmq",
                operation="publish",
            )
        return returned

    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        if not messages:
            return
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        now = time.time()
        outgoing = [fresh(id_, body, headers, now) for id_, body, headers in messages]
        await self._publish(await self._connected(), route, outgoing)

    # -- receiving ------------------------------------------------------------------------

    async def stream(self, prefetch: int) -> bool:
        """Subscribe this client to the queue with ``prefetch`` (a worker receives
        continuously): from then on the broker pushes deliveries into the client's leftovers
        and :meth:`receive` takes them from there, with no ``basic.get`` round trips (a link
        opened again subscribes again)."""
        self._stream_prefetch = max(1, min(int(prefetch), 65535))
        await self._start_stream(await self._connected())
        return True

    async def _start_stream(self, link: _Link) -> None:
        if self._stream_prefetch <= 0 or link.streaming or not link.usable:
            return
        link.streaming = True

        async def on_message(message: DeliveredMessage) -> None:
            link.leftovers.append(link.read(message))
            link.pushed.set()

        try:
            await link.channel.basic_qos(
                prefetch_count=self._stream_prefetch, timeout=self._timeout
            )
            ok = await link.channel.basic_consume(
                self.name, on_message, no_ack=False, timeout=self._timeout
            )
        except (asyncio.TimeoutError, *_LINK_ERRORS):
            self._break(link)
            raise
        link.stream_tag = ok.consumer_tag

    async def unstream(self, consumer: str) -> list[QueuedMessage]:
        """Cancel the subscription of :meth:`stream` and hand ``consumer`` the deliveries it
        pushed that no receive returned (the worker defers them, uncounted). On a broken
        connection they are already back in the queue."""
        self._stream_prefetch = 0
        link = self._live()
        if link is None or not link.streaming:
            return []
        link.streaming = False
        tag, link.stream_tag = link.stream_tag, None
        if tag is not None:
            try:
                await link.channel.basic_cancel(tag, timeout=self._timeout)
            except (asyncio.TimeoutError, *_LINK_ERRORS):
                self._break(link)
                return []
            for _ in range(3):  # a delivery read before the cancel-ok runs its callback first
                await asyncio.sleep(0)
        got = link.leftovers[:]
        del link.leftovers[:]
        return [link.deliveries.hand_out(m, consumer) for m in got]

    async def _receive_streamed(
        self, link: _Link, consumer: str, max_messages: int, wait: float
    ) -> list[QueuedMessage]:
        """Take up to ``max_messages`` pushed deliveries, waiting up to ``wait`` for one."""
        if not link.leftovers and wait > 0:
            link.pushed.clear()
            link.waiters.add(link.pushed)
            try:
                await wait_event(link.pushed, wait)
            finally:
                link.waiters.discard(link.pushed)
            if not link.usable:
                if self._closing:
                    return []
                raise ConnectionError("the connection to RabbitMQ was lost during the wait")
        got = link.leftovers[:max_messages]
        del link.leftovers[:max_messages]
        return [link.deliveries.hand_out(m, consumer) for m in got]

    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        link = await self._connected()
        if self._stream_prefetch > 0:
            await self._start_stream(link)  # again on a new connection
            return await self._receive_streamed(link, consumer, max_messages, wait)
        got = link.leftovers[:max_messages]
        del link.leftovers[:max_messages]
        try:
            await self._get(link, got, max_messages)
            if not got and wait > 0:
                await self._wait_one(link, got, wait)
                if got:
                    await self._get(link, got, max_messages)
        except BaseException:
            if link.usable:  # nothing is lost: the next receive returns them first
                link.leftovers[:0] = got
            raise
        return [link.deliveries.hand_out(m, consumer) for m in got]

    async def _get(self, link: _Link, got: list[Incoming], max_messages: int) -> None:
        """``basic.get`` until ``got`` holds ``max_messages`` or the queue is empty."""
        while len(got) < max_messages:
            reply: DeliveredMessage = await self._request(
                link,
                link.channel.basic_get(self.name, no_ack=False, timeout=self._timeout),
                orphan=lambda late: self._keep_got(link, late),
            )
            if not isinstance(reply.delivery, spec.Basic.GetOk):
                return
            message = link.read(reply)
            got.append(message)
            if message.remaining == 0:
                return

    def _keep_got(self, link: _Link, reply: DeliveredMessage) -> None:
        """A message got for a receive that was cancelled meanwhile: the next one returns it."""
        if isinstance(reply.delivery, spec.Basic.GetOk) and link.usable:
            link.leftovers.append(link.read(reply))

    async def _wait_one(self, link: _Link, got: list[Incoming], wait: float) -> None:
        """Wait up to ``wait`` seconds for the broker to push one message to a consumer of
        prefetch 1, and append it to ``got``. However the wait ends (a push, the time, a
        cancelled receive, a lost connection), the consumer is cancelled, and a message
        pushed to it that this receive does not return is kept for the next one."""
        arrived = asyncio.Event()
        sink = [got]  # where pushes go: ``got`` while this receive may still return them

        async def on_message(message: DeliveredMessage) -> None:
            sink[0].append(link.read(message))
            arrived.set()

        consuming = asyncio.ensure_future(
            link.channel.basic_consume(self.name, on_message, no_ack=False, timeout=self._timeout)
        )
        link.waiters.add(arrived)
        try:
            try:
                await asyncio.shield(consuming)
                if link.usable:
                    await wait_event(arrived, wait)
            finally:
                link.waiters.discard(arrived)
                ending = asyncio.ensure_future(self._end_consumer(link, consuming))
            await asyncio.shield(ending)
        except BaseException:
            sink[0] = link.leftovers  # receive() keeps what is in ``got`` already
            self._keep(ending)
            raise
        sink[0] = link.leftovers
        if not link.usable:  # what it delivered went back to the queue with the channel
            got.clear()
            if not self._closing:
                raise ConnectionError("the connection to RabbitMQ was lost during the wait")

    async def _end_consumer(self, link: _Link, consuming: asyncio.Future[Any]) -> None:
        """Cancel the consumer ``consuming`` started (once it started) and let the callback
        of a delivery that came before the cancel-ok run."""
        try:
            ok = await consuming
        except BaseException:
            if not consuming.cancelled():
                self._break(link)
            return
        if not link.usable:
            return
        try:
            await link.channel.basic_cancel(ok.consumer_tag, timeout=self._timeout)
        except (asyncio.TimeoutError, *_LINK_ERRORS):
            self._break(link)
            return
        for _ in range(3):  # a delivery read before the cancel-ok runs its callback first
            await asyncio.sleep(0)

    # -- settling -------------------------------------------------------------------------

    def _live(self) -> _Link | None:
        link = self._link
        return link if link is not None and link.usable else None

    async def _settled(self, link: _Link, settle: Any) -> bool:
        """Send a settlement (ack, nack) and wait for the barrier; False if the link failed."""
        try:
            await settle
            await link.barrier.wait()
        except (asyncio.TimeoutError, *_LINK_ERRORS):
            self._break(link)
            return False
        return True

    async def ack(self, receipt: str, consumer: str) -> bool:
        link = self._live()
        message = link.deliveries.take(receipt, consumer) if link is not None else None
        if link is None or message is None:
            return False
        return await self._settled(link, link.send_acks((message.tag,)))

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """Ack every delivery of ``items``, then wait for ONE barrier round trip for all."""
        link = self._live()
        if link is None:
            return [False] * len(items)
        taken = [link.deliveries.take(receipt, consumer) for receipt, consumer in items]
        tags = [message.tag for message in taken if message is not None]
        try:
            if tags:
                await link.send_acks(tags)
                await link.barrier.wait()
        except (asyncio.TimeoutError, *_LINK_ERRORS):
            self._break(link)
            return [False] * len(items)
        return [message is not None for message in taken]

    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        link = self._live()
        message = link.deliveries.take(receipt, consumer) if link is not None else None
        if link is None or message is None:
            return False
        if delay <= 0 and error is None:  # the broker requeues it in place and counts it
            return await self._settled(link, link.send_requeue(message.tag))
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        return await self._republish(link, message, consumer, route, retry_copy(message, error))

    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """Republish the message (to the delay queue of ``delay``, or the queue) with the
        deliveries before this one, then ack this delivery: not counted."""
        link = self._live()
        message = link.deliveries.take(receipt, consumer) if link is not None else None
        if link is None or message is None:
            return False
        route = self._topology.delay(delay) if delay > 0 else self._topology.main
        return await self._republish(link, message, consumer, route, defer_copy(message))

    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        link = self._live()
        message = link.deliveries.take(receipt, consumer) if link is not None else None
        if link is None or message is None:
            return False
        copy = dead_copy(message, error, time.time())
        return await self._republish(link, message, consumer, self._topology.dead_route, copy)

    async def _republish(
        self, link: _Link, message: Incoming, consumer: str, route: Route, copy: Outgoing
    ) -> bool:
        """Publish ``copy`` to ``route`` (confirmed), then ack the delivery ``message``."""
        try:
            await self._publish(link, route, [copy])
        except BaseException:
            if link.usable:
                link.deliveries.put_back(message, consumer)
            raise
        return await self._settled(link, link.send_acks((message.tag,)))

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        link = self._live()
        if link is None:
            return [False] * len(items)
        try:  # one round trip: is the channel that holds the deliveries still there?
            await link.barrier.wait()
        except (asyncio.TimeoutError, *_LINK_ERRORS):
            self._break(link)
            return [False] * len(items)
        return [link.deliveries.holds(receipt, consumer) for receipt, consumer, _ in items]

    # -- dead letters, stats, maintenance --------------------------------------------------

    async def stats(self) -> QueueStats:
        link = await self._connected()
        ready = await self._declare(link, self._topology.main)
        dead = await self._declare(link, self._topology.dead_route)
        return QueueStats(
            ready=ready.message_count or 0,
            delayed=None,
            in_flight=None,
            dead=dead.message_count or 0,
        )

    async def _get_dead(self, link: _Link) -> Incoming | None:
        reply: DeliveredMessage = await self._request(
            link,
            link.channel.basic_get(self._topology.dead, no_ack=False, timeout=self._timeout),
        )
        return link.read(reply) if isinstance(reply.delivery, spec.Basic.GetOk) else None

    async def _requeue_tags(self, link: _Link, tags: list[int]) -> None:
        """Give peeked messages back (to their places) and wait until the broker has them:
        without the round trip, a count or a get right after could miss them."""
        if link.usable and tags:
            for tag in tags:
                await self._request(link, link.send_requeue(tag))
            await self._request(link, link.barrier.wait())

    async def names(self, limit: int) -> list[str]:
        raise ConfigurationError(RABBITMQ_NAMES, argument="url")

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        link = await self._connected()
        found: list[Incoming] = []
        try:
            while len(found) < limit:
                message = await self._get_dead(link)
                if message is None:
                    break
                found.append(message)
        finally:  # a peek: every one goes back, in its place
            await self._requeue_tags(link, [m.tag for m in found])
        return [m.dead_letter() for m in found]

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        wanted = None if ids is None else set(ids)
        link = await self._connected()
        kept: list[int] = []
        batch: list[Incoming] = []
        moved = 0
        try:
            # every dead letter is got once: moved ones are acked, kept ones stay unacked
            # until the end, so the loop ends when the dead letters are exhausted
            while (message := await self._get_dead(link)) is not None:
                if wanted is None or message.id in wanted:
                    batch.append(message)
                else:
                    kept.append(message.tag)
                if len(batch) >= _REQUEUE_BATCH:
                    moved += await self._move(link, batch)
            moved += await self._move(link, batch)
        finally:
            await self._requeue_tags(link, kept + [m.tag for m in batch])
        return moved

    async def _move(self, link: _Link, batch: list[Incoming]) -> int:
        """Publish the dead letters ``batch`` to the queue (confirmed), then ack them."""
        if not batch:
            return 0
        now = time.time()
        await self._publish(link, self._topology.main, [requeue_copy(m, now) for m in batch])
        await self._request(link, link.send_acks([message.tag for message in batch]))
        moved = len(batch)
        batch.clear()
        await self._request(link, link.barrier.wait())
        return moved

    async def purge(self) -> int:
        link = await self._connected()
        count = 0
        # this client's own deliveries are part of the queue: settle them as deleted
        tags = [*link.deliveries.take_all(), *(m.tag for m in link.leftovers)]
        if tags:
            await self._request(link, link.send_acks(tags))
            count += len(tags)
        link.leftovers.clear()
        for queue in (self.name, self._topology.dead):
            ok = await self._request(link, link.channel.queue_purge(queue, timeout=self._timeout))
            count += ok.message_count or 0
        count += await self._delete_delay_queues(link)
        await self._request(link, link.barrier.wait())
        return count

    async def _delete_delay_queues(self, link: _Link) -> int:
        """Delete every delay queue of this queue (deleting a missing queue is a no-op; a
        publish into a deleted one is returned and declares it again)."""
        count = 0
        for queue in self._topology.delay_queues():
            ok = await self._request(link, link.channel.queue_delete(queue, timeout=self._timeout))
            count += ok.message_count or 0
            self._declared.pop(queue, None)
        return count

    async def drop(self) -> None:
        link = await self._connected()
        await self._delete_delay_queues(link)
        for queue in (self.name, self._topology.dead):
            await self._request(link, link.channel.queue_delete(queue, timeout=self._timeout))
        self._declared.clear()
        self._break(link)  # the next call connects again and declares the queue anew

    async def close(self) -> None:
        self._closing = True
        link, self._link = self._link, None
        if link is not None:
            link.broken = True
            link.wake_all()
            await self._close_quietly(link.connection)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def after_fork(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            forks.keep(link.connection)  # the parent's: neither used nor closed here
        self._connecting = None
        self._background = set()
