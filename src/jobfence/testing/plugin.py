"""The pytest plugin of ``jobfence.testing``: it lives in the top-level module
``jobfence_pytest``, which the ``pytest11`` entry point registers (so that a pytest start
imports nothing of jobfence). This module re-exports its hooks for an installation whose
entry point still names ``jobfence.testing.plugin``; register one of the two, not both.
"""

from __future__ import annotations

from jobfence_pytest import (
    pytest_addoption,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_unconfigure,
)

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_unconfigure",
]
