"""A pytest plugin that reports which specs the collected tests run.

Loaded with ``-p tests.conformance._collected_specs`` and the environment variable
``JOBFENCE_COLLECTED_SPECS`` naming a file: after collection it writes one line per collected
test that is parametrised with a :class:`~tests.conformance.specs.Spec` (directly or through a
fixture), ``<test file name> <spec id>``. ``test_specs.py`` reads it to check that every
registered backend really runs through each of its parts' suites.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conformance.specs import Spec

ENV = "JOBFENCE_COLLECTED_SPECS"


def pytest_collection_finish(session: pytest.Session) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    lines = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        for value in callspec.params.values() if callspec is not None else ():
            if isinstance(value, Spec):
                lines.append(f"{item.path.name} {value.id}\n")
    Path(target).write_text("".join(lines))
