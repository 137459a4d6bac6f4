"""Names and keys as PostgreSQL ``text`` can store them."""

from __future__ import annotations

__all__ = ["pg_text"]

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
