"""The runnable examples in docs/inbox.md run and their assertions hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "inbox.md"
BLOCKS = [
    b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "import jobfence" in b
]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"docs/inbox.md example {index + 1}", "exec"), {})


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 3
