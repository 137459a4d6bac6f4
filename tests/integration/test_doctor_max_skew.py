"""``jobfence doctor --max-skew``: the clock offset between this host and the server is held
to a bound, on real Redis and PostgreSQL servers. The offset is measured against jobfence's
clock, so a test moves this host's side of it with a clock whose ``time()`` is off."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import jobfence
from jobfence.cli.app import cli
from jobfence.doctor import Report, diagnose
from jobfence.testing import Clock, clocked
from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL

pytestmark = pytest.mark.timeout(120)

SERVERS = [pytest.param(REDIS_URL, id="redis"), pytest.param(POSTGRES_URL, id="postgres")]


class Skewed(Clock):
    """Real time, with a wall clock ``seconds`` off (negative: this host is behind)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def time(self) -> float:
        return time.time() + self.seconds


def _clock(report: Report) -> tuple[str, str]:
    [finding] = [f for f in report.findings if f.code.startswith("clock-")]
    return finding.level, finding.message


@pytest.mark.parametrize("url", SERVERS)
def test_an_offset_within_the_bound_passes(url: str) -> None:
    report = diagnose(url, probe=False, max_skew=30)
    level, message = _clock(report)
    assert level == "ok" and report.clock_verdict == "ok", message
    assert message.endswith("within the bound of 30 s")
    assert report.max_skew == 30.0 and abs(report.clock_offset_ms or 0) < 30_000


@pytest.mark.parametrize("url", SERVERS)
def test_an_offset_over_the_bound_is_an_error(url: str) -> None:
    with clocked(Skewed(-5.0)):  # this host 5 s behind: the server is 5 s ahead of it
        report = diagnose(url, probe=False, max_skew=1)
    level, message = _clock(report)
    assert (level, report.clock_verdict, report.level) == ("error", "error", "error")
    assert report.clock_offset_ms is not None and 4_500 < report.clock_offset_ms < 5_500
    assert message.startswith("the server's clock is +5.0")
    assert message.endswith("from this host's, over the bound of 1 s (--max-skew)")


@pytest.mark.parametrize("url", SERVERS)
def test_a_bound_of_zero_fails_any_offset_and_the_default_only_warns(url: str) -> None:
    with clocked(Skewed(0.25)):  # this host a quarter of a second ahead
        strict = diagnose(url, probe=False, max_skew=0)
        default = diagnose(url, probe=False)
    assert _clock(strict)[0] == "error" and strict.clock_offset_ms < -200  # type: ignore[operator]
    # without a bound, the warning threshold (1 s) applies, as before
    assert _clock(default)[0] == "ok" and default.max_skew is None
    with clocked(Skewed(3.0)):
        late = diagnose(url, probe=False)
    assert _clock(late)[0] == "warning" and late.clock_verdict == "warning"
    assert late.level == "warning"  # exits 0 unless --strict


def test_an_offset_that_cannot_be_measured_is_a_warning_under_a_bound() -> None:
    # RabbitMQ tells no time: the bound cannot be checked
    report = diagnose(RABBITMQ_URL, probe=False, max_skew=1)
    assert report.clock_offset_ms is None and report.clock_verdict == "warning"
    level, message = _clock(report)
    assert level == "warning" and "the offset bound of 1 s was not checked" in message
    assert diagnose(RABBITMQ_URL, probe=False).clock_verdict is None  # no bound: no verdict
    # a server that cannot be reached: its error, and no clock verdict on top
    down = diagnose("redis://127.0.0.1:1/0", probe=False, max_skew=1)
    assert down.clock_verdict is None and down.level == "error"
    assert not [f for f in down.findings if f.code.startswith("clock-")]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "1"])
def test_a_bad_bound_names_max_skew(bad: object) -> None:
    with pytest.raises(jobfence.ConfigurationError) as exc:
        diagnose(REDIS_URL, probe=False, max_skew=bad)  # type: ignore[arg-type]
    assert exc.value.argument == "max_skew"


def test_the_command_passes_a_generous_bound_and_reports_it_in_json() -> None:
    command = [sys.executable, "-m", "jobfence.cli.app", "doctor", "--json", "--max-skew", "30"]
    result = subprocess.run(
        [*command, REDIS_URL, POSTGRES_URL],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = json.loads(result.stdout)["reports"]
    assert [(r["max_skew"], r["clock_verdict"]) for r in reports] == [(30.0, "ok")] * 2


@pytest.mark.parametrize("url", SERVERS)
def test_the_command_fails_over_the_bound(url: str) -> None:
    runner = CliRunner()
    with clocked(Skewed(-5.0)):
        result = runner.invoke(cli, ["doctor", "--json", "--max-skew", "1", url])
        shown = runner.invoke(cli, ["doctor", "--max-skew", "1", url])
    assert result.exit_code == 1, result.output
    [report] = json.loads(result.output)["reports"]
    assert (report["max_skew"], report["clock_verdict"], report["level"]) == (1.0, "error", "error")
    assert shown.exit_code == 1
    assert "over the bound of 1 s (--max-skew)" in shown.output and "(max 1 s)" in shown.output


def test_the_command_refuses_a_negative_bound() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--max-skew", "-1", REDIS_URL])
    assert result.exit_code == 2 and "--max-skew" in result.output
    result = CliRunner().invoke(cli, ["doctor", "--max-skew", "nan", REDIS_URL])
    assert result.exit_code == 2 and "--max-skew" in result.output
