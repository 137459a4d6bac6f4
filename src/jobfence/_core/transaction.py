"""The transaction protocol of ``fence``, ``versioned_update``, ``Inbox.claim_in`` and
``Outbox.add``.

These functions run their statement on the caller's connection, inside the caller's
transaction (:mod:`jobfence._core.sqlconn` adapts the drivers). An object that is not a
driver connection but has transactions of its own -- the simulated tables and their
transactions in :mod:`jobfence.testing` -- takes part through one method,
``__jobfence_transaction__()``, returning an :class:`AsyncTransaction`. The functions then
validate their arguments and call the I/O hook exactly as for a connection, and ask it to do
what their statement does, with the same semantics: the work belongs to its transaction
(it commits or rolls back with it), a versioned update of a row at another version raises
:class:`~jobfence.StaleVersion`, a fence reports the newest token recorded for the resource,
and a claim reports whether this transaction is the first to apply the key. ``retry_unit``
asks it whether it is an open transaction, as it asks a driver's connection.

Only the async functions (``fence_async``, ``versioned_update_async``, ``AsyncInbox.claim_in``,
``AsyncOutbox.add``) look for it: the simulated tables are async.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["AsyncTransaction", "transaction_of"]


class AsyncTransaction(Protocol):
    """What ``__jobfence_transaction__()`` returns."""

    #: the name telemetry and messages give the database (``"simulated"``, ``"sqlite"``...)
    dialect: str

    @property
    def in_transaction(self) -> bool:
        """True while it is a transaction still open (``retry_unit`` refuses to re-run a
        unit inside one, as inside a connection's open transaction); False for what commits
        each call on its own."""
        ...

    async def versioned_update(
        self,
        table: str,
        key: dict[str, Any],
        version: int,
        values: dict[str, Any],
        version_column: str,
    ) -> int:
        """Set ``values`` on the row ``key`` of ``table`` if it is at ``version``; the new
        version, or :class:`~jobfence.StaleVersion`."""
        ...

    async def fence(self, resource: str, token: int, table: str) -> int:
        """Record ``token`` for ``resource`` in the fence table ``table`` unless a newer one
        is recorded; the newest token recorded (``token`` itself if it passed)."""
        ...

    async def claim_in(
        self, table: str, key: str, fingerprint: str | None, retention: float
    ) -> tuple[bool, str | None]:
        """Mark ``key`` applied in the inbox table ``table``: ``(True, None)`` if this
        transaction is the first to apply it, else ``(False, the fingerprint stored)``."""
        ...

    async def outbox_add(self, table: str, row: dict[str, Any]) -> None:
        """Add ``row`` to the outbox table ``table`` in this transaction (it becomes
        claimable when the transaction commits; an id already there is not added again).
        ``row`` holds ``id``, ``queue``, ``key`` (or None), ``body`` (the encoded body,
        bytes), ``headers`` (a dict of str) and ``delay`` (seconds)."""
        ...


def transaction_of(conn: object) -> AsyncTransaction | None:
    """The :class:`AsyncTransaction` of ``conn``, or ``None`` for anything else (a driver
    connection)."""
    method = getattr(type(conn), "__jobfence_transaction__", None)
    if method is None:
        return None
    found: AsyncTransaction = method(conn)
    return found
