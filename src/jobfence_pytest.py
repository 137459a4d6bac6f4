"""The pytest plugin of ``jobfence.testing`` (registered through the ``pytest11`` entry point).

- ``pytest --jobfence-seed=N`` replays exactly the schedule of seed ``N`` (the seed a failure
  prints, never its index) of every :func:`jobfence.testing.explore` the selected tests run,
  after that explore's schedule 0; an explore whose seeds do not include ``N`` runs as usual;
- ``pytest --jobfence-schedules=N`` overrides every ``explore``'s ``schedules`` (a quick run
  while editing, or a long one at night);
- a failing ``explore`` assertion (``report.assert_ok()``) prints the seed and tape, and the
  test's report gets a line with the command that replays it.

A top-level module of its own, importing nothing of jobfence: pytest loads every plugin at
its start, and a test run that never explores pays nothing for this one. It keeps the options
here (:data:`replay_seed`, :data:`schedules`); ``explore()`` looks them up when it runs.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_unconfigure",
    "replay_seed",
    "schedules",
]

#: ``--jobfence-seed=N``: the seed of the one schedule each explore runs (after schedule 0)
replay_seed: int | None = None
#: ``--jobfence-schedules=N``: how many schedules every explore runs
schedules: int | None = None

_SEED_OPTION = "--jobfence-seed"


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
        _SEED_OPTION,
        type=_non_negative,
        default=None,
        metavar="SEED",
        help=(
            "replay only the schedule of this SEED in each jobfence explore() whose seeds "
            "include it: the seed a failure prints ('schedule I (seed SEED)'), not the "
            "index I; explore() runs schedule i with seed=explore's seed + i"
        ),
    )
    group.addoption(
        "--jobfence-schedules",
        type=_non_negative,
        default=None,
        metavar="N",
        help="run N schedules in every jobfence explore(), whatever the test asks for",
    )


def pytest_configure(config: Any) -> None:
    global replay_seed, schedules
    replay_seed = config.getoption(_SEED_OPTION)
    schedules = config.getoption("--jobfence-schedules") or None


def pytest_unconfigure(config: Any) -> None:
    global replay_seed, schedules
    replay_seed = None
    schedules = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    text = str(call.excinfo.value)
    marker = f"{_SEED_OPTION}="
    if text.startswith("jobfence.testing:") and marker in text:
        seed = text.split(marker, 1)[1].split(",", 1)[0].split()[0]
        report.sections.append(
            ("jobfence", f"replay this schedule: pytest {item.nodeid} {marker}{seed}")
        )
