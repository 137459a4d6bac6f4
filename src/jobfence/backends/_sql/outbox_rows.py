"""What the SQL outbox backends share (hand-written, no I/O): the outbox's options and
defaults, the check of an outbox ``table`` option, and the rows of ``sql/outbox.sql`` made
into :class:`~jobfence.backends.base.OutboxRow` / :class:`~jobfence.backends.base.OutboxEntry`
/ :class:`~jobfence.backends.base.OutboxStats`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._core.options import reject_unknown
from ..._core.url import BackendURL
from ..._core.validate import check_namespace
from ..base import OutboxEntry, OutboxRow, OutboxStats

__all__ = [
    "DEFAULT_OUTBOX_TABLE",
    "OUTBOX_SCHEMA_VERSION",
    "STATES",
    "entry_from_row",
    "headers_out",
    "lock_key",
    "outbox_table",
    "row_from_db",
    "seq_list",
    "stats_from_row",
    "text",
]

DEFAULT_OUTBOX_TABLE = "jobfence_outbox"
#: the version of the outbox table's layout, stored in ``jobfence_outbox_schema``
OUTBOX_SCHEMA_VERSION = 1
#: the states an outbox row can be in
STATES = ("pending", "claimed", "published", "dead")


def outbox_table(
    url: BackendURL,
    table: str,
    options: Mapping[str, Any],
    *,
    backend: str,
    limit: int,
    allowed: Sequence[str],
) -> str:
    """Check an outbox backend's keyword ``options`` (``allowed``) and return its table: the
    URL's ``table`` option, else ``table``, an SQL identifier within ``limit``."""
    reject_unknown(options, allowed, f"{backend} outbox")
    return check_namespace(
        url.options.get("table", table), limit=limit, backend=backend, argument="table"
    )


def lock_key(table: str) -> int:
    """A signed 64-bit number made from the outbox table's name (the PostgreSQL advisory lock
    that serialises its claims)."""
    digest = hashlib.blake2b(f"jobfence_outbox:{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def text(value: Any) -> str | None:
    """A text column as ``str`` (MySQL's VARBINARY columns come back as bytes)."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def headers_out(value: Any) -> dict[str, str]:
    """The headers column (JSON text, or NULL) as a dict."""
    raw = text(value)
    if not raw:
        return {}
    return {str(k): str(v) for k, v in json.loads(raw).items()}


def seq_list(seqs: Sequence[int]) -> list[int]:
    """The seq numbers a relay passed, as ints, without repeats, in order."""
    return list(dict.fromkeys(int(seq) for seq in seqs))


def _time(value: Any, scale: float) -> float | None:
    return None if value is None else float(value) / scale


def row_from_db(row: Sequence[Any], scale: float = 1.0) -> OutboxRow:
    """An :class:`OutboxRow` from ``(seq, id, queue, ordering_key, body, headers, attempts,
    created_at)``; times are seconds since the epoch times ``scale`` (MySQL: microseconds)."""
    seq, id_, queue, key, body, headers, attempts, created_at = row[:8]
    return OutboxRow(
        seq=int(seq),
        id=text(id_) or "",
        queue=text(queue) or "",
        key=text(key),
        body=bytes(body),
        headers=headers_out(headers),
        attempts=int(attempts),
        created_at=float(created_at) / scale,
    )


def entry_from_row(
    row: Sequence[Any], scale: float = 1.0, *, order: Callable[[Sequence[Any]], Sequence[Any]]
) -> OutboxEntry:
    """An :class:`OutboxEntry` from an ``entries`` row, its columns put in the order
    ``(seq, id, queue, key, state, attempts, created_at, available_at, claimed_by,
    claimed_until, published_at, last_error, body, headers)`` by ``order``."""
    (
        seq,
        id_,
        queue,
        key,
        state,
        attempts,
        created_at,
        available_at,
        claimed_by,
        claimed_until,
        published_at,
        last_error,
        body,
        headers,
    ) = order(row)
    return OutboxEntry(
        seq=int(seq),
        id=text(id_) or "",
        queue=text(queue) or "",
        key=text(key),
        state=text(state) or "",
        attempts=int(attempts),
        created_at=float(created_at) / scale,
        available_at=_time(available_at, scale),
        claimed_by=text(claimed_by),
        claimed_until=_time(claimed_until, scale),
        published_at=_time(published_at, scale),
        last_error=text(last_error),
        body=bytes(body),
        headers=headers_out(headers),
    )


def stats_from_row(row: Sequence[Any], scale: float = 1.0) -> OutboxStats:
    """:class:`OutboxStats` from the ``stats`` row."""
    pending, claimed, published, dead, oldest = row
    return OutboxStats(
        pending=int(pending),
        claimed=int(claimed),
        published=int(published),
        dead=int(dead),
        oldest_pending=_time(oldest, scale),
    )
