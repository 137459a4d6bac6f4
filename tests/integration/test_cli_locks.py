"""``jobfence locks list|show|break``: with Click's runner on every lock backend that can list,
and as a real ``jobfence`` process against Redis and SQLite while the test holds a lease."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import jobfence
from jobfence.cli.app import cli
from tests.conformance.specs import LOCKS, SPECS, Spec, new_namespace, spec_params

pytestmark = pytest.mark.timeout(90)

TTL = 60.0
#: wider than 80 columns: output that is not a terminal must not cut it
LONG = "report:" + "x" * 120


@pytest.fixture(params=spec_params(LOCKS, lambda spec: spec.ttl_expiry))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    spec: Spec = request.param
    url, namespace = spec.make_url(tmp_path), new_namespace()
    yield url, namespace
    spec.cleanup(url, namespace)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_list_show_and_break(where: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url, namespace = where
    ns = ["--namespace", namespace]
    with jobfence.Locks(url, namespace=namespace) as locks:
        locks.install()
        code, out, _ = _run("locks", "list", url, *ns, "--json")
        assert (code, out) == (0, "")
        a = locks.acquire("job:[a]", ttl=TTL)
        b = locks.acquire(LONG, ttl=TTL)

        code, out, _ = _run("locks", "list", url, *ns, "--json")
        rows = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [r["name"] for r in rows] == ["job:[a]", LONG]
        assert rows[0]["owner"] == a.owner and rows[0]["token"] == a.token
        assert 0 < rows[0]["expires_in"] <= TTL

        code, out, _ = _run("locks", "list", url, *ns, "--prefix", "job:")
        assert code == 0 and "job:[a]" in out and a.owner in out and str(a.token) in out
        assert "report:" not in out  # the prefix left it out
        code, out, _ = _run("locks", "list", url, *ns)
        assert LONG in out  # a table off a terminal is not cut to 80 columns

        code, out, _ = _run("locks", "show", url, "job:[a]", *ns, "--json")
        shown = json.loads(out)
        assert code == 0 and (shown["owner"], shown["token"]) == (a.owner, a.token)
        code, out, _ = _run("locks", "show", url, "job:[a]", *ns)
        assert code == 0 and a.owner in out and f"token {a.token}" in out and "s left" in out
        code, out, _ = _run("locks", "show", url, "nobody", *ns)
        assert code == 1 and "'nobody' is not held" in out
        code, out, _ = _run("locks", "show", url, "nobody", *ns, "--json")
        assert (code, out.strip()) == (1, "null")

        code, _, err = _run("locks", "break", url, "job:[a]", *ns)
        assert code == 2 and "without --yes" in err
        assert locks.holder("job:[a]") is not None  # refused: still held

        with caplog.at_level(logging.WARNING, logger="jobfence.cli"):
            code, out, _ = _run("locks", "break", url, "job:[a]", *ns, "--yes")
        assert code == 0 and f"broke job:[a]: it was held by {a.owner}" in out
        [record] = [r for r in caplog.records if r.name == "jobfence.cli"]
        assert record.levelno == logging.WARNING
        message = record.getMessage()
        assert "'job:[a]'" in message and "broken by" in message and a.owner in message
        assert locks.holder("job:[a]") is None
        assert not a.release()  # it was taken from its holder

        code, out, _ = _run("locks", "break", url, "job:[a]", *ns, "--yes")
        assert code == 1 and "was not held" in out
        assert b.release()


def test_the_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    env = {"JOBFENCE_URL": url, "JOBFENCE_NAMESPACE": "envns"}
    with jobfence.Locks(url, namespace="envns") as locks:
        lease = locks.acquire("nightly", ttl=TTL)
        code, out, _ = _run("locks", "list", "--json", env=env)
        assert code == 0 and json.loads(out)["name"] == "nightly"
        code, out, _ = _run("locks", "show", "nightly", "--json", env=env)
        assert code == 0 and json.loads(out)["token"] == lease.token
        code, out, _ = _run("locks", "break", "nightly", "--yes", env=env)
        assert code == 0 and locks.holder("nightly") is None
    code, _, err = _run("locks", "list", env={"JOBFENCE_URL": ""})
    assert code == 2 and "JOBFENCE_URL" in err


def test_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = _run("locks", "list", "nosuch://x")
    assert code == 2 and "nosuch" in err
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    code, _, err = _run("locks", "list", url, "--namespace", "not a name")
    assert code == 2 and "namespace" in err
    code, _, err = _run("locks", "show", url, "--namespace", "x")
    assert code == 2 and "NAME" in err


def _postgres_session_url() -> str:
    [spec] = [s for s in SPECS if s.id == "postgres-session"]
    return spec.make_url(Path("."))


def test_listing_session_mode_is_refused() -> None:
    code, _, err = _run("locks", "list", _postgres_session_url(), "--namespace", new_namespace())
    assert code == 2 and "session mode" in err


@pytest.mark.parametrize("spec_id", ["redis", "sqlite"])
def test_a_real_jobfence_process_lists_a_lease_the_test_holds(spec_id: str, tmp_path: Path) -> None:
    [spec] = [s for s in SPECS if s.id == spec_id]
    url, namespace = spec.make_url(tmp_path), new_namespace()
    program = Path(sys.executable).with_name("jobfence")
    assert program.exists(), f"the jobfence console script is not installed at {program}"
    try:
        with jobfence.Locks(url, namespace=namespace) as locks:
            lease = locks.acquire(LONG, ttl=TTL)
            env = {**os.environ, "JOBFENCE_NAMESPACE": namespace}
            done = subprocess.run(
                [str(program), "locks", "list", url],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert LONG in done.stdout  # a pipe is not a terminal: nothing cut
            assert lease.owner in done.stdout and str(lease.token) in done.stdout
            done = subprocess.run(
                [str(program), "locks", "show", url, LONG, "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["token"] == lease.token
            assert lease.release()
    finally:
        spec.cleanup(url, namespace)
