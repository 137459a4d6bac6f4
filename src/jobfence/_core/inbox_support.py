"""Defaults, serialisers and checks shared by the inbox (sync and async) and its backends;
nothing here does I/O. The claim types live in :mod:`jobfence.backends.base`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from ..errors import ClaimLost, ConfigurationError
from .options import reject_unknown
from .url import BackendURL
from .validate import MAX_NAME_BYTES, check_namespace

__all__ = [
    "DEFAULT_CLAIM_TTL",
    "DEFAULT_RETENTION",
    "DEFAULT_TABLE",
    "SCHEMA_VERSION",
    "ClaimLost",
    "JSONSerializer",
    "Serializer",
    "check_fingerprint",
    "inbox_table",
]

#: seconds an in-progress claim lives unless completed or released (its worker's deadline)
DEFAULT_CLAIM_TTL = 300.0
#: seconds a completed record is kept for result replay (7 days)
DEFAULT_RETENTION = 7 * 86400.0
DEFAULT_TABLE = "jobfence_inbox"
#: version of the inbox's SQL schema, stored in ``jobfence_inbox_schema``
SCHEMA_VERSION = 1


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


#: keyword options every inbox backend accepts (``retention`` is read by the inbox itself)
INBOX_KEYWORDS = ("retention", "pool_size", "max_idle")


def inbox_table(
    url: BackendURL,
    table: str,
    options: Mapping[str, Any],
    *,
    backend: str,
    limit: int,
    extra: tuple[str, ...] = (),
) -> str:
    """Check an inbox backend's keyword ``options`` (the common ones plus ``extra``) and
    return its table: the URL's ``table`` option, else ``table``, within ``limit``."""
    reject_unknown(options, (*INBOX_KEYWORDS, *extra), f"{backend} inbox")
    return check_namespace(
        url.options.get("table", table), limit=limit, backend=backend, argument="table"
    )
