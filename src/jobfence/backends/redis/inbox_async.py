"""``redis://`` / ``rediss://`` inbox backend (``inbox_async.py``; ``inbox.py`` is generated
from it).

Each verb is ONE Lua script (``lua/inbox_*.lua``, loaded once, run by EVALSHA), so a claim is
one round trip and atomic on the server; time is Redis's own clock (``TIME``). Completed
records expire natively after ``retention`` (``PEXPIRE``), so ``purge()`` has nothing to delete:
it only checks that the server answers (one ``PING``), so that a wrong password or an
unreachable server fails as on the other backends; an abandoned in-progress record expires
``retention`` after its deadline.

Keys (``keys.py``): ``<table>:<idempotency key>`` (a hash) for a key without braces, else
``<table>:inbox%:{<key, percent-encoded>}``; no idempotency key makes a lock's or a queue's
key, whose names always hold a ``{`` after their part tag. The operator's reads (``claims``,
``claim_info``) walk the table's keys with ``SCAN`` (never ``KEYS``), keep those that decode as
this table's records, and read records with one read-only script per batch
(``inbox_info.lua``); ``forget`` is one ``DEL`` of the record's key. URL options: ``table`` (default
``jobfence_inbox``), ``connect_timeout`` and ``timeout`` (seconds, default 5 each); the rest of
the URL and the keyword options go to redis-py, with the defaults of ``connect_redis``
(``client_async.py`` / ``client.py``: one immediate retry on a connection error, the scripts
loaded as each connection opens). Every script is safe to re-send after a lost reply: a
claim the caller already owns is returned as its own, ``complete`` stores the same result
again, ``extend`` (also the batched renewal) sets the deadline again, and ``release``
remembers the owner that released (field ``x``).

Replicas: with ``wait_replicas`` = N (default 0; ``wait_timeout`` seconds, default 1) every
claim, completion and extension is followed, in the same pipeline on the same connection, by
``WAIT N wait_timeout``. When fewer than N replicas acknowledge in time,
:class:`~jobfence.NotReplicated` is raised: a claim that was taken is released first
(owner-checked), so it is not handed out, since a failover could let a second worker claim the
key; a completion or an extension stays stored on the primary but is reported unconfirmed (a
failover may lose it: the job may run again, which the caller must be ready for). Releases do
not wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..._core.inbox_support import DEFAULT_RETENTION, DEFAULT_TABLE, utc_from_epoch
from ..._core.sqlfiles import load_lua
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ..base import (
    AsyncInboxBackend,
    ClaimInfo,
    ClaimItem,
    ClaimRecord,
    ClaimState,
    CompleteItem,
    InboxCapabilities,
    RenewItem,
)
from . import TABLE_LIMIT
from . import keys as key_layout
from .client_async import (
    AsyncLuaScript,
    ReplicaWait,
    adopt_redis,
    check_replica_wait,
    connect_redis,
    forget_connections,
    is_cluster,
    not_replicated,
    per_slot,
    replica_wait,
)
from .locks_async import _ms as lease_ms

__all__ = ["AsyncRedisInboxBackend"]


_PACKAGE = "jobfence.backends.redis"


def _script(name: str, *, lock_lib: bool = False) -> str:
    """The script ``lua/<name>.lua`` after the functions of ``lua/inbox_lib.lua`` it calls, and
    first those of ``lua/lock_lib.lua`` for a script that reads or takes a lease (``lock_lib``)."""
    libs = ("lock_lib.lua", "inbox_lib.lua") if lock_lib else ("inbox_lib.lua",)
    return load_lua(_PACKAGE, *libs, f"{name}.lua", needed_only=True)


#: records read by one call of the info script while listing
_INFO_BATCH = 200


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _claim_record(reply: Any, owner: str, fingerprint: str | None) -> ClaimRecord:
    """The record of one claim's reply: the record's fields, or the expiry alone (an
    integer) of a key that was new and is now ``owner``'s (attempt 1, with ``fingerprint``)."""
    if isinstance(reply, int):
        return ClaimRecord(
            mine=True,
            state=ClaimState.IN_PROGRESS,
            attempt=1,
            owner=owner,
            fingerprint=fingerprint or None,
            expires_at=utc_from_epoch(reply / 1000),
        )
    mine, state, rec_owner, attempt, rec_fp, result, expires = reply
    return ClaimRecord(
        mine=bool(mine),
        state=ClaimState(_str(state)),
        attempt=int(attempt),
        owner=_str(rec_owner),
        fingerprint=_str(rec_fp) or None,
        result=result,
        expires_at=utc_from_epoch(int(expires) / 1000),
    )


def _server(client: Any) -> tuple[Any, ...] | None:
    """Where a plain redis-py client (sync or asyncio) connects, and as whom: (host, port,
    database, user) or (unix socket path, database, user) -- the user too, since an ACL may
    let another user read other keys; ``None`` when it does not tell (e.g. a Sentinel pool,
    which finds the primary as it connects)."""
    if type(getattr(client, "connection_pool", None)).__name__.startswith("Sentinel"):
        return None
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    db = int(kwargs.get("db") or 0)
    user = kwargs.get("username")
    if kwargs.get("path"):
        return ("unix", kwargs["path"], db, user)
    if kwargs.get("host") is None:
        return None
    return (str(kwargs["host"]).lower(), int(kwargs.get("port") or 6379), db, user)


def _same_database(a: Any, b: Any) -> bool:
    """Do the clients ``a`` and ``b`` reach the same database of the same server as the same
    user (as far as their connection settings tell: the same host name, port, database
    number and user name)?"""
    where = _server(a)
    return where is not None and where == _server(b)


class AsyncRedisInboxBackend(AsyncInboxBackend):
    kind = "redis"
    capabilities = InboxCapabilities(
        cross_process=True, transactional=False, native_expiry=True, scanned_listing=True
    )

    def __init__(
        self,
        url: BackendURL,
        *,
        table: str = DEFAULT_TABLE,
        retention: float = DEFAULT_RETENTION,
        client: Any = None,
        **options: Any,
    ) -> None:
        self.table = check_namespace(
            url.options.get("table", table), limit=TABLE_LIMIT, backend="redis", argument="table"
        )
        self.retention = retention
        #: replicas every claim, completion and extension waits for (None: none)
        self.replica_wait: ReplicaWait | None = replica_wait(url, options)
        self.url = url.masked
        scripts = [
            _script("inbox_claim"),
            _script("inbox_complete"),
            load_lua(_PACKAGE, "inbox_release.lua"),
            load_lua(_PACKAGE, "inbox_extend.lua"),
            load_lua(_PACKAGE, "inbox_info.lua"),
            _script("inbox_complete_held", lock_lib=True),
            _script("guard_claim", lock_lib=True),
            _script("guard_complete", lock_lib=True),
        ]
        #: whether the client is ours to close (False: the caller passed it in)
        self._owned = client is None
        self._cluster = False
        if client is not None:
            self.client: Any = adopt_redis(client, options, what="redis inbox", binary=True)
            self._cluster = is_cluster(client)
        else:
            self.client = connect_redis(
                url, options, what="redis inbox", own=("table",), scripts=scripts
            )
        check_replica_wait(self.replica_wait, self.client, what="redis inbox")
        self._claim = AsyncLuaScript(self.client, scripts[0])
        self._complete = AsyncLuaScript(self.client, scripts[1])
        self._release = AsyncLuaScript(self.client, scripts[2])
        self._extend = AsyncLuaScript(self.client, scripts[3])
        self._info = AsyncLuaScript(self.client, scripts[4])
        self._complete_held = AsyncLuaScript(self.client, scripts[5])
        self._guard_claim = AsyncLuaScript(self.client, scripts[6])
        self._guard_complete = AsyncLuaScript(self.client, scripts[7])

    batches = True

    def _key(self, key: str) -> str:
        """The Redis key of idempotency key ``key``'s record."""
        return key_layout.inbox_key(self.table, key)

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        return (await self._claim_some([(key, owner, fingerprint, ttl)], range(1)))[0]

    async def claim_many(self, items: Sequence[ClaimItem]) -> list[ClaimRecord]:
        """Claim a batch with one script call (one round trip; on a cluster, one per hash
        slot)."""
        if not items:
            return []
        if self._cluster:
            keys = [self._key(key) for key, _, _, _ in items]
            return await per_slot(keys, partial(self._claim_some, items))
        return await self._claim_some(items, range(len(items)))

    async def _claim_some(
        self, items: Sequence[ClaimItem], which: Sequence[int]
    ) -> list[ClaimRecord]:
        keys = []
        args: list[Any] = [int(self.retention * 1000)]
        for i in which:
            key, owner, fingerprint, ttl = items[i]
            keys.append(self._key(key))
            args += [owner, fingerprint or "", int(ttl * 1000)]
        if self.replica_wait is not None:
            replies, acked = await self._claim.replicated(keys, args, self.replica_wait)
            await self._check_claims(items, which, replies, acked)
        else:
            replies = await self._claim(keys, args)
        return [
            _claim_record(reply, items[i][1], items[i][2])
            for i, reply in zip(which, replies, strict=True)
        ]

    async def _check_claims(
        self, items: Sequence[ClaimItem], which: Sequence[int], replies: Any, acked: int
    ) -> None:
        """Claims that ``acked`` replicas acknowledged: kept if enough did, else the ones
        taken are released (owner-checked; if that fails, they expire after their ttl) and
        :class:`~jobfence.NotReplicated` raised."""
        wait = self.replica_wait
        if wait is None or acked >= wait.replicas:
            return
        taken = [
            i
            for i, reply in zip(which, replies, strict=True)
            if isinstance(reply, int) or bool(reply[0])
        ]
        outcome = "nothing was claimed"
        if taken:
            try:
                for i in taken:
                    await self._release((self._key(items[i][0]),), (items[i][1],))
                outcome = "the claim was released: not claimed"
            except Exception as exc:
                outcome = f"releasing the claim failed ({exc!r}): it expires after its ttl"
        first = items[which[0]][0]
        raise not_replicated(
            "redis inbox", self.url, f"inbox.claim of {first!r}", acked, wait, outcome
        )

    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        return (await self._complete_some([(key, owner, result)], retention, range(1)))[0]

    async def complete_many(self, items: Sequence[CompleteItem], retention: float) -> list[bool]:
        """Complete a batch with one script call (one round trip; on a cluster, one per hash
        slot)."""
        if not items:
            return []
        if self._cluster:
            keys = [self._key(key) for key, _, _ in items]
            return await per_slot(keys, partial(self._complete_some, items, retention))
        return await self._complete_some(items, retention, range(len(items)))

    async def _complete_some(
        self, items: Sequence[CompleteItem], retention: float, which: Sequence[int]
    ) -> list[bool]:
        keys = []
        args: list[Any] = [max(1, int(retention * 1000))]
        for i in which:
            key, owner, data = items[i]
            keys.append(self._key(key))
            args += [owner, data]
        if self.replica_wait is not None:
            replies, acked = await self._complete.replicated(keys, args, self.replica_wait)
            if acked < self.replica_wait.replicas and any(replies):
                raise not_replicated(
                    "redis inbox",
                    self.url,
                    f"inbox.complete of {items[which[0]][0]!r}",
                    acked,
                    self.replica_wait,
                    "the result is stored on the primary but unconfirmed: a failover may "
                    "lose it and the job run again",
                )
            return [bool(ok) for ok in replies]
        return [bool(ok) for ok in await self._complete(keys, args)]

    def shares_server(self, client: Any) -> bool:
        """Does ``client`` (a lock backend's redis-py client) reach the same database of the
        same server as this inbox, with nothing between a write and its acknowledgement that
        this inbox's own scripts would not do (no cluster, no replica ``WAIT``)? Then
        :meth:`complete_held` can check a lease of that client in the completion itself."""
        if self._cluster or self.replica_wait is not None or is_cluster(client):
            return False
        return _same_database(self.client, client)

    async def claim_leased(
        self,
        key: str,
        owner: str,
        fingerprint: str | None,
        ttl: float,
        lease_key: str,
        lease_owner: str,
        lease_ttl: float,
    ) -> tuple[int, ClaimRecord | None]:
        """Take the lease stored at ``lease_key`` (a lock backend's key on this server: see
        :meth:`shares_server`) for ``lease_owner`` as the lock backend's plain try does, then,
        only if it was taken, :meth:`claim` ``key``: one script, one round trip
        (``guard_claim.lua``). Returns the lock backend's answer (the fencing token, or
        ``-1 -`` the milliseconds left on the current lease) and the claim's record (``None``:
        the lease was not free, nothing was claimed)."""
        args = (
            lease_owner,
            lease_ms(lease_ttl),
            int(self.retention * 1000),
            owner,
            fingerprint or "",
            int(ttl * 1000),
        )
        reply = await self._guard_claim((lease_key, self._key(key)), args)
        token = int(reply[0])
        if token <= 0:
            return token, None
        return token, _claim_record(reply[1], owner, fingerprint)

    async def complete_held(
        self,
        key: str,
        owner: str,
        result: bytes,
        retention: float,
        lease_key: str,
        lease_owner: str,
        *,
        release: bool = False,
    ) -> int:
        """:meth:`complete`, only while the lease stored at ``lease_key`` (a lock backend's
        key on this server: see :meth:`shares_server`) is ``lease_owner``'s, in one script:
        1 stored, 0 the claim is not ``owner``'s, -1 the lease is not held (nothing written).
        ``release``: the same script then releases the lease as the lock backend's release
        does, hand-off to a waiter included (``guard_complete.lua``; not on -1)."""
        args = (max(1, int(retention * 1000)), owner, result, lease_owner)
        script = self._guard_complete if release else self._complete_held
        return int(await script((self._key(key), lease_key), args))

    async def release(self, key: str, owner: str) -> bool:
        return bool(await self._release((self._key(key),), (owner,)))

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        return (await self.renew([(key, owner, ttl)]))[0]

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every claim of ``items`` with one script call (one round trip)."""
        if not items:
            return []
        keys = [self._key(key) for key, _, _ in items]
        if self._cluster:  # one script call per hash slot (each key is a claim of its own)
            return await per_slot(keys, partial(self._renew_some, keys, items))
        return await self._renew_some(keys, items, range(len(items)))

    async def _renew_some(
        self, keys: Sequence[str], items: Sequence[RenewItem], which: Sequence[int]
    ) -> list[bool]:
        args: list[Any] = [max(1, int(self.retention * 1000))]
        for i in which:
            _, owner, ttl = items[i]
            args += [owner, max(1, int(ttl * 1000))]
        if self.replica_wait is not None:
            reply, acked = await self._extend.replicated(
                [keys[i] for i in which], args, self.replica_wait
            )
            if acked < self.replica_wait.replicas and any(reply):
                raise not_replicated(
                    "redis inbox",
                    self.url,
                    f"inbox.extend of {len(which)} claims",
                    acked,
                    self.replica_wait,
                    "the new deadline is unconfirmed: the claim keeps its previous one",
                )
            return [bool(ok) for ok in reply]
        reply = await self._extend([keys[i] for i in which], args)
        return [bool(ok) for ok in reply]

    async def purge(self, retention: float) -> int:
        """Nothing to delete (records expire natively): 0, once the server answered a
        ``PING`` -- a wrong password or an unreachable server raises, as a purge elsewhere."""
        await self.client.ping()
        return 0

    async def _infos(self, keys: Sequence[str]) -> list[ClaimInfo | None]:
        """The records of ``keys`` (idempotency keys), ``None`` where there is none."""
        if not keys:
            return []
        names = [self._key(key) for key in keys]
        if self._cluster:  # one call per key: the keys lie in many slots
            replies = [(await self._info((name,)))[0] for name in names]
        else:
            replies = list(await self._info(names))
        found: list[ClaimInfo | None] = []
        for key, reply in zip(keys, replies, strict=True):
            if not reply:
                found.append(None)
                continue
            state, owner, attempt, fingerprint, claimed, left = reply
            found.append(
                ClaimInfo(
                    key=key,
                    state=ClaimState(_str(state)),
                    owner=_str(owner) or None,
                    attempt=int(attempt),
                    fingerprint=_str(fingerprint) or None,
                    claimed_at=utc_from_epoch(int(claimed) / 1000) if claimed else None,
                    expires_in=int(left) / 1000,
                )
            )
        return found

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        """``SCAN`` (never ``KEYS``) for the table's hashes of keys starting with ``prefix``
        (glob characters escaped: matched literally; only keys that decode as this table's
        records count), then read them in key order, a batch per script call, until ``limit``
        records in ``state`` are found."""
        keys: set[str] = set()
        for pattern in key_layout.inbox_patterns(self.table, prefix):
            async for raw in self.client.scan_iter(
                match=pattern, count=key_layout.SCAN_COUNT, _type="hash"
            ):
                name = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
                key = key_layout.inbox_name(self.table, name)
                if key is not None and key.startswith(prefix):
                    keys.add(key)
        ordered = sorted(keys)
        found: list[ClaimInfo] = []
        for start in range(0, len(ordered), _INFO_BATCH):
            for info in await self._infos(ordered[start : start + _INFO_BATCH]):
                # gone since the scan saw it, or of another state
                if info is not None and (state is None or info.state is state):
                    found.append(info)
                    if len(found) >= limit:
                        return found
        return found

    async def claim_info(self, key: str) -> ClaimInfo | None:
        return (await self._infos([key]))[0]

    async def forget(self, key: str) -> bool:
        return bool(await self.client.delete(self._key(key)))

    async def install(self) -> None:
        await self.client.ping()  # nothing to create; checks that the server answers

    async def drop(self) -> None:
        """Delete every record of the table (only keys that decode as its records: a lock
        or queue whose namespace is the table's name keeps its keys)."""
        batch: list[Any] = []
        pattern = key_layout.inbox_patterns(self.table)[0]
        async for name in self.client.scan_iter(match=pattern, count=key_layout.SCAN_COUNT):
            text = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
            if key_layout.inbox_name(self.table, text) is None:
                continue
            batch.append(name)
            if len(batch) >= 500:
                await self._delete(batch)
                batch = []
        if batch:
            await self._delete(batch)

    async def _delete(self, keys: list[Any]) -> None:
        if self._cluster:  # one DEL per key: the keys lie in many slots
            for key in keys:
                await self.client.delete(key)
        else:
            await self.client.delete(*keys)

    async def close(self) -> None:
        if self._owned:  # a client passed in is the caller's to close
            await self.client.aclose()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connections inherited from
        the parent (see ``jobfence/_core/forks.py``)."""
        forget_connections(self.client)
