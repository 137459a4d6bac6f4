"""A worker paused (SIGSTOP) while it holds a message, past the message's visibility: another
worker gets the message and processes it; when the first resumes, its delivery is lost (it
is not acked). The naive handler writes the effect twice; the guarded one once.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import jobfence

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


def _worker(url: str, handler: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobfence.cli.app",
            "worker",
            f"tests.reliability._pause_handlers:{handler}",
            "--queue",
            url,
            "--name",
            "paused",
            "--visibility",
            "1",
            "--concurrency",
            "1",
            "--no-live",
            "--log-level",
            "INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate: Any, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("handler", ["naive", "guarded"])
def test_a_worker_paused_past_the_visibility_loses_its_delivery(
    handler: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as conn:
        conn.execute("CREATE TABLE effects (msg_id TEXT, delivery INT, pid INT)")
    jobfence.Inbox(f"sqlite:///{ledger}").install()
    out = tmp_path / "out.txt"
    env = {
        **os.environ,
        "JF_OUT": str(out),
        "JF_LEDGER": str(ledger),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
    }
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    queue = jobfence.Queue(url, "paused")
    queue.publish({"order": 1}, id="order:1")

    def started() -> list[list[str]]:
        text = out.read_text() if out.exists() else ""
        return [line.split()[1:] for line in text.splitlines()]

    first = _worker(url, handler, env)
    second = None
    try:
        _wait_for(lambda: len(started()) == 1)
        first.send_signal(signal.SIGSTOP)  # paused while it holds order:1 (delivery 1)
        second = _worker(url, handler, env)

        def effects() -> list[tuple[str, int, int]]:
            with sqlite3.connect(ledger, timeout=30) as conn:
                return conn.execute("SELECT msg_id, delivery, pid FROM effects").fetchall()

        _wait_for(lambda: any(pid == second.pid for _, _, pid in effects()))
        first.send_signal(signal.SIGCONT)  # resumes inside the handler, past its visibility
        if handler == "naive":
            _wait_for(lambda: len(effects()) == 2)
        else:
            # the paused worker finds its delivery lost: its renewer may notice first (the
            # handler then raises after the loss), or the handler's failure does (its nack is
            # refused); either way the queue logs the loss
            _wait_for(lambda: "of queue 'paused' lost" in _stderr_so_far(first), limit=30)
        stats = queue.stats()
        _wait_for(lambda: queue.stats().in_flight == 0 and queue.stats().ready == 0)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60)[1] if p is not None else "" for p in (first, second)]
    assert first.returncode == 0 and second is not None and second.returncode == 0, outputs
    rows = effects()
    pids = [pid for _, _, pid in rows]
    if handler == "naive":
        # the paused worker wrote the effect again after it resumed: a duplicate
        assert sorted(pids) == sorted([first.pid, second.pid]), rows
    else:
        assert pids == [second.pid], rows  # exactly one effect, by the worker that took over
    # the resumed worker did not ack a delivery that was no longer its own
    first_log = _seen_stderr.pop(first.pid, "") + outputs[0]
    assert "processed=0, duplicates=0, retried=0, deferred=0, dead_lettered=0, lost=1" in first_log
    assert stats.dead == 0
    queue.close()


_seen_stderr: dict[int, str] = {}


def _stderr_so_far(proc: subprocess.Popen[str]) -> str:
    """What ``proc`` logged so far, read without blocking (its stderr is a pipe)."""
    import fcntl

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        chunk = b""
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    _seen_stderr[proc.pid] = _seen_stderr.get(proc.pid, "") + chunk.decode("utf-8", "replace")
    return _seen_stderr[proc.pid]
