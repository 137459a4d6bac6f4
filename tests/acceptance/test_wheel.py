"""The package as users get it: ``python -m build`` makes an sdist and a wheel that ``twine
check`` accepts, and the wheel, installed alone into a clean virtual environment, runs the
README's first example and the ``jobfence`` command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*cmd: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_the_built_wheel_installs_alone_and_runs_the_readme_example(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    wheels = list(dist.glob("jobfence-*.whl"))
    sdists = list(dist.glob("jobfence-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    twine = (sys.executable, "-m", "twine", "check", "--strict")
    checked = _run(*twine, *wheels, *sdists, cwd=tmp_path)
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        meta = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert "jobfence/py.typed" in names  # the type hints ship
    assert any(n.endswith("backends/postgres/sql/locks.sql") for n in names)  # server scripts
    assert "Requires-Python: >=3.10" in meta and "License-Expression: MIT" in meta
    assert "Classifier: Typing :: Typed" in meta
    # the Django app's migrations and the framework modules ship, and so do their extras
    assert "jobfence/integrations/django/migrations/0001_initial.py" in names
    for module in ("celery", "rq", "dramatiq", "arq"):
        assert f"jobfence/integrations/{module}.py" in names
        assert f"Provides-Extra: {module}" in meta
    assert "Provides-Extra: django" in meta and "Classifier: Framework :: Django" in meta
    assert "jobfence/compat/redis_py/lock.py" in names  # the generated sync twin
    for static in ("index.html", "app.js", "app.css"):  # the dashboard's page
        assert f"jobfence/dashboard/static/{static}" in names
    assert b"jobfence = jobfence.cli.app:main" in entry  # the command
    # the pytest plugin: a top-level module of its own, so a pytest start imports no jobfence
    assert b"[pytest11]" in entry and b"jobfence = jobfence_pytest" in entry
    assert "jobfence_pytest.py" in names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", wheels[0], cwd=tmp_path)
    # the example runs from a directory of its own, so only the installed package is importable
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "lock_contention.py", work / "lock_contention.py")
    where = _run(python, "-c", "import jobfence; print(jobfence.__file__)", cwd=work)
    assert str(venv) in where.stdout and str(ROOT / "src") not in where.stdout
    out = _run(python, "lock_contention.py", "--db", work / "locks.db", cwd=work).stdout
    assert "all checks passed" in out and "FAIL" not in out
    help_text = _run(venv / "bin" / "jobfence", "--help", cwd=work).stdout
    assert "worker" in help_text and "demo" in help_text and "dashboard" in help_text
    # the dashboard's page is read from the installed package
    page = "from jobfence.dashboard.server import _static; print(_static('app.js')[:200])"
    assert "jobfence dashboard" in _run(python, "-c", page, cwd=work).stdout
    # the README's first command, from the wheel alone (no extra, no server), at a small size
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    demo = subprocess.run(
        [venv / "bin" / "jobfence", "demo", "--jobs", "40", "--messages", "30", "--json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr
    numbers = json.loads(demo.stdout)
    assert numbers["inventory"]["guarded"]["stock"] == numbers["inventory"]["expected_stock"]
    assert numbers["duplicates"]["guarded"]["effects"] == 30
