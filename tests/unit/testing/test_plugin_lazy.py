"""The pytest plugin costs nothing until a test explores: its entry point is a top-level module
that imports nothing of jobfence, and its options still reach ``explore()``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jobfence

SRC = Path(jobfence.__file__).resolve().parents[1]
ROOT = SRC.parent

TINY = """
import sys

def test_nothing_of_jobfence_is_imported():
    loaded = sorted(m for m in sys.modules if m == "jobfence" or m.startswith("jobfence."))
    assert loaded == [], loaded
    assert "jobfence_pytest" in sys.modules
"""

EXPLORES = """
from jobfence import testing

async def scenario(sim):
    order = []

    async def job(name):
        await testing.point("step")
        order.append(name)

    for name in ("a", "b", "c"):
        sim.spawn(job(name))
    await sim.join()
    sim.check(order[0] == "a", f"{order[0]} first")

def test_explores():
    report = testing.explore(scenario, schedules=200, seed=7, shrink=False)
    print("RAN", report.schedules, "SEEDS", [f.seed for f in report.failures])
    report.assert_ok()
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: no conftest of ours
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    # the installed entry point may still name an older module: load this one by name
    command = [sys.executable, "-m", "pytest", "-p", "no:jobfence", "-p", "jobfence_pytest"]
    command += ["-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_entry_point_is_the_top_level_module() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.entry-points.pytest11]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^jobfence = "jobfence_pytest"$', section, re.M)
    assert (SRC / "jobfence_pytest.py").is_file()
    assert '"src/jobfence_pytest.py"' in text  # shipped in the wheel beside the package


def test_a_pytest_start_imports_nothing_of_jobfence(tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY)
    # the test looks at sys.modules once pytest has started and collected it
    ran = _pytest(tmp_path, "-q", "--jobfence-seed=3", "--jobfence-schedules=5")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


def test_the_options_still_reach_explore(tmp_path: Path) -> None:
    (tmp_path / "test_explores.py").write_text(EXPLORES)
    first = _pytest(tmp_path, "-q", "-s")
    assert first.returncode == 1, first.stdout + first.stderr
    seed = int(re.search(r"--jobfence-seed=(\d+)", first.stdout).group(1))  # type: ignore[union-attr]
    assert re.search(rf"replay this schedule: pytest \S+ --jobfence-seed={seed}", first.stdout)
    again = _pytest(tmp_path, "-q", "-s", f"--jobfence-seed={seed}")
    assert f"RAN 2 SEEDS [{seed}]" in again.stdout  # schedule 0, then the one of that seed
    quick = _pytest(tmp_path, "-q", "-s", "--jobfence-schedules=1")
    assert "RAN 1 SEEDS []" in quick.stdout and quick.returncode == 0
    helped = _pytest(tmp_path, "--help")
    assert "the seed a failure prints" in " ".join(helped.stdout.split())
