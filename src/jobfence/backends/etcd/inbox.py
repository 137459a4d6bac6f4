# Generated from backends/etcd/inbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``etcd://`` / ``etcds://`` inbox backend (``inbox_async.py``; ``inbox.py`` is generated
from it), over etcd's JSON gateway (``client_async.py``).

Keys (``keys.py``), per idempotency key::

    <table>/inbox/<key>            the record (JSON: state, owner, attempt, fingerprint, when
                                   it was claimed, its deadline or the end of its retention,
                                   the result in base64), attached to an etcd lease
    <table>/inbox-attempts/<key>   the key's last claim (attempt, owner, fingerprint; no
                                   lease), so that a takeover knows the attempt before it

Expiry is etcd's, never a comparison of clocks: an in-progress record is attached to the
lease of its claim, ``ttl`` rounded up to whole seconds, at least 2 (``leases.py``), and the
server deletes it when the lease ends. A key is free when its record is gone (its claim's
lease ended, it was released, or its retention's lease ended); a record that is there is
live, whatever any host's clock says. The holder counts its ttl on its own monotonic clock from
before its request, so it considers the claim lost before the server frees the key. Hosts
need no clock agreement; the wall-clock instants stored in a record (when it was claimed,
its deadline) are information for operators only.

Verbs (each compare-and-write is one transaction on the record's ``mod_revision``, or on its
absence, and on the attempts key's): a claim grants its lease, then puts the record attached
to it with the attempts key (attempt + 1 after a takeover); a duplicate's lease is revoked.
``renew`` keeps the lease alive (``lease/keepalive``; a ttl of 0 back: the claim is lost)
after a read showing the record is the owner's, or extends it when the ttl is not the
lease's; ``extend`` grants a new lease and re-puts the record attached to it (if unchanged),
then revokes the old one. ``release`` deletes the record (the attempts key stays, with no
owner) and revokes its lease. ``complete`` puts the completed record attached to a lease of
the retention (rounded up to whole seconds; retentions over ten years get none), deletes the
attempts key and revokes the claim's lease: the server deletes the record when its retention
ends. ``purge()`` deletes the attempts keys of claims that ended (no record) more than
``retention`` after their deadline, and the completed records without a lease past their
retention. ``forget`` deletes both keys and revokes the record's lease. Writes are
Raft-committed: a completed record survives the loss of any minority of
members and leader failover.

URL options: ``table`` (default ``jobfence_inbox``) and the client's (``client_async.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..._core.clock import get_clock
from ..._core.inbox_support import DEFAULT_RETENTION, DEFAULT_TABLE, utc_from_epoch
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ...errors import BackendError
from ..base import (
    ClaimInfo,
    ClaimRecord,
    ClaimState,
    InboxBackend,
    InboxCapabilities,
    RenewItem,
)
from . import TABLE_LIMIT
from . import keys as key_layout
from .client import EtcdClient, b64, connect_etcd, unb64
from .leases import lease_seconds

__all__ = ["EtcdInboxBackend"]

IN_PROGRESS = ClaimState.IN_PROGRESS.value
COMPLETED = ClaimState.COMPLETED.value
#: retentions longer than this get no lease (kept until purged)
_NO_LEASE_BEYOND = 10 * 365 * 86400.0
#: attempts of one verb when other workers keep changing the record between read and write
_ROUNDS = 16
#: the fields of a record the attempts key keeps
_LAST_CLAIM = ("a", "o", "f", "c", "d")


def _record(kv: dict[str, Any] | None) -> dict[str, Any]:
    try:
        value = json.loads(unb64(kv.get("value"))) if kv else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"s": IN_PROGRESS, "a": 1, "d": 0}


def _dump(record: dict[str, Any]) -> str:
    return b64(json.dumps(record, separators=(",", ":")))


def _first(response: dict[str, Any]) -> dict[str, Any] | None:
    kvs = response.get("response_range", {}).get("kvs", ())
    return kvs[0] if kvs else None


def _result(record: dict[str, Any]) -> bytes | None:
    raw = record.get("r")
    return None if raw is None else unb64(raw)


def _lease(kv: dict[str, Any]) -> int:
    return int(kv.get("lease", 0) or 0)


def _compare(name: str, kv: dict[str, Any] | None) -> dict[str, Any]:
    """A transaction's compare: ``name`` is still as ``kv`` read it (``None``: absent)."""
    if kv is None:
        return {"key": b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
    return {
        "key": b64(name),
        "target": "MOD",
        "result": "EQUAL",
        "mod_revision": str(kv["mod_revision"]),
    }


def _put(name: str, record: dict[str, Any], lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(name), "value": _dump(record)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def _delete(name: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(name)}}


def _last_claim(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """What the attempts key keeps of ``record``."""
    kept = {field: record.get(field) for field in _LAST_CLAIM}
    kept.update(changes)
    return kept


class EtcdInboxBackend(InboxBackend):
    kind = "etcd"
    capabilities = InboxCapabilities(cross_process=True, transactional=False, native_expiry=True)

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
        self.client: EtcdClient = (
            client if client is not None else connect_etcd(url, options, what="etcd inbox")
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} table={self.table!r}>"

    def _key(self, key: str) -> str:
        return key_layout.inbox_key(self.table, key)

    def _attempts(self, key: str) -> str:
        return key_layout.attempts_key(self.table, key)

    def _reads(self, key: str) -> list[dict[str, Any]]:
        """A transaction's reads of ``key``'s record and attempts key."""
        return [
            {"request_range": self.client.range_request(self._key(key))},
            {"request_range": self.client.range_request(self._attempts(key))},
        ]

    def _read(self, key: str) -> dict[str, Any] | None:
        found = self.client.range(self._key(key))
        return found[0] if found else None

    def _read_both(self, key: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``key``'s record and attempts key, read at one revision."""
        _, rows = self.client.txn([], self._reads(key))
        return _first(rows[0]), _first(rows[1])

    def _drop_lease(self, lease: int) -> None:
        """Revoke ``lease``, which no longer holds a key this call still needs; a failure
        is left to the lease's own end (it holds nothing)."""
        if not lease:
            return
        try:
            self.client.revoke(lease)
        except BackendError:
            pass

    # -- claim -----------------------------------------------------------------------------
    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        seconds = lease_seconds(ttl)
        lease = self.client.grant(seconds)
        taken = False
        try:
            record, taken = self._claim(key, owner, fingerprint, ttl, seconds, lease)
        finally:
            if not taken:
                self._drop_lease(lease)
        return record

    def _claim(
        self, key: str, owner: str, fingerprint: str | None, ttl: float, seconds: int, lease: int
    ) -> tuple[ClaimRecord, bool]:
        """``(the answer, whether the record is now attached to lease)``."""
        clock = get_clock()
        name, attempts = self._key(key), self._attempts(key)
        # first round: a key never seen (one transaction); later rounds: what it read
        kv: dict[str, Any] | None = None
        last: dict[str, Any] | None = None
        for _ in range(_ROUNDS):
            if kv is not None:
                record = _record(kv)
                if record.get("s") != COMPLETED:
                    # in progress: attached to a lease the server has not ended, so held
                    if record.get("o") == owner:
                        # ours already: a request sent again (after a lost answer, the one
                        # attached to this call's lease)
                        return self._mine(record), _lease(kv) == lease
                    return self._theirs(record), False
                if _lease(kv) or float(record.get("e", 0)) > clock.time():
                    return self._theirs(record), False  # completed, within its retention
                # completed, kept without a lease past its retention: a key never seen
                attempt, stored = 1, None
            elif last is not None:  # its last claim ended (expired or released)
                previous = _record(last)
                stored = previous.get("f") or None
                if fingerprint and stored and fingerprint != stored:
                    # the caller reports the mismatch
                    return self._theirs(dict(previous, s=IN_PROGRESS)), False
                attempt = int(previous.get("a") or 1) + 1
            else:
                attempt, stored = 1, None
            now = clock.time()
            mine = {
                "s": IN_PROGRESS,
                "o": owner,
                "a": attempt,
                "f": stored or fingerprint or None,
                "c": now,
                "d": now + ttl,
                "l": seconds,
            }
            ok, rows = self.client.txn(
                [_compare(name, kv), _compare(attempts, last)],
                [_put(name, mine, lease), _put(attempts, _last_claim(mine))],
                self._reads(key),
            )
            if ok:
                return self._mine(mine), True
            kv, last = _first(rows[0]), _first(rows[1])
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
            attempt=int(record.get("a") or 1),
            owner=record.get("o"),
            fingerprint=record.get("f") or None,
            expires_at=utc_from_epoch(float(record.get("d") or 0)),
        )

    @staticmethod
    def _theirs(record: dict[str, Any]) -> ClaimRecord:
        completed = record.get("s") == COMPLETED
        return ClaimRecord(
            mine=False,
            state=ClaimState.COMPLETED if completed else ClaimState.IN_PROGRESS,
            attempt=int(record.get("a") or 1),
            owner=record.get("o"),
            fingerprint=record.get("f") or None,
            result=_result(record) if completed else None,
            expires_at=utc_from_epoch(float(record.get("e" if completed else "d") or 0)),
        )

    # -- the owner's verbs -----------------------------------------------------------------
    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        name = self._key(key)
        retained = 0
        for _ in range(_ROUNDS):
            kv = self._read(key)
            if kv is None:
                break
            record = _record(kv)
            if record.get("o") != owner:
                break
            if record.get("s") == COMPLETED:
                # stored already by this owner (a request sent again): the same result only
                if _result(record) == result:
                    if _lease(kv) != retained:  # not this call's, whose answer was lost
                        self._drop_lease(retained)
                    return True
                break
            if not retained and retention < _NO_LEASE_BEYOND:
                retained = self.client.grant(lease_seconds(retention))
            done = dict(record, s=COMPLETED, r=b64(result), e=get_clock().time() + retention)
            done.pop("d", None)
            done.pop("l", None)
            ok, _ = self.client.txn(
                [_compare(name, kv)], [_put(name, done, retained), _delete(self._attempts(key))]
            )
            if ok:
                self._drop_lease(_lease(kv))  # the claim's: it holds nothing now
                return True
        self._drop_lease(retained)
        return False

    def release(self, key: str, owner: str) -> bool:
        name = self._key(key)
        for _ in range(_ROUNDS):
            kv = self._read(key)
            if kv is None:
                return False
            record = _record(kv)
            if record.get("s") != IN_PROGRESS or record.get("o") != owner:
                return False
            given = _last_claim(record, o=None, d=get_clock().time())
            ok, _ = self.client.txn(
                [_compare(name, kv)], [_delete(name), _put(self._attempts(key), given)]
            )
            if ok:
                self._drop_lease(_lease(kv))
                return True
        return False

    def extend(self, key: str, owner: str, ttl: float) -> bool:
        """Attach the owner's record to a new lease of ``ttl`` (the record is there only
        while its claim's lease lives: an expired claim is never extended)."""
        seconds = lease_seconds(ttl)
        name = self._key(key)
        lease = 0
        for _ in range(_ROUNDS):
            kv = self._read(key)
            if kv is None:
                break
            record = _record(kv)
            if record.get("s") != IN_PROGRESS or record.get("o") != owner or not _lease(kv):
                break
            if _lease(kv) == lease:
                return True  # re-put by this call already (its answer was lost)
            if not lease:
                lease = self.client.grant(seconds)
            now = get_clock().time()
            moved = dict(record, d=now + ttl, l=seconds)
            ok, _ = self.client.txn(
                [_compare(name, kv)],
                [_put(name, moved, lease), _put(self._attempts(key), _last_claim(moved))],
            )
            if ok:
                self._drop_lease(_lease(kv))  # the old lease: it holds nothing now
                return True
        self._drop_lease(lease)
        return False

    def _renew(self, key: str, owner: str, ttl: float) -> bool:
        """Keep the owner's claim alive: a keep-alive of its lease when the lease is ``ttl``
        long, else :meth:`extend`."""
        kv = self._read(key)
        if kv is None:
            return False
        record = _record(kv)
        if record.get("s") != IN_PROGRESS or record.get("o") != owner or not _lease(kv):
            return False
        if record.get("l") != lease_seconds(ttl):
            return self.extend(key, owner, ttl)
        return self.client.keepalive(_lease(kv)) > 0

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Keep every claim of ``items`` alive: concurrently in the async flavour."""
        return [self._renew(key, owner, ttl) for key, owner, ttl in items]

    # -- operators -------------------------------------------------------------------------
    def purge(self, retention: float) -> int:
        """Delete what the server does not expire by itself: the attempts keys of claims
        that ended (no record) longer than ``retention`` past their deadline, and completed
        records kept without a lease (retentions over ten years) past their retention; each
        only if unchanged since it was read."""
        deleted = 0
        live: set[str] = set()
        for kv in self.client.range_all(key_layout.inbox_prefix(self.table)):
            key = key_layout.inbox_name(self.table, _text(kv["key"]))
            if key is None:
                continue
            live.add(key)
            record = _record(kv)
            due = (
                record.get("s") == COMPLETED
                and not _lease(kv)
                and float(record.get("e", 0)) <= get_clock().time()
            )
            if due:
                name = self._key(key)
                ok, _ = self.client.txn([_compare(name, kv)], [_delete(name)])
                deleted += int(ok)
        for kv in self.client.range_all(key_layout.attempts_prefix(self.table)):
            key = key_layout.inbox_name(self.table, _text(kv["key"]), attempts=True)
            if key is None or key in live:
                continue
            last = _record(kv)
            if float(last.get("d") or 0) + retention <= get_clock().time():
                ok, _ = self.client.txn(
                    [_compare(self._attempts(key), kv), _compare(self._key(key), None)],
                    [_delete(self._attempts(key))],
                )
                deleted += int(ok)
        return deleted

    def _info(self, key: str, kv: dict[str, Any] | None, last: dict[str, Any] | None) -> ClaimInfo:
        """``key``'s record (``kv``) or, when there is none, its last claim (``last``): an
        ended claim, in progress with no time left, that the next claim takes over."""
        record = _record(kv if kv is not None else last)
        completed = kv is not None and record.get("s") == COMPLETED
        claimed = record.get("c")
        now = get_clock().time()
        if kv is None:
            left = min(0.0, float(record.get("d") or 0) - now)
        elif _lease(kv):
            # by the server's clock: what its lease has left, in whole seconds rounded down.
            # A record that is there holds its key, even a moment past its lease's end (the
            # server deletes it a moment later): never reported stuck
            ttl = (self.client.time_to_live(_lease(kv)))[0]
            left = max(float(ttl), 0.5)
        else:
            left = float(record.get("e") or 0) - now
        return ClaimInfo(
            key=key,
            state=ClaimState.COMPLETED if completed else ClaimState.IN_PROGRESS,
            owner=record.get("o"),
            attempt=int(record.get("a") or 1),
            fingerprint=record.get("f") or None,
            claimed_at=None if claimed is None else utc_from_epoch(float(claimed)),
            expires_in=left,
        )

    def claim_infos(self, state: ClaimState | None, prefix: str, limit: int) -> list[ClaimInfo]:
        """One range read (in pages) of the table's records whose keys start with
        ``prefix`` and one of their attempts keys (the claims that ended unreleased or
        released, which have no record), sorted by key in code point order."""
        records: dict[str, dict[str, Any]] = {}
        for kv in self.client.range_all(key_layout.inbox_prefix(self.table, prefix)):
            key = key_layout.inbox_name(self.table, _text(kv["key"]))
            if key is not None and key.startswith(prefix):
                records[key] = kv
        ended: dict[str, dict[str, Any]] = {}
        for kv in self.client.range_all(key_layout.attempts_prefix(self.table, prefix)):
            key = key_layout.inbox_name(self.table, _text(kv["key"]), attempts=True)
            if key is not None and key.startswith(prefix) and key not in records:
                ended[key] = kv
        found: list[ClaimInfo] = []
        for key in sorted({*records, *ended}):
            record = records.get(key)
            completed = record is not None and _record(record).get("s") == COMPLETED
            if state is not None and (state is ClaimState.COMPLETED) != completed:
                continue
            found.append(self._info(key, record, ended.get(key)))
            if len(found) >= limit:
                break
        return found

    def claim_info(self, key: str) -> ClaimInfo | None:
        kv, last = self._read_both(key)
        if kv is None and last is None:
            return None
        return self._info(key, kv, last)

    def forget(self, key: str) -> bool:
        _, rows = self.client.txn(
            [],
            [
                {"request_delete_range": {"key": b64(self._key(key)), "prev_kv": True}},
                _delete(self._attempts(key)),
            ],
        )
        gone = [row.get("response_delete_range", {}) for row in rows]
        for kv in gone[0].get("prev_kvs", ()):
            self._drop_lease(_lease(kv))  # its holder's keep-alives fail from now on
        return any(int(row.get("deleted", 0)) for row in gone)

    def install(self) -> None:
        self.client.status()  # nothing to create; checks that the server answers

    def drop(self) -> None:
        self.client.delete_prefix(key_layout.inbox_prefix(self.table))
        self.client.delete_prefix(key_layout.attempts_prefix(self.table))

    def close(self) -> None:
        if self._owned:
            self.client.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the parent's connections."""
        self.client.after_fork()


def _text(raw: str) -> str:
    return unb64(raw).decode("utf-8", "surrogateescape")
