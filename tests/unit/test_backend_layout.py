"""Where a server's code lives: ``_core`` (the machinery every part shares) imports nothing
from ``backends`` (the registry and the server packages depend on ``_core``, never the other
way round), every server's ``jobfence doctor`` checks are found through the registry, and
every backend class goes by its registry name."""

from __future__ import annotations

import ast
from pathlib import Path

import jobfence
from jobfence.backends import BACKENDS, load_class

CORE = Path(jobfence.__file__).parent / "_core"


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_core_imports_nothing_from_backends() -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in sorted(CORE.glob("*.py"))
        for name in _imports(path)
        if "backends" in name.split(".")
    }
    assert not offenders


def test_every_built_in_server_has_its_doctor_checks_in_its_package() -> None:
    for info in BACKENDS.values():
        inspect = info.doctor_checks()
        assert inspect is not None, info.name
        assert inspect.__module__ == f"{info.package}.doctor"


def test_every_backend_class_goes_by_its_registry_name() -> None:
    """One name per backend: the ``kind`` of every class a backend provides (errors, the
    I/O hook's ``backend``, telemetry) is its registry entry's ``name``."""
    for info in BACKENDS.values():
        for part in info.parts:
            for asynchronous in (False, True):
                cls = load_class(info, part, asynchronous=asynchronous)
                assert cls.kind == info.name, (info.name, part, cls)
