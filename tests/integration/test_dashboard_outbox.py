"""``jobfence dashboard --outbox URL``: the outbox panel of a real dashboard process over
real PostgreSQL and SQLite outboxes, through its JSON API (counts, oldest unpublished row,
rows by queue, dead rows, the retry action and its defences) and once in a real headless
Chromium driven by Playwright."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.conformance.specs import SPECS, new_namespace
from tests.servers import POSTGRES_URL

from ._dashboard import Running, dashboard

pytestmark = pytest.mark.timeout(120)

CHROMIUM = Path("/usr/bin/chromium")
JSON = {"Content-Type": "application/json"}
RELAY = "tests:relay:1"
RETRY = "/api/outbox/retry"


class Where:
    """The outbox of one test: its URL and table, and a connection to add rows with."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.namespace = new_namespace()
        self.table = f"{self.namespace}_outbox"
        self.path = tmp_path / "app.db"
        self.url = POSTGRES_URL if kind == "postgres" else f"sqlite:///{self.path}"

    def outbox(self) -> jobfence.Outbox:
        return jobfence.Outbox(self.url, table=self.table)

    def add(self, queue: str, msg_id: str, body: Any) -> None:
        if self.kind == "postgres":
            import psycopg

            conn: Any = psycopg.connect(POSTGRES_URL)
        else:
            conn = sqlite3.connect(self.path)
        try:
            with self.outbox() as outbox:
                outbox.add(conn, queue=queue, body=body, id=msg_id)
            conn.commit()
        finally:
            conn.close()

    def args(self, *more: str) -> tuple[str, ...]:
        return ("--outbox", self.url, "--outbox-table", self.table, *more)


@pytest.fixture(params=["postgres", "sqlite"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    made = Where(request.param, tmp_path)
    with made.outbox() as outbox:
        outbox.install()
    yield made
    with made.outbox() as outbox:
        outbox.drop()
    if request.param == "postgres":
        [spec] = [s for s in SPECS if s.id == "postgres"]
        spec.cleanup(POSTGRES_URL, made.namespace)


def _env() -> dict[str, str]:
    return {**os.environ, "JOBFENCE_URL": ""}


def _fill(where: Where) -> None:
    """Two rows waiting for emails, one for sms, one claimed (sms), one published and two
    dead (with their errors)."""
    for msg_id in ("e-published", "e-dead", "s-dead", "s-claimed"):
        where.add("sms" if msg_id.startswith("s-") else "emails", msg_id, {"id": msg_id})
    with where.outbox() as outbox:
        rows = {row.id: row for row in outbox.backend.claim(RELAY, 10, 60.0)}
        assert outbox.backend.published(RELAY, [rows["e-published"].seq], 600.0) == 1
        assert outbox.backend.failed(RELAY, rows["e-dead"].seq, "SMTPError: relay refused", None)
        assert outbox.backend.failed(RELAY, rows["s-dead"].seq, "TwilioError: bad number", None)
    for msg_id in ("e-1", "e-2", "s-1"):
        where.add("sms" if msg_id.startswith("s-") else "emails", msg_id, {"id": msg_id})


def _action(board: Running, body: Any, **headers: str) -> tuple[int, Any]:
    return board.request(
        RETRY, body=body, headers={**JSON, "X-Jobfence-Token": board.token(), **headers}
    )


def test_the_panel_shows_counts_queues_and_dead_rows(where: Where, tmp_path: Path) -> None:
    _fill(where)
    with dashboard(*where.args(), tmp_path=tmp_path, env=_env()) as board:
        status, state = board.request("/api/state")
    assert status == 200 and state["targets"] == [] and state["schedulers"] == []
    [panel] = state["outboxes"]
    assert (panel["id"], panel["table"], panel["status"]) == (0, where.table, "ok"), panel
    assert panel["counts"] == {"pending": 3, "claimed": 1, "published": 1, "dead": 2}
    assert panel["oldest_pending"] >= 0
    assert panel["queues"] == [
        {"name": "emails", "pending": 2, "claimed": 0},
        {"name": "sms", "pending": 1, "claimed": 1},
    ]
    assert panel["queues_truncated"] is False and panel["dead_truncated"] is False
    # the newest dead row first
    assert [(d["id"], d["queue"], d["attempts"], d["error"]) for d in panel["dead"]] == [
        ("s-dead", "sms", 1, "TwilioError: bad number"),
        ("e-dead", "emails", 1, "SMTPError: relay refused"),
    ]


def test_retry_over_http_has_the_protections_of_every_action(where: Where, tmp_path: Path) -> None:
    _fill(where)
    with dashboard(*where.args(), tmp_path=tmp_path, env=_env()) as board:
        status, answer = board.request(RETRY, body={"outbox": 0, "ids": None}, headers=JSON)
        assert status == 403 and "--allow-actions" in answer["error"]
    with dashboard(*where.args("--allow-actions"), tmp_path=tmp_path, env=_env()) as board:
        body = {"outbox": 0, "ids": ["e-dead"]}
        status, answer = board.request(RETRY, body=body, headers=JSON)
        assert status == 403 and "X-Jobfence-Token" in answer["error"]
        status, _ = _action(board, body, Host=f"attacker.example:{board.port}")
        assert status == 421
        status, _ = _action(board, body, Origin="http://attacker.example")
        assert status == 403
        status, _ = _action(board, body, **{"Content-Type": "text/plain"})
        assert status == 415
        for bad, word in (
            ({"outbox": 1, "ids": ["e-dead"]}, "outbox must be from 0 to 0"),
            ({"ids": ["e-dead"]}, "outbox must be an int"),
            ({"outbox": 0, "ids": []}, "ids must be a non-empty list"),
            ({"outbox": 0, "ids": "e-dead"}, "ids must be a non-empty list"),
            ({"outbox": 0, "ids": [""]}, "ids must be a non-empty list"),
        ):
            status, answer = _action(board, bad)
            assert status == 400 and word in answer["error"], (bad, answer)
        with where.outbox() as outbox:
            assert outbox.stats().dead == 2  # nothing refused went through

        status, answer = _action(board, body)
        assert (status, answer) == (200, {"retried": 1})
        _, state = board.request("/api/state")
        [panel] = state["outboxes"]
        assert (panel["counts"]["dead"], panel["counts"]["pending"]) == (1, 4)
        assert [d["id"] for d in panel["dead"]] == ["s-dead"]
        assert {"name": "emails", "pending": 3, "claimed": 0} in panel["queues"]
        status, answer = _action(board, {"outbox": 0, "ids": None})
        assert (status, answer) == (200, {"retried": 1})
        log = board.log()
    line = next(line for line in log.splitlines() if "retried from the dashboard" in line)
    assert "WARNING jobfence.cli" in line and "'e-dead'" in line and where.table in line
    with where.outbox() as outbox:
        stats = outbox.stats()
        revived = {e.id: e.attempts for e in outbox.entries(state="pending")}
    assert (stats.dead, stats.pending) == (0, 5)
    assert revived["e-dead"] == 0 and revived["s-dead"] == 0

    # a dashboard without --outbox has no outbox to act on
    url = f"sqlite:///{tmp_path / 'other.db'}"
    with dashboard(url, "--allow-actions", tmp_path=tmp_path, env=_env()) as board:
        status, answer = _action(board, {"outbox": 0, "ids": None})
        assert status == 400 and "--outbox" in answer["error"]
        _, state = board.request("/api/state")
        assert state["outboxes"] == []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_outbox_that_is_down_shows_its_error_masked(tmp_path: Path) -> None:
    down = f"postgresql://postgres:s3cret-pw@127.0.0.1:{_closed_port()}/test"
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with jobfence.Outbox(url) as outbox:
        outbox.install()
    with dashboard("--outbox", down, "--outbox", url, tmp_path=tmp_path, env=_env()) as board:
        _, state = board.request("/api/state")
    failing, working = state["outboxes"]
    assert failing["status"] == "error" and "s3cret-pw" not in str(failing)
    assert failing["url"].startswith("postgresql://postgres:***@127.0.0.1:")
    assert working["status"] == "ok" and working["counts"]["pending"] == 0


def test_bad_outbox_options_are_usage_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from jobfence.cli.app import cli

    url = f"sqlite:///{tmp_path / 'x.db'}"
    for args, word in (
        (["--outbox", "memory://"], "--outbox"),
        (["--outbox", "nosuch://x"], "--outbox"),
        (["--outbox", url, "--outbox-table", "bad table!"], "--outbox-table"),
    ):
        result = CliRunner().invoke(cli, ["dashboard", *args], env={"JOBFENCE_URL": ""})
        assert result.exit_code == 2 and word in result.stderr, (args, result.output)


# -- the page in a real browser --------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert CHROMIUM.exists(), (
        f"the browser tests need Chromium at {CHROMIUM}: apt-get install -y chromium"
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert errors == []  # no script error, no CSP violation


def test_the_page_shows_the_outbox_and_retries_a_dead_row(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    where = Where("sqlite", tmp_path)
    with where.outbox() as outbox:
        outbox.install()
    _fill(where)
    args = where.args("--allow-actions")
    with dashboard(*args, tmp_path=tmp_path, env=_env(), page=page) as board:
        page.goto(board.base + "/")
        article = page.locator('article[data-outbox="0"]')
        expect(article.locator("h2")).to_contain_text(f"outbox {where.table}")
        counts = article.locator("table.counts").first
        expect(counts.locator("td.pending")).to_have_text("3")
        expect(counts.locator("td.claimed")).to_have_text("1")
        expect(counts.locator("td.published")).to_have_text("1")
        expect(counts.locator("td.dead")).to_have_text("2")
        expect(counts.locator("td.oldest-pending")).to_have_text(re.compile(r"^\d+\.\ds$"))
        sms = article.locator('tr[data-outbox-queue="sms"]')
        expect(sms.locator("td.pending")).to_have_text("1")
        expect(sms.locator("td.claimed")).to_have_text("1")
        row = article.locator('tr[data-outbox-dead="e-dead"]')
        expect(row).to_contain_text("SMTPError: relay refused")
        expect(row.locator("td.attempts")).to_have_text("1")

        # Cancel changes nothing
        row.get_by_role("button", name="Retry").click()
        dialog = page.get_by_role("dialog")
        question = f"Retry dead row e-dead (queue emails, 1 attempts) of outbox {where.table}"
        expect(dialog).to_contain_text(question)
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_be_hidden()
        with where.outbox() as outbox:
            assert outbox.stats().dead == 2

        row.get_by_role("button", name="Retry").click()
        expect(dialog).to_contain_text(question)
        dialog.get_by_role("button", name="Confirm").click()
        expect(page.locator("#message")).to_have_text("retried 1 dead row(s)")
        expect(row).to_have_count(0)
        expect(counts.locator("td.dead")).to_have_text("1")
        expect(counts.locator("td.pending")).to_have_text("4")
        expect(article.locator('tr[data-outbox-dead="s-dead"]')).to_have_count(1)
    with where.outbox() as outbox:
        assert outbox.stats().dead == 1
        [revived] = [e for e in outbox.entries(state="pending") if e.id == "e-dead"]
        assert revived.attempts == 0
