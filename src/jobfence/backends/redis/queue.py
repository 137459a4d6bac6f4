# Generated from backends/redis/queue_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``redis://`` / ``rediss://`` -- the Redis queue backend, on Redis Streams
(``queue_async.py``; ``queue.py`` is generated from it).

Every verb is ONE Lua script (``lua/queue_*.lua`` after ``lua/queue_lib*.lua``, loaded as each
connection opens, run by ``EVALSHA``): one round trip, atomic on the server, owner-checked
there, timed by the server's clock (``TIME``). Only a waiting :meth:`receive` adds a command:
between two runs of its script it blocks in ``XREAD BLOCK`` on the stream, which returns as
soon as any client appends an entry (a publish, a nack, a requeue, or a receive moving due
delayed messages in), bounded by the next delayed message's due time or visibility deadline
the script reported. An idle waiter costs three commands per wait (script, ``XREAD``,
script), however long the wait, up to 80% of ``timeout`` per ``XREAD``.

Keys of queue ``Q`` in namespace ``S`` (``Q`` between braces: one Redis Cluster hash tag; built
by ``keys.py``, which percent-encodes a namespace holding a brace and marks the tag:
``S':q%:{Q}:s``, ...):

=================  =======  ========================================================
``S:q:{Q}:s``      STREAM   ready and in-flight messages; consumer group ``jobfence``
``S:q:{Q}:f``      ZSET     entry id of each delivery in flight -> visibility deadline
``S:q:{Q}:o``      HASH     entry id -> ``"<delivery>:<consumer>"`` (the owner check)
``S:q:{Q}:d``      ZSET     delayed messages -> due time
``S:q:{Q}:ds``     STREAM   the delayed messages' fields
``S:q:{Q}:dead``   STREAM   dead letters, oldest first
``S:q:{Q}:m``      HASH     call id -> result of a recent call (re-sent calls)
``S:q:{Q}:mx``     ZSET     call id -> when its result is forgotten (60 s); a publish's
                            call id is here alone (its result follows from its arguments)
=================  =======  ========================================================

A receipt is ``"<stream entry id>:<delivery>"``: unique per delivery, since a redelivery
after the visibility keeps the entry and counts up, and a nack appends a new entry.

Options (URL query or keyword): ``namespace`` (key prefix, default ``jobfence``),
``max_dead_letters`` (0, the default: keep every dead letter; else the oldest beyond it are
trimmed), ``connect_timeout`` and ``timeout`` (seconds, default 5 each); every other keyword,
and the URL's query options, go to redis-py with the defaults of ``connect_redis``
(``client_async.py`` / ``client.py``: one immediate retry on a connection error). Every
script is safe to re-send after a lost reply: each call carries a random call id, and a
script that changed something records its result under it for 60 s, so the re-send answers
the same and changes nothing again. Requires Redis >= 6.0, like the other Redis parts
(Streams, and scripts that read ``TIME`` before they write).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..._core.clock import get_clock
from ..._core.options import option_int
from ..._core.sqlfiles import load_lua
from ..._core.url import BackendURL
from ..._core.validate import check_namespace, check_queue_name
from ...errors import ConfigurationError
from ..base import (
    DeadLetter,
    QueueBackend,
    QueueCapabilities,
    QueuedMessage,
    QueueStats,
    RenewItem,
)
from . import NAMESPACE_LIMIT
from . import keys as key_layout
from .client import (
    LuaScript,
    adopt_redis,
    client_socket_timeout,
    connect_redis,
    forget_connections,
    is_cluster,
)

__all__ = ["RedisQueueBackend"]

CAPABILITIES = QueueCapabilities(cross_process=True, visibility_timeout=True, server_wakeup=True)

#: options this backend reads itself (never handed to redis-py)
OWN_OPTIONS = ("namespace", "max_dead_letters")
#: the consumer group of every queue stream (created with the stream)
GROUP = "jobfence"
#: due delayed messages one receive moves into the stream at most
MOVE_LIMIT = 1000
#: dead letters one requeue script call looks at
REQUEUE_PAGE = 500
#: an XREAD BLOCK lasts at most this fraction of the socket timeout (the reply must beat it)
_BLOCK_SHARE = 0.8
#: the largest max_dead_letters
_MAX_DEAD_LIMIT = 2**62

_PACKAGE = "jobfence.backends.redis"
_SCRIPTS = (
    "publish",
    "receive",
    "ack",
    "nack",
    "defer",
    "renew",
    "dead_letter",
    "stats",
    "requeue",
    "purge",
)
#: the Lua helpers prepended to a script: the keys and shared helpers (sent whole), then the
#: delivery helpers, of which each script gets only those it calls
_LIBS = ("queue_lib.lua", "queue_lib_delivery.lua")
#: the key suffixes, in the order every script gets them as KEYS (see lua/queue_lib.lua);
#: the publish script gets the first :data:`_PUBLISH_KEYS` only, the keys it touches
_KEY_SUFFIXES = ("s", "d", "ds", "m", "mx", "f", "o", "dead")
_PUBLISH_KEYS = 5


def _script(name: str) -> str:
    """The script ``lua/queue_<name>.lua`` after ``lua/queue_lib.lua`` and the functions of
    ``lua/queue_lib_delivery.lua`` it calls (none for publish, purge and stats)."""
    return load_lua(_PACKAGE, *_LIBS, f"queue_{name}.lua", needed_only=True)


def _ms(seconds: float) -> int:
    """Seconds -> whole milliseconds, at least 1."""
    return max(1, math.ceil(seconds * 1000))


def _call_id() -> str:
    """A random id for one script call: a re-send of the call carries the same id."""
    return os.urandom(8).hex()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _fields(raw: Sequence[Any]) -> dict[str, Any]:
    """A stream entry's field list ``[k1, v1, k2, v2, ...]`` as a dict with str keys."""
    return {_text(raw[j]): raw[j + 1] for j in range(0, len(raw) - 1, 2)}


def _headers(raw: Any) -> dict[str, str]:
    loaded = json.loads(raw) if raw else {}
    return {str(k): str(v) for k, v in loaded.items()}


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _option(url: BackendURL, options: dict[str, Any], name: str, default: Any) -> Any:
    """Our own option ``name``: the keyword wins over the URL's query."""
    return options.pop(name, url.options.get(name, default))


class RedisQueueBackend(QueueBackend):
    """One named queue in Redis Streams: at-least-once delivery with per-delivery receipts,
    visibility deadlines, delays, batched renewal and dead letters."""

    kind = "redis"
    capabilities = CAPABILITIES

    def __init__(self, url: BackendURL, *, name: str, client: Any = None, **options: Any) -> None:
        self.name = check_queue_name(name)
        self.namespace = check_namespace(
            _option(url, options, "namespace", "jobfence"),
            limit=NAMESPACE_LIMIT,
            backend="redis",
            identifier=False,
        )
        self.max_dead_letters = option_int(
            _option(url, options, "max_dead_letters", 0), "max_dead_letters", 0, _MAX_DEAD_LIMIT
        )
        for source in (options, url.options):
            if str(source.get("decode_responses", "")).lower() in ("1", "true", "yes", "on"):
                raise ConfigurationError(
                    "the redis queue backend reads message bodies as bytes: "
                    "decode_responses must not be set",
                    argument="decode_responses",
                )
        self.url = url.masked
        scripts = {script: _script(script) for script in _SCRIPTS}
        #: whether the client is ours to close (False: the caller passed it in)
        self._owned = client is None
        self._cluster = False
        if client is not None:
            self._client: Any = adopt_redis(
                client, options, what="redis queue backend", binary=True
            )
            self._cluster = is_cluster(client)
        else:
            self._client = connect_redis(
                url,
                options,
                what="redis queue backend",
                own=OWN_OPTIONS,
                scripts=list(scripts.values()),
            )
        self._run = {name: self._client.register_script(text) for name, text in scripts.items()}
        prefix = key_layout.queue_prefix(self.namespace, self.name)
        self._keys = [prefix + suffix for suffix in _KEY_SUFFIXES]
        #: the publish script on its keys, without the per-call work of redis-py's Script
        #: wrapper (its keys encoded, or packed, once)
        self._publish = LuaScript(self._client, scripts["publish"]).with_keys(
            self._keys[:_PUBLISH_KEYS]
        )
        self._stream = self._keys[0]
        self._dead = self._keys[_KEY_SUFFIXES.index("dead")]
        timeout = client_socket_timeout(self._client)
        self._block_cap: float | None = None if not timeout else float(timeout) * _BLOCK_SHARE

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} name={self.name!r}>"

    @property
    def keys(self) -> list[str]:
        """Every key of this queue, in the order the scripts get them (see the module doc)."""
        return list(self._keys)

    # -- publishing ---------------------------------------------------------------------
    def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        if not messages:
            return
        args: list[Any] = [_call_id(), _ms(delay) if delay > 0 else 0]
        for message_id, body, headers in messages:
            args += [
                message_id,
                body,
                json.dumps(headers, separators=(",", ":")) if headers else b"{}",
            ]
        self._publish(args)

    # -- receiving ----------------------------------------------------------------------
    def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        """Run the receive script; while it delivers nothing and ``wait`` is not over, block
        in ``XREAD BLOCK`` until an entry is appended to the stream (or the next delayed
        message is due, or the next visibility deadline passes), then run it again."""
        clock = get_clock()
        deadline = clock.monotonic() + wait
        args: list[Any] = [consumer, max_messages, _ms(visibility), MOVE_LIMIT]
        while True:
            reply = self._run["receive"](self._keys, [_call_id(), *args])
            deliveries, wake_ms, last_id = reply
            if deliveries:
                return [self._message(*delivery) for delivery in deliveries]
            left = deadline - clock.monotonic()
            if wait <= 0 or left <= 0:
                return []
            block = left
            if int(wake_ms) >= 0:
                block = min(block, int(wake_ms) / 1000 + 0.002)
            if self._block_cap is not None:
                block = min(block, self._block_cap)
            self._client.xread({self._stream: _text(last_id)}, count=1, block=_ms(block))

    @staticmethod
    def _message(receipt: Any, delivery: Any, raw: Sequence[Any]) -> QueuedMessage:
        fields = _fields(raw)
        error = fields.get("e")
        published = fields.get("t")
        return QueuedMessage(
            id=_text(fields.get("i", b"")),
            body=_bytes(fields.get("b", b"")),
            headers=_headers(fields.get("h")),
            delivery=int(delivery),
            receipt=_text(receipt),
            published_at=None if published is None else int(published) / 1000,
            last_error=None if error is None else _text(error),
        )

    # -- finishing a delivery -----------------------------------------------------------
    def ack(self, receipt: str, consumer: str) -> bool:
        return bool(self._run["ack"](self._keys, [_call_id(), receipt, consumer]))

    def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """Ack every delivery of ``items``: one ``ack`` script call each, pipelined (one round
        trip); each is owner-checked and safe to re-send like a single ack."""
        if not items:
            return []
        if self._cluster:  # redis-py's cluster pipelines refuse scripts: one call each
            return [self.ack(receipt, consumer) for receipt, consumer in items]
        pipe = self._client.pipeline(transaction=False)
        for receipt, consumer in items:
            self._run["ack"](self._keys, [_call_id(), receipt, consumer], client=pipe)
        return [bool(ok) for ok in pipe.execute()]

    def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        args: list[Any] = [_call_id(), receipt, consumer, _ms(delay) if delay > 0 else 0]
        if error is not None:
            args.append(error)
        return bool(self._run["nack"](self._keys, args))

    def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        """As :meth:`nack`, without counting this delivery and keeping ``last_error``."""
        args: list[Any] = [_call_id(), receipt, consumer, _ms(delay) if delay > 0 else 0]
        return bool(self._run["defer"](self._keys, args))

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Renew every delivery of ``items`` with one script call (one round trip)."""
        if not items:
            return []
        args: list[Any] = []
        for receipt, consumer, visibility in items:
            args += [receipt, consumer, _ms(visibility)]
        reply = self._run["renew"](self._keys, args)
        return [bool(ok) for ok in reply]

    def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        args: list[Any] = [_call_id(), receipt, consumer, self.max_dead_letters]
        if error is not None:
            args.append(error)
        return bool(self._run["dead_letter"](self._keys, args))

    # -- administration -----------------------------------------------------------------
    def stats(self) -> QueueStats:
        ready, delayed, in_flight, dead = self._run["stats"](self._keys, [])
        return QueueStats(int(ready), int(delayed), int(in_flight), int(dead))

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        if limit <= 0:
            return []
        entries: Any = self._client.xrange(self._dead, "-", "+", count=limit)
        out = []
        for _, raw in entries or ():
            fields = {_text(k): v for k, v in raw.items()}
            error, dead_at = fields.get("e"), fields.get("x")
            out.append(
                DeadLetter(
                    id=_text(fields.get("i", b"")),
                    body=_bytes(fields.get("b", b"")),
                    headers=_headers(fields.get("h")),
                    deliveries=int(fields.get("n", 0)),
                    error=None if error is None else _text(error),
                    dead_at=None if dead_at is None else int(dead_at) / 1000,
                )
            )
        return out

    def names(self, limit: int) -> list[str]:
        """The queues of the namespace, from their stream keys (``S:q:{Q}:s``) by SCAN (never
        KEYS); the scan stops once ``limit`` names are found."""
        found: set[str] = set()
        for pattern in key_layout.tagged_patterns(key_layout.QUEUE, self.namespace):
            for key in self._client.scan_iter(match=pattern + "}:s", count=key_layout.SCAN_COUNT):
                text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                parts = key_layout.parse(text)
                if (
                    parts is not None
                    and parts.part == key_layout.QUEUE
                    and parts.namespace == self.namespace
                    and parts.suffix == ":s"
                ):
                    found.add(parts.name)
                    if len(found) >= limit:
                        return sorted(found)
        return sorted(found)[:limit]

    def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        """Requeue dead letters a page of :data:`REQUEUE_PAGE` at a time (each page one
        atomic script call), oldest first."""
        if ids is not None and not ids:
            return 0
        wanted = list(ids or ())
        total, start = 0, "-"
        while True:
            count, last = self._run["requeue"](
                self._keys, [_call_id(), REQUEUE_PAGE, start, *wanted]
            )
            total += int(count)
            last = _text(last)
            if not last:
                return total
            start = "(" + last

    def purge(self) -> int:
        return int(self._run["purge"](self._keys, [_call_id()]))

    def install(self) -> None:
        """Create the stream and its consumer group now (idempotent; they are also created
        on first use)."""
        try:
            self._client.xgroup_create(self._stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def drop(self) -> None:
        """Delete every key of the queue (the recent call results too)."""
        self._client.delete(*self._keys)

    def close(self) -> None:
        if self._owned:  # a client passed in is the caller's to close
            self._client.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connections inherited from
        the parent (see ``jobfence/_core/forks.py``)."""
        forget_connections(self._client)
