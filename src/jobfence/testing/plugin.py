"""The pytest plugin of ``jobfence.testing`` (registered through the ``pytest11`` entry point).

- ``pytest --jobfence-seed=N`` replays exactly schedule ``N`` of every
  :func:`jobfence.testing.explore` the selected tests run (the seed a failure prints);
- ``pytest --jobfence-schedules=N`` overrides every ``explore``'s ``schedules`` (a quick run
  while editing, or a long one at night);
- a failing ``explore`` assertion (``report.assert_ok()``) prints the seed and tape, and the
  test's report gets a line with the command that replays it.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_unconfigure"]


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise pytest.UsageError(f"expected an int >= 0, got {text!r}") from None
    if value < 0:
        raise pytest.UsageError(f"expected an int >= 0, got {text!r}")
    return value


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("jobfence", "jobfence race testing")
    group.addoption(
        "--jobfence-seed",
        type=_non_negative,
        default=None,
        metavar="N",
        help="replay only schedule N (the seed a failure printed) of each jobfence explore()",
    )
    group.addoption(
        "--jobfence-schedules",
        type=_non_negative,
        default=None,
        metavar="N",
        help="run N schedules in every jobfence explore(), whatever the test asks for",
    )


def _explore_module() -> Any:
    # the module, not the function of the same name the package exports
    return importlib.import_module("jobfence.testing.explore")


def pytest_configure(config: Any) -> None:
    explore = _explore_module()
    explore._REPLAY_SEED = config.getoption("--jobfence-seed")
    explore._SCHEDULES = config.getoption("--jobfence-schedules") or None


def pytest_unconfigure(config: Any) -> None:
    explore = _explore_module()

    explore._REPLAY_SEED = None
    explore._SCHEDULES = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    text = str(call.excinfo.value)
    marker = "--jobfence-seed="
    if text.startswith("jobfence.testing:") and marker in text:
        seed = text.split(marker, 1)[1].split(",", 1)[0].split()[0]
        report.sections.append(
            ("jobfence", f"replay this schedule: pytest {item.nodeid} {marker}{seed}")
        )
