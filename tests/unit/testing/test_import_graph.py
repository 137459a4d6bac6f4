"""The modules of ``jobfence.testing`` import each other without a cycle, counting every
import: at module level, inside functions and under ``TYPE_CHECKING``. (Shared types live in
``jobfence/testing/_base.py``, which imports none of them.)"""

from __future__ import annotations

import ast
from pathlib import Path

import jobfence.testing

PACKAGE = Path(jobfence.testing.__file__).parent


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports (``from .x import ...``, ``from . import x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {m: _imports(PACKAGE / f"{m}.py") & modules for m in sorted(modules)}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (each reported once, from its first node)."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append([*cycle, nxt])
            elif len(path) < len(edges):
                visit(nxt, [*path, nxt])

    for start in sorted(edges):
        visit(start, [start])
    return found


def test_the_testing_modules_import_each_other_without_a_cycle() -> None:
    assert cycles(graph()) == []


def test_the_shared_types_module_imports_no_sibling() -> None:
    assert graph()["_base"] == set()


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
