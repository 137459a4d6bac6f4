"""Three real ``celery beat`` processes on one schedule, one of them SIGKILLed midway, with a
real Celery worker (Redis broker, a 1 s beat entry, ``_beat_app.py``).

* With ``-S jobfence.integrations.celery_beat:Scheduler``: every slot of the window is sent
  under its slot key as task id and its body runs exactly once -- none missed, the killed
  beat's slot taken over within the grace -- and at most one slot reaches the worker twice
  (the killed beat may have sent it before it recorded it; the guard runs it once).
* With Celery's own ``PersistentScheduler`` (the default), the same three beats each send
  every tick: the body runs two or three times in most seconds.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis

import jobfence
from tests.frameworks._support import Workers, env, python, wait_until, workers
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

APP = "tests.frameworks._beat_app"
ENTRY = "jf-beat-tick"
JOBFENCE_BEAT = "jobfence.integrations.celery_beat:Scheduler"
PREFIX = f"schedule:{ENTRY}@"


class Run:
    """One test's queue, namespace and the worker's records of it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.namespace = f"jf_beat_{uuid.uuid4().hex[:10]}"
        self.queue = f"jf-beat-{self.namespace}"
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.environ = {
            **env(self.namespace),
            "JOBFENCE_BEAT_QUEUE": self.queue,
            "JOBFENCE_BEAT_NAMESPACE": self.namespace,
        }

    def records(self, what: str) -> list[tuple[str, float]]:
        """``received`` or ``runs``: (task id, time) in order."""
        return [tuple(json.loads(x)) for x in self.redis.lrange(f"{self.namespace}:{what}", 0, -1)]  # type: ignore[misc]

    def worker(self, pool: Workers) -> subprocess.Popen[bytes]:
        return pool.start(
            [
                *(python(), "-m", "celery", "-A", APP, "worker", "-P", "solo", "-Q", self.queue),
                *("-n", f"{self.queue}@%h", "--loglevel=INFO"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            self.environ,
        )

    def beat(self, pool: Workers, n: int, scheduler: str | None) -> subprocess.Popen[bytes]:
        chosen = ["-S", scheduler] if scheduler else ["-s", str(self.tmp_path / f"beat-{n}")]
        return pool.start(
            [python(), "-m", "celery", "-A", APP, "beat", "--loglevel=INFO", *chosen],
            self.environ,
        )

    def started(self, procs: list[subprocess.Popen[bytes]]) -> bool:
        """Every beat process logged its start (the logs are ``worker-<n>.log``)."""
        logs = sorted(self.tmp_path.glob("worker-*.log"))
        starting = sum("beat: Starting..." in p.read_text(errors="replace") for p in logs)
        for proc in procs:
            assert proc.poll() is None, f"a process exited early\n{self.logs()}"
        return starting >= 3

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.tmp_path.glob("worker-*.log"))
        )

    def cleanup(self) -> None:
        self.redis.close()
        delete_redis_keys(f"*{self.namespace}*")


def stop(pool: Workers, proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Celery's warm shutdown), then SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pool.kill(proc)


def slot_of(task_id: str) -> int:
    assert task_id.startswith(PREFIX), task_id
    at = datetime.strptime(task_id[len(PREFIX) :], "%Y-%m-%dT%H:%M:%SZ")
    return int(at.replace(tzinfo=timezone.utc).timestamp())


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    state = Run(tmp_path)
    try:
        yield state
    finally:
        state.cleanup()


@dataclass
class Outcome:
    up: float  #: all three beats had started
    killed: float  #: one was SIGKILLed
    killed_pid: int
    stopped: float  #: the other two were killed
    logs: str


def three_beats_one_killed(run: Run, scheduler: str | None) -> Outcome:
    """Start a worker and 3 beats, let them run, SIGKILL one beat, let the other two run on,
    stop them."""
    with workers(run.tmp_path) as pool:
        worker = run.worker(pool)
        beats = [run.beat(pool, n, scheduler) for n in range(3)]
        wait_until("the three beats to start", lambda: run.started([worker, *beats]), 30)
        up = time.time()
        wait_until(
            "4 s of runs with 3 beats", lambda: any(t >= up + 4 for _, t in run.records("runs")), 20
        )
        pool.kill(beats[0])
        killed = time.time()
        wait_until(
            "8 s of runs after the kill",
            lambda: any(t >= killed + 8 for _, t in run.records("runs")),
            20,
        )
        for beat in beats[1:]:
            pool.kill(beat)
        stopped = time.time()
        logs = run.logs()
        # the worker takes what the beats sent: the queue empties
        wait_until("the worker to drain the queue", lambda: run.redis.llen(run.queue) == 0, 20)
        stop(pool, worker)
    return Outcome(up, killed, beats[0].pid, stopped, logs)


def test_three_jobfence_beats_send_each_slot_once_through_a_sigkill(run: Run) -> None:
    outcome = three_beats_one_killed(run, JOBFENCE_BEAT)
    up, stopped, logs = outcome.up, outcome.stopped, outcome.logs
    runs = Counter(slot_of(task_id) for task_id, _ in run.records("runs"))
    received = Counter(slot_of(task_id) for task_id, _ in run.records("received"))

    # every slot from when the three beats were up to the stop (less the lease and a second:
    # a slot the beats killed at the stop had claimed is nobody's) ran, once
    window = range(math.ceil(up), math.floor(stopped) - 3)
    assert len(window) >= 7
    missing = [at for at in window if runs[at] == 0]
    assert not missing, f"slots never run: {missing}\n{logs}"
    assert all(runs[at] == 1 for at in window), runs
    assert max(runs.values()) == 1, runs  # no slot ran twice, in or out of the window
    # each message carries its slot as task id; a slot reached the worker twice only if the
    # killed beat sent it before it recorded it (then the guard ran it once)
    assert set(received) == set(runs)
    assert sum(n - 1 for n in received.values()) <= 1, received

    # the records: every slot of the window fired (none missed), on time within the grace
    with jobfence.Scheduler(REDIS_URL, namespace=run.namespace) as sched:
        sched.add(ENTRY, every=1, send=lambda slot: None)
        fires = {
            int(f.slot_at.timestamp()): f for f in sched.history(ENTRY, limit=None) if f.slot_at
        }
    assert all(fires[at].outcome == "fired" for at in window), fires
    assert max(fires[at].lag or 0.0 for at in window) < 60
    # the slots after the kill were sent by the two beats left (a pod is host:pid:suffix)
    after = [at for at in window if at > outcome.killed + 1]
    assert len(after) >= 3
    pids = {int(str(fires[at].pod).split(":")[1]) for at in after}
    assert outcome.killed_pid not in pids and len(pids) >= 1, pids


def test_three_persistent_scheduler_beats_send_every_tick_three_times(run: Run) -> None:
    """The same setup with Celery's default ``PersistentScheduler`` (a shelve file each):
    nothing coordinates the beats, so each sends the entry every second."""
    outcome = three_beats_one_killed(run, None)
    up, killed = outcome.up, outcome.killed
    runs = [t for _, t in run.records("runs") if up + 1 <= t < killed]
    per_second = Counter(math.floor(t) for t in runs)
    seconds = len(per_second)
    # with three beats up, about three runs a second: the duplicates are there
    assert len(runs) >= 2 * seconds, per_second
    assert sum(1 for n in per_second.values() if n >= 2) >= seconds // 2, per_second
    # each send had a task id of its own (a uuid), so the guard could not tell them apart
    ids = [task_id for task_id, _ in run.records("runs")]
    assert len(set(ids)) == len(ids)
