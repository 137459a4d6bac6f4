"""``redis://`` / ``rediss://`` -- the Redis lock backend (``locks_async.py``; ``locks.py`` is
generated from it).

Every operation is one round trip: an ``EVALSHA`` of a script in ``lua/`` (re-loaded, as
redis-py's ``register_script`` does, when the server forgot it, e.g. after a restart), or a
``BLPOP`` while waiting. Lifetimes are measured by the Redis server's clock (``PX``).

Key layout for lock name ``N`` in namespace ``S`` (built by ``keys.py``, which also encodes a
namespace or name holding a brace: then the lease key is ``S':lock%:{N'}``, both
percent-encoded, so that no namespace or name can produce another lock's, queue's or inbox
record's key). ``N`` sits between literal braces, so all keys of one name share a Redis
Cluster hash tag; names are only ever passed as KEYS/ARGV. A script gets the lease key ``L``
and derives the others by suffix (the name is brace-free in the key, so the first ``}`` after
its ``{`` ends it, and a lease key is the only key of a name ending there)::

    L = S:lock:{N}       STRING "<token>:<owner>", PX = the lease ttl
    L:tok                STRING fencing-token counter: max(counter + 1, server TIME in
                         microseconds) on every grant; expires max(10 * ttl, 1 day) after use
    L:q                  ZSET   waiting owners scored by arrival (FIFO queue)
    L:qd                 HASH   owner -> "<deadline_ms>:<ttl_ms>" of each waiter
    L:qf                 STRING "1" while anyone may wait (the queue's expiry): the waiters
                         flag, read with the lease and the counter in one MGET, so that an
                         uncontended acquire or release never looks at the queue
    L:w:<owner>          LIST   the token, pushed when the lease is handed to <owner>
    L:rel                STRING the owner that last released L (60 s): a release that
                         redis-py re-sends after a lost reply still answers True

Waiting is by notification with a fair FIFO hand-off: a denied ``acquire(..., wait=w)``
puts the owner in the queue (deadline = server now + ``w`` + ``waiter_slack``, refreshed on
every retry); ``release`` gives the lease straight to the first live waiter (new token, its
own ttl) and pushes the token onto that waiter's wake list, so exactly one waiter wakes and
it already owns the lease. :meth:`wait` is a ``BLPOP`` on that list, bounded by the time
left on the current lease (a lease that expires without a release wakes nobody).

Options (URL query or keyword): ``waiter_slack`` (seconds, default 1) is added to a waiter
entry's deadline; ``connect_timeout`` and ``timeout`` (seconds, default 5 each: opening a
connection, and one request's reply). Every other keyword option, and the URL's query options,
go to redis-py's ``Redis.from_url`` (``redis.asyncio.Redis`` / ``redis.Redis``) with the
defaults of ``connect_redis`` (``client_async.py`` / ``client.py``: one immediate retry on a
connection error, none after a timeout, so an unreachable server is reported in milliseconds
and a lost lease is noticed in time; every script is safe to re-send).

A caller's client (``client=``: a ``redis.asyncio.Redis`` / ``redis.Redis`` or a
``RedisCluster``, passed to ``Locks`` in place of the URL) is used as it is and never closed;
renewals then share it (one script call per hash slot on a cluster). ``bare_keys=True`` makes
the lease key the name itself, as redis-py's ``Lock`` names its key
(``jobfence.compat.redis_py``).

Replicas: with ``wait_replicas`` = N (default 0; ``wait_timeout`` seconds, default 1) every
grant (an acquire, a hand-off a waiter picks up) and every renewal and extension is followed,
in the same pipeline on the same connection, by ``WAIT N wait_timeout``. A grant fewer than
N replicas acknowledged is given back (owner-checked) and :class:`~jobfence.NotReplicated`
raised: it is not handed out, since a failover could give it to a second holder. A renewal
or extension fewer than N acknowledged raises it too: the lease keeps only the lifetime a
replica is known to have, and is retried, then lost, like a renewal that could not reach the
server. Releases do not wait (a lost release only keeps the name held until the ttl).

Every new connection loads the scripts as part of opening it, and :meth:`prepare` opens one
before ``Locks`` starts a lease's clock, so the grant request and every renewal are one
``EVALSHA`` round trip even on a cold client over a slow link. Renewals run on a client of
their own (one connection, opened by the first :meth:`prepare`), never queued behind a
waiter's ``BLPOP`` or a connection being opened.
Requires Redis >= 6.0 (float ``BLPOP`` timeouts).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from functools import partial
from typing import Any

from redis.asyncio import Redis

from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.sqlfiles import load_lua
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ...errors import ConfigurationError
from ..base import AsyncLockBackend, LockCapabilities, LockHolder, RenewItem
from . import NAMESPACE_LIMIT
from . import keys as key_layout
from .client_async import (
    WAIT_BARRIER,
    AsyncLuaScript,
    ReplicaWait,
    adopt_redis,
    check_replica_wait,
    client_socket_timeout,
    connect_redis,
    forget_connections,
    is_cluster,
    not_replicated,
    per_slot,
    replica_wait,
)

if ASYNC:
    import asyncio
else:
    import select

    #: ``select.poll`` where the platform has it (not on Windows: there prepare always warms)
    _poll = getattr(select, "poll", None)

__all__ = ["AsyncRedisLockBackend"]

CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=True, handoff=True, tokens_survive_data_loss=True
)

#: options this backend reads itself (never handed to redis-py)
OWN_OPTIONS = ("waiter_slack", "namespace")
DEFAULT_WAITER_SLACK = 1.0
#: a BLPOP may last at most this fraction of the socket timeout (the reply must beat it)
_BLPOP_SHARE = 0.8
#: expiry hints kept for owners between a denied acquire and their wait
_MAX_HINTS = 10_000
#: lease keys kept for the names used last
_KEYS_KEPT = 10_000


_PACKAGE = "jobfence.backends.redis"


def _script(name: str, *, with_lib: bool = True) -> str:
    """A script of ``lua/``, after the functions of ``lock_lib.lua`` it calls, if any."""
    if with_lib:
        return load_lua(_PACKAGE, "lock_lib.lua", name, needed_only=True)
    return load_lua(_PACKAGE, name)


def _ms(seconds: float) -> int:
    """Seconds -> whole milliseconds, at least 1 (rounded up, but float noise as in
    ``20.999 * 1000 == 20999.000000000004`` does not add a millisecond)."""
    return max(1, math.ceil(round(seconds * 1000, 6)))


async def _warm(client: Redis) -> None:
    """Make sure ``client``'s pool holds an open connection: take one (redis-py opens it if
    needed, scripts and all) and give it back."""
    pool: Any = client.connection_pool
    conn = await pool.get_connection()
    await pool.release(conn)


def _idle_open(client: Redis) -> bool:
    """Whether the next command of ``client`` will run on an idle connection of its pool that
    is open and that the server has not closed: then :func:`_warm` has nothing to do, and is
    skipped (a checkout and a give-back of redis-py's pool cost more than the lock's own
    work). ``False`` whenever it cannot tell (another kind of pool): :func:`_warm` then runs."""
    pool = client.connection_pool
    idle = getattr(pool, "_available_connections", None)
    if type(idle) is not list or not idle:
        return False
    conn = idle[-1]  # the one redis-py's pool hands out next
    if ASYNC:
        reader = getattr(conn, "_reader", None)
        writer = getattr(conn, "_writer", None)
        if reader is None or writer is None:
            return False
        # the server closed it (the loop saw the end of the stream) or sent something unasked
        return not (reader.at_eof() or len(getattr(reader, "_buffer", b"")) or writer.is_closing())
    else:
        if getattr(pool, "pid", None) != os.getpid():
            return False  # forked: redis-py's pool drops the parent's connections on next use
        sock = getattr(conn, "_sock", None)
        if sock is None or _poll is None:
            return False
        try:
            poller = _poll()
            poller.register(sock, select.POLLIN)
            # readable with nothing asked: closed by the server, or a stray reply
            return not poller.poll(0)
        except (OSError, ValueError):  # closed meanwhile by another thread
            return False


def _url_namespace(url: BackendURL, namespace: str) -> str:
    """The namespace: the URL's ``namespace`` query option (as a Redis queue's URL takes it)
    or the keyword; both given and different is a :class:`ConfigurationError` (the keyword's
    default, ``"jobfence"``, gives way to the URL's)."""
    given = url.options.get("namespace")
    if given is None or given == namespace:
        return namespace
    if namespace != "jobfence":
        raise ConfigurationError(
            f"the url's namespace {given!r} and namespace={namespace!r} differ; give one",
            argument="namespace",
        )
    return given


def _slack(url: BackendURL, options: dict[str, Any]) -> float:
    raw = options.pop("waiter_slack", url.options.get("waiter_slack", DEFAULT_WAITER_SLACK))
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not (0.0 <= value <= 3600.0):
        raise ConfigurationError(
            f"waiter_slack must be a number of seconds between 0 and 3600, got {raw!r}",
            argument="waiter_slack",
        )
    return value


def _has_hash_tag(key: str) -> bool:
    """Whether Redis Cluster hashes ``key`` by a hash tag (what lies between its first ``{``
    and the first ``}`` after it, if not empty), so that every key made by appending to it
    shares its slot. Two such keys merely hashing alike would not vouch for the others."""
    start = key.find("{")
    return start >= 0 and key.find("}", start + 1) > start + 1


class AsyncRedisLockBackend(AsyncLockBackend):
    """Leases in Redis, with fencing tokens, batched renewal and fair FIFO hand-off."""

    kind = "redis"
    capabilities = CAPABILITIES
    #: a release sent again (its reply lost, or its caller cancelled in flight) answers as the
    #: first one did: lock_release.lua remembers the releasing owner for a minute. An
    #: ``AsyncLease`` then releases in its caller's task and sends the release again in the
    #: background only if the caller is cancelled meanwhile.
    resendable_release = True

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        bare_keys: bool = False,
        **options: Any,
    ) -> None:
        self.namespace = check_namespace(
            _url_namespace(url, namespace), limit=NAMESPACE_LIMIT, backend="redis", identifier=False
        )
        self.url = url.masked
        self._slack_ms = round(_slack(url, options) * 1000)
        #: replicas every grant and renewal waits for (None: none)
        self.replica_wait: ReplicaWait | None = replica_wait(url, options)
        scripts = {
            "acquire": _script("lock_acquire.lua"),
            "release": _script("lock_release.lua"),
            "cancel": _script("lock_cancel_wait.lua"),
            "renew": _script("lock_renew.lua", with_lib=False),
            "holder": _script("lock_holder.lua", with_lib=False),
        }
        #: whether the client is ours to close (False: the caller passed it in)
        self._owned = client is None
        self._cluster = False
        #: the lease key is the name itself, as redis-py's ``Lock`` names its key
        #: (``jobfence.compat.redis_py``); the namespace is not used
        self.bare_keys = bare_keys
        if client is not None:
            # a caller's client, used as configured; replies may be decoded (the lock's
            # replies are numbers and owner strings), and it is never closed here
            self._client: Any = adopt_redis(
                client, options, what="redis lock backend", binary=False
            )
            self._renewals: Any = self._client
            self._cluster = is_cluster(client)
        else:
            self._client = connect_redis(
                url,
                options,
                what="redis lock backend",
                own=OWN_OPTIONS,
                scripts=list(scripts.values()),
            )
            # renewals get a client of their own: its connection is never busy with a
            # waiter's BLPOP, so a renewal does not wait for, or open, a connection
            self._renewals = connect_redis(
                url,
                options,
                what="redis lock backend",
                own=OWN_OPTIONS,
                scripts=[scripts["renew"]],
            )
        self._renewals_ready = False
        check_replica_wait(self.replica_wait, self._client, what="redis lock backend")
        timeout = client_socket_timeout(self._client)
        self._blpop_cap: float | None = None if not timeout else float(timeout) * _BLPOP_SHARE
        if self._blpop_cap is not None and self.replica_wait is not None:
            # the BLPOP and its WAIT share one reply deadline
            self._blpop_cap = max(0.001, float(timeout or 0) - self.replica_wait.timeout) * (
                _BLPOP_SHARE
            )
        self._acquire = AsyncLuaScript(self._client, scripts["acquire"])
        self._release = AsyncLuaScript(self._client, scripts["release"])
        self._cancel = AsyncLuaScript(self._client, scripts["cancel"])
        self._renew = AsyncLuaScript(self._client, scripts["renew"])
        self._renew_batch = AsyncLuaScript(self._renewals, scripts["renew"])
        self._holder = AsyncLuaScript(self._client, scripts["holder"])
        # owner -> local monotonic time when the lease it waits for expires (a wait bound)
        self._hints: dict[str, float] = {}
        #: name -> lease key, for the names used last (see :meth:`lock_key`)
        self._keys: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} namespace={self.namespace!r}>"

    # -- keys ----------------------------------------------------------------------------
    def lock_key(self, name: str) -> str:
        """The lease key of ``name``; every other key of the name derives from it (kept for
        the names used last: one dict look-up per call)."""
        key = self._keys.get(name)
        if key is None:
            key = self._lock_key(name)
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            self._keys[name] = key
        return key

    def _lock_key(self, name: str) -> str:
        if self.bare_keys:
            if self._cluster and not _has_hash_tag(name):
                raise ConfigurationError(
                    "on Redis Cluster the name of a redis-py style lock must hold a hash tag "
                    f"(as in '{{orders}}:lock'), so that the keys derived from it share its "
                    f"slot; got {name!r}",
                    argument="name",
                )
            return name
        return key_layout.lock_key(self.namespace, name)

    # -- operations ----------------------------------------------------------------------
    async def prepare(self, *, waiting: bool = False) -> None:
        """Make sure the pool holds an open connection (its scripts loaded): unless an idle
        one is open (:func:`_idle_open`), take one from redis-py's pool, which opens it if
        needed, and give it back. The first time, open the renewals' connection too."""
        if self._cluster:
            return  # a cluster client opens a connection per node as it routes commands
        if self._renewals is self._client or self._renewals_ready:
            if not _idle_open(self._client):
                await _warm(self._client)
            return
        if ASYNC:
            await asyncio.gather(_warm(self._client), _warm(self._renewals))
        else:
            _warm(self._client)
            _warm(self._renewals)
        self._renewals_ready = True

    async def prepare_renewals(self) -> None:
        """:meth:`prepare` for a lease granted on another client (``jobfence.guarded``'s one
        script on the inbox's Redis), whose grant does not use this client's connection: the
        renewals' connection is opened the first time, and this client's own is not looked
        at. Where the renewals run on this client itself (a client of the caller's), it is
        :meth:`prepare`."""
        if self._cluster or (self._renewals is not self._client and self._renewals_ready):
            return
        await self.prepare()

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        key = self.lock_key(name)
        ttl_ms = _ms(ttl)
        if self.replica_wait is not None:
            args: tuple[Any, ...] = (owner, ttl_ms)
            if wait is not None:
                args += (_ms(wait), self._slack_ms)
            reply, acked = await self._acquire.replicated((key,), args, self.replica_wait)
            result = int(reply)
            if result > 0:
                await self._check_grant(name, owner, acked, "acquire")
        elif wait is None:  # a plain try: the short path
            result = int(await self._acquire((key,), (owner, ttl_ms)))
            return result if result > 0 else None
        else:
            result = int(await self._acquire((key,), (owner, ttl_ms, _ms(wait), self._slack_ms)))
        if result > 0:
            return result
        if wait is None:
            return None
        if len(self._hints) > _MAX_HINTS:
            self._hints.clear()
        self._hints[owner] = get_clock().monotonic() + (-1 - result) / 1000
        return None

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        limit = timeout
        expires = self._hints.pop(owner, None)
        if expires is not None:  # nobody is woken when a lease expires: look again then
            limit = min(limit, expires - get_clock().monotonic() + 0.002)
        if self._blpop_cap is not None:
            limit = min(limit, self._blpop_cap)
        if limit < 0.001:
            return None
        wake = self.lock_key(name) + ":w:" + owner
        if self.replica_wait is not None:
            # the BLPOP that takes a hand-off is a write, replicated after the hand-off
            # itself: WAIT on its connection covers both
            pipe: Any = self._client.pipeline(transaction=False)
            pipe.blpop([wake], _ms(limit) / 1000)
            pipe.execute_command("PUBLISH", WAIT_BARRIER, "")
            pipe.execute_command("WAIT", self.replica_wait.replicas, self.replica_wait.timeout_ms)
            reply, _, acked = await pipe.execute()
            if reply is None:
                return None
            await self._check_grant(name, owner, int(acked), "wait")
            return int(reply[1])
        # typed loosely: redis-py < 6 types blpop's timeout as int and its reply as a union
        blpop: Any = self._client.blpop
        reply = await blpop([wake], _ms(limit) / 1000)
        return None if reply is None else int(reply[1])

    async def _check_grant(self, name: str, owner: str, acked: int, operation: str) -> None:
        """A grant to ``owner`` that ``acked`` replicas acknowledged: kept if enough did, else
        given back (owner-checked; if that fails too, the lease expires after its ttl) and
        :class:`~jobfence.NotReplicated` raised."""
        wait = self.replica_wait
        if wait is None or acked >= wait.replicas:
            return
        try:
            await self._release((self.lock_key(name),), (owner,))
            outcome = "the lease was given back: not acquired"
        except Exception as exc:
            outcome = f"giving the lease back failed ({exc!r}): it expires after its ttl"
        raise not_replicated(
            "redis lock backend", self.url, f"lock.{operation} of {name!r}", acked, wait, outcome
        )

    async def cancel_wait(self, name: str, owner: str) -> int | None:
        self._hints.pop(owner, None)
        result = await self._cancel((self.lock_key(name),), (owner,))
        return None if result is None else int(result)

    async def release(self, name: str, owner: str) -> bool:
        return bool(await self._release((self.lock_key(name),), (owner,)))

    async def force_release(self, name: str) -> bool:
        """Drop the lease on ``name`` whoever holds it; the next live waiter gets it."""
        return bool(await self._release((self.lock_key(name),), ("", "force")))

    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        key, args = self.lock_key(name), (owner, _ms(ttl))
        if self.replica_wait is not None:
            result, acked = await self._renew.replicated((key,), args, self.replica_wait)
            if result[0]:
                self._check_renewal(acked, f"lock.extend of {name!r}")
            return bool(result[0])
        result = await self._renew((key,), args)
        return bool(result[0])

    def _check_renewal(self, acked: int, operation: str) -> None:
        """A renewal that ``acked`` replicas acknowledged: :class:`~jobfence.NotReplicated`
        unless enough did (the lease counts only the lifetime a replica is known to have)."""
        wait = self.replica_wait
        if wait is not None and acked < wait.replicas:
            raise not_replicated(
                "redis lock backend",
                self.url,
                operation,
                acked,
                wait,
                "the new lifetime is unconfirmed: the lease keeps its previous deadline",
            )

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every lease in ``items`` with one script call (one round trip), on the
        renewals' own connection."""
        if not items:
            return []
        keys = [self.lock_key(name) for name, _, _ in items]
        if self._cluster:  # one script call per hash slot, all at once
            return await per_slot(keys, partial(self._renew_some, keys, items))
        return await self._renew_some(keys, items, range(len(items)))

    async def _renew_some(
        self, keys: Sequence[str], items: Sequence[RenewItem], which: Sequence[int]
    ) -> list[bool]:
        args: list[str | int] = []
        for i in which:
            _, owner, ttl = items[i]
            args.append(owner)
            args.append(_ms(ttl))
        if self.replica_wait is not None:
            result, acked = await self._renew_batch.replicated(
                [keys[i] for i in which], args, self.replica_wait
            )
            if any(result):
                self._check_renewal(acked, f"lock.renew of {len(which)} leases")
            return [bool(ok) for ok in result]
        result = await self._renew_batch([keys[i] for i in which], args)
        return [bool(ok) for ok in result]

    async def holder(self, name: str) -> LockHolder | None:
        reply = await self._holder((self.lock_key(name),))
        if not reply:
            return None
        owner, token, pttl = reply
        owner = owner.decode("utf-8", "replace") if isinstance(owner, bytes) else str(owner)
        return LockHolder(owner, int(token), max(0, int(pttl)) / 1000)

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """``SCAN`` (never ``KEYS``) for the namespace's lease keys of names starting with
        ``prefix`` (string keys that ``keys.parse`` reads as a lock of this namespace with no
        suffix: never a derived key, another namespace's or another part's key), then read
        each one's holder, in name order, until ``limit`` live ones are found. One round trip
        per ``SCAN`` page and per lease read; on a cluster the scan visits every primary."""
        if self.bare_keys:
            raise ConfigurationError(
                "a redis-py style lock backend (bare_keys) has no namespace to list: its "
                "keys are the lock names themselves; ask for one name with holder(name)",
                argument="bare_keys",
            )
        names: set[str] = set()
        for pattern in key_layout.tagged_patterns(key_layout.LOCK, self.namespace, prefix):
            async for raw in self._client.scan_iter(
                match=pattern, count=key_layout.SCAN_COUNT, _type="string"
            ):
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                parts = key_layout.parse(key)
                if (
                    parts is not None
                    and parts.part == key_layout.LOCK
                    and parts.namespace == self.namespace
                    and not parts.suffix
                    and parts.name.startswith(prefix)
                ):
                    names.add(parts.name)
        found: list[tuple[str, LockHolder]] = []
        for name in sorted(names):
            if len(found) >= limit:
                break
            held = await self.holder(name)
            if held is not None:  # it may have ended since the scan saw it
                found.append((name, held))
        return found

    async def close(self) -> None:
        self._hints.clear()
        if self._owned:  # a client passed in is the caller's to close
            await self._client.aclose()
            await self._renewals.aclose()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connections and wait hints
        inherited from the parent (see ``jobfence/_core/forks.py``)."""
        forget_connections(self._client)
        if self._renewals is not self._client:
            forget_connections(self._renewals)
        self._renewals_ready = False
        self._hints = {}
