"""A real Celery prefork worker whose main process touched the clients before forking.

The worker (``celery worker -P prefork -c 2``, broker and result backend: the test Redis)
imports ``_celery_app.py``, which installs the inbox and takes the lease ``parent`` at import,
in the main process; the pool then forks two children, which run 30 ``guarded`` tasks with
those very ``Locks`` and ``Inbox`` objects. Every task must succeed (no statement may fail on
a connection shared with another process), nothing may be reported lost in any process, and
the main process's lease must still be held when the tasks are done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import celery
import pytest

import jobfence
from tests.conformance.specs import LOCKS, spec_params
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
TASK = "jobfence_fork_test.work"
TASKS = 30
#: backends shared between processes, with the inbox on the same server
SPECS = spec_params(LOCKS, lambda s: s.cross_process and s.ttl_expiry)


def _stop(worker: subprocess.Popen[str]) -> tuple[str, str]:
    """Warm shutdown of the worker and its children (SIGTERM), SIGKILL if it hangs."""
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        return worker.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        return worker.communicate(timeout=10)


@pytest.mark.parametrize("backend", SPECS, indirect=True)
def test_a_prefork_worker_runs_every_task_with_clients_touched_before_the_fork(
    backend: tuple[str, str],
) -> None:
    url, namespace = backend
    queue = f"jobfence-fork-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "JOBFENCE_CELERY_URL": url,
        "JOBFENCE_CELERY_NAMESPACE": namespace,
        "JOBFENCE_CELERY_BROKER": REDIS_URL,
        "JOBFENCE_CELERY_QUEUE": queue,
    }
    # [sys.executable, "-m", "celery"]: the worker runs on this test's interpreter
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "tests.reliability._celery_app", "worker"),
            *("-P", "prefork", "-c", "2", "-Q", queue, "-n", f"{queue}@%h"),
            *("--loglevel=WARNING", "--without-gossip", "--without-mingle"),
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: _stop reaches the pool's children
    )
    client = celery.Celery("jobfence_fork_test_client", broker=REDIS_URL, backend=REDIS_URL)
    ids: list[str] = []
    try:
        results = [client.send_task(TASK, args=(n, n % 3), queue=queue) for n in range(TASKS)]
        ids = [r.id for r in results]
        outcomes = []
        for result in results:
            try:
                outcomes.append(result.get(timeout=90, propagate=True))
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        failed = [o for o in outcomes if not isinstance(o, dict)]
        assert not failed, f"{len(failed)} of {TASKS} tasks failed: {failed[:5]}"
        assert sorted(o["n"] for o in outcomes) == list(range(TASKS))
        children = {o["pid"] for o in outcomes}
        assert worker.pid not in children  # the tasks ran in the forked children
        # the main process's lease is still held (renewed by the main process only)
        other = jobfence.Locks(url, namespace=namespace)
        try:
            assert other.try_acquire("parent", ttl=1, renew=False) is None
        finally:
            other.close()
        assert worker.poll() is None, "the worker died"
    finally:
        out, err = _stop(worker)
        client.close()
        for task_id in ids:
            delete_redis_keys(f"celery-task-meta-{task_id}")
        delete_redis_keys(f"*{queue}*")
    logged = out + err
    # no lease or claim was reported lost anywhere (Celery's own "succeeded before the
    # worker was lost", logged when the stop's SIGTERM ends a child, is not jobfence's)
    lost = [line for line in logged.splitlines() if " lost" in line]
    assert not [line for line in lost if "WorkerLostError" not in line], logged
    assert "Traceback" not in logged, logged
