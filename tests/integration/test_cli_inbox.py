"""``jobfence inbox list|show|purge``: with Click's runner on every inbox backend, and as a
real ``jobfence`` process against Redis and SQLite while the test holds a claim."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import jobfence
from jobfence import ClaimLost, ClaimState
from jobfence.cli.app import cli
from tests.conformance.specs import INBOX, SPECS, Spec, inbox_table, new_namespace, spec_params

pytestmark = pytest.mark.timeout(90)

TTL = 60.0
#: wider than 80 columns: output that is not a terminal must not cut it
LONG = "report:" + "x" * 120


@pytest.fixture(params=spec_params(INBOX))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    yield url, inbox_table(namespace)
    spec.cleanup(url, namespace)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def _until_stuck(inbox: jobfence.Inbox, key: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = inbox.claim_info(key)
        if info is not None and info.stuck:
            return
        time.sleep(0.05)
    raise AssertionError(f"{key!r} never went past its deadline")


def test_list_and_show(where: tuple[str, str]) -> None:
    url, table = where
    tb = ["--table", table]
    with jobfence.Inbox(url, table=table) as inbox:
        inbox.install()
        code, out, _ = _run("inbox", "list", url, *tb, "--json")
        assert (code, out) == (0, "")
        held = inbox.claim("job:[a]", ttl=TTL, fingerprint="fp-a")
        inbox.claim(LONG, ttl=TTL).complete({"ok": 1})
        dead = inbox.claim("dead%_", ttl=0.3)
        assert dead.state is ClaimState.NEW
        _until_stuck(inbox, "dead%_")

        code, out, _ = _run("inbox", "list", url, *tb, "--json")
        rows = _rows(out)
        assert code == 0 and [r["key"] for r in rows] == ["dead%_", "job:[a]", LONG]
        a = rows[1]
        assert (a["state"], a["owner"], a["attempt"]) == ("in_progress", held.owner, 1)
        assert a["fingerprint"] == "fp-a" and a["stuck"] is False
        assert 0 < a["expires_in"] <= TTL and a["claimed_at"] and 0 <= a["age"] + 5 < 60
        assert rows[0]["stuck"] is True and rows[0]["expires_in"] <= 0
        assert rows[2]["state"] == "completed"

        def keys(*args: str) -> list[str]:
            code, out, _ = _run("inbox", "list", url, *tb, "--json", *args)
            assert code == 0
            return [r["key"] for r in _rows(out)]

        assert keys("--state", "completed") == [LONG]
        assert keys("--state", "in_progress") == ["dead%_", "job:[a]"]
        assert keys("--stuck") == ["dead%_"]
        assert keys("--prefix", "job:[") == ["job:[a]"]
        assert keys("--prefix", "dead%") == ["dead%_"]
        assert keys("--prefix", "d%") == []  # literal: % is no wildcard
        assert keys("--limit", "1") == ["dead%_"]

        code, out, _ = _run("inbox", "list", url, *tb)
        assert code == 0 and LONG in out  # a table off a terminal is not cut to 80 columns
        assert held.owner in out and "(stuck)" in out and "expires in" in out
        code, out, _ = _run("inbox", "list", url, *tb, "--stuck")
        assert code == 0 and "dead%_" in out and "job:[a]" not in out

        code, out, _ = _run("inbox", "show", url, "job:[a]", *tb, "--json")
        shown = json.loads(out)
        assert code == 0 and (shown["owner"], shown["attempt"]) == (held.owner, 1)
        code, out, _ = _run("inbox", "show", url, "job:[a]", *tb)
        assert code == 0 and held.owner in out and "attempt 1" in out and "deadline in" in out
        code, out, _ = _run("inbox", "show", url, "dead%_", *tb)
        assert code == 0 and "(stuck)" in out and "deadline passed" in out
        code, out, _ = _run("inbox", "show", url, "nobody", *tb)
        assert code == 1 and "'nobody' has no record" in out
        code, out, _ = _run("inbox", "show", url, "nobody", *tb, "--json")
        assert (code, out.strip()) == (1, "null")
        held.complete("done")


def test_purge_and_forget(where: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url, table = where
    tb = ["--table", table]
    with (
        jobfence.Inbox(url, table=table) as inbox,
        jobfence.Inbox(url, table=table, retention=0.2) as short,
    ):
        held = inbox.claim("job:[a]", ttl=TTL)
        inbox.claim("done", ttl=TTL).complete("kept")
        short.claim("expired").complete("gone soon")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            info = inbox.claim_info("expired")
            if info is None or info.expires_in < 0:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the short retention never ended")

        code, out, _ = _run("inbox", "purge", url, *tb)
        purged = 0 if short.capabilities.native_expiry else 1  # Redis expired it by itself
        assert code == 0 and f"purged {purged} expired record" in out
        assert inbox.claim_info("expired") is None
        code, out, _ = _run("inbox", "purge", url, *tb, "--json")
        assert (code, json.loads(out)) == (0, {"purged": 0})

        code, _, err = _run("inbox", "purge", url, *tb, "--key", "job:[a]")
        assert code == 2 and "without --yes" in err
        assert inbox.claim_info("job:[a]") is not None  # refused: nothing deleted

        with caplog.at_level(logging.WARNING, logger="jobfence.cli"):
            code, out, _ = _run(
                "inbox", "purge", url, *tb, "--key", "job:[a]", "--key", "done", "--yes"
            )
        assert code == 0
        assert f"forgot job:[a]: it was in_progress, attempt 1, owner {held.owner}" in out
        assert "forgot done: it was completed" in out
        records = [r for r in caplog.records if r.name == "jobfence.cli"]
        assert len(records) == 2 and all(r.levelno == logging.WARNING for r in records)
        message = records[0].getMessage()
        assert "'job:[a]'" in message and "forgotten by" in message and held.owner in message
        assert f"@{socket.gethostname()}" in message
        assert inbox.claims() == []
        with pytest.raises(ClaimLost):  # its worker lost the claim
            held.complete("too late")
        assert inbox.claim("done").state is ClaimState.NEW  # the work runs again

        code, out, _ = _run("inbox", "purge", url, *tb, "--key", "nosuch", "--yes", "--json")
        assert code == 1 and json.loads(out) == {"key": "nosuch", "forgotten": False, "was": None}


def test_the_url_and_table_come_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    env = {"JOBFENCE_URL": url, "JOBFENCE_INBOX_TABLE": "env_inbox"}
    with jobfence.Inbox(url, table="env_inbox") as inbox:
        claim = inbox.claim("nightly", ttl=TTL)
        code, out, _ = _run("inbox", "list", "--json", env=env)
        assert code == 0 and json.loads(out)["owner"] == claim.owner
        code, out, _ = _run("inbox", "show", "nightly", "--json", env=env)
        assert code == 0 and json.loads(out)["key"] == "nightly"
        code, _, _ = _run("inbox", "purge", "--key", "nightly", "--yes", env=env)
        assert code == 0 and inbox.claim_info("nightly") is None
    code, _, err = _run("inbox", "list", env={"JOBFENCE_URL": ""})
    assert code == 2 and "JOBFENCE_URL" in err


def test_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = _run("inbox", "list", "nosuch://x")
    assert code == 2 and "nosuch" in err
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    code, _, err = _run("inbox", "list", url, "--table", "not a table")
    assert code == 2 and "table" in err
    code, _, err = _run("inbox", "list", url, "--limit", "0")
    assert code == 2 and "limit" in err
    code, _, err = _run("inbox", "list", url, "--state", "new")
    assert code == 2 and "state" in err
    code, _, err = _run("inbox", "list", url, "--state", "completed", "--stuck")
    assert code == 2 and "--stuck" in err
    code, _, err = _run("inbox", "show", url)
    assert code == 2 and "KEY" in err
    code, _, err = _run("inbox", "purge", url, "--yes")
    assert code == 2 and "--key" in err


@pytest.mark.parametrize("spec_id", ["redis", "sqlite"])
def test_a_real_jobfence_process_lists_a_claim_the_test_holds(spec_id: str, tmp_path: Path) -> None:
    [spec] = [s for s in SPECS if s.id == spec_id]
    url, namespace = spec.make_url(tmp_path), new_namespace()
    table = inbox_table(namespace)
    program = Path(sys.executable).with_name("jobfence")
    assert program.exists(), f"the jobfence console script is not installed at {program}"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "JOBFENCE_INBOX_TABLE": table}
        return subprocess.run(
            [str(program), "inbox", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    try:
        with jobfence.Inbox(url, table=table) as inbox:
            claim = inbox.claim(LONG, ttl=TTL)
            done = run("list", url)
            assert done.returncode == 0, done.stderr
            assert LONG in done.stdout  # a pipe is not a terminal: nothing cut
            assert claim.owner is not None and claim.owner in done.stdout
            done = run("show", url, LONG, "--json")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["owner"] == claim.owner
            done = run("purge", url, "--key", LONG)
            assert done.returncode == 2 and inbox.claim_info(LONG) is not None
            done = run("purge", url, "--key", LONG, "--yes")
            assert done.returncode == 0, done.stderr
            assert "forgotten by" in done.stderr  # the WARNING log record
            assert inbox.claim_info(LONG) is None
            with pytest.raises(ClaimLost):
                claim.complete("too late")
    finally:
        spec.cleanup(url, namespace)
