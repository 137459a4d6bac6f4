"""The README's first command: ``python examples/lock_contention.py`` with real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lock_contention.py"


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.slow
def test_lock_contention_example_passes_its_checks(tmp_path: Path) -> None:
    result = run_example("--db", str(tmp_path / "locks.db"))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "4 processes x 10 holds" in out
    assert "PASS no two holds overlapped (40 holds" in out
    assert "PASS counter = 40, expected 40" in out
    assert "PASS fencing tokens strictly increase in hold order" in out
    assert "FAIL" not in out
    assert "all checks passed" in out
    # every one of the four workers held the lock: four table rows with 10 holds each
    assert all(f"w{i}" in out.split("hold order:", 1)[1] for i in range(4))


@pytest.mark.slow
def test_without_the_lock_the_checks_catch_the_race_and_exit_1(tmp_path: Path) -> None:
    """The checks are real: the same workload without the lock fails them."""
    result = run_example("--no-lock", "--db", str(tmp_path / "locks.db"))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "FAIL holds overlapped" in out
    assert "SOME CHECKS FAILED" in out
    assert "all checks passed" not in out


def test_a_missing_db_directory_is_refused_up_front(tmp_path: Path) -> None:
    result = run_example("--db", str(tmp_path / "no" / "locks.db"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr
