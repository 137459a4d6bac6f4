"""A ``jobfence worker`` process with a plain ``def`` handler, SIGKILLed while its handlers run
and more messages wait in its prefetch (received by pull, or pushed to its subscription on
RabbitMQ): no message is lost. Everything it held comes back to another consumer (after the
visibility, or at once where the server takes back a dead connection's deliveries), and the
deliveries it had started count (the poison-message guard).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import jobfence
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

QUEUES: dict[str, Callable[[Path], str]] = {
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'queue.db'}",
    "redis": lambda tmp: REDIS_URL,
    "postgres": lambda tmp: POSTGRES_URL,
    "rabbitmq": lambda tmp: RABBITMQ_URL,
}

#: the handler: note the message id, then hang until killed
HANDLER = """
import os, time
def handler(message):
    with open(os.environ["JF_STARTED"], "a") as f:
        f.write(message.id + "\\n")
    time.sleep(3600)
"""


@pytest.mark.parametrize("backend", sorted(QUEUES))
def test_a_killed_def_worker_loses_none_of_its_running_or_prefetched_messages(
    backend: str, tmp_path: Path
) -> None:
    url = QUEUES[backend](tmp_path)
    name = "kill-" + uuid.uuid4().hex[:10]
    queue = jobfence.Queue(url, name)
    ids = [f"k{i}" for i in range(20)]
    queue.publish_many([{"n": i} for i in range(20)], ids=ids)
    (tmp_path / "killhandlers.py").write_text(HANDLER)
    started = tmp_path / "started.txt"
    started.touch()
    env = {
        **os.environ,
        "JF_STARTED": str(started),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), str(ROOT)]),
    }
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobfence.cli.app",
            "worker",
            "killhandlers:handler",
            "--queue",
            url,
            "--name",
            name,
            "--concurrency",
            "2",
            "--visibility",
            "2",
            "--no-live",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while len(started.read_text().split()) < 2:  # both slots busy, the prefetch filled
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker never started two handlers"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    ran = set(started.read_text().split())
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while len(seen) < len(ids) and time.monotonic() < deadline:
        for message in queue.receive(10, wait=1):
            seen[message.id] = message.delivery
            message.ack()
    try:
        assert sorted(seen) == sorted(ids), "every message comes back"
        assert all(seen[i] >= 2 for i in ran), "a started delivery of a dead worker counts"
        assert queue.dead_letters() == []
    finally:
        queue.drop()
        queue.close()
