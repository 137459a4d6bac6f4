from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.backends import SPECS, Spec, new_namespace
from tests.conformance.flavours import LocksW


@pytest.fixture(params=SPECS, ids=[s.id for s in SPECS])
def spec(request: pytest.FixtureRequest) -> Spec:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


class Env:
    """One backend, one namespace: makes clients of either flavour and cleans up."""

    def __init__(self, spec: Spec, flavour: str, tmp_path: Path) -> None:
        self.spec = spec
        self.flavour = flavour
        self.url = spec.make_url(tmp_path)
        self.namespace = new_namespace()
        self.clients: list[LocksW] = []

    def client(self, flavour: str | None = None, **options: Any) -> LocksW:
        sync = (flavour or self.flavour) == "sync"
        client = LocksW(self.url, self.namespace, sync, **options)
        self.clients.append(client)
        return client


@pytest.fixture
async def env(spec: Spec, flavour: str, tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(spec, flavour, tmp_path)
    try:
        yield e
    finally:
        for c in e.clients:
            try:
                await c.close()
            except Exception:  # closing after a failed test must not hide the failure
                pass
        spec.cleanup(e.url, e.namespace)


Factory = Callable[..., LocksW]
