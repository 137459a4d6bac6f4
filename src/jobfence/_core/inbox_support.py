"""Types shared by the inbox (sync and async) and its backends; nothing here does I/O."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ..errors import ClaimLost, ConfigurationError
from .validate import MAX_NAME_BYTES

__all__ = [
    "DEFAULT_CLAIM_TTL",
    "DEFAULT_RETENTION",
    "DEFAULT_TABLE",
    "SCHEMA_VERSION",
    "ClaimLost",
    "ClaimRecord",
    "ClaimState",
    "InboxCapabilities",
    "JSONSerializer",
    "Serializer",
    "check_fingerprint",
    "record_from_row",
]

#: seconds an in-progress claim lives unless completed or released (its worker's deadline)
DEFAULT_CLAIM_TTL = 300.0
#: seconds a completed record is kept for result replay (7 days)
DEFAULT_RETENTION = 7 * 86400.0
DEFAULT_TABLE = "jobfence_inbox"
#: version of the inbox's SQL schema, stored in ``jobfence_inbox_schema``
SCHEMA_VERSION = 1


class ClaimState(str, enum.Enum):
    """What :meth:`Inbox.claim` found.

    * ``NEW`` -- the key is yours now: do the work, then ``complete(result)`` or ``release()``.
    * ``IN_PROGRESS`` -- another live worker owns it (``owner``, ``expires_at`` say who and
      until when); do not run the work.
    * ``COMPLETED`` -- the work was done; ``result`` is the stored result to replay.
    """

    NEW = "new"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class InboxCapabilities:
    """What an inbox backend guarantees; the conformance suite reads these.

    * ``cross_process`` -- claims are shared between processes (and hosts).
    * ``transactional`` -- :meth:`Inbox.claim_in` works with connections to this database.
    * ``native_expiry`` -- records expire on the server by themselves (``purge()`` is a no-op).
    """

    cross_process: bool
    transactional: bool = False
    native_expiry: bool = False


@dataclass(frozen=True)
class ClaimRecord:
    """One claim's outcome as a backend reports it.

    ``mine`` is true when this call took the key (a first claim or a takeover); otherwise the
    other fields describe the record that stopped it. ``result`` is the serialised result
    (``None`` unless completed). ``expires_at`` is an aware UTC datetime: the claim's deadline
    while in progress, the end of retention once completed.
    """

    mine: bool
    state: ClaimState
    attempt: int
    owner: str | None = None
    fingerprint: str | None = None
    result: bytes | None = None
    expires_at: datetime | None = None


def record_from_row(
    row: Sequence[Any],
    expires_at: Callable[[Any], datetime | None],
    text: Callable[[Any], Any] = str,
) -> ClaimRecord:
    """A :class:`ClaimRecord` from a SQL row ``(mine, state, owner, attempt, fingerprint,
    result, expires_at)``; ``expires_at`` converts the dialect's time value, ``text`` the
    dialect's strings (MySQL may return bytes)."""
    mine, state, owner, attempt, fingerprint, result, expires = row
    return ClaimRecord(
        mine=bool(mine),
        state=ClaimState(text(state)),
        attempt=int(attempt),
        owner=None if owner is None else text(owner),
        fingerprint=None if fingerprint is None else text(fingerprint),
        result=None if result is None else bytes(result),
        expires_at=expires_at(expires),
    )


class Serializer(Protocol):
    """Anything with ``dumps(obj) -> str | bytes`` and ``loads(bytes) -> obj`` (``json``,
    ``pickle``, ``msgpack``...). ``loads`` is given bytes."""

    def dumps(self, obj: Any, /) -> str | bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


class JSONSerializer:
    """The default: compact JSON, UTF-8."""

    def dumps(self, obj: Any, /) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def loads(self, data: bytes, /) -> Any:
        return json.loads(data)


def check_fingerprint(fingerprint: object) -> str | None:
    """``None`` or a non-empty str of at most 1024 bytes in UTF-8 (e.g. a hex digest)."""
    if fingerprint is None:
        return None
    if isinstance(fingerprint, bytes):
        fingerprint = fingerprint.hex()
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ConfigurationError(
            f"fingerprint must be None or a non-empty str (e.g. a hex digest), got "
            f"{type(fingerprint).__name__}",
            argument="fingerprint",
        )
    if len(fingerprint.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"fingerprint must be at most {MAX_NAME_BYTES} bytes in UTF-8", argument="fingerprint"
        )
    return fingerprint


def utc_from_epoch(seconds: float | None) -> datetime | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(float(seconds), tz=timezone.utc)


def as_utc(value: datetime | None) -> datetime | None:
    """A naive datetime is taken to be UTC (MySQL ``DATETIME`` written with UTC_TIMESTAMP)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)
