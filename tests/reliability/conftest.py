"""Fixtures shared by the reliability tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.specs import Spec, new_namespace


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(url, namespace)`` of the spec the test is parametrized with (``indirect=True``), in a
    fresh namespace that is cleaned up afterwards."""
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    try:
        yield url, namespace
    finally:
        spec.cleanup(url, namespace)
