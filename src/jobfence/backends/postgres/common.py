"""Names and keys as PostgreSQL ``text`` can store them; which pooled connection is reusable."""

from __future__ import annotations

from typing import Any

__all__ = ["pg_text", "reusable"]

_ESCAPE = "\ufffe"


def pg_text(name: str) -> str:
    """``name`` as jobfence's PostgreSQL tables store it: unchanged, unless ``text`` cannot hold
    it.

    ``text`` cannot contain NUL, so a name with a NUL character -- or one starting with the
    escape mark U+FFFE, to keep the mapping one-to-one -- is stored as U+FFFE followed by the
    hex of its UTF-8 bytes. Every other name is stored as it is (readable for operators).
    """
    if "\0" in name or name.startswith(_ESCAPE):
        return _ESCAPE + name.encode("utf-8").hex()
    return name


def reusable(conn: Any) -> bool:
    """Whether a psycopg connection may serve the next statement of a pool: open, not broken,
    and not inside a transaction (a statement cut off mid-way leaves it ACTIVE)."""
    from psycopg.pq import TransactionStatus  # only psycopg connections come here

    return bool(
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
    )
