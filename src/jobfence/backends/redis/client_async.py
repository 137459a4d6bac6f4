"""One way to build the redis-py client of every Redis backend (``redis.asyncio.Redis`` in
``client_async.py``, ``redis.Redis`` in the generated ``client.py``): the same option checks
and the same defaults for locks and the inbox.

Deadlines: ``connect_timeout`` (redis-py's ``socket_connect_timeout``) and ``timeout``
(``socket_timeout``), 5 s each by default like every jobfence backend (redis-py's default is
to wait forever, which would hide a lost lease or hang a claim). A request whose reply does
not come within ``timeout`` fails and its connection is closed (redis-py disconnects on a
read error), never reused in an unknown state.

Retries: one immediate retry on a connection error (a reset, a refused connection) instead of
redis-py's backoff, so an unreachable server is reported in milliseconds; no retry after a
timeout, so a server that does not answer is reported after ``timeout``, not a multiple of
it. Every verb jobfence sends is safe to re-send: acquire, renew, extend, complete and claim
are idempotent for their owner, and a release remembers who released.

Replicas: ``wait_replicas`` (default 0) and ``wait_timeout`` (seconds, default 1) make the
writes that a failover must not lose wait for that many replicas: the script call and a
``WAIT wait_replicas wait_timeout`` go in one pipeline on one connection
(:meth:`AsyncLuaScript.replicated`), and each backend decides what an unacknowledged write
means (:class:`jobfence.errors.NotReplicated`).

Sentinel: a ``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]`` URL opens
the current primary of ``service`` through redis-py's ``Sentinel`` (``master_for``): a
connection that fails, or that finds its server demoted to a replica, asks the Sentinels
again, so the client follows a failover.

Scripts: every new connection loads the backend's Lua scripts (one pipelined round trip of
``SCRIPT LOAD``, part of opening the connection), so the first ``EVALSHA`` on it never costs
the extra round trips of a ``NOSCRIPT`` reply (a server whose script cache was flushed still
gets the script re-sent by redis-py).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.connection import parse_url as parse_redis_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._core import forks
from ..._core.flavour import ASYNC
from ..._core.options import DEFAULT_TIMEOUT, TIMEOUT_OPTIONS, option_timeouts
from ..._core.url import BackendURL
from ...errors import ConfigurationError, NotReplicated

if ASYNC:
    import asyncio
    import functools
else:
    import functools

    from redis.connection import PythonRespSerializer
    from redis.utils import HIREDIS_AVAILABLE

__all__ = [
    "DEFAULT_SOCKET_TIMEOUT",
    "DEFAULT_WAIT_TIMEOUT",
    "MAX_WAIT_REPLICAS",
    "REPLICA_OPTIONS",
    "SENTINEL_SCHEMES",
    "WAIT_BARRIER",
    "AsyncLuaScript",
    "ReplicaWait",
    "adopt_redis",
    "by_slot",
    "check_database",
    "client_socket_timeout",
    "connect_redis",
    "forget_connections",
    "is_cluster",
    "not_replicated",
    "replica_wait",
]

R = TypeVar("R")

#: the default of both deadlines (``connect_timeout`` and ``timeout``)
DEFAULT_SOCKET_TIMEOUT = DEFAULT_TIMEOUT
#: jobfence's name of each redis-py timeout option
_TIMEOUT_NAMES = {"connect_timeout": "socket_connect_timeout", "timeout": "socket_timeout"}
#: the options of every Redis backend that ask for replica acknowledgements (never redis-py's)
REPLICA_OPTIONS = ("wait_replicas", "wait_timeout")
#: the channel of the replicated no-op that every ``WAIT`` follows (see
#: :meth:`AsyncLuaScript.replicated`); nothing subscribes to it
WAIT_BARRIER = "jobfence:replicated"
#: the default of ``wait_timeout`` (seconds)
DEFAULT_WAIT_TIMEOUT = 1.0
#: the largest ``wait_replicas``
MAX_WAIT_REPLICAS = 100
#: the longest ``wait_timeout`` (seconds)
MAX_WAIT_TIMEOUT = 60.0
#: the URL schemes that name Sentinels rather than a Redis server
SENTINEL_SCHEMES = ("redis+sentinel",)
#: the port of a Sentinel named without one
DEFAULT_SENTINEL_PORT = 26379
#: the Sentinel URL's own option (the password of the Sentinels, not of the Redis servers)
SENTINEL_OPTIONS = ("sentinel_password",)


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must acknowledge a write (``WAIT replicas timeout_ms``)."""

    replicas: int
    timeout: float

    @property
    def timeout_ms(self) -> int:
        """``timeout`` in whole milliseconds, at least 1 (``WAIT 0`` would wait forever)."""
        return max(1, math.ceil(round(self.timeout * 1000, 6)))


def replica_wait(url: BackendURL, options: dict[str, Any]) -> ReplicaWait | None:
    """``wait_replicas`` and ``wait_timeout`` taken out of the keyword ``options`` (they win)
    or read from the URL's query; ``None`` when no replica is to be waited for (0, the
    default). A bad value raises :class:`ConfigurationError` naming the option and its range."""
    raw_n = options.pop("wait_replicas", url.options.get("wait_replicas", 0))
    raw_t = options.pop("wait_timeout", url.options.get("wait_timeout", DEFAULT_WAIT_TIMEOUT))
    replicas: int | None = None
    if isinstance(raw_n, int) and not isinstance(raw_n, bool):
        replicas = raw_n
    elif isinstance(raw_n, str) and raw_n.strip().isdigit():
        replicas = int(raw_n.strip())
    if replicas is None or not 0 <= replicas <= MAX_WAIT_REPLICAS:
        raise ConfigurationError(
            f"wait_replicas must be a whole number of replicas from 0 to {MAX_WAIT_REPLICAS} "
            f"(0: do not wait), got {raw_n!r}",
            argument="wait_replicas",
        )
    try:
        timeout = float(raw_t) if not isinstance(raw_t, bool) else math.nan
    except (TypeError, ValueError):
        timeout = math.nan
    if not 0.001 <= timeout <= MAX_WAIT_TIMEOUT:
        raise ConfigurationError(
            f"wait_timeout must be a number of seconds from 0.001 to {MAX_WAIT_TIMEOUT:g} (how "
            f"long a write waits for wait_replicas replicas), got {raw_t!r}",
            argument="wait_timeout",
        )
    return ReplicaWait(replicas, timeout) if replicas else None


def check_replica_wait(wait: ReplicaWait | None, client: Any, *, what: str) -> None:
    """``wait`` can be met on ``client``: not a Redis Cluster client (its pipelines are split
    by hash slot, so a ``WAIT`` would not follow the write on its connection), and a
    ``wait_timeout`` shorter than the client's reply deadline (``timeout``), which a ``WAIT``
    must beat."""
    if wait is None:
        return
    if is_cluster(client):
        raise ConfigurationError(
            f"wait_replicas is not supported on Redis Cluster by the {what}; leave it 0",
            argument="wait_replicas",
        )
    limit = client_socket_timeout(client)
    if limit is not None and wait.timeout >= limit:
        raise ConfigurationError(
            f"wait_timeout ({wait.timeout:g} s) must be shorter than the {what}'s reply "
            f"deadline (timeout / socket_timeout, {limit:g} s): the WAIT must answer before it",
            argument="wait_timeout",
        )


def not_replicated(
    what: str, url: str, operation: str, acked: int, wait: ReplicaWait, outcome: str
) -> NotReplicated:
    """The :class:`NotReplicated` of ``operation``: ``acked`` of ``wait.replicas`` replicas
    acknowledged in time; ``outcome`` says what became of the write."""
    return NotReplicated(
        f"{what} ({url}): {operation}: {acked} of {wait.replicas} replicas acknowledged the "
        f"write within {wait.timeout:g} s (wait_replicas={wait.replicas}); {outcome}",
        backend="redis",
        operation=operation,
        acknowledged=acked,
        required=wait.replicas,
    )


def fast_pack(args: Sequence[Any], utf8: bool, cutoff: int) -> bytes | None:
    """The RESP request of the command ``args`` as redis-py's pure-Python packer writes it
    (its own bytes, in one buffer), for the commonest case only: a one-word command name, and
    arguments that are ``str`` (``utf8``: the client encodes them as UTF-8, strictly), plain
    ``int`` or ``bytes``, none of them longer than ``cutoff`` bytes. ``None`` for any other
    command: redis-py packs it (floats, a ``bool`` it refuses, a large value it sends
    without copying, a command name of two words such as ``"SCRIPT LOAD"``).

    redis-py's packer runs its encoder's type checks on every argument and joins the buffer
    again for each one: for a script call of ten arguments that is most of the client's cost
    of packing it."""
    name = args[0]
    if type(name) is not str or " " in name or not utf8:
        return None
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            return None
        if len(arg) > cutoff:
            return None
        append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def _is_utf8(encoder: Any) -> bool:
    """Whether redis-py's ``encoder`` encodes a ``str`` as ``str.encode()`` does."""
    encoding = str(getattr(encoder, "encoding", "")).lower().replace("_", "-")
    return encoding in ("utf-8", "utf8") and getattr(encoder, "encoding_errors", "") == "strict"


if not ASYNC:

    class _FastSerializer(PythonRespSerializer):  # type: ignore[misc]
        """redis-py's pure-Python packer, with :func:`fast_pack` first."""

        def __init__(self, buffer_cutoff: int, encoder: Any) -> None:
            super().__init__(buffer_cutoff, encoder.encode)
            self._utf8 = _is_utf8(encoder)

        def pack(self, *args: Any) -> list[bytes]:
            packed = fast_pack(args, self._utf8, self._buffer_cutoff)
            if packed is None:
                return super().pack(*args)  # type: ignore[no-untyped-call,no-any-return]
            return [packed]

    class _FastPacking:
        """Mixed into the connection class of every client jobfence opens: requests are
        packed by :class:`_FastSerializer` where redis-py would use its pure-Python packer
        (hiredis, when installed, packs in C: it is kept)."""

        _buffer_cutoff: int
        encoder: Any

        def _construct_command_packer(self, packer: Any) -> Any:
            if packer is None and not HIREDIS_AVAILABLE:
                return _FastSerializer(self._buffer_cutoff, self.encoder)
            return super()._construct_command_packer(packer)  # type: ignore[misc]

    @functools.cache
    def _fast_packing(cls: type) -> type:
        """``cls`` (a redis-py connection class) with :class:`_FastPacking` mixed in."""
        if issubclass(cls, _FastPacking):
            return cls
        return type(cls.__name__, (_FastPacking, cls), {"__module__": cls.__module__})


if ASYNC:

    class _Watched:
        """Mixed into the connection class of every client jobfence opens: each write of a
        request and each read of a reply on an open connection is bounded by
        ``socket_timeout`` with a watchdog of the connection's own, instead of redis-py's
        per-call deadline (``asyncio.wait_for`` around each write, which on Python < 3.12
        runs it in a task of its own, and an ``asyncio.timeout`` around each read: a timer
        made, scheduled and cancelled per call).

        A call records when it must be done (``_jf_deadline``, the loop's clock) and clears
        it when it ends. The watchdog is one timer per connection, set when the connection
        is used and nothing watches it: when it fires it looks at the call in flight -- none:
        it stops; one due later: it waits until then; one past its deadline: the connection's
        transport is aborted, which ends the stalled read or write at once. The call then
        closes the connection and raises ``TimeoutError("Timeout reading from ...")`` /
        ``TimeoutError("Timeout writing to socket")``, as redis-py does after its own
        deadline (no retry: a timeout is not a connection error). A reply that was already
        read when the watchdog fired is returned, and its connection closed.

        A connection still to be opened, a health check due, or a read with a timeout of its
        own (``read_response(timeout=...)``) take redis-py's own path."""

        socket_timeout: float | None
        health_check_interval: float
        is_connected: bool
        _writer: Any

        #: when the call in flight must be done (the loop's clock), 0.0 with none
        _jf_deadline = 0.0
        #: the watchdog's timer, when it fires, and the loop it runs on
        _jf_timer: asyncio.TimerHandle | None = None
        _jf_timer_at = 0.0
        _jf_loop: asyncio.AbstractEventLoop | None = None
        #: the watchdog aborted the transport under the call in flight
        _jf_fired = False

        def _jf_watch(self) -> None:
            """The watchdog's timer fired: see the class's docstring."""
            self._jf_timer = None
            deadline = self._jf_deadline
            loop = self._jf_loop
            if not deadline or loop is None:
                return  # nothing in flight: the next call sets the timer again
            if deadline > loop.time():  # a later call: watch it until its deadline
                self._jf_timer = loop.call_at(deadline, self._jf_watch)
                self._jf_timer_at = deadline
                return
            writer = self._writer
            if writer is not None:
                self._jf_fired = True
                writer.transport.abort()

        def _jf_arm(self, limit: float) -> None:
            """Watch the call that starts now: it must be done within ``limit`` seconds."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limit
            self._jf_deadline = deadline
            self._jf_fired = False
            timer = self._jf_timer
            # none set, set on another loop, or set too late (a shorter socket_timeout now)
            if timer is None or self._jf_loop is not loop or deadline < self._jf_timer_at:
                if timer is not None:
                    timer.cancel()
                self._jf_loop = loop
                self._jf_timer = loop.call_at(deadline, self._jf_watch)
                self._jf_timer_at = deadline

        async def _jf_timed_out(self, message: str) -> RedisTimeoutError:
            """The watchdog ended the call: close the connection; the error to raise."""
            self._jf_fired = False
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            return RedisTimeoutError(message)

        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            limit = self.socket_timeout
            send = super().send_packed_command  # type: ignore[misc]
            if not limit or not self.is_connected or (check_health and self.health_check_interval):
                await send(command, check_health)
                return
            self._jf_arm(limit)
            self.socket_timeout = None  # redis-py's write below: no deadline of its own
            try:
                await send(command, check_health)
            except Exception:
                if not self._jf_fired:
                    raise
                raise await self._jf_timed_out("Timeout writing to socket") from None
            finally:
                self.socket_timeout = limit
                self._jf_deadline = 0.0
            if self._jf_fired:  # the write may not have reached the socket
                raise await self._jf_timed_out("Timeout writing to socket")

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            limit = self.socket_timeout
            read = super().read_response  # type: ignore[misc]
            if not limit or len(args) > 1 or kwargs.get("timeout") is not None:
                return await read(*args, **kwargs)
            self._jf_arm(limit)
            self.socket_timeout = None  # redis-py's read below: no deadline of its own
            try:
                response = await read(*args, **kwargs)
            except Exception:
                if not self._jf_fired:
                    raise
                raise await self._jf_timed_out(
                    f"Timeout reading from {self._host_error()}"  # type: ignore[attr-defined]
                ) from None
            finally:
                self.socket_timeout = limit
                self._jf_deadline = 0.0
            if self._jf_fired:  # read in full as the deadline passed: the connection goes
                await self._jf_timed_out("")
            return response

        #: whether the connection's encoder encodes a ``str`` as UTF-8 (see :func:`fast_pack`)
        _jf_utf8: bool | None = None

        def pack_command(self, *args: Any) -> list[bytes]:
            """redis-py's packing, but by :func:`fast_pack` where it can, and for a command
            whose second argument is :class:`PackedArgs` (arguments packed once, sent as they
            are)."""
            if len(args) < 2 or type(args[1]) is not PackedArgs:
                utf8 = self._jf_utf8
                if utf8 is None:
                    utf8 = self._jf_utf8 = _is_utf8(self.encoder)  # type: ignore[attr-defined]
                packed = fast_pack(args, utf8, self._buffer_cutoff)  # type: ignore[attr-defined]
                if packed is None:
                    return super().pack_command(*args)  # type: ignore[misc,no-any-return]
                return [packed]
            head: PackedArgs = args[1]
            name = args[0].encode() if isinstance(args[0], str) else args[0]
            encode = self.encoder.encode  # type: ignore[attr-defined]
            parts = [b"*%d\r\n$%d\r\n%b\r\n" % (len(args) + head.args - 1, len(name), name)]
            parts.append(head)
            for arg in map(encode, args[2:]):
                parts += (b"$%d\r\n" % len(arg), bytes(arg), b"\r\n")
            return [b"".join(parts)]

    class PackedArgs(bytes):
        """``args`` arguments of a command packed once (their RESP bulk strings), for a
        connection of a client :func:`connect_redis` opened (:func:`packs_args`), which sends
        them as they are. A script run many times with the same keys packs its digest, the
        number of keys and the keys once (:meth:`AsyncLuaScript.with_keys`)."""

        #: how many arguments these are
        args: int

        @classmethod
        def of(cls, args: Sequence[bytes]) -> PackedArgs:
            packed = cls(b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args))
            packed.args = len(args)
            return packed

    def packs_args(client: Any) -> bool:
        """Whether the connections of ``client`` send :class:`PackedArgs` as they are
        (a client :func:`connect_redis` opened; never a Cluster client's)."""
        pool = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        return isinstance(cls, type) and issubclass(cls, _Watched) and not is_cluster(client)

    @functools.cache
    def _watched(cls: type) -> type:
        """``cls`` (a redis-py connection class) with :class:`_Watched` mixed in."""
        if issubclass(cls, _Watched):
            return cls
        return type(cls.__name__, (_Watched, cls), {"__module__": cls.__module__})


def _load_scripts_on_connect(scripts: Sequence[str]) -> Callable[[Any], Any]:
    """The ``redis_connect_func`` of a client: redis-py's own handshake, then one pipelined
    ``SCRIPT LOAD`` of every script (one round trip)."""

    async def setup(conn: Any) -> None:
        await conn.on_connect()
        commands = [("SCRIPT", "LOAD", script) for script in scripts]
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        for _ in commands:
            await conn.read_response()

    return setup


class AsyncLuaScript:
    """One Lua script run by ``EVALSHA`` on ``client``: what redis-py's ``register_script``
    gives, without the work its ``Script`` does on every call (copying keys and arguments
    into new tuples, importing and checking for a pipeline, two more layers of calls). A
    ``NOSCRIPT`` reply (a server whose script cache was flushed, or a failover to a replica
    that never loaded it) is answered as redis-py does: ``SCRIPT LOAD``, then the same
    ``EVALSHA`` once more."""

    __slots__ = ("client", "sha", "source")

    def __init__(self, client: Any, source: str) -> None:
        self.client = client
        self.source = source
        # the digest of the bytes the client sends, in the client's own encoding
        self.sha = hashlib.sha1(client.get_encoder().encode(source)).hexdigest()

    async def __call__(self, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        try:
            return await self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = await self.client.script_load(self.source)
            return await self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def with_keys(self, keys: Sequence[str]) -> Callable[[Sequence[Any]], Awaitable[Any]]:
        """The script as a call of ``args`` alone, on ``keys`` always (a queue's): the keys
        encoded once and, on the asyncio client of a client :func:`connect_redis` opened, the
        digest, the number of keys and the keys packed once for every call."""
        encoded = [key.encode("utf-8") for key in keys]
        if ASYNC:  # noqa: SIM102 - the sync twin drops this block whole
            if packs_args(self.client):
                sha = self.sha
                head = PackedArgs.of([sha.encode(), b"%d" % len(encoded), *encoded])

                async def packed(args: Sequence[Any]) -> Any:
                    if self.sha != sha:  # reloaded under another digest: the plain call
                        return await self(encoded, args)
                    try:
                        return await self.client.execute_command("EVALSHA", head, *args)
                    except NoScriptError:
                        self.sha = await self.client.script_load(self.source)
                        return await self(encoded, args)

                return packed

        async def plain(args: Sequence[Any]) -> Any:
            return await self(encoded, args)

        return plain

    async def replicated(
        self, keys: Sequence[Any], args: Sequence[Any], wait: ReplicaWait
    ) -> tuple[Any, int]:
        """The script's reply and how many replicas acknowledged its write: the ``EVALSHA``
        and a ``WAIT`` in one pipeline (one round trip, one connection: ``WAIT`` counts the
        replicas that have every write of its own connection), ``WAIT`` answering once
        ``wait.replicas`` replicas acknowledged or after ``wait.timeout``.

        Between them, a ``PUBLISH`` to a channel nobody listens on (:data:`WAIT_BARRIER`):
        Redis replicates it, so the ``WAIT`` covers everything the primary did before it,
        whatever the connection itself wrote. A script re-sent after a lost reply (redis-py's
        retry, on a new connection) may find its work done by the first send and write
        nothing: the ``WAIT`` must still cover the first send's write, whichever way the
        server tracks the offset of a connection that wrote nothing."""
        for attempt in (1, 2):
            pipe: Any = self.client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            pipe.execute_command("PUBLISH", WAIT_BARRIER, "")
            pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
            reply, _, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError) and attempt == 1:
                self.sha = await self.client.script_load(self.source)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
            return reply, int(acked)
        raise AssertionError("unreachable")  # pragma: no cover


def connect_redis(
    url: BackendURL,
    options: dict[str, Any],
    *,
    what: str,
    own: tuple[str, ...] = (),
    scripts: Sequence[str] = (),
) -> Redis:
    """A client for ``url`` (its query options minus ``own`` and the timeout options go to
    redis-py) with the keyword ``options`` (``connect_timeout``, ``timeout``, and keyword
    arguments of ``redis.Redis``); a bad option or URL raises :class:`ConfigurationError`
    naming it. ``what`` names the backend in messages; ``scripts`` are loaded on every new
    connection."""
    timeouts = option_timeouts(options, url.options)
    for ours, theirs in _TIMEOUT_NAMES.items():
        if (ours in options or ours in url.options) and (
            theirs in options or theirs in url.options
        ):
            raise ConfigurationError(
                f"{ours} and {theirs} set the same deadline of the {what}; give one of them",
                argument=ours,
            )
    options = {k: v for k, v in options.items() if k not in TIMEOUT_OPTIONS}
    sentinel = url.scheme in SENTINEL_SCHEMES
    own = (*own, *REPLICA_OPTIONS, *(SENTINEL_OPTIONS if sentinel else ()))
    allowed = set(inspect.signature(Redis.__init__).parameters) - {"self"}
    allowed.add("connection_class")  # a connection-pool option
    for key in options:
        if key not in allowed:
            extra = "".join(f"{name}, " for name in (*own, *TIMEOUT_OPTIONS))
            raise ConfigurationError(
                f"unknown option {key!r} for the {what}; allowed: {extra}the keyword "
                "arguments of redis.Redis (socket_timeout, max_connections, ssl_ca_certs, ...)",
                argument=key,
            )
    kwargs: dict[str, Any] = {
        "socket_timeout": timeouts.request,
        "socket_connect_timeout": timeouts.connect,
        # a timeout is not retried: the caller hears of it after one `timeout`
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        # redis-py < 6 retries only the errors listed here (>= 6 also those of `retry`)
        "retry_on_error": [RedisConnectionError],
    }
    if scripts and "redis_connect_func" not in options:
        kwargs["redis_connect_func"] = _load_scripts_on_connect(scripts)
    kwargs.update(options)
    if not sentinel:
        check_database(url)
    try:
        client: Redis
        if sentinel:
            client = _through_sentinel(url, own, kwargs)
        else:
            client = Redis.from_url(url.without_options(*own, *TIMEOUT_OPTIONS), **kwargs)
    except ValueError as exc:  # redis-py's message names the option, never a secret's value
        raise ConfigurationError(
            f"invalid redis url {url.masked}: {url.redact(str(exc))}", argument="url"
        ) from None
    _check_connection_options(client, url, what, own)
    pool: Any = client.connection_pool
    if ASYNC:
        pool.connection_class = _watched(pool.connection_class)
        pool.__class__ = _following_the_loop(pool.__class__)
    else:
        pool.connection_class = _fast_packing(pool.connection_class)
    return client


def _check_connection_options(
    client: Redis, url: BackendURL, what: str, own: Sequence[str]
) -> None:
    """A query option of the URL that neither jobfence nor redis-py's connection takes raises
    :class:`ConfigurationError` naming it now (redis-py hands every unknown query option to
    its connection class, which would refuse it with a ``TypeError`` at the first
    connection)."""
    pool: Any = client.connection_pool
    allowed: set[str] = set()
    for klass in (pool.connection_class, type(pool)):
        for base in klass.__mro__:
            init = base.__dict__.get("__init__")
            if init is None or not inspect.isfunction(init):
                continue
            allowed.update(
                name
                for name, param in inspect.signature(init).parameters.items()
                if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL)
            )
    for key in url.options:
        if key in own or key in TIMEOUT_OPTIONS or key in allowed:
            continue
        extra = "".join(f"{name}, " for name in (*own, *TIMEOUT_OPTIONS))
        raise ConfigurationError(
            f"unknown query option {key!r} in the url of the {what} ({url.masked}); allowed: "
            f"{extra}the options of redis-py's connection (client_name, "
            "health_check_interval, ssl_cert_reqs, ...)",
            argument="url",
        )


class _SentinelClient(Redis):
    """The client of the primary a Sentinel names: closing it also closes its connections to
    the Sentinels (redis-py leaves them to the ``Sentinel`` object, which only it holds)."""

    async def aclose(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().aclose(*args, **kwargs)
        finally:
            manager = getattr(self.connection_pool, "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", ()):
                await sentinel.aclose()


def _through_sentinel(url: BackendURL, own: Sequence[str], kwargs: dict[str, Any]) -> Redis:
    """The client of the current primary of the service a ``redis+sentinel://`` URL names:
    ``redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db][?options]``.
    The user name and password are the Redis servers'; ``sentinel_password`` the Sentinels'.
    The Sentinels are asked with the same deadlines as the servers."""
    parts = urlsplit(url.raw)
    hosts = parts.netloc.rpartition("@")[2]
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, port = item, str(DEFAULT_SENTINEL_PORT)
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":") or port
        elif ":" in item:
            host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"url {url.masked}: each Sentinel is host or host:port, separated by commas, "
                f"as in redis+sentinel://s1:26379,s2:26379/mymaster/0; got {item!r}",
                argument="url",
            )
        sentinels.append((unquote(host), int(port)))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"url {url.masked}: the path of a Sentinel URL is the service name and an "
            "optional database number, as in redis+sentinel://s1:26379/mymaster/0",
            argument="url",
        )
    # the query options and the credentials, read as redis-py reads a redis:// URL
    userinfo = parts.netloc.rpartition("@")[0]
    plain = BackendURL(
        raw=parts._replace(
            scheme="redis", netloc=userinfo + ("@" if userinfo else "") + "localhost", path=""
        ).geturl(),
        scheme="redis",
        host=None,
        port=None,
        username=None,
        password=None,
        path="",
    ).without_options(*own, *TIMEOUT_OPTIONS)
    read_url: Any = parse_redis_url  # untyped in the blocking redis-py
    options: dict[str, Any] = dict(read_url(plain))
    for key in ("host", "port", "connection_class"):
        options.pop(key, None)
    kwargs = {**kwargs, **options}
    if len(path) == 2:
        kwargs["db"] = int(path[1])
    sentinel_kwargs = {
        key: kwargs[key]
        for key in ("socket_timeout", "socket_connect_timeout", "retry", "retry_on_error")
        if key in kwargs
    }
    if url.options.get("sentinel_password"):
        sentinel_kwargs["password"] = url.options["sentinel_password"]
    sentinel_class: Any = Sentinel  # untyped in redis-py
    manager = sentinel_class(sentinels, sentinel_kwargs=sentinel_kwargs)
    client: Redis = manager.master_for(path[0], redis_class=_SentinelClient, **kwargs)
    return client


if ASYNC:

    @functools.cache
    def _following_the_loop(cls: Any) -> type:
        """``cls`` (redis-py's asyncio connection pool), whose connections work only on the
        event loop that opened them, made to start over on another loop: a client made once
        per process and used under ``asyncio.run`` once per job (a Celery or RQ task) would
        otherwise hand the second job a connection of the first job's closed loop. The
        connections left behind are not closed through that loop (it cannot run any more):
        their sockets close when they are collected."""

        class FollowingTheLoop(cls):  # type: ignore[valid-type,misc]
            _jobfence_loop: asyncio.AbstractEventLoop | None = None

            def _jobfence_follow_loop(self) -> None:
                loop = asyncio.get_running_loop()
                if loop is not self._jobfence_loop:
                    if self._jobfence_loop is not None:
                        _start_over(self)
                    self._jobfence_loop = loop

            async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
                self._jobfence_follow_loop()
                return await super().get_connection(*args, **kwargs)

            async def disconnect(self, *args: Any, **kwargs: Any) -> Any:
                self._jobfence_follow_loop()  # (aclose() too) only this loop's connections
                return await super().disconnect(*args, **kwargs)

        FollowingTheLoop.__name__ = FollowingTheLoop.__qualname__ = cls.__name__
        return FollowingTheLoop

    def _start_over(pool: Any) -> None:
        """redis-py's asyncio ``pool`` forgets its connections (without closing them) and its
        lock (an ``asyncio.Lock``, perhaps bound to another loop): it opens new ones on first
        use, on the running loop."""
        pool.reset()
        if hasattr(pool, "_lock"):
            pool._lock = asyncio.Lock()


def adopt_redis(client: Any, options: dict[str, Any], *, what: str, binary: bool) -> Any:
    """A caller's redis-py client (``redis.asyncio.Redis`` / ``redis.Redis``, or a
    ``RedisCluster``), used as the caller configured it: its pool, timeouts, retries, TLS,
    credentials, Sentinel or Cluster routing. jobfence never closes it.

    Connection options (``options`` left after the backend took its own) cannot apply to a
    client that already exists: each raises :class:`ConfigurationError` naming it. ``binary``:
    the backend reads bytes it stored (results, message bodies), so a client that decodes
    replies (``decode_responses=True``) is refused.
    """
    for key in options:
        raise ConfigurationError(
            f"option {key!r} configures the connections of the {what}, which uses the "
            "redis-py client passed in as it is: set it on that client instead",
            argument=key,
        )
    encoder = client.get_encoder()
    if binary and getattr(encoder, "decode_responses", False):
        raise ConfigurationError(
            f"the {what} stores bytes (results, message bodies) and needs a client with "
            "decode_responses=False; pass another client on the same server, e.g. "
            "redis.Redis(connection_pool=...) of a pool made without decode_responses",
            argument="url",
        )
    return client


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a redis-py ``RedisCluster`` (sync or asyncio)."""
    return any(cls.__name__ == "RedisCluster" for cls in type(client).__mro__)


def by_slot(keys: Sequence[str]) -> dict[int, list[int]]:
    """The positions of ``keys``, grouped by Redis Cluster hash slot (a script call may only
    touch the keys of one slot)."""
    from redis.crc import key_slot

    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode("utf-8")), []).append(i)
    return groups


async def per_slot(
    keys: Sequence[str], call: Callable[[Sequence[int]], Awaitable[list[R]]]
) -> list[R]:
    """``call`` once per Redis Cluster hash slot of ``keys`` (with the positions of that
    slot's keys; the async client makes the calls at once), the answers put back in the order
    of ``keys``."""
    groups = list(by_slot(keys).values())
    if ASYNC:
        replies = await asyncio.gather(*(call(group) for group in groups))
    else:
        replies = [call(group) for group in groups]
    answers: dict[int, R] = {}
    for group, reply in zip(groups, replies, strict=True):
        answers.update(zip(group, reply, strict=True))
    return [answers[i] for i in range(len(keys))]


def client_socket_timeout(client: Any) -> float | None:
    """The reply deadline (``socket_timeout``) a redis-py client was configured with, if it
    tells (a blocking read must end before it)."""
    pool = getattr(client, "connection_pool", None)
    kwargs: Any = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        kwargs = getattr(client, "connection_kwargs", None)  # asyncio RedisCluster
    if kwargs is None:
        node = getattr(client, "get_default_node", lambda: None)()
        kwargs = getattr(
            getattr(getattr(node, "redis_connection", None), "connection_pool", None),
            "connection_kwargs",
            None,
        )
    timeout = (kwargs or {}).get("socket_timeout")
    return float(timeout) if timeout else None


def check_database(url: BackendURL) -> None:
    """The URL's path is empty or a database number (``/0``): redis-py would silently use
    database 0 for anything else (``/notadb``)."""
    number = url.path.removeprefix("/").removesuffix("/")
    if number and not (number.isascii() and number.isdigit()):
        raise ConfigurationError(
            f"url {url.masked}: the path must be a database number, as in "
            "redis://host:6379/0 (or nothing, for database 0)",
            argument="url",
        )


def forget_connections(client: Any) -> None:
    """In a child process right after ``fork()``: the client's pool forgets the connections
    inherited from the parent, without closing them (:func:`jobfence._core.forks.keep`), and
    opens its own on first use. redis-py's blocking pool does that by itself when it sees a
    new process id; its asyncio pool does not."""
    if is_cluster(client):
        return  # a cluster client's nodes keep their own pools; redis-py resets them
    if ASYNC:
        pool = client.connection_pool
        forks.keep(
            [
                *getattr(pool, "_available_connections", ()),
                *getattr(pool, "_in_use_connections", ()),
            ]
        )
        _start_over(pool)
