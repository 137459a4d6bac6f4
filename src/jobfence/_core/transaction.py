"""The transaction protocol of ``fence``, ``versioned_update``, ``Inbox.claim_in`` and
``Outbox.add``.

These functions run their statement on the caller's connection, inside the caller's
transaction (:mod:`jobfence._core.sqlconn` adapts the drivers). An object that is not a
driver connection but has transactions of its own -- the simulated tables and their
transactions in :mod:`jobfence.testing` -- takes part through one method,
``__jobfence_transaction__()``, returning an :class:`AsyncTransaction` (for the async
functions: ``fence_async``, ``versioned_update_async``, ``AsyncInbox.claim_in``,
``AsyncOutbox.add``) or a :class:`Transaction` (for the sync ones: ``fence``,
``versioned_update``, ``Inbox.claim_in``, ``Outbox.add``; its ``blocking`` attribute is
True). The functions then validate their arguments and call the I/O hook exactly as for a
connection, and ask it to do what their statement does, with the same semantics: the work
belongs to its transaction (it commits or rolls back with it), a versioned update of a row at
another version raises :class:`~jobfence.StaleVersion`, a fence reports the newest token
recorded for the resource, and a claim reports whether this transaction is the first to apply
the key. ``retry_unit`` asks it whether it is an open transaction, as it asks a driver's
connection.

An async function given a blocking one (a sync view of a simulated table, ``table.sync``), or
a sync function given an async one, raises :class:`~jobfence.ConfigurationError`: the
flavours never mix (a blocking call would stall the event loop; a coroutine would never run).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ConfigurationError

__all__ = [
    "AsyncTransaction",
    "Transaction",
    "own_transaction",
    "own_transaction_async",
    "transaction_of",
]


class _Common(Protocol):
    #: the name telemetry and messages give the database (``"simulated"``, ``"sqlite"``...)
    dialect: str

    @property
    def in_transaction(self) -> bool:
        """True while it is a transaction still open (``retry_unit`` refuses to re-run a
        unit inside one, as inside a connection's open transaction); False for what commits
        each call on its own."""
        ...


class AsyncTransaction(_Common, Protocol):
    """What ``__jobfence_transaction__()`` returns for the async functions."""

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


class Transaction(_Common, Protocol):
    """What ``__jobfence_transaction__()`` returns for the sync functions: the same methods
    as :class:`AsyncTransaction`, blocking, and ``blocking = True``."""

    #: always True: tells it from an :class:`AsyncTransaction`
    blocking: bool

    def versioned_update(
        self,
        table: str,
        key: dict[str, Any],
        version: int,
        values: dict[str, Any],
        version_column: str,
    ) -> int:
        """See :meth:`AsyncTransaction.versioned_update`."""
        ...

    def fence(self, resource: str, token: int, table: str) -> int:
        """See :meth:`AsyncTransaction.fence`."""
        ...

    def claim_in(
        self, table: str, key: str, fingerprint: str | None, retention: float
    ) -> tuple[bool, str | None]:
        """See :meth:`AsyncTransaction.claim_in`."""
        ...

    def outbox_add(self, table: str, row: dict[str, Any]) -> None:
        """See :meth:`AsyncTransaction.outbox_add`."""
        ...


def transaction_of(conn: object) -> AsyncTransaction | Transaction | None:
    """What ``conn.__jobfence_transaction__()`` returns, of either flavour, or ``None`` for
    anything else (a driver connection)."""
    method = getattr(type(conn), "__jobfence_transaction__", None)
    if method is None:
        return None
    found: AsyncTransaction | Transaction = method(conn)
    return found


def _blocking(tx: object) -> bool:
    return getattr(tx, "blocking", False) is True


def own_transaction_async(conn: object) -> AsyncTransaction | None:
    """The :class:`AsyncTransaction` of ``conn`` for an async function, ``None`` for a
    driver connection; ConfigurationError(argument="conn") for a blocking one."""
    tx = transaction_of(conn)
    if tx is None:
        return None
    if _blocking(tx):
        raise ConfigurationError(
            f"conn: {type(conn).__name__} is blocking (the sync view of a simulated table, "
            "for thread tasks and the sync functions); the async functions take the table "
            "itself or a transaction of its async transaction() block",
            argument="conn",
        )
    return tx  # type: ignore[return-value]


def own_transaction(conn: object) -> Transaction | None:
    """The blocking :class:`Transaction` of ``conn`` for a sync function, ``None`` for a
    driver connection; ConfigurationError(argument="conn") for an async one."""
    tx = transaction_of(conn)
    if tx is None:
        return None
    if not _blocking(tx):
        raise ConfigurationError(
            f"conn: {type(conn).__name__} is async (a simulated table or its transaction, "
            "for async tasks and the *_async functions); the sync functions take its blocking "
            "view, table.sync, or a transaction of table.sync.transaction()",
            argument="conn",
        )
    return tx  # type: ignore[return-value]
