"""Every ```python block of docs/how-to/dramatiq.md runs (each in a fresh namespace, in a
temporary directory, after the blocks its ``<!-- after: ... -->`` names) and its assertions
hold."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

import jobfence

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "dramatiq.md"
BLOCK = re.compile(r"(?:<!-- (\w[\w-]*): ([^>]*) -->\n)?```python\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, dict[str, str], str]]:
    found = []
    for index, match in enumerate(BLOCK.finditer(DOC.read_text(encoding="utf-8"))):
        marks = {match.group(1): match.group(2).strip()} if match.group(1) else {}
        name = marks.get("block", f"block-{index + 1}")
        found.append((name, marks, match.group(3)))
    return found


BLOCKS = _blocks()
BY_NAME = {name: code for name, _, code in BLOCKS}


@pytest.mark.parametrize(("name", "marks", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_the_block_runs(
    name: str, marks: dict[str, str], code: str, tmp_path: Path, monkeypatch: Any
) -> None:
    if "no-run" in marks:
        return
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": f"docs_dramatiq_{name}"}
    for before in filter(None, (n.strip() for n in marks.get("after", "").split(","))):
        exec(compile(BY_NAME[before], f"{DOC.name} [{before}]", "exec"), namespace)
    try:
        exec(compile(code, f"{DOC.name} [{name}]", "exec"), namespace)
    finally:  # what a worker's shutdown would close (JobfenceMiddleware(clients=...))
        for value in namespace.values():
            if isinstance(value, (jobfence.Locks, jobfence.Inbox)):
                value.close()
            elif isinstance(value, (jobfence.AsyncLocks, jobfence.AsyncInbox)):
                asyncio.run(value.close())
