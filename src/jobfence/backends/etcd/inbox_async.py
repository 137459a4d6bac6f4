"""``etcd://`` / ``etcds://`` inbox backend (``inbox_async.py``; ``inbox.py`` is generated
from it), over etcd's JSON gateway (``client_async.py``).

One key per idempotency key, ``<table>/inbox/<key>`` (``keys.py``), holding the record as
JSON: state, owner, attempt, fingerprint, when it was claimed, its deadline (in progress) or
the end of its retention (completed), and the result (base64). Every verb is one read and
one transaction that compares the record's ``mod_revision`` (or, for a first claim, that the
key does not exist), so no two workers can both take a key or both change one record; a
claim of an unknown key is one round trip (the transaction puts it, or reads what is
there). Writes are Raft-committed: a completed record survives the loss of any minority of
members and leader failover.

Time: etcd has no clock a client can read, and its leases count whole seconds, so a claim's
deadline and a record's retention are instants of the claiming (completing) client's clock,
stored in the record, and compared with the reading client's clock. The hosts' clocks must
agree (NTP) to well within a claim's ttl: a clock ahead takes a claim over early. A completed
record is also attached to an etcd lease of its retention plus a minute, so the server
deletes it by itself; ``purge()`` deletes the completed records past their retention and the
in-progress records abandoned for longer than ``retention`` past their deadline that are
still there.

URL options: ``table`` (default ``jobfence_inbox``) and the client's (``client_async.py``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..._core.clock import get_clock
from ..._core.inbox_support import DEFAULT_RETENTION, DEFAULT_TABLE, utc_from_epoch
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ..base import (
    AsyncInboxBackend,
    ClaimInfo,
    ClaimRecord,
    ClaimState,
    InboxCapabilities,
)
from . import TABLE_LIMIT
from . import keys as key_layout
from .client_async import AsyncEtcdClient, b64, connect_etcd, unb64

__all__ = ["AsyncEtcdInboxBackend"]

IN_PROGRESS = ClaimState.IN_PROGRESS.value
COMPLETED = ClaimState.COMPLETED.value
#: the etcd lease of a completed record outlives its retention by this much (``purge()``
#: finds it first; the server deletes what nobody purged)
RETENTION_GRACE = 60
#: retentions longer than this get no lease (kept until purged)
_NO_LEASE_BEYOND = 10 * 365 * 86400.0
#: attempts of one verb when other workers keep changing the record between read and write
_ROUNDS = 16


def _record(kv: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(unb64(kv.get("value")))
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"s": IN_PROGRESS, "a": 1, "d": 0}


def _dump(record: dict[str, Any]) -> str:
    return b64(json.dumps(record, separators=(",", ":")))


def _kvs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return list(response.get("response_range", {}).get("kvs", ()))


def _result(record: dict[str, Any]) -> bytes | None:
    raw = record.get("r")
    return None if raw is None else unb64(raw)


class AsyncEtcdInboxBackend(AsyncInboxBackend):
    kind = "etcd"
    capabilities = InboxCapabilities(cross_process=True, transactional=False, native_expiry=False)

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
            url.options.get("table", table), limit=TABLE_LIMIT, backend="etcd", argument="table"
        )
        self.retention = retention
        self.url = url.masked
        self._owned = client is None
        self.client: AsyncEtcdClient = (
            client if client is not None else connect_etcd(url, options, what="etcd inbox")
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} table={self.table!r}>"

    def _key(self, key: str) -> str:
        return key_layout.inbox_key(self.table, key)

    async def _read(self, key: str) -> dict[str, Any] | None:
        found = await self.client.range(self._key(key))
        return found[0] if found else None

    async def _swap(self, key: str, kv: dict[str, Any], op: dict[str, Any] | None) -> bool:
        """Put (``op``: a put request) or delete (``None``) ``key``'s record if it is still
        the one ``kv`` read."""
        name = self._key(key)
        compare = [
            {
                "key": b64(name),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": str(kv["mod_revision"]),
            }
        ]
        action = op if op is not None else {"request_delete_range": {"key": b64(name)}}
        ok, _ = await self.client.txn(compare, [action])
        return ok

    def _put(self, key: str, record: dict[str, Any], lease: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(self._key(key)), "value": _dump(record)}
        if lease:
            body["lease"] = str(lease)
        return {"request_put": body}

    # -- claim -----------------------------------------------------------------------------
    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        clock = get_clock()
        now = clock.time()
        fresh = {"s": IN_PROGRESS, "o": owner, "a": 1, "f": fingerprint or None, "c": now}
        fresh["d"] = now + ttl
        name = self._key(key)
        read = {"request_range": self.client.range_request(name)}
        for _ in range(_ROUNDS):
            ok, rows = await self.client.txn(
                [{"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                [self._put(key, fresh)],
                [read],
            )
            if ok:
                return self._mine(fresh)
            found = _kvs(rows[0])
            while found:
                kv = found[0]
                record = _record(kv)
                now = clock.time()
                state = record.get("s")
                if state == COMPLETED and float(record.get("e", 0)) > now:
                    return self._theirs(record)
                if state == IN_PROGRESS and float(record.get("d", 0)) > now:
                    if record.get("o") == owner:
                        return self._mine(record)  # ours already (a request sent again)
                    return self._theirs(record)
                if state == COMPLETED:  # past its retention: a key never seen
                    taken = dict(fresh, c=now, d=now + ttl)
                else:  # released, or abandoned past its deadline: taken over
                    stored = record.get("f")
                    if fingerprint and stored and fingerprint != stored:
                        return self._theirs(record)  # the caller reports the mismatch
                    taken = dict(fresh, a=int(record.get("a", 1)) + 1, f=stored or fresh["f"])
                    taken.update(c=now, d=now + ttl)
                ok, rows = await self.client.txn(
                    [
                        {
                            "key": b64(name),
                            "target": "MOD",
                            "result": "EQUAL",
                            "mod_revision": str(kv["mod_revision"]),
                        }
                    ],
                    [self._put(key, taken)],
                    [read],
                )
                if ok:
                    return self._mine(taken)
                found = _kvs(rows[0])
        from ...errors import BackendError

        raise BackendError(
            f"etcd inbox: the record of {key!r} kept changing under {_ROUNDS} claims in a row",
            backend="etcd",
            operation="claim",
        )

    @staticmethod
    def _mine(record: dict[str, Any]) -> ClaimRecord:
        return ClaimRecord(
            mine=True,
            state=ClaimState.IN_PROGRESS,
            attempt=int(record.get("a", 1)),
            owner=record.get("o"),
            fingerprint=record.get("f") or None,
            expires_at=utc_from_epoch(float(record.get("d", 0))),
        )

    @staticmethod
    def _theirs(record: dict[str, Any]) -> ClaimRecord:
        completed = record.get("s") == COMPLETED
        return ClaimRecord(
            mine=False,
            state=ClaimState.COMPLETED if completed else ClaimState.IN_PROGRESS,
            attempt=int(record.get("a", 1)),
            owner=record.get("o"),
            fingerprint=record.get("f") or None,
            result=_result(record) if completed else None,
            expires_at=utc_from_epoch(float(record.get("e" if completed else "d", 0))),
        )

    # -- the owner's verbs -----------------------------------------------------------------
    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        lease = 0
        for _ in range(_ROUNDS):
            kv = await self._read(key)
            if kv is None:
                break
            record = _record(kv)
            if record.get("o") != owner:
                break
            if record.get("s") == COMPLETED:
                # stored already by this owner (a request sent again): the same result only
                if _result(record) == result:
                    return True
                break
            if not lease and retention < _NO_LEASE_BEYOND:
                lease = await self.client.grant(math.ceil(retention) + RETENTION_GRACE)
            done = dict(record, s=COMPLETED, r=b64(result), e=get_clock().time() + retention)
            done.pop("d", None)
            if await self._swap(key, kv, self._put(key, done, lease)):
                return True
        if lease:
            await self.client.revoke(lease)
        return False

    async def release(self, key: str, owner: str) -> bool:
        for _ in range(_ROUNDS):
            kv = await self._read(key)
            if kv is None:
                return False
            record = _record(kv)
            if record.get("s") != IN_PROGRESS or record.get("o") != owner:
                return False
            given = dict(record, o=None, d=get_clock().time())
            if await self._swap(key, kv, self._put(key, given)):
                return True
        return False

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        for _ in range(_ROUNDS):
            kv = await self._read(key)
            if kv is None:
                return False
            record = _record(kv)
            now = get_clock().time()
            if (
                record.get("s") != IN_PROGRESS
                or record.get("o") != owner
                or float(record.get("d", 0)) <= now
            ):
                return False
            if await self._swap(key, kv, self._put(key, dict(record, d=now + ttl))):
                return True
        return False

    # -- operators -------------------------------------------------------------------------
    async def purge(self, retention: float) -> int:
        """Delete the completed records past their retention and the in-progress records
        abandoned for longer than ``retention`` past their deadline (each only if unchanged
        since it was read)."""
        deleted = 0
        for kv in await self.client.range_all(key_layout.inbox_prefix(self.table)):
            key = key_layout.inbox_name(self.table, _text(kv["key"]))
            if key is None:
                continue
            record = _record(kv)
            now = get_clock().time()
            if record.get("s") == COMPLETED:
                due = float(record.get("e", 0)) <= now
            else:
                due = float(record.get("d", 0)) + retention <= now
            if due and await self._swap(key, kv, None):
                deleted += 1
        return deleted

    def _info(self, key: str, kv: dict[str, Any]) -> ClaimInfo:
        record = _record(kv)
        completed = record.get("s") == COMPLETED
        until = float(record.get("e" if completed else "d", 0))
        claimed = record.get("c")
        return ClaimInfo(
            key=key,
            state=ClaimState.COMPLETED if completed else ClaimState.IN_PROGRESS,
            owner=record.get("o"),
            attempt=int(record.get("a", 1)),
            fingerprint=record.get("f") or None,
            claimed_at=None if claimed is None else utc_from_epoch(float(claimed)),
            expires_in=until - get_clock().time(),
        )

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        """One range read (in pages) of the table's records whose keys start with
        ``prefix``, sorted by key in code point order."""
        found: list[ClaimInfo] = []
        start = key_layout.inbox_prefix(self.table, prefix)
        records = []
        for kv in await self.client.range_all(start):
            key = key_layout.inbox_name(self.table, _text(kv["key"]))
            if key is not None and key.startswith(prefix):
                records.append((key, kv))
        for key, kv in sorted(records, key=lambda pair: pair[0]):
            info = self._info(key, kv)
            if state is None or info.state is state:
                found.append(info)
                if len(found) >= limit:
                    break
        return found

    async def claim_info(self, key: str) -> ClaimInfo | None:
        kv = await self._read(key)
        return None if kv is None else self._info(key, kv)

    async def forget(self, key: str) -> bool:
        return await self.client.delete(self._key(key)) > 0

    async def install(self) -> None:
        await self.client.status()  # nothing to create; checks that the server answers

    async def drop(self) -> None:
        await self.client.delete_prefix(key_layout.inbox_prefix(self.table))

    async def close(self) -> None:
        if self._owned:
            await self.client.aclose()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the parent's connections."""
        self.client.after_fork()


def _text(raw: str) -> str:
    return unb64(raw).decode("utf-8", "surrogateescape")
