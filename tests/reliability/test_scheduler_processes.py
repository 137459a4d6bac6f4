"""Three ``jobfence scheduler`` processes run one schedule of a slot a second: one is killed
(SIGKILL), another is stopped (SIGSTOP) for longer than its lease and then continued. Every
slot from the first fire to the last fires exactly once, by some process, none is missed.
Real processes on the real clock, on the backends whose claims end by the lease given.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

import jobfence
from tests.conformance.specs import SPECS, inbox_table

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)

PROCESS_SPECS = [pytest.param(s, id=s.id) for s in SPECS if s.id in ("sqlite", "redis", "postgres")]


def _scheduler(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobfence.cli.app",
            "scheduler",
            "tests.reliability._schedules:sched",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate: Callable[[], bool], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", PROCESS_SPECS, indirect=True)
def test_every_slot_fires_once_while_processes_die_and_stall(
    backend: tuple[str, str], tmp_path: Path
) -> None:
    url, namespace = backend
    out = tmp_path / "fires.txt"
    env = {
        **os.environ,
        "JF_URL": url,
        "JF_TABLE": inbox_table(namespace),
        "JF_OUT": str(out),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
    }

    def fires() -> list[tuple[str, int]]:
        text = out.read_text() if out.exists() else ""
        return [(key, int(pid)) for key, pid in (line.split() for line in text.splitlines())]

    def more(n: int, by: Callable[[int], bool] = lambda pid: True) -> Callable[[], bool]:
        start = len([f for f in fires() if by(f[1])])
        return lambda: len([f for f in fires() if by(f[1])]) >= start + n

    procs = [_scheduler(env) for _ in range(3)]
    dead, stalled, steady = procs
    try:
        _wait_for(more(3))
        dead.send_signal(signal.SIGKILL)  # maybe while it holds a slot's claim
        dead.wait(30)
        _wait_for(more(3))
        stalled.send_signal(signal.SIGSTOP)
        _wait_for(more(3, lambda pid: pid == steady.pid))  # 3 s: past its 1 s lease
        stalled.send_signal(signal.SIGCONT)
        _wait_for(more(4))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        logs = [proc.communicate(timeout=60)[1] for proc in procs]
    assert stalled.returncode == 0 and steady.returncode == 0, logs
    got = fires()
    keys = [key for key, _ in got]
    assert len(keys) == len(set(keys)), "a slot fired twice"
    times = sorted(datetime.fromisoformat(k.split("@")[1].replace("Z", "+00:00")) for k in keys)
    seconds = [int(t.timestamp()) for t in times]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), "a slot was missed"
    with jobfence.Scheduler(url, namespace=inbox_table(namespace)) as sched:
        sched.add("tick", every=1, target=lambda: None)
        info = sched.info("tick")
        history = sched.history("tick", limit=len(keys))
    assert info.misses == 0
    assert {f.outcome for f in history} == {"fired"}
    assert {f.key for f in history} == set(keys)
