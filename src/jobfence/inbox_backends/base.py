# Generated from inbox_backends/base_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The inbox backend interface (async source of ``base.py``).

Each verb is ONE atomic operation on the server -- a conditional insert / upsert, a Lua
script, or one statement inside the store's mutex -- with the owner check done there, never a
read followed by a write decided in Python. Keys arrive validated (non-empty, <= 1024 bytes of
UTF-8); ``ttl`` and ``retention`` are seconds > 0; results arrive serialised (bytes).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from .._inbox_types import ClaimRecord, InboxCapabilities

__all__ = ["InboxBackend", "SQLInboxBackend"]


class InboxBackend(abc.ABC):
    """claim / complete / release, plus install, purge and close."""

    #: short backend name used in errors ("redis", "postgres", ...)
    kind: str = "?"
    capabilities: InboxCapabilities
    #: the validated table name (SQL) or key prefix (Redis, memory)
    table: str

    @abc.abstractmethod
    def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        """Take ``key`` for ``owner`` if it is unknown, or in progress past its deadline, or
        completed past its retention; otherwise report the record that is there.

        A takeover of an expired in-progress claim increments ``attempt``; it does not happen
        when both fingerprints are set and differ (the caller raises ``FingerprintMismatch``).
        """

    @abc.abstractmethod
    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        """Store ``result`` and mark ``key`` completed for ``retention`` seconds, if ``owner``
        still owns the claim. Returns whether it did."""

    @abc.abstractmethod
    def release(self, key: str, owner: str) -> bool:
        """Give ``key`` back (the next claim takes it over, ``attempt`` + 1) if ``owner`` owns
        the in-progress claim. Returns whether it did."""

    @abc.abstractmethod
    def purge(self, retention: float) -> int:
        """Delete completed records past their retention, and in-progress records abandoned
        for longer than ``retention`` past their deadline. Returns how many were deleted."""

    @abc.abstractmethod
    def install(self) -> None:
        """Create the schema if it is missing (idempotent)."""

    @abc.abstractmethod
    def drop(self) -> None:
        """Delete the table / every key this backend stored (tests, uninstall)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""


class SQLInboxBackend(InboxBackend):
    """The verbs that are one named statement each on PostgreSQL and SQLite.

    Subclasses provide :meth:`_run` (run the statement of a named section of their ``.sql``
    file, returning rows and the row count) and may map keys with :meth:`_db_key`.
    """

    @abc.abstractmethod
    def _run(self, name: str, params: Sequence[Any]) -> tuple[list[Any], int]:
        """Run the one statement of section ``name``; create the table on first use."""

    def _db_key(self, key: str) -> str:
        return key

    def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        _, count = self._run("complete", (result, retention, self._db_key(key), owner))
        return count == 1

    def release(self, key: str, owner: str) -> bool:
        _, count = self._run("release", (self._db_key(key), owner))
        return count == 1

    def purge(self, retention: float) -> int:
        _, count = self._run("purge", (retention,))
        return max(count, 0)
