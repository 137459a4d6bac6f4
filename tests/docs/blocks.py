"""Find the ```python blocks of README.md and docs/**/*.md, with their markers.

A block's markers are HTML comments on the lines just before its opening fence:

* ``<!-- block: NAME -->`` names the block, so that other blocks of the page can run it first;
* ``<!-- after: NAME[, NAME2] -->`` runs the named blocks of the same page first, in the same
  namespace (setup blocks);
* ``<!-- file: PATH -->`` also writes the block to ``PATH`` in the run's directory when it runs
  (a module that a command started by a later block imports);
* ``<!-- no-run: REASON -->`` keeps the block from running; the reason is required.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^\s*<!--\s*(block|after|no-run|file):\s*(.*?)\s*-->\s*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*(block|after|no-run|file|norun|no_run|skip)\b")
FENCE = re.compile(r"^(\s*)```python\s*$")


@dataclass
class Block:
    """One ```python block of a Markdown page."""

    page: str  # path relative to the repository root
    line: int  # line number of the opening fence (1-based)
    code: str
    name: str | None = None
    after: list[str] = field(default_factory=list)
    no_run: str | None = None
    file: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}" + (f"[{self.name}]" if self.name else "")


class MarkerError(Exception):
    """A marker that is malformed or names a block the page does not have."""


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(path: Path) -> list[Block]:
    """The python blocks of one page, with the markers just above each."""
    page = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    in_other_fence = False
    while i < len(lines):
        line = lines[i]
        match = FENCE.match(line)
        if match is None:
            if line.lstrip().startswith("```"):
                in_other_fence = not in_other_fence
            i += 1
            continue
        if in_other_fence:
            i += 1
            continue
        indent = match.group(1)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise MarkerError(f"{page}:{start + 1}: the python block is never closed")
        i += 1
        block = Block(page, start + 1, textwrap.dedent("\n".join(body)) + "\n")
        if indent:
            block.code = textwrap.dedent(block.code)
        j = start - 1
        while j >= 0 and (MARKER.match(lines[j]) or ANY_MARKER.match(lines[j])):
            marker = MARKER.match(lines[j])
            if marker is None:
                raise MarkerError(f"{page}:{j + 1}: malformed marker {lines[j].strip()!r}")
            kind, value = marker.groups()
            if not value:
                raise MarkerError(f"{page}:{j + 1}: the {kind} marker needs a value")
            if kind == "block":
                block.name = value
            elif kind == "after":
                block.after = [n.strip() for n in value.split(",") if n.strip()]
            elif kind == "file":
                block.file = value
            else:
                block.no_run = value
            j -= 1
        blocks.append(block)
    names = [b.name for b in blocks if b.name]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise MarkerError(f"{page}: block names used twice: {sorted(duplicates)}")
    for block in blocks:
        for name in block.after:
            if name not in names:
                raise MarkerError(f"{block.id}: after: names no block of the page: {name!r}")
    return blocks


def all_blocks() -> list[Block]:
    """Every python block of README.md and docs/."""
    return [block for path in pages() for block in parse(path)]
