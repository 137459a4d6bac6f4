"""``memory://`` -- an in-process inbox for tests and the testing toolkit.

Every operation runs under one mutex, so it is atomic like the server backends' single
statements. Time comes from jobfence's clock (``get_clock().time()``), so a virtual clock
drives expiry. Sync and async inboxes of the same URL and table in one process share a store.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..._core.clock import get_clock
from ..._core.inbox_support import DEFAULT_TABLE, inbox_table, utc_from_epoch
from ..._core.options import reject_unknown
from ..._core.url import BackendURL
from ..base import (
    AsyncInboxBackend,
    ClaimInfo,
    ClaimRecord,
    ClaimState,
    InboxBackend,
    InboxCapabilities,
    RenewItem,
)
from . import TABLE_LIMIT

__all__ = ["AsyncMemoryInboxBackend", "MemoryInboxBackend", "MemoryInboxStore"]


@dataclass
class _Record:
    state: ClaimState
    owner: str | None
    attempt: int
    fingerprint: str | None
    result: bytes | None
    expires: float
    applied: bool = False
    #: when the current attempt was claimed (epoch seconds)
    claimed: float | None = None


class MemoryInboxStore:
    """The records of one ``memory://`` URL and table."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.records: dict[str, _Record] = {}

    @staticmethod
    def _view(rec: _Record, mine: bool) -> ClaimRecord:
        return ClaimRecord(
            mine=mine,
            state=rec.state,
            attempt=rec.attempt,
            owner=rec.owner,
            fingerprint=rec.fingerprint,
            result=rec.result,
            expires_at=utc_from_epoch(rec.expires),
        )

    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        now = get_clock().time()
        with self.mutex:
            rec = self.records.get(key)
            if rec is None or (rec.state is ClaimState.COMPLETED and rec.expires <= now):
                rec = _Record(
                    ClaimState.IN_PROGRESS, owner, 1, fingerprint, None, now + ttl, claimed=now
                )
                self.records[key] = rec
                return self._view(rec, True)
            compatible = (
                rec.fingerprint is None or fingerprint is None or rec.fingerprint == fingerprint
            )
            if rec.state is ClaimState.IN_PROGRESS and rec.expires <= now and compatible:
                rec.owner = owner
                rec.attempt += 1
                if fingerprint is not None:  # a takeover without one keeps the key's
                    rec.fingerprint = fingerprint
                rec.expires = now + ttl
                rec.claimed = now
                return self._view(rec, True)
            return self._view(replace(rec), False)

    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        now = get_clock().time()
        with self.mutex:
            rec = self.records.get(key)
            if rec is None or rec.owner != owner:
                return False
            if rec.state is ClaimState.COMPLETED and rec.expires <= now:
                return False
            rec.state = ClaimState.COMPLETED
            rec.result = result
            rec.expires = now + retention
            return True

    def release(self, key: str, owner: str) -> bool:
        now = get_clock().time()
        with self.mutex:
            rec = self.records.get(key)
            if rec is None or rec.owner != owner or rec.state is not ClaimState.IN_PROGRESS:
                return False
            rec.owner = None
            rec.expires = min(rec.expires, now)
            return True

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend each live in-progress claim ``(key, owner, ttl)`` its owner still owns."""
        now = get_clock().time()
        out: list[bool] = []
        with self.mutex:
            for key, owner, ttl in items:
                rec = self.records.get(key)
                if (
                    rec is not None
                    and rec.owner == owner
                    and rec.state is ClaimState.IN_PROGRESS
                    and rec.expires > now
                ):
                    rec.expires = now + ttl
                    out.append(True)
                else:
                    out.append(False)
        return out

    def purge(self, retention: float) -> int:
        now = get_clock().time()
        with self.mutex:
            dead = [
                key
                for key, rec in self.records.items()
                if (rec.state is ClaimState.COMPLETED and rec.expires <= now)
                or (rec.state is ClaimState.IN_PROGRESS and rec.expires + retention <= now)
            ]
            for key in dead:
                del self.records[key]
            return len(dead)

    @staticmethod
    def _info(key: str, rec: _Record, now: float) -> ClaimInfo:
        return ClaimInfo(
            key=key,
            state=rec.state,
            owner=rec.owner,
            attempt=rec.attempt,
            fingerprint=rec.fingerprint,
            claimed_at=utc_from_epoch(rec.claimed),
            expires_in=rec.expires - now,
        )

    def claim_infos(self, state: ClaimState | None, prefix: str, limit: int) -> list[ClaimInfo]:
        now = get_clock().time()
        with self.mutex:
            found = []
            for key in sorted(k for k in self.records if k.startswith(prefix)):
                rec = self.records[key]
                if state is None or rec.state is state:
                    found.append(self._info(key, rec, now))
                    if len(found) >= limit:
                        break
            return found

    def claim_info(self, key: str) -> ClaimInfo | None:
        now = get_clock().time()
        with self.mutex:
            rec = self.records.get(key)
            return None if rec is None else self._info(key, rec, now)

    def forget(self, key: str) -> bool:
        with self.mutex:
            return self.records.pop(key, None) is not None

    def drop(self) -> None:
        with self.mutex:
            self.records.clear()


_stores: dict[str, MemoryInboxStore] = {}
_stores_mutex = threading.Lock()


def get_inbox_store(url: BackendURL, table: str) -> MemoryInboxStore:
    key = f"{url.host or ''}{url.path}\x00{table}"
    with _stores_mutex:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = MemoryInboxStore()
        return store


def _open_store(
    url: BackendURL, table: str, options: dict[str, Any]
) -> tuple[str, MemoryInboxStore]:
    """The table and store of an inbox; an unknown option (keyword or URL query) is refused
    as on every backend."""
    reject_unknown(url.options, ("table",), "memory inbox URL")
    table = inbox_table(url, table, options, backend="memory", limit=TABLE_LIMIT)
    return table, get_inbox_store(url, table)


_CAPS = InboxCapabilities(cross_process=False, transactional=False, native_expiry=False)


class MemoryInboxBackend(InboxBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        self.table, self.store = _open_store(url, table, options)

    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        return self.store.claim(key, owner, fingerprint, ttl)

    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        return self.store.complete(key, owner, result, retention)

    def release(self, key: str, owner: str) -> bool:
        return self.store.release(key, owner)

    def extend(self, key: str, owner: str, ttl: float) -> bool:
        return self.store.renew([(key, owner, ttl)])[0]

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return self.store.renew(items)

    def purge(self, retention: float) -> int:
        return self.store.purge(retention)

    def claim_infos(self, state: ClaimState | None, prefix: str, limit: int) -> list[ClaimInfo]:
        return self.store.claim_infos(state, prefix, limit)

    def claim_info(self, key: str) -> ClaimInfo | None:
        return self.store.claim_info(key)

    def forget(self, key: str) -> bool:
        return self.store.forget(key)

    def install(self) -> None:
        pass

    def drop(self) -> None:
        self.store.drop()

    def close(self) -> None:
        pass


class AsyncMemoryInboxBackend(AsyncInboxBackend):
    kind = "memory"
    capabilities = _CAPS

    def __init__(self, url: BackendURL, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        self.table, self.store = _open_store(url, table, options)

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        return self.store.claim(key, owner, fingerprint, ttl)

    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        return self.store.complete(key, owner, result, retention)

    async def release(self, key: str, owner: str) -> bool:
        return self.store.release(key, owner)

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        return self.store.renew([(key, owner, ttl)])[0]

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return self.store.renew(items)

    async def purge(self, retention: float) -> int:
        return self.store.purge(retention)

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        return self.store.claim_infos(state, prefix, limit)

    async def claim_info(self, key: str) -> ClaimInfo | None:
        return self.store.claim_info(key)

    async def forget(self, key: str) -> bool:
        return self.store.forget(key)

    async def install(self) -> None:
        pass

    async def drop(self) -> None:
        self.store.drop()

    async def close(self) -> None:
        pass
