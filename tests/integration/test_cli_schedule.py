"""``jobfence scheduler``, ``jobfence schedule list|show|pause|resume|trigger`` and
``jobfence worker --scheduler``: with Click's runner, against SQLite and Redis, for a module
with a ``Scheduler`` and one with an ``AsyncScheduler``."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobfence.cli.app import cli
from tests.conformance.specs import SPECS, Spec, inbox_table, new_namespace

pytestmark = pytest.mark.timeout(90)

SPEC_IDS = ("sqlite", "redis")

MODULE = """
import os
import signal
from pathlib import Path

import jobfence

URL = {url!r}
MARKS = Path({marks!r})
sched = jobfence.Scheduler(URL, namespace={namespace!r}, lease=5)
queue = jobfence.Queue(URL, {queue!r})


@sched.every(seconds=1, name="beat")
def beat(slot: jobfence.Slot) -> None:
    assert jobfence.current_claim().key == slot.key
    with MARKS.open("a") as marks:
        marks.write(slot.key + "\\n")
    if os.environ.get("STOP_AFTER_ONE"):
        sched.stop()


@sched.cron("0 3 * * *", tz="Europe/Paris", name="broken")
def broken() -> None:
    raise RuntimeError("disk full")


sched.add("publish", every=1, queue=queue, body=lambda slot: {{"slot": slot.key}})


def handle(message: jobfence.Message) -> None:
    with MARKS.open("a") as marks:
        marks.write("handled " + message.id + "\\n")
    os.kill(os.getpid(), signal.SIGTERM)  # the worker stops; the scheduler with it
"""


def asynchronous(source: str) -> str:
    """The module with an ``AsyncScheduler``: its functions ``async def``, its queue an
    ``AsyncQueue`` (the worker's handler stays a plain function)."""
    for sync, flavoured in (
        ("jobfence.Scheduler(", "jobfence.AsyncScheduler("),
        ("jobfence.Queue(", "jobfence.AsyncQueue("),
        ("def beat(", "async def beat("),
        ("def broken(", "async def broken("),
    ):
        assert sync in source
        source = source.replace(sync, flavoured)
    return source


class Where:
    def __init__(
        self, spec: Spec, flavour: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.spec = spec
        self.url = spec.make_url(tmp_path)
        self.namespace = new_namespace()
        self.queue = self.namespace + "q"
        self.marks = tmp_path / "marks.txt"
        self.module = "sched_" + uuid.uuid4().hex[:8]
        source = MODULE.format(
            url=self.url,
            marks=str(self.marks),
            namespace=inbox_table(self.namespace),
            queue=self.queue,
        )
        if flavour == "async":
            source = asynchronous(source)
        (tmp_path / f"{self.module}.py").write_text(textwrap.dedent(source))
        monkeypatch.chdir(tmp_path)
        self.obj = f"{self.module}:sched"

    def lines(self) -> list[str]:
        return self.marks.read_text().splitlines() if self.marks.exists() else []

    def cleanup(self) -> None:
        self.spec.cleanup(self.url, self.namespace)
        if self.spec.id == "redis":  # the queue's keys
            self.spec.cleanup(self.url, self.queue)


@pytest.fixture(
    params=[(s, f) for s in SPECS if s.id in SPEC_IDS for f in ("sync", "async")],
    ids=lambda p: f"{p[0].id}-{p[1]}",
)
def where(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Where]:
    spec, flavour = request.param
    made = Where(spec, flavour, tmp_path, monkeypatch)
    yield made
    made.cleanup()


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """One ``jobfence`` command; it imports the scheduler's module afresh, as a new process
    would (each command closes the scheduler it ran)."""
    for name in [m for m in sys.modules if m.startswith("sched_")]:
        del sys.modules[name]
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def jsons(out: str) -> list[Any]:
    return [json.loads(line) for line in out.splitlines()]


def test_scheduler_runs_until_stopped_and_logs_its_fires(
    where: Where, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobfence.scheduler")
    code, _, err = run("scheduler", where.obj, env={"STOP_AFTER_ONE": "1"})
    assert code == 0, err
    fired = where.lines()
    # the first fire stops the scheduler; a fire of the next second's slot that had already
    # started (a fire slower than a second on a loaded machine) still ends, none starts after
    assert 1 <= len(fired) <= 2 and all(key.startswith("schedule:beat@") for key in fired)
    for key in fired:
        assert f"fired slot {key.split('@')[1]}" in caplog.text
    assert "scheduler stopped" in caplog.text
    code, out, _ = run("schedule", "show", where.obj, "beat", "--json")
    assert code == 0
    shown = json.loads(out)
    assert sorted((f["key"], f["outcome"]) for f in shown["history"]) == [
        (key, "fired") for key in sorted(fired)
    ]
    assert shown["info"]["last"]["key"] in fired


def test_list_pause_resume_and_show(where: Where) -> None:
    code, out, _ = run("schedule", "list", where.obj, "--json")
    assert code == 0
    rows = {row["name"]: row for row in jsons(out)}
    assert sorted(rows) == ["beat", "broken", "publish"]
    assert rows["beat"]["spec"] == "every 1" and rows["beat"]["paused"] is False
    assert rows["broken"]["spec"] == "cron 0 3 * * * Europe/Paris"
    assert rows["broken"]["next_at"].endswith("+00:00")
    assert rows["publish"]["target"] == f"queue {where.queue!r}"
    assert json.loads(run("schedule", "pause", where.obj, "beat", "--json")[1]) == {
        "schedule": "beat",
        "paused": True,
    }
    code, out, _ = run("schedule", "list", where.obj)
    assert code == 0 and "paused" in out and "every 1" in out
    assert json.loads(run("schedule", "show", where.obj, "beat", "--json")[1])["info"]["paused"]
    code, out, _ = run("schedule", "resume", where.obj, "beat")
    assert (code, out.strip()) == (0, "resumed beat")
    code, out, _ = run("schedule", "resume", where.obj, "beat")
    assert (code, out.strip()) == (0, "beat was not paused")
    info = json.loads(run("schedule", "show", where.obj, "beat", "--json")[1])["info"]
    assert info["paused"] is False


def test_trigger_fires_once_now_and_a_failure_exits_1(where: Where) -> None:
    code, out, _ = run("schedule", "trigger", where.obj, "beat", "--json")
    assert code == 0
    fire = json.loads(out)
    assert fire["outcome"] == "fired" and "+manual-" in fire["key"]
    assert where.lines() == [fire["key"]]
    code, out, _ = run("schedule", "trigger", where.obj, "broken")
    assert code == 1 and "failed" in out and "RuntimeError: disk full" in out
    code, out, _ = run("schedule", "show", where.obj, "broken")
    assert code == 0 and "RuntimeError: disk full" in out and "failed" in out


def test_bad_input_is_a_usage_error(where: Where) -> None:
    assert run("schedule", "show", where.obj, "nope")[0] == 2
    assert run("schedule", "list", "no_such_module_here:sched")[0] == 2
    assert run("schedule", "list", f"{where.module}:queue")[0] == 2  # not a scheduler
    assert run("schedule", "list", "missing-colon")[0] == 2
    assert run("scheduler", f"{where.module}:nothing")[0] == 2


def test_worker_runs_the_scheduler_beside_it(where: Where) -> None:
    code, _, err = run(
        "worker",
        f"{where.module}:handle",
        "--queue",
        where.url,
        "--name",
        where.queue,
        "--no-live",
        "--scheduler",
        where.obj,
    )
    assert code == 0, err
    lines = where.lines()
    handled = [line for line in lines if line.startswith("handled ")]
    # the scheduler published its slots (message id = slot key), the worker handled them
    assert handled and all(h.startswith("handled schedule:publish@") for h in handled)
    assert len(set(handled)) == len(handled)
    assert any(line.startswith("schedule:beat@") for line in lines)  # and ran its function
