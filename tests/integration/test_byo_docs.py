"""Every ```python block of the how-to pages on bringing your own client and moving from
redis-py runs against the local services, by the docs conventions: each block in a fresh
namespace with a temporary working directory; ``<!-- after: NAME -->`` runs the named blocks
of the page first, in the same namespace; ``<!-- no-run: REASON -->`` skips a block that
needs what is not here (a Sentinel deployment, a Redis Cluster)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "how-to"
PAGES = ("bring-your-own-client.md", "from-redis-py.md")
_BLOCK = re.compile(
    r"(?:<!-- (?P<kind>block|after|no-run): ?(?P<arg>[^>]*?) -->\n)?```python\n(?P<code>.*?)```",
    re.S,
)


def _blocks(page: str) -> list[dict[str, Any]]:
    text = (DOCS / page).read_text(encoding="utf-8")
    found = []
    for match in _BLOCK.finditer(text):
        kind, arg = match.group("kind"), (match.group("arg") or "").strip()
        found.append(
            {
                "code": match.group("code"),
                "name": arg if kind == "block" else None,
                "after": [a.strip() for a in arg.split(",")] if kind == "after" else [],
                "skip": kind == "no-run",
                "line": text[: match.start()].count("\n") + 1,
            }
        )
    return found


CASES = [
    pytest.param(page, i, id=f"{page}:{block['line']}")
    for page in PAGES
    for i, block in enumerate(_blocks(page))
    if not block["skip"]
]


@pytest.mark.parametrize(("page", "index"), CASES)
def test_doc_block_runs(
    page: str, index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _blocks(page)
    named = {b["name"]: b for b in blocks if b["name"]}
    block = blocks[index]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__doc__"}
    for name in block["after"]:
        setup = named[name]
        exec(compile(setup["code"], f"docs/how-to/{page}:{setup['line']}", "exec"), namespace)
    exec(compile(block["code"], f"docs/how-to/{page}:{block['line']}", "exec"), namespace)


def test_the_pages_have_their_examples() -> None:
    for page in PAGES:
        assert len([b for b in _blocks(page) if not b["skip"]]) >= 3, page
