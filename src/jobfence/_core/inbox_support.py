"""Defaults, serialisers and checks shared by the inbox (sync and async) and its backends;
nothing here does I/O. The claim types live in :mod:`jobfence.backends.base`."""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Protocol, cast

from ..errors import ClaimLost, ConfigurationError
from .options import reject_unknown
from .url import BackendURL
from .validate import MAX_NAME_BYTES, check_namespace

__all__ = [
    "BYTES_PREFIX",
    "DEFAULT_CLAIM_TTL",
    "DEFAULT_RETENTION",
    "DEFAULT_TABLE",
    "SCHEMA_VERSION",
    "ClaimLost",
    "JSONSerializer",
    "Serializer",
    "check_fingerprint",
    "check_serializer",
    "held_here",
    "hold_here",
    "inbox_table",
    "local_retry_after",
]

#: seconds an in-progress claim lives unless completed or released (its worker's deadline)
DEFAULT_CLAIM_TTL = 300.0
#: seconds a completed record is kept for result replay (7 days)
DEFAULT_RETENTION = 7 * 86400.0
DEFAULT_TABLE = "jobfence_inbox"
#: version of the inbox's SQL schema, stored in ``jobfence_inbox_schema``
SCHEMA_VERSION = 1


#: the claims this process holds now, by owner id (owner ids are random per claim): a claim
#: found in progress under one of them is held by a call running in this very process
_HELD: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: the shortest wait before a call refused by a claim of this process asks again (seconds)
LOCAL_RECHECK = 0.5


def hold_here(owner: str, claim: Any) -> None:
    """Record ``claim`` (a NEW claim, with its monotonic start time ``_started`` and its
    ``owned`` property) as held by this process under ``owner``, for as long as it exists."""
    _HELD[owner] = claim


def held_here(owner: str | None) -> Any:
    """The claim this process holds under ``owner`` (not completed or released yet), else
    None."""
    if owner is None:
        return None
    claim = _HELD.get(owner)
    return claim if claim is not None and claim.owned else None


def local_retry_after(owner: str | None, now: float) -> float | None:
    """When a call refused by the claim of ``owner`` should ask again, if a call of this
    process holds that claim (else None: the holder's expiry is what is known): after as long
    as the holder has run so far (at least :data:`LOCAL_RECHECK` seconds), so that a holder
    that finishes soon is not waited out to its expiry and a long one is not asked about
    more often than it ran. ``now``: the clock's monotonic time."""
    claim = held_here(owner)
    if claim is None:
        return None
    started: float = claim._started
    return max(LOCAL_RECHECK, now - started)


# a child process holds none of its parent's claims (their calls run in the parent)
os.register_at_fork(after_in_child=_HELD.clear)


class Serializer(Protocol):
    """Anything with ``dumps(obj) -> str | bytes`` and ``loads(bytes) -> obj`` (``json``,
    ``pickle``, ``msgpack``...). ``loads`` is given bytes."""

    def dumps(self, obj: Any, /) -> str | bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


class JSONSerializer:
    """The default: compact JSON, UTF-8."""

    #: what ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` makes per call
    _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def dumps(self, obj: Any, /) -> bytes:
        return self._encoder.encode(obj).encode("utf-8")

    def loads(self, data: bytes, /) -> Any:
        return json.loads(data)


def check_serializer(serializer: object) -> Serializer:
    """``serializer`` if it has ``dumps`` and ``loads`` (``None``: a :class:`JSONSerializer`);
    else a :class:`ConfigurationError` naming ``serializer``."""
    if serializer is None:
        return JSONSerializer()
    if not (
        callable(getattr(serializer, "dumps", None))
        and callable(getattr(serializer, "loads", None))
    ):
        raise ConfigurationError(
            "serializer must have dumps(obj) -> str | bytes and loads(bytes) -> obj "
            f"(e.g. the json or pickle module), got {serializer!r}",
            argument="serializer",
        )
    return cast("Serializer", serializer)


#: how a ``bytes`` fingerprint is stored: this prefix, then its hex digits; a ``str``
#: fingerprint may not start with it, so a str never equals a bytes one (``"78"``, ``b"x"``)
BYTES_PREFIX = "bytes:"


def check_fingerprint(fingerprint: object) -> str | None:
    """``None``, or the stored form of a fingerprint: a non-empty ``str`` as it is, or
    non-empty ``bytes`` as ``"bytes:<hex>"``; at most 1024 bytes in UTF-8.

    Every backend stores and compares it as text, so a str must be valid Unicode (no lone
    surrogates) without NUL characters, and must not start with ``"bytes:"``; anything else
    raises :class:`ConfigurationError` (``argument="fingerprint"``).
    """
    if fingerprint is None:
        return None
    if isinstance(fingerprint, (bytes, bytearray)) and fingerprint:
        fingerprint = BYTES_PREFIX + bytes(fingerprint).hex()
    elif not isinstance(fingerprint, str) or not fingerprint:
        raise ConfigurationError(
            f"fingerprint must be None, a non-empty str (e.g. a hex digest) or non-empty "
            f"bytes, got {type(fingerprint).__name__}"
            + (" (empty)" if isinstance(fingerprint, (str, bytes, bytearray)) else ""),
            argument="fingerprint",
        )
    elif fingerprint.startswith(BYTES_PREFIX):
        raise ConfigurationError(
            f"a str fingerprint must not start with {BYTES_PREFIX!r}: that is how a bytes "
            "fingerprint is stored (pass the bytes themselves)",
            argument="fingerprint",
        )
    try:
        size = len(fingerprint.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(
            "fingerprint must be valid Unicode text: lone surrogates cannot be stored",
            argument="fingerprint",
        ) from None
    if "\x00" in fingerprint:
        raise ConfigurationError(
            "fingerprint must not contain NUL characters (PostgreSQL text cannot hold them)",
            argument="fingerprint",
        )
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"fingerprint must be at most {MAX_NAME_BYTES} bytes in UTF-8"
            + (
                " (bytes take 2 hex digits each, after 'bytes:')"
                if fingerprint.startswith(BYTES_PREFIX)
                else ""
            )
            + f", got {size}",
            argument="fingerprint",
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
