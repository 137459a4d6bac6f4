"""The inbox verbs that are one named statement each on PostgreSQL and SQLite:
``AsyncSQLInboxBackend`` (``inbox_async.py``) and ``SQLInboxBackend`` (``inbox.py``,
generated from it).

A subclass provides :meth:`_run` (run the statement of one named section of its ``inbox.sql``,
returning the rows and the row count, creating the table on first use), :meth:`_record` (a
:class:`ClaimRecord` from a ``claim``/``peek`` row), :meth:`_info` (a :class:`ClaimInfo` from
a ``claims``/``claim_info`` row) and, where the server stores keys in another form,
:meth:`_db_key`, :meth:`_key_from_db` and :meth:`_prefix_params`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from ..base import AsyncInboxBackend, ClaimInfo, ClaimRecord, ClaimState

__all__ = ["AsyncSQLInboxBackend"]


class AsyncSQLInboxBackend(AsyncInboxBackend):
    @abc.abstractmethod
    async def _run(self, name: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""

    @abc.abstractmethod
    def _record(self, row: Sequence[Any]) -> ClaimRecord:
        """The claim record of a ``claim`` or ``peek`` row."""

    @abc.abstractmethod
    def _info(self, key: str, row: Sequence[Any]) -> ClaimInfo:
        """The record of ``key`` from the columns of a ``claims``/``claim_info`` row after the
        key (state, owner, attempt, fingerprint, claimed_at, time left)."""

    def _db_key(self, key: str) -> str:
        return key

    def _key_from_db(self, stored: Any) -> str:
        """The key that :meth:`_db_key` stored as ``stored``."""
        return str(stored)

    def _prefix_params(self, prefix: str) -> dict[str, Any]:
        """The parameters of the ``claims`` statement that carry ``prefix``."""
        return {"prefix": prefix}

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        key = self._db_key(key)
        while True:
            rows, _ = await self._run(
                "claim", {"key": key, "owner": owner, "fingerprint": fingerprint, "ttl": ttl}
            )
            if not rows:  # a duplicate: read the record that stopped us
                rows, _ = await self._run("peek", {"key": key})
            if rows:
                return self._record(rows[0])
            # purged between the two statements: claim again

    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        params = {"result": result, "retention": retention, "key": self._db_key(key)}
        _, count = await self._run("complete", {**params, "owner": owner})
        return count == 1

    async def release(self, key: str, owner: str) -> bool:
        _, count = await self._run("release", {"key": self._db_key(key), "owner": owner})
        return count == 1

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        params = {"key": self._db_key(key), "owner": owner, "ttl": ttl}
        _, count = await self._run("extend", params)
        return count == 1

    async def purge(self, retention: float) -> int:
        _, count = await self._run("purge", {"retention": retention})
        return max(count, 0)

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        params = {
            **self._prefix_params(prefix),
            "state": None if state is None else state.value,
            "limit": limit,
        }
        rows, _ = await self._run("claims", params)
        return [self._info(self._key_from_db(row[0]), row[1:]) for row in rows]

    async def claim_info(self, key: str) -> ClaimInfo | None:
        rows, _ = await self._run("claim_info", {"key": self._db_key(key)})
        return self._info(key, rows[0][1:]) if rows else None

    async def forget(self, key: str) -> bool:
        _, count = await self._run("forget", {"key": self._db_key(key)})
        return count == 1
