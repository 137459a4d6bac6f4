"""Loading the inbox's SQL files (hand-written, shared by the sync and async backends).

Each file under ``sql/`` has sections introduced by ``-- name: <section>``; ``{table}`` is
replaced by a validated table name and ``?`` is the neutral placeholder, converted here for the
driver (``%s`` for psycopg and PyMySQL, literal ``%`` doubled).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

from .inbox_support import check_table

__all__ = ["load_queries", "to_format"]

_SECTION = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

#: macros used by the SQL files (documented at the top of each file)
_MACROS = {
    "sqlite": {"{now}": "((julianday('now') - 2440587.5) * 86400.0)"},
    "mysql": {
        "{take}": (
            "(expires_at <= UTC_TIMESTAMP(6) AND (state = 'completed' OR fingerprint IS NULL"
            " OR VALUES(fingerprint) IS NULL OR fingerprint = VALUES(fingerprint)))"
        )
    },
    "postgresql": {},
}


def _strip(body: str) -> str:
    lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip()


def _split(body: str) -> list[str]:
    """Statements of a section: split at ``;`` but never inside a ``$jobfence$`` block."""
    statements: list[str] = []
    current: list[str] = []
    quoted = False
    for part in re.split(r"(;|\$jobfence\$)", body):
        if part == "$jobfence$":
            quoted = not quoted
        if part == ";" and not quoted:
            statements.append("".join(current).strip())
            current = []
        else:
            current.append(part)
    statements.append("".join(current).strip())
    return [s for s in statements if s]


@lru_cache(maxsize=64)
def _load(dialect: str, table: str) -> dict[str, tuple[str, ...]]:
    stem = {"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"}[dialect]
    path = resources.files(f"jobfence.backends.{stem}").joinpath("sql/inbox.sql")
    source = path.read_text(encoding="utf-8")
    for macro, text in _MACROS[dialect].items():
        source = source.replace(macro, text)
    source = source.replace("{table}", check_table(table))
    parts = _SECTION.split(source)
    queries: dict[str, tuple[str, ...]] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        queries[name] = tuple(_split(_strip(body)))
    return queries


def load_queries(dialect: str, table: str) -> dict[str, tuple[str, ...]]:
    """Every section of the dialect's file as a tuple of statements (no trailing ``;``)."""
    return _load(dialect, table)


def to_format(sql: str) -> str:
    """``?`` -> ``%s`` (psycopg, PyMySQL); a literal ``%`` is doubled."""
    return sql.replace("%", "%%").replace("?", "%s")
