"""``etcd://`` / ``etcds://`` -- the etcd lock backend (``locks_async.py``; ``locks.py`` is
generated from it), the etcd lock recipe over etcd's JSON gateway (``client_async.py``).

Key layout (``keys.py``; every component percent-encoded)::

    <namespace>/locks/<name>/<owner>     value: the owner; attached to an etcd lease

* acquire: grant an etcd lease of ``ttl`` rounded UP to whole seconds (etcd counts leases in
  seconds, and a server never keeps one shorter than its minimum, 1.5 election timeouts
  rounded up: 2 s with etcd's default 1 s election timeout), then one transaction puts the
  owner's key attached to it unless the key exists, and reads the name's oldest key (ttls
  under 2 s get a 2 s lease: see ``leases.py``). The
  holder is the key with the lowest ``create_revision`` under the name; the fencing token is
  that ``create_revision``. etcd's revision grows on every write of the cluster and is
  Raft-committed, so tokens of one name strictly increase, through leader failover too.
* waiting (FIFO hand-off, no thundering herd): a waiter keeps its key (attached to a short
  lease of ``waiter_ttl`` seconds, default 2, that it keeps alive while it waits, so that a
  waiter that dies leaves the queue soon) and watches ONLY its predecessor, the key with the
  greatest ``create_revision`` below its own, for deletion; then it looks again. When no key
  is older than its own, the lease is the waiter's: its key is re-put attached to a lease of
  the ttl it asked for (the re-put keeps ``create_revision``, so the token is the one its
  place in the queue gave it). A wait that times out or is cancelled revokes the waiter's
  lease, which deletes its key.
* release: revoke the owner's lease, which deletes its key (one call when this client was
  granted the lease; otherwise after a read showing the key is the holder's);
  ``force_release`` revokes the holder's lease whoever it is.
* extend and renew: a lease keep-alive (``lease/keepalive``, one call per lease; ``renew``
  sends them concurrently in the async flavour) when the ttl is the lease's, after a read
  showing the owner's key still holds the name; a keep-alive answering a ttl of 0 (the lease
  is gone) means the lease was lost. etcd cannot change a lease's ttl: an ``extend`` to
  another ttl grants a new lease and re-puts the key attached to it in a transaction that
  compares the key's ``mod_revision`` (so only while it is still the owner's, unchanged),
  then revokes the old lease. The token is unchanged (``create_revision`` stays).

The server keeps a lease alive for at least its ttl from the last keep-alive it committed,
by its own clock; the client counts the ttl from before its request, so a holder believes
its lease lost before the server frees it. Capabilities: cross-process, ttl expiry, FIFO
with hand-off; tokens do not survive the loss of etcd's data (a new cluster's revisions
start again at 1).

Options (URL query or keyword): ``waiter_ttl`` (whole seconds, default 2) and the client's
(``client_async.py``): ``timeout``, ``connect_timeout``, ``ca_file``, ``cert_file``,
``key_file``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._core.clock import get_clock
from ..._core.flavour import ASYNC
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ...errors import ConfigurationError
from ..base import AsyncLockBackend, LockCapabilities, LockHolder, RenewItem
from . import NAMESPACE_LIMIT
from . import keys as key_layout
from .client_async import AsyncEtcdClient, b64, connect_etcd, unb64
from .leases import lease_seconds

if ASYNC:
    import asyncio

__all__ = ["AsyncEtcdLockBackend"]

CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=True, handoff=True, tokens_survive_data_loss=False
)
DEFAULT_WAITER_TTL = 2


def _waiter_ttl(url: BackendURL, options: dict[str, Any]) -> int:
    raw = options.pop("waiter_ttl", url.options.get("waiter_ttl", DEFAULT_WAITER_TTL))
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not (2.0 <= value <= 3600.0):
        raise ConfigurationError(
            f"waiter_ttl must be a number of seconds from 2 to 3600, got {raw!r}",
            argument="waiter_ttl",
        )
    return lease_seconds(value)


def _compare(key: str, target: str, value: int, result: str = "EQUAL") -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": b64(key), "target": target, "result": result, field: str(value)}


def _kvs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return list(response.get("response_range", {}).get("kvs", ()))


class _Mine:
    """This client's key under one name: its lease and the lease's seconds, its
    create_revision, and the seconds its owner asked for (the lease's once it holds)."""

    __slots__ = ("held", "lease", "revision", "seconds", "want")

    def __init__(self, lease: int, seconds: int, revision: int, want: int) -> None:
        self.lease = lease
        self.seconds = seconds
        self.revision = revision
        self.want = want
        #: whether the name was granted to it (its token handed out)
        self.held = False


class AsyncEtcdLockBackend(AsyncLockBackend):
    """Leases on etcd: the etcd lock recipe, with create-revision fencing tokens and FIFO
    hand-off."""

    kind = "etcd"
    capabilities = CAPABILITIES

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        **options: Any,
    ) -> None:
        self.namespace = check_namespace(
            namespace, limit=NAMESPACE_LIMIT, backend="etcd", identifier=False
        )
        self.url = url.masked
        self.waiter_ttl = _waiter_ttl(url, options)
        self._owned = client is None
        self.client: AsyncEtcdClient = (
            client if client is not None else connect_etcd(url, options, what="etcd lock backend")
        )
        #: (name, owner) -> the key this client put for it (as holder or waiter)
        self._mine: dict[tuple[str, str], _Mine] = {}
        #: whether :meth:`prepare` opened a connection already
        self._ready = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} namespace={self.namespace!r}>"

    # -- keys ------------------------------------------------------------------------------
    def _prefix(self, name: str) -> str:
        return key_layout.lock_prefix(self.namespace, name)

    def _key(self, name: str, owner: str) -> str:
        return key_layout.lock_key(self.namespace, name, owner)

    def _oldest(self, name: str) -> dict[str, Any]:
        """A read of the oldest key under ``name`` (its holder), for a transaction."""
        return {
            "request_range": self.client.range_request(
                self._prefix(name), prefix=True, limit=1, sort_target="CREATE"
            )
        }

    def _before(self, name: str, revision: int) -> dict[str, Any]:
        """A read of the key just before ``revision`` in ``name``'s queue (its predecessor)."""
        body = self.client.range_request(
            self._prefix(name), prefix=True, limit=1, sort_target="CREATE", sort_order="DESCEND"
        )
        body["max_create_revision"] = str(revision - 1)
        return {"request_range": body}

    # -- the queue -------------------------------------------------------------------------
    async def _join(
        self, name: str, owner: str, want: int, plain: bool
    ) -> tuple[_Mine, bool | None] | None:
        """Put ``owner``'s key under ``name`` attached to a new lease of ``want`` seconds (or
        find the key it put before, and keep its lease alive); ``(the key, whether it is the
        oldest)`` (``None`` for a key found again: not looked at), or ``None`` when ``plain``
        (a try that does not queue) and ``name`` is held, or when the key vanished."""
        key = self._key(name, owner)
        mine = self._mine.get((name, owner))
        if mine is not None:
            ok, _ = await self.client.txn([_compare(key, "LEASE", mine.lease)], [])
            if ok and await self.client.keepalive(mine.lease) > 0:
                mine.want = want
                return mine, None
            self._mine.pop((name, owner), None)  # our key is gone: join again, at the back
        if plain:
            held = await self.client.range(self._prefix(name), prefix=True, limit=1, keys_only=True)
            if held:
                return None
        lease = await self.client.grant(want)
        read = {"request_range": self.client.range_request(key)}
        ok, rows = await self.client.txn(
            [_compare(key, "CREATE", 0)],
            [
                {"request_put": {"key": b64(key), "value": b64(owner), "lease": str(lease)}},
                read,
                self._oldest(name),
            ],
            [read, self._oldest(name)],
        )
        found, oldest = _kvs(rows[-2]), _kvs(rows[-1])
        if not found:  # its lease ended at once
            return None
        kv = found[0]
        if int(kv.get("lease", 0)) != lease:  # there already (a request sent again)
            await self.client.revoke(lease)
        mine = _Mine(int(kv.get("lease", 0)), want, int(kv["create_revision"]), want)
        self._mine[(name, owner)] = mine
        return mine, bool(oldest) and int(oldest[0]["create_revision"]) == mine.revision

    async def _ahead(self, name: str, owner: str, mine: _Mine) -> tuple[bool, list[Any], int]:
        """``(whether owner's key is still there, the key just ahead of it if any, the
        store's revision)``."""
        ok, rows = await self.client.txn(
            [_compare(self._key(name, owner), "CREATE", mine.revision)],
            [self._before(name, mine.revision)],
        )
        if not ok:
            return False, [], 0
        return True, _kvs(rows[0]), int(rows[0]["response_range"]["header"]["revision"])

    async def _granted(self, name: str, owner: str, mine: _Mine) -> int | None:
        """``owner``'s key is the oldest: make its lease as long as its owner asked
        (re-leased if it is not) and return the token, or ``None`` if the key went."""
        if mine.seconds != mine.want and not await self._relet(name, owner, mine, mine.want):
            self._mine.pop((name, owner), None)
            return None
        mine.held = True
        return mine.revision

    async def _relet(self, name: str, owner: str, mine: _Mine, seconds: int) -> bool:
        """Attach ``owner``'s key to a new lease of ``seconds`` (the key keeps its
        create_revision, so the token stays), if the key is still as this client left it."""
        key = self._key(name, owner)
        lease = await self.client.grant(seconds)
        ok, _ = await self.client.txn(
            [_compare(key, "CREATE", mine.revision), _compare(key, "LEASE", mine.lease)],
            [{"request_put": {"key": b64(key), "value": b64(owner), "lease": str(lease)}}],
        )
        if not ok:
            await self.client.revoke(lease)
            return False
        await self.client.revoke(mine.lease)  # its key is attached to the new lease now
        mine.lease, mine.seconds = lease, seconds
        return True

    async def _leave(self, name: str, owner: str) -> None:
        mine = self._mine.pop((name, owner), None)
        if mine is not None:
            await self.client.revoke(mine.lease)

    # -- operations ------------------------------------------------------------------------
    async def prepare(self, *, waiting: bool = False) -> None:
        """Open the first connection (one status call) before ``Locks`` starts a lease's
        clock, so that opening it does not eat into the first lease; later calls reuse
        httpx's pooled connections."""
        if not self._ready:
            await self.client.status()
            self._ready = True

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        joined = await self._join(name, owner, lease_seconds(ttl), wait is None)
        if joined is None:
            return None
        mine, first = joined
        if first is None:  # a waiter's key, found again: is anyone still ahead?
            there, ahead, _ = await self._ahead(name, owner, mine)
            if not there:
                self._mine.pop((name, owner), None)
                return None
            first = not ahead
        if first:
            return await self._granted(name, owner, mine)
        if wait is None:
            await self._leave(name, owner)
        elif mine.seconds != self.waiter_ttl:
            # a waiter: a short lease, kept alive while it waits, so that a waiter that
            # dies leaves the queue soon
            await self._relet(name, owner, mine, self.waiter_ttl)
        return None

    async def wait(self, name: str, owner: str, timeout: float) -> int | None:
        mine = self._mine.get((name, owner))
        if mine is None:
            return None
        clock = get_clock()
        deadline = clock.monotonic() + timeout
        while True:
            there, ahead, revision = await self._ahead(name, owner, mine)
            if not there:  # our key is gone (its lease expired): the caller joins again
                self._mine.pop((name, owner), None)
                return None
            if not ahead:  # nobody ahead: handed to us
                return await self._granted(name, owner, mine)
            left = deadline - clock.monotonic()
            if left <= 0:
                return None
            await self.client.wait_deleted(
                _text(ahead[0]["key"]), revision + 1, min(left, mine.seconds / 3)
            )
            if await self.client.keepalive(mine.lease) <= 0:
                self._mine.pop((name, owner), None)
                return None

    async def cancel_wait(self, name: str, owner: str) -> int | None:
        mine = self._mine.get((name, owner))
        if mine is None:
            return None
        there, ahead, _ = await self._ahead(name, owner, mine)
        if there and not ahead:
            token = await self._granted(name, owner, mine)  # handed to us meanwhile
            if token is not None:
                return token
        await self._leave(name, owner)
        return None

    async def release(self, name: str, owner: str) -> bool:
        mine = self._mine.pop((name, owner), None)
        if mine is not None and mine.held:
            # granted by this client: its lease is attached to the holder's key and nothing
            # else, so revoking it (one call) releases exactly this lease, if it still lives
            return await self.client.revoke(mine.lease)
        _, rows = await self.client.txn(
            [],
            [
                {"request_range": self.client.range_request(self._key(name, owner))},
                self._oldest(name),
            ],
        )
        found, oldest = _kvs(rows[0]), _kvs(rows[1])
        if not found:
            return False
        held = bool(oldest) and oldest[0]["key"] == found[0]["key"]
        lease = int(found[0].get("lease", 0))
        if lease:
            gone = await self.client.revoke(lease)
        else:
            gone = await self.client.delete(self._key(name, owner)) > 0
        return held and gone

    async def force_release(self, name: str) -> bool:
        """Revoke the holder's lease (deleting its key) whoever holds ``name``; the next
        waiter's key becomes the oldest."""
        oldest = await self.client.range(
            self._prefix(name), prefix=True, limit=1, sort_target="CREATE"
        )
        if not oldest:
            return False
        lease = int(oldest[0].get("lease", 0))
        if lease:
            return await self.client.revoke(lease)
        return await self.client.delete(_text(oldest[0]["key"])) > 0

    async def extend(self, name: str, owner: str, ttl: float) -> bool:
        seconds = lease_seconds(ttl)
        key = self._key(name, owner)
        _, rows = await self.client.txn(
            [], [{"request_range": self.client.range_request(key)}, self._oldest(name)]
        )
        found, oldest = _kvs(rows[0]), _kvs(rows[1])
        if not found or not oldest or oldest[0]["key"] != found[0]["key"]:
            self._mine.pop((name, owner), None)
            return False
        lease = int(found[0].get("lease", 0))
        mine = self._mine.get((name, owner))
        if mine is None or mine.lease != lease:
            granted = (await self.client.time_to_live(lease))[1] if lease else 0
            mine = _Mine(lease, granted, int(found[0]["create_revision"]), granted)
            self._mine[(name, owner)] = mine
        mine.held = True  # its key is the oldest under the name
        if mine.seconds == seconds:
            if await self.client.keepalive(lease) > 0:
                return True
            self._mine.pop((name, owner), None)
            return False
        return await self._relet(name, owner, mine, seconds)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """:meth:`extend` every lease of ``items``: concurrently in the async flavour."""
        if ASYNC:
            return list(
                await asyncio.gather(*(self.extend(name, owner, ttl) for name, owner, ttl in items))
            )
        else:
            return [self.extend(name, owner, ttl) for name, owner, ttl in items]

    async def holder(self, name: str) -> LockHolder | None:
        oldest = await self.client.range(
            self._prefix(name), prefix=True, limit=1, sort_target="CREATE"
        )
        if not oldest:
            return None
        return await self._holder_of(oldest[0])

    async def _holder_of(self, kv: dict[str, Any]) -> LockHolder | None:
        lease = int(kv.get("lease", 0))
        left = (await self.client.time_to_live(lease))[0] if lease else -1
        if lease and left < 0:
            return None  # its lease ended since the read
        owner = unb64(kv.get("value")).decode("utf-8", "replace")
        return LockHolder(owner, int(kv["create_revision"]), float(left) if lease else None)

    async def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        """Every key of the namespace's names starting with ``prefix`` (one range read, in
        pages), the oldest of each name, then each one's lease ttl; in name order."""
        start = key_layout.lock_prefix(self.namespace, prefix, whole=False)
        oldest: dict[str, dict[str, Any]] = {}
        for kv in await self.client.range_all(start):
            parsed = key_layout.split_lock_key(
                self.namespace, unb64(kv["key"]).decode("utf-8", "surrogateescape")
            )
            if parsed is None or not parsed[0].startswith(prefix):
                continue
            seen = oldest.get(parsed[0])
            if seen is None or int(kv["create_revision"]) < int(seen["create_revision"]):
                oldest[parsed[0]] = kv
        found: list[tuple[str, LockHolder]] = []
        for name in sorted(oldest):
            if len(found) >= limit:
                break
            held = await self._holder_of(oldest[name])
            if held is not None:
                found.append((name, held))
        return found

    async def close(self) -> None:
        """Revoke the leases of this client's waiters (a waiter not told would leave its key
        to expire after ``waiter_ttl``), then close the connections."""
        waiting = [mine for mine in self._mine.values() if mine.seconds != mine.want]
        self._mine.clear()
        try:
            for mine in waiting:
                await self.client.revoke(mine.lease)
        finally:
            if self._owned:
                await self.client.aclose()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the parent's connections and
        keys (no I/O)."""
        self.client.after_fork()
        self._mine = {}
        self._ready = False


def _text(raw: str) -> str:
    """A base64 key read from the gateway, as text."""
    return unb64(raw).decode("utf-8", "surrogateescape")
