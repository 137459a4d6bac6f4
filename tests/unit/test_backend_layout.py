"""Where a server's code lives: ``_core`` (the machinery every part shares) imports nothing
from ``backends`` (the registry and the server packages depend on ``_core``, never the other
way round), every server's ``jobfence doctor`` checks are found through the registry, and
every backend class goes by its registry name."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends import BACKENDS, BackendInfo, load_class, open_lock_backend

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


def test_a_backend_package_without_a_doctor_module_has_no_server_checks() -> None:
    info = BackendInfo(name="bare", schemes=("bare",), package="jobfence.backends._sql", parts={})
    assert info.doctor_checks() is None
    assert replace(info, doctor=None).doctor_checks() is None


def test_postgres_mode_picks_the_lock_class_in_one_place() -> None:
    """``mode=session`` (URL or keyword) makes the session class, from the registry's open
    path and from the lease class's constructor alike; no connection is opened."""
    from jobfence.backends.postgres import (
        SESSION_CAPABILITIES,
        AsyncPostgresLockBackend,
        AsyncPostgresSessionLockBackend,
        PostgresLockBackend,
        PostgresSessionLockBackend,
    )

    url = "postgresql://u@127.0.0.1:1/db"
    session = parse_url(url + "?mode=session")
    for lease_cls, session_cls in (
        (PostgresLockBackend, PostgresSessionLockBackend),
        (AsyncPostgresLockBackend, AsyncPostgresSessionLockBackend),
    ):
        asynchronous = lease_cls is AsyncPostgresLockBackend
        opened = open_lock_backend(url + "?mode=session", asynchronous=asynchronous)
        assert type(opened) is session_cls and opened.mode == "session"
        assert opened.capabilities == SESSION_CAPABILITIES
        assert type(lease_cls(session)) is session_cls
        assert type(lease_cls(parse_url(url), mode="session")) is session_cls
        assert type(lease_cls(session, mode="lease")) is lease_cls
        lease = open_lock_backend(url, asynchronous=asynchronous)
        assert type(lease) is lease_cls and lease.mode == "lease"
