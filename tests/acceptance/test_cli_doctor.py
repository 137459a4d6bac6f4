"""``jobfence doctor`` in a subprocess, against real backends."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import REDIS_URL


def _doctor(*urls: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", "doctor", *urls],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_doctor_reports_working_backends(tmp_path: object) -> None:
    result = _doctor("memory://", REDIS_URL, f"sqlite:///{tmp_path}/d.db")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" ok ") == 3


def test_doctor_fails_on_unreachable_backend_and_masks_the_password() -> None:
    result = _doctor("redis://:hunter2@127.0.0.1:1/0")
    assert result.returncode == 1
    assert "error" in result.stdout and "ConnectionError" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
