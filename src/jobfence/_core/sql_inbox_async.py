"""The inbox verbs that are one named statement each on PostgreSQL and SQLite:
``AsyncSQLInboxBackend`` (``sql_inbox_async.py``) and ``SQLInboxBackend`` (``sql_inbox.py``,
generated from it).

A subclass provides :meth:`_run` (run the statement of one named section of its ``inbox.sql``,
returning the rows and the row count, creating the table on first use), :meth:`_record` (a
:class:`ClaimRecord` from a ``claim``/``peek`` row) and, where the server stores keys in
another form, :meth:`_db_key`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.base import AsyncInboxBackend, ClaimRecord

__all__ = ["AsyncSQLInboxBackend"]


class AsyncSQLInboxBackend(AsyncInboxBackend):
    @abc.abstractmethod
    async def _run(self, name: str, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""

    @abc.abstractmethod
    def _record(self, row: Sequence[Any]) -> ClaimRecord:
        """The claim record of a ``claim`` or ``peek`` row."""

    def _db_key(self, key: str) -> str:
        return key

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
