"""``jobfence doctor`` in a subprocess, against real backends."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.servers import POSTGRES_URL, REDIS_URL


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})},
        check=False,
    )


def test_doctor_reports_working_backends(tmp_path: object) -> None:
    result = _doctor("memory://", REDIS_URL, f"sqlite:///{tmp_path}/d.db")
    # the test Redis persists nothing: a warning, which exits 0 without --strict
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("probe lease taken, extended and released") == 3
    assert "redis-persistence" in result.stdout and "warning" in result.stdout


def test_doctor_fails_on_unreachable_backend_and_masks_the_password() -> None:
    result = _doctor("redis://:hunter2@127.0.0.1:1/0")
    assert result.returncode == 1
    assert "error" in result.stdout and "ConnectionError" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr


def test_doctor_json_reads_urls_from_the_environment(tmp_path: object) -> None:
    urls = f"memory:// {POSTGRES_URL}"
    result = _doctor("--json", env={"JOBFENCE_URL": urls})
    assert result.returncode == 0, result.stdout + result.stderr
    reports = json.loads(result.stdout)["reports"]
    assert [r["backend"] for r in reports] == ["memory", "postgres"]
    pg = reports[1]
    assert pg["probe"]["ok"] and pg["probe"]["token"] > 0
    assert pg["server_version"] and pg["rtt_ms"] is not None
    assert {t["component"] for t in pg["tables"]} == {"locks", "inbox", "fences", "queue"}


def test_doctor_strict_fails_on_warnings() -> None:
    # the test Redis persists nothing: a warning
    assert _doctor(REDIS_URL).returncode == 0
    result = _doctor("--strict", "--json", REDIS_URL)
    assert result.returncode == 1
    [report] = json.loads(result.stdout)["reports"]
    assert report["level"] == "warning"


def test_doctor_without_a_url_is_a_usage_error() -> None:
    result = _doctor()
    assert result.returncode == 2 and "JOBFENCE_URL" in result.stderr


def test_doctor_output_is_not_cut_when_not_a_terminal() -> None:
    result = _doctor(REDIS_URL, env={"COLUMNS": "80"})
    # the advice of the persistence finding wraps inside its column, but nothing is cut
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 80
