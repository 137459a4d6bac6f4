"""Every complete example of docs/testing.md runs and its assertions hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "testing.md"
BLOCKS = [
    b
    for b in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    if "from jobfence import testing" in b and "async def" in b
]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"docs/testing.md example {index + 1}", "exec"), {})


def test_the_doc_has_its_examples() -> None:
    assert len(BLOCKS) >= 5
