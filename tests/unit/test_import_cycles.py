"""No import cycle through the modules a lease's life runs in, nor between the errors, the
clock and the I/O hook: every import statement counts (those inside functions and under
``TYPE_CHECKING`` too)."""

from __future__ import annotations

import ast
from pathlib import Path

import jobfence

SRC = Path(jobfence.__file__).resolve().parent

#: no import cycle may pass through these
LAYERED = {
    "jobfence.errors",
    "jobfence._core.clock",
    "jobfence._core.hooks",
    "jobfence._core.lease_state",
    "jobfence._core.renewable",
    "jobfence._core.renewer_async",
    "jobfence._core.renewer",
    "jobfence.renewal_async",
    "jobfence.renewal",
    "jobfence.locks_async",
    "jobfence.locks",
    "jobfence.lease_async",
    "jobfence.lease",
    "jobfence.acquire_async",
    "jobfence.acquire",
    "jobfence.inbox_async",
    "jobfence.inbox",
    "jobfence.queue_async",
    "jobfence.queue",
}


def _graph() -> dict[str, set[str]]:
    """module -> the jobfence modules it imports."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        graph[name].add(f"{source}.{alias.name}")
                    elif source in modules:
                        graph[name].add(source)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in modules}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def test_no_import_cycle_passes_through_the_lease_modules_or_errors_clock_hooks() -> None:
    graph = _graph()
    assert graph.keys() >= LAYERED, LAYERED - graph.keys()
    cyclic = sorted(name for name in LAYERED if name in _reaches(graph, name))
    assert not cyclic, f"modules on an import cycle: {cyclic}"


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert "a" in _reaches(graph, "a") and "d" not in _reaches(graph, "d")
