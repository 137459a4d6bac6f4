"""The benchmark scripts run: ``--quick`` prints every row and the bugs they hunt are found.

A smoke test: no figure is asserted (speeds depend on the machine), only that the script
runs to the end, prints the rows it promises, and that the races it times are really found.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH_TESTING = ROOT / "benchmarks" / "bench_testing.py"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # the checkout's own sources, whatever jobfence the interpreter has installed
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )


def table_rows(out: str) -> dict[tuple[str, str], list[str]]:
    """Every markdown table row, by its first two cells, as its list of cells."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells
    return rows


def test_bench_testing_quick_prints_every_row_and_finds_both_bugs() -> None:
    result = run_script(BENCH_TESTING, "--quick")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    rows = table_rows(out)
    # 1. throughput: 2 and 3 tasks x 5, 10, 20 points under each strategy, and the locks row
    for tasks in (2, 3):
        for points in (5, 10, 20):
            for strategy in ("random", "pct", "fifo"):
                row = rows[(f"{tasks} tasks x {points} points", strategy)]
                assert row[2] == str(tasks * points), row  # the points each schedule hit
    locks = [cells for (name, _), cells in rows.items() if "sim.locks()" in name]
    assert len(locks) == 1, out
    assert int(locks[0][2]) > 0, locks  # the lock row's schedules did hit points
    # 2. both races are found, by the checker that describes them
    lost = rows[("(a) lost update", "yes")]
    assert lost[2] == "no_lost_update", lost
    duplicate = rows[("(b) duplicate processing", "yes")]
    assert duplicate[2] == "exactly_once", duplicate
    assert "no_lost_update: t1 wrote inventory['stock']" in out
    assert "exactly_once: charge applied more than once for 'order-1'" in out
    # 3. the profile section
    assert "## 3. Where the time goes" in out
    assert "testing/_sim.py" in out  # the simulator's functions are in the profile's top
