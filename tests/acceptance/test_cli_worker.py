"""``jobfence queue ...`` and ``jobfence worker`` in subprocesses, on a SQLite queue file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import jobfence

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def _env(out: Path) -> dict[str, str]:
    return {
        **os.environ,
        "JF_OUT": str(out),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
        "COLUMNS": "80",
    }


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


def _worker(
    url: str,
    handler: str,
    env: dict[str, str],
    *extra: str,
    module: str = "tests.acceptance._cli_handlers",
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobfence.cli.app",
            "worker",
            f"{module}:{handler}",
            "--queue",
            url,
            "--name",
            "orders",
            "--no-live",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate: Any, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_publish_work_dead_letter_and_requeue_from_the_shell(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = tmp_path / "out.txt"
    env = _env(out)
    published = _cli("queue", "publish", url, "orders", '{"n": 1}', '{"fail": true}', env=env)
    assert published.returncode == 0, published.stderr
    ids = published.stdout.split()
    assert len(ids) == 2
    one = _cli(
        "queue",
        "publish",
        url,
        "orders",
        '{"n": 2}',
        "--id",
        "order:2",
        "--header",
        "tenant=acme",
        env=env,
    )
    assert one.stdout.split() == ["order:2"]
    stats = json.loads(_cli("queue", "stats", url, "orders", "--json", env=env).stdout)
    assert stats == {"queue": "orders", "ready": 3, "delayed": 0, "in_flight": 0, "dead": 0}

    worker = _worker(url, "record", env, "--max-deliveries", "2", "--concurrency", "2")
    queue = jobfence.Queue(url, "orders")
    try:
        _wait_for(lambda: queue.stats().dead == 1 and queue.stats().ready == 0)
    finally:
        worker.send_signal(signal.SIGTERM)
        _stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert "SIGTERM: stopping" in stderr
    assert "goes to the dead letters" in stderr and "this message always fails" in stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(lines) == sorted([[ids[0], 1], [ids[1], 1], [ids[1], 2], ["order:2", 1]])

    dead = [
        json.loads(line)
        for line in _cli("queue", "dead-letters", url, "orders", "--json", env=env).stdout.split(
            "\n"
        )
        if line
    ]
    assert [(d["id"], d["deliveries"]) for d in dead] == [(ids[1], 2)]
    assert "RuntimeError: this message always fails" in dead[0]["error"]
    table = _cli("queue", "dead-letters", url, "orders", env=env).stdout
    assert ids[1] in table  # the whole id: output that is not a terminal is not cut
    requeued = _cli("queue", "requeue", url, "orders", "--id", ids[1], env=env)
    assert "requeued 1 message(s)" in requeued.stdout
    assert queue.stats().ready == 1 and queue.stats().dead == 0
    queue.close()


def test_sigterm_lets_in_flight_messages_finish(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = tmp_path / "out.txt"
    env = _env(out)
    queue = jobfence.Queue(url, "orders")
    queue.publish({"seconds": 1.0}, id="slow-1")
    worker = _worker(url, "slow", env, "--shutdown-timeout", "20")
    try:
        _wait_for(lambda: out.exists() and "started slow-1" in out.read_text())
    finally:
        worker.send_signal(signal.SIGTERM)
        _stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert out.read_text().splitlines() == ["started slow-1", "finished slow-1"]
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (0, 0)  # acked before the process exited
    queue.close()


def test_past_the_shutdown_timeout_the_message_is_given_back_for_redelivery(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = tmp_path / "out.txt"
    env = _env(out)
    queue = jobfence.Queue(url, "orders")
    queue.publish({"seconds": 60}, id="stuck")
    worker = _worker(url, "slow", env, "--shutdown-timeout", "0.5", "--visibility", "60")
    try:
        _wait_for(lambda: out.exists() and "started stuck" in out.read_text())
    finally:
        worker.send_signal(signal.SIGTERM)
        _stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    (again,) = queue.receive(wait=5)  # at once, not after the 60 s visibility
    assert (again.id, again.delivery) == ("stuck", 2)
    again.ack()
    queue.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not module:function"),
        ("tests.acceptance.nope:x", "cannot import"),
        ("tests.acceptance._cli_handlers:missing", "has no 'missing'"),
        ("tests.acceptance._cli_handlers:not_callable", "is not callable"),
    ],
)
def test_a_bad_handler_is_named(spec: str, message: str, tmp_path: Path) -> None:
    result = _cli(
        "worker",
        spec,
        "--queue",
        f"sqlite:///{tmp_path}/q.db",
        "--name",
        "q",
        env=_env(tmp_path / "o"),
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_bad_queue_arguments_are_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    bad_name = _cli("queue", "stats", url, "bad name", env=_env(tmp_path / "o"))
    assert bad_name.returncode == 2 and "name must be a queue name" in bad_name.stderr
    bad_body = _cli("queue", "publish", url, "q", "{not json", env=_env(tmp_path / "o"))
    assert bad_body.returncode == 2 and "is not JSON" in bad_body.stderr
    bad_scheme = _cli("queue", "stats", "mysql://root@127.0.0.1/test", "q", env=_env(tmp_path))
    assert bad_scheme.returncode == 2
    assert "scheme 'mysql' has no queue backend" in bad_scheme.stderr
    assert "amqp://" in bad_scheme.stderr  # the schemes that do have a queue are listed


def test_live_status_shows_the_worker_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = tmp_path / "out.txt"
    env = {**_env(out), "COLUMNS": "160"}
    queue = jobfence.Queue(url, "orders")
    queue.publish_many([{"n": i} for i in range(3)])
    worker = _worker(url, "record", env, "--live", "--concurrency", "2")
    try:
        _wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 3)
        _wait_for(lambda: queue.stats().in_flight == 0 and queue.stats().ready == 0)
    finally:
        worker.send_signal(signal.SIGTERM)
        _stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert "jobfence worker: orders" in stderr  # the status table, drawn on stderr
    for column in ("in flight", "processed", "duplicates", "retried", "dead-lettered", "lost"):
        assert column in stderr
    assert "0/2" in stderr  # nothing in flight out of 2 slots at the end
    queue.close()


def test_sigterm_while_the_handler_module_loads_exits_cleanly(tmp_path: Path) -> None:
    """SIGTERM before the worker runs (its handler's module still importing): status 0, as a
    graceful stop, and the queue's message is left for the next worker, not received."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = tmp_path / "out.txt"
    env = {**_env(out), "JF_GO": str(tmp_path / "go")}
    queue = jobfence.Queue(url, "orders")
    queue.publish({"n": 1}, id="m-1")
    worker = _worker(url, "handle", env, module="tests.acceptance._cli_slow_import")
    try:
        _wait_for(lambda: out.exists() and "importing" in out.read_text())
    finally:
        worker.send_signal(signal.SIGTERM)
        _stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert out.read_text().splitlines() == ["importing"]  # the handler never ran
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (1, 0)  # left for the next worker
    queue.close()
