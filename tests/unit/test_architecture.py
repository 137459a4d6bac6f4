"""The package's shape, checked from its imports: the rules that keep one place for each thing.

- no import cycle between jobfence's modules (``TYPE_CHECKING`` imports count too: a cycle
  there is still two rooms that need each other);
- ``jobfence.testing._base`` imports no other module of the toolkit;
- the lease renewer knows no lease, claim or message class: it works on the ``Renewable``
  protocol;
- no branch on a server's or dialect's name outside ``jobfence.backends`` (what differs
  between servers is asked of the backend package's dialect).

Each rule names the files that break it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jobfence

ROOT = Path(jobfence.__file__).parent
PACKAGE = "jobfence"


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The jobfence modules ``name`` imports (a ``from . import x`` of a submodule is that
    submodule, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_the_simulations_shared_types_import_no_sibling() -> None:
    """``jobfence.testing._base`` holds what the simulation's modules share, so that they
    need not import each other."""
    siblings = {m for m in GRAPH[f"{PACKAGE}.testing._base"] if m.startswith(f"{PACKAGE}.testing")}
    assert siblings == set()


def test_the_renewer_knows_no_lease_claim_or_message_class() -> None:
    renewers = [name for name in MODULES if name.startswith(f"{PACKAGE}._core.renewer")]
    assert renewers, "the lease renewer lives in jobfence._core"
    parts = {f"{PACKAGE}.{m}" for m in ("locks", "inbox", "queue", "lease")}
    parts |= {f"{m}_async" for m in parts}
    for name in renewers:
        assert GRAPH[name] & parts == set(), name


#: a comparison of a server's or a dialect's name, as a branch would write it
_SERVERS = "postgres|postgresql|mysql|mariadb|sqlite|redis"
_BRANCH = re.compile(
    r"(dialect|backend|kind|scheme)\w*\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[{]?\s*"
    rf"[\"']({_SERVERS})[\"']"
)


def test_no_server_name_branches_outside_backends() -> None:
    offenders = []
    for name, path in MODULES.items():
        if name.startswith(f"{PACKAGE}.backends"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _BRANCH.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
