"""``jobfence queue list|publish|requeue`` with Click's runner on the queue backends, and
``jobfence queue list`` as a real process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import jobfence
from jobfence.cli.app import cli
from tests.conformance.specs import new_namespace
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

pytestmark = pytest.mark.timeout(90)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis", "memory"])
def test_list_shows_the_queues_with_their_counts(backend: str, tmp_path: Path) -> None:
    name = new_namespace()
    url = {
        "sqlite": f"sqlite:///{tmp_path}/q.db",
        "postgres": POSTGRES_URL,
        "redis": REDIS_URL,
        "memory": f"memory://{name}",
    }[backend]
    queue = jobfence.Queue(url, name)
    try:
        code, out, _ = _run("queue", "publish", url, name, "1", "2", "--json")
        assert code == 0
        ids = json.loads(out)["ids"]
        assert len(ids) == 2
        [message] = queue.receive(visibility=60)
        message.dead_letter("boom")
        code, out, _ = _run("queue", "list", url, "--limit", "100000", "--json")
        assert code == 0, out
        rows = {row["queue"]: row for row in map(json.loads, out.splitlines())}
        assert rows[name] == {"queue": name, "ready": 1, "delayed": 0, "in_flight": 0, "dead": 1}
        code, out, _ = _run("queue", "list", "--limit", "100000", env={"JOBFENCE_URL": url})
        assert code == 0 and name in out
    finally:
        queue.drop()
        queue.close()


def test_requeue_json_and_its_warning_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url, name = f"sqlite:///{tmp_path}/q.db", "orders"
    with jobfence.Queue(url, name) as queue:
        queue.publish({"n": 1}, id="a")
        queue.publish({"n": 2}, id="b")
        for message in queue.receive(2, visibility=60):
            message.dead_letter("boom")
        with caplog.at_level(logging.WARNING, logger="jobfence.cli"):
            # the URL from JOBFENCE_URL, the queue NAME alone
            code, out, _ = _run(
                "queue", "requeue", name, "--id", "a", "--json", env={"JOBFENCE_URL": url}
            )
        assert code == 0
        assert json.loads(out) == {"queue": name, "requeued": 1, "ids": ["a"]}
        [record] = [r for r in caplog.records if r.name == "jobfence.cli"]
        assert record.levelno == logging.WARNING
        assert "requeued 1 dead letter(s) of queue 'orders'" in record.getMessage()
        assert "ids a" in record.getMessage()
        stats = queue.stats()
        assert (stats.ready, stats.dead) == (1, 1)


def test_list_on_rabbitmq_is_a_usage_error_that_says_why() -> None:
    code, _out, err = _run("queue", "list", RABBITMQ_URL)
    assert code == 2
    assert "management API" in err


def test_commands_without_a_url_are_usage_errors() -> None:
    code, _, err = _run("queue", "list", env={"JOBFENCE_URL": ""})
    assert code == 2 and "JOBFENCE_URL" in err
    code, _, err = _run("queue", "stats", "orders", env={"JOBFENCE_URL": ""})
    assert code == 2 and "JOBFENCE_URL" in err


def test_list_in_a_real_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    with jobfence.Queue(url, "emails") as queue:
        queue.publish("hello")
    result = subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", "queue", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "JOBFENCE_URL": url, "COLUMNS": "80"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "emails" in result.stdout and "queues (1)" in result.stdout
