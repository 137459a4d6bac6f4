"""Load the named statements of a shipped ``backends/sql/*.sql`` file.

A file is split into sections by ``-- name: <section>`` lines; SQL comments are removed from
the statements (they document the parameter contract for readers and migration tools). The
default table name in a file is replaced by the configured, already quoted one.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib.resources import files

__all__ = ["load_sections", "statements"]

_SECTION = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_COMMENT = re.compile(r"--[^\n]*")


@cache
def load_sections(filename: str) -> dict[str, str]:
    text = files("jobfence.backends").joinpath(filename).read_text(encoding="utf-8")
    parts = _SECTION.split(text)
    sections: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [_COMMENT.sub("", line).rstrip() for line in body.splitlines()]
        sections[name] = "\n".join(line for line in lines if line.strip())
    return sections


@lru_cache(maxsize=256)
def statements(filename: str, default_table: str, quoted_table: str) -> dict[str, str]:
    """The file's statements with ``default_table`` (whole word) replaced by ``quoted_table``."""
    word = re.compile(rf"\b{re.escape(default_table)}\b")
    return {k: word.sub(lambda _m: quoted_table, v) for k, v in load_sections(filename).items()}
