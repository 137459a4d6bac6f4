"""What the two RabbitMQ queue clients share, with no driver import: the connection settings
read from the URL and options, the server objects of a queue and their arguments, the delay
buckets, the message headers jobfence writes and reads, and the bookkeeping of deliveries and
receipts.

``queue_aio.py`` (aio-pika) and ``queue_pika.py`` (pika) only move bytes: every decision
about names, arguments, headers, delivery counts and receipt ownership is made here, once.

Server objects of the queue ``N`` (all on the default exchange, so no exchange or binding is
ever created)::

    N                 quorum queue: the messages; dead-letters (RabbitMQ's own dead-lettering,
                      e.g. a delivery limit) to N.dead, at least once
    N.dead            classic queue: the dead letters, in the order they died
    N.delay.<ms>      quorum queue per delay bucket: x-message-ttl <ms>, dead-letters to N
                      at least once when the ttl passes; x-expires removes it when idle
"""

from __future__ import annotations

import bisect
import math
import os
import ssl
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

from ..._core.options import Timeouts, option_int, option_timeouts, reject_unknown
from ..._core.url import BackendURL
from ...errors import ConfigurationError
from ..base import DeadLetter, QueueCapabilities, QueuedMessage

__all__ = [
    "CAPABILITIES",
    "DEFAULT_HEARTBEAT",
    "DELAY_BUCKETS",
    "MAX_DELAY_MS",
    "Deliveries",
    "Incoming",
    "Outgoing",
    "Route",
    "Settings",
    "Topology",
    "Unsettled",
    "check_backend_name",
    "dead_copy",
    "delay_bucket",
    "fresh",
    "parse_incoming",
    "read_settings",
    "requeue_copy",
    "retry_copy",
    "unique_waves",
]

CAPABILITIES = QueueCapabilities(cross_process=True, visibility_timeout=False, server_wakeup=True)

#: the options this backend reads (URL query or keyword; ``ssl_context`` is keyword only)
OPTIONS = (
    "connect_timeout",
    "timeout",
    "heartbeat",
    "cafile",
    "certfile",
    "keyfile",
    "ssl_context",
)
#: seconds between heartbeats (both sides close a connection that missed two)
DEFAULT_HEARTBEAT = 30
MAX_HEARTBEAT = 3600

# -- server objects ------------------------------------------------------------------------

DEAD_SUFFIX = ".dead"
DELAY_INFIX = ".delay."
#: a delay queue outlives its last use by its ttl plus this (it is re-declared, which renews
#: its lease, at most REDECLARE_AFTER before a publish into it)
DELAY_EXPIRY_MARGIN_MS = 300_000
#: seconds after which a client declares a delay queue again before publishing into it
REDECLARE_AFTER = 60.0

# Delays are rounded UP to a bucket (so a message is never delivered early), each bucket one
# queue: mantissas of at most 20 % apart in every decade, from 10 ms to 46 days. A fixed set
# of names lets purge() and drop() reach the delay queues every client created.
_MANTISSAS = (
    10,
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    22,
    25,
    30,
    35,
    40,
    45,
    50,
    60,
    70,
    80,
    90,
)
#: the longest delay (RabbitMQ's message ttl is at most 2**32 - 1 ms)
MAX_DELAY_MS = 4_000_000_000
DELAY_BUCKETS: tuple[int, ...] = tuple(
    sorted(m * 10**e for e in range(9) for m in _MANTISSAS if m * 10**e <= MAX_DELAY_MS)
)


def delay_bucket(seconds: float) -> int:
    """The delay bucket (milliseconds) of a delay of ``seconds`` > 0: the smallest bucket that
    is not shorter. ``ConfigurationError`` beyond the longest."""
    wanted = math.ceil(round(seconds * 1000.0, 3))
    index = bisect.bisect_left(DELAY_BUCKETS, wanted)
    if index == len(DELAY_BUCKETS):
        raise ConfigurationError(
            f"delay must be at most {MAX_DELAY_MS // 1000} seconds on RabbitMQ, got {seconds!r}",
            argument="delay",
        )
    return DELAY_BUCKETS[index]


@dataclass(frozen=True)
class Route:
    """Where a publish goes: the queue (on the default exchange) and how to declare it."""

    queue: str
    arguments: dict[str, Any]
    #: the delay bucket of a delay queue (it expires when idle, so it is re-declared)
    delay_ms: int | None = None


class Topology:
    """The names and declarations of the server objects of the queue ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dead = name + DEAD_SUFFIX
        # Messages RabbitMQ dead-letters itself (a quorum queue's delivery limit) land in the
        # dead letters too; at-least-once dead-lettering needs x-overflow=reject-publish.
        self.main = Route(
            name,
            {
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.dead,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )
        # Classic: peeking (get, then requeue) must never count toward a quorum queue's
        # delivery limit, which would drop a dead letter that has nowhere left to go.
        self.dead_route = Route(self.dead, {"x-queue-type": "classic"})

    def delay(self, seconds: float) -> Route:
        """The delay queue of a delay of ``seconds`` (rounded up to its bucket)."""
        ms = delay_bucket(seconds)
        return Route(
            f"{self.name}{DELAY_INFIX}{ms}",
            {
                "x-queue-type": "quorum",
                "x-message-ttl": ms,
                "x-expires": ms + DELAY_EXPIRY_MARGIN_MS,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.name,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
            delay_ms=ms,
        )

    def delay_queues(self) -> list[str]:
        """The name of every delay queue this queue can have (for purge and drop)."""
        return [f"{self.name}{DELAY_INFIX}{ms}" for ms in DELAY_BUCKETS]

    def installed(self) -> tuple[Route, Route]:
        """The queues every client declares when it connects."""
        return self.main, self.dead_route


RABBITMQ_NAMES = (
    "RabbitMQ cannot list queue names over AMQP: listing needs the management API "
    "(rabbitmqctl list_queues, or the management plugin's HTTP API); pass the queue names"
)


def check_backend_name(name: str) -> str:
    """A validated queue name must also not be one of another queue's server objects."""
    if name.endswith(DEAD_SUFFIX) or DELAY_INFIX in name:
        raise ConfigurationError(
            f"name {name!r}: on RabbitMQ a queue name may not end with {DEAD_SUFFIX!r} nor "
            f"contain {DELAY_INFIX!r} (those name the dead letters and delays of a queue)",
            argument="name",
        )
    return name


# -- connection settings -------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How to reach the broker, parsed once from the URL and the options."""

    host: str
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    #: the TLS context of an ``amqps://`` URL, else None
    tls: ssl.SSLContext | None
    timeouts: Timeouts
    heartbeat: int
    #: shown in the management UI (``connection_name`` client property)
    connection_name: str


def read_settings(url: BackendURL, options: Mapping[str, Any], *, queue: str) -> Settings:
    """The settings of ``url`` with the keyword ``options``; ``ConfigurationError`` naming the
    first unknown or invalid option."""
    reject_unknown({**url.options, **options}, OPTIONS, "rabbitmq queue")
    if "ssl_context" in url.options:
        raise ConfigurationError(
            "ssl_context is a keyword option (an ssl.SSLContext), not a URL option",
            argument="ssl_context",
        )

    def get(option: str) -> Any:
        return options.get(option, url.options.get(option))

    timeouts = option_timeouts(options, url.options)
    raw_heartbeat = get("heartbeat")
    heartbeat = (
        DEFAULT_HEARTBEAT
        if raw_heartbeat is None
        else option_int(raw_heartbeat, "heartbeat", 0, MAX_HEARTBEAT)
    )
    tls = url.scheme == "amqps"
    tls_options = [o for o in ("cafile", "certfile", "keyfile", "ssl_context") if get(o)]
    if tls_options and not tls:
        raise ConfigurationError(
            f"{tls_options[0]} needs an amqps:// URL (TLS); the URL is {url.masked}",
            argument=tls_options[0],
        )
    context: ssl.SSLContext | None = None
    if tls:
        given = get("ssl_context")
        if given is not None and not isinstance(given, ssl.SSLContext):
            raise ConfigurationError(
                f"ssl_context must be an ssl.SSLContext, got {type(given).__name__}",
                argument="ssl_context",
            )
        if given is not None and (get("cafile") or get("certfile") or get("keyfile")):
            raise ConfigurationError(
                "give either ssl_context or cafile/certfile/keyfile, not both",
                argument="ssl_context",
            )
        context = given or _tls_context(get("cafile"), get("certfile"), get("keyfile"))
    path = urlsplit(url.raw).path
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    return Settings(
        host=url.host or "localhost",
        port=url.port or (5671 if tls else 5672),
        vhost=vhost,
        username=url.username or "guest",
        password=url.password or "guest",
        tls=context,
        timeouts=timeouts,
        heartbeat=heartbeat,
        connection_name=f"jobfence queue {queue} (pid {os.getpid()})",
    )


def _tls_context(cafile: str | None, certfile: str | None, keyfile: str | None) -> ssl.SSLContext:
    if keyfile and not certfile:
        raise ConfigurationError("keyfile needs certfile", argument="keyfile")
    try:
        context = ssl.create_default_context(cafile=cafile or None)
        if certfile:
            context.load_cert_chain(certfile, keyfile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load the TLS files (cafile/certfile/keyfile): {exc}", argument="cafile"
        ) from None
    return context


# -- headers -------------------------------------------------------------------------------

#: jobfence's own headers (every name starting with ``x-jobfence-`` is reserved)
H_PREFIX = "x-jobfence-"
H_ID = "x-jobfence-id"  # the id, when it is too long for the message_id property
H_DELIVERIES = "x-jobfence-deliveries"  # deliveries before a republish (nack, dead letter)
H_ERROR = "x-jobfence-error"
H_PUBLISHED = "x-jobfence-published-at"  # epoch milliseconds of the first publish
H_DEAD_AT = "x-jobfence-dead-at"  # epoch milliseconds
#: headers RabbitMQ writes itself
_BROKER_HEADERS = ("x-delivery-count", "x-acquired-count", "x-death")
_BROKER_PREFIXES = ("x-first-death-", "x-last-death-", H_PREFIX)
#: the longest error text kept, in bytes of UTF-8 (a message's headers travel in one frame)
MAX_ERROR_BYTES = 8192
#: the longest message_id property (an AMQP short string)
_MAX_MESSAGE_ID_BYTES = 255
#: the longest header name (an AMQP field name; aio-pika would silently cut a longer one)
MAX_HEADER_NAME_BYTES = 128
#: the most bytes a message's headers may take when published: all of them travel in the
#: message's content header, which must fit in one AMQP frame (128 KiB on a default broker,
#: or RabbitMQ closes the connection), with room left for the error and counts jobfence adds
MAX_HEADER_BYTES = 100_000


def is_reserved_header(name: str) -> bool:
    """Whether ``name`` is a header jobfence or RabbitMQ writes (not a user header)."""
    return name in _BROKER_HEADERS or name.startswith(_BROKER_PREFIXES)


@dataclass(frozen=True)
class Outgoing:
    """One message to publish, in driver-neutral form."""

    id: str
    body: bytes
    #: the ``message_id`` property (None when the id is too long: then it is in ``headers``)
    message_id: str | None
    headers: dict[str, Any]
    #: the ``timestamp`` property, epoch seconds
    timestamp: int


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _build(
    id_: str,
    body: bytes,
    user: Mapping[str, str],
    published_ms: int,
    extra: Mapping[str, Any] | None = None,
) -> Outgoing:
    headers: dict[str, Any] = dict(user)
    message_id: str | None = id_
    if len(id_.encode("utf-8")) > _MAX_MESSAGE_ID_BYTES:
        headers[H_ID] = id_
        message_id = None
    headers[H_PUBLISHED] = published_ms
    headers.update(extra or {})
    return Outgoing(id_, body, message_id, headers, published_ms // 1000)


def _table_bytes(headers: Mapping[str, Any]) -> int:
    """The size of ``headers`` encoded as an AMQP field table (string values; numbers are
    counted as 9 bytes)."""
    size = 4
    for name, value in headers.items():
        size += 2 + len(name.encode("utf-8", "replace"))
        size += 5 + len(value.encode("utf-8", "replace")) if isinstance(value, str) else 9
    return size


def fresh(id_: str, body: bytes, headers: Mapping[str, str], now: float) -> Outgoing:
    """A message as ``publish`` sends it. ``ConfigurationError`` (argument ``headers``) for a
    reserved header name, a name longer than an AMQP field name, or headers too large for one
    AMQP frame."""
    for name in headers:
        if is_reserved_header(name):
            raise ConfigurationError(
                f"header {name!r} is reserved on RabbitMQ (x-jobfence-*, x-delivery-count, "
                "x-acquired-count, x-death, x-first-death-*, x-last-death-*)",
                argument="headers",
            )
        if len(name.encode("utf-8", "replace")) > MAX_HEADER_NAME_BYTES:
            raise ConfigurationError(
                f"header {name[:40]!r}...: names may have at most {MAX_HEADER_NAME_BYTES} bytes "
                "on RabbitMQ (an AMQP field name)",
                argument="headers",
            )
    message = _build(id_, body, headers, _ms(now))
    size = _table_bytes(message.headers)
    if size > MAX_HEADER_BYTES:
        raise ConfigurationError(
            f"the headers (and a long id) of message {id_[:80]!r} take {size} bytes; at most "
            f"{MAX_HEADER_BYTES} fit in one AMQP frame on RabbitMQ",
            argument="headers",
        )
    return message


def _error_text(error: str | None) -> str | None:
    if error is None:
        return None
    return error.encode("utf-8", "replace")[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


def retry_copy(message: Incoming, error: str | None) -> Outgoing:
    """The copy a ``nack`` republishes: the same message with its deliveries so far and the
    error (the earlier one if ``error`` is None)."""
    extra: dict[str, Any] = {H_DELIVERIES: message.delivery}
    text = _error_text(error) if error is not None else message.last_error
    if text is not None:
        extra[H_ERROR] = text
    return _build(message.id, message.body, message.headers, message.published_ms, extra)


def defer_copy(message: Incoming) -> Outgoing:
    """The copy a ``defer`` republishes: the same message with the deliveries BEFORE this one
    (its next delivery has this delivery's number again) and its last error kept. Always a
    republish, never a requeue in place: the broker would count the return."""
    extra: dict[str, Any] = {H_DELIVERIES: max(message.delivery - 1, 0)}
    if message.last_error is not None:
        extra[H_ERROR] = message.last_error
    return _build(message.id, message.body, message.headers, message.published_ms, extra)


def dead_copy(message: Incoming, error: str | None, now: float) -> Outgoing:
    """The dead letter of ``message``: its deliveries, the error and when it died."""
    extra: dict[str, Any] = {H_DELIVERIES: message.delivery, H_DEAD_AT: _ms(now)}
    text = _error_text(error)
    if text is not None:
        extra[H_ERROR] = text
    return _build(message.id, message.body, message.headers, message.published_ms, extra)


def requeue_copy(message: Incoming, now: float) -> Outgoing:
    """A dead letter published again: a fresh message (no deliveries, no error)."""
    return _build(message.id, message.body, message.headers, _ms(now))


#: the most message ids an error about unconfirmed messages lists
LISTED_IDS = 20


def unconfirmed_text(queue: str, ids: Sequence[str | None], total: int) -> str:
    """The start of the error of a publish whose messages ``ids`` (of ``total`` published
    together) were not confirmed: how many, and which (the first ``LISTED_IDS``). The
    others of the batch were confirmed: the broker has them."""
    shown = ", ".join(repr(i) for i in ids[:LISTED_IDS])
    more = f" and {len(ids) - LISTED_IDS} more" if len(ids) > LISTED_IDS else ""
    return (
        f"RabbitMQ did not confirm {len(ids)} of the {total} message(s) published to queue "
        f"{queue!r} (ids {shown}{more}; the others are confirmed)"
    )


def unique_waves(messages: Sequence[Outgoing]) -> Iterator[list[Outgoing]]:
    """``messages`` in order, cut into runs without a repeated ``message_id``: aio-pika's
    driver matches a returned (unroutable) message to its publish by ``message_id``, so one
    run of confirms in flight must not hold the same id twice."""
    wave: list[Outgoing] = []
    seen: set[str] = set()
    for message in messages:
        if message.message_id in seen:  # (None: the driver makes up a unique one)
            yield wave
            wave, seen = [], set()
        wave.append(message)
        if message.message_id is not None:
            seen.add(message.message_id)
    if wave:
        yield wave


# -- deliveries ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Incoming:
    """One delivery read from the broker, parsed (driver-neutral)."""

    tag: int
    id: str
    body: bytes
    #: the user's headers (jobfence's and RabbitMQ's own removed)
    headers: dict[str, str]
    #: 1 on the first delivery
    delivery: int
    last_error: str | None
    published_ms: int
    #: messages left in the queue after this one (``basic.get`` only), else None
    remaining: int | None
    #: the dead letter's fields (for a message read from the dead letters)
    dead_deliveries: int
    dead_error: str | None
    dead_at: float | None

    def queued(self, receipt: str) -> QueuedMessage:
        return QueuedMessage(
            id=self.id,
            body=self.body,
            headers=dict(self.headers),
            delivery=self.delivery,
            receipt=receipt,
            published_at=self.published_ms / 1000.0,
            last_error=self.last_error,
        )

    def dead_letter(self) -> DeadLetter:
        return DeadLetter(
            id=self.id,
            body=self.body,
            headers=dict(self.headers),
            deliveries=self.dead_deliveries,
            error=self.dead_error,
            dead_at=self.dead_at,
        )


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _epoch(value: Any) -> float | None:
    """Seconds since the epoch of an AMQP timestamp (aiormq: a datetime; pika: an int)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return float(value.timestamp())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def parse_incoming(
    *,
    tag: int,
    body: bytes,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    timestamp: Any,
    redelivered: bool,
    remaining: int | None,
) -> Incoming:
    """Parse one delivery.

    ``delivery`` = 1 + the deliveries carried over by jobfence's republishes
    (``x-jobfence-deliveries``) + the broker's redeliveries of this copy: the quorum queue's
    ``x-delivery-count`` (every return: a nack with requeue, a consumer whose channel closed;
    RabbitMQ 4 counts all of them in ``x-acquired-count``), at least 1 if ``redelivered``.
    """
    raw: Mapping[str, Any] = headers or {}
    user = {str(k): _text(v) for k, v in raw.items() if not is_reserved_header(str(k))}
    id_ = raw.get(H_ID)
    id_text = _text(id_) if id_ is not None else (message_id or "")
    carried = _int(raw.get(H_DELIVERIES))
    counted = max(_int(raw.get("x-delivery-count")), _int(raw.get("x-acquired-count")))
    broker = max(counted, 1 if redelivered else 0)
    error = raw.get(H_ERROR)
    published = raw.get(H_PUBLISHED)
    if published is not None:
        published_ms = _int(published)
    else:
        seconds = _epoch(timestamp)
        published_ms = _ms(seconds) if seconds is not None else 0
    dead_at_ms = raw.get(H_DEAD_AT)
    if dead_at_ms is not None:  # dead-lettered by jobfence
        dead_deliveries = carried
        dead_error = _text(error) if error is not None else None
        dead_at: float | None = _int(dead_at_ms) / 1000.0
    else:  # by RabbitMQ (a delivery limit, a policy): its x-death header says why and when
        # (not ``redelivered``: peeking at the dead letters sets it)
        dead_deliveries = 1 + carried + counted
        reason = raw.get("x-first-death-reason")
        dead_error = f"dead-lettered by RabbitMQ: {_text(reason)}" if reason else None
        dead_at = _death_time(raw.get("x-death"))
    return Incoming(
        tag=tag,
        id=id_text,
        body=bytes(body),
        headers=user,
        delivery=1 + carried + broker,
        last_error=_text(error) if error is not None else None,
        published_ms=published_ms,
        remaining=remaining,
        dead_deliveries=dead_deliveries,
        dead_error=dead_error,
        dead_at=dead_at,
    )


def _death_time(deaths: Any) -> float | None:
    if isinstance(deaths, (list, tuple)) and deaths and isinstance(deaths[0], Mapping):
        return _epoch(deaths[0].get("time"))
    return None


class Deliveries:
    """The deliveries handed out on one channel and not settled yet.

    A receipt names the channel's incarnation (random, new for every channel a client opens)
    and the delivery tag, and the delivery is kept with the consumer it was handed to. So a
    receipt from a channel that is gone, from another client, or presented by another consumer
    is refused without asking the broker -- acking an unknown delivery tag would make
    RabbitMQ close the channel, and with it every other delivery on it.
    """

    def __init__(self) -> None:
        self.incarnation = uuid.uuid4().hex[:16]
        self._open: dict[int, tuple[str, Incoming]] = {}

    def hand_out(self, message: Incoming, consumer: str) -> QueuedMessage:
        self._open[message.tag] = (consumer, message)
        return message.queued(f"{self.incarnation}:{message.tag}")

    def _tag(self, receipt: str) -> int | None:
        incarnation, _, tag = receipt.rpartition(":")
        if incarnation != self.incarnation or not tag.isdigit():
            return None
        return int(tag)

    def holds(self, receipt: str, consumer: str) -> bool:
        """Whether ``receipt`` is an open delivery of ``consumer`` on this channel."""
        tag = self._tag(receipt)
        entry = self._open.get(tag) if tag is not None else None
        return entry is not None and entry[0] == consumer

    def take(self, receipt: str, consumer: str) -> Incoming | None:
        """Remove and return the delivery ``receipt`` if it is ``consumer``'s, else None (so
        two calls never settle one delivery twice)."""
        if not self.holds(receipt, consumer):
            return None
        return self._open.pop(int(receipt.rpartition(":")[2]))[1]

    def put_back(self, message: Incoming, consumer: str) -> None:
        """Undo :meth:`take` (the settlement failed before it reached the broker)."""
        self._open[message.tag] = (consumer, message)

    def take_all(self) -> list[int]:
        """Remove every open delivery (purge settles them); their tags."""
        tags = list(self._open)
        self._open.clear()
        return tags

    def __len__(self) -> int:
        return len(self._open)


class Unsettled:
    """The delivery tags of one channel that may still be unsettled at the broker, so that a
    batch of acks can go as one ``basic.ack`` with ``multiple`` where that settles nothing
    else.

    RabbitMQ numbers a channel's deliveries (pushed and got alike) 1, 2, 3, ... in the order
    it sends them, and ``multiple`` settles every unsettled delivery up to its tag. Every tag
    up to the highest one read counts as unsettled until its own settlement has been sent --
    also a tag whose delivery was never read (the reply of a request whose caller went away)
    -- so a ``multiple`` ack never covers a delivery held elsewhere (a handler still running,
    a peeked dead letter, a delivery being republished before its ack). A settlement is
    recorded only once its frame is queued, in order, behind any earlier one.
    """

    def __init__(self) -> None:
        self._highest = 0
        self._open: set[int] = set()

    def seen(self, tag: int) -> None:
        """A delivery with ``tag`` was read (every lower tag was delivered before it)."""
        if tag > self._highest:
            self._open.update(range(self._highest + 1, tag + 1))
            self._highest = tag

    def sent(self, tags: Sequence[int]) -> None:
        """The settlements of ``tags`` (one each, or one ``multiple`` ack) were sent."""
        self._open.difference_update(tags)

    def split(self, tags: Sequence[int]) -> tuple[int | None, list[int]]:
        """How to ack ``tags`` (this caller's, all unsettled): ``(last, rest)``, where one ack
        with ``multiple`` at ``last`` settles exactly the tags of ``tags`` up to ``last`` (no
        other unsettled tag is below it), and ``rest`` (ascending) are acked one by one.
        ``last`` is None when ``multiple`` would not save a frame."""
        mine = set(tags)
        others = [tag for tag in self._open if tag not in mine]
        first_other = min(others) if others else None
        ordered = sorted(mine)
        if first_other is None:
            below, rest = ordered, []
        else:
            cut = bisect.bisect_left(ordered, first_other)
            below, rest = ordered[:cut], ordered[cut:]
        if len(below) < 2:
            return None, ordered
        return below[-1], rest

    def __len__(self) -> int:
        return len(self._open)
