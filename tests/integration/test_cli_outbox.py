"""``jobfence relay``, ``jobfence worker --relay`` and ``jobfence outbox ...`` against real
PostgreSQL and SQLite outboxes and a real Redis queue: rows added by committed (and rolled
back) transactions of the test, relays and workers run as ``jobfence`` processes stopped with
SIGTERM, the admin commands run with Click's runner."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import jobfence
from jobfence.cli.app import cli
from tests.conformance.specs import SPECS, new_namespace
from tests.servers import POSTGRES_URL, REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
RELAY = "tests:relay:1"  # the owner id the tests claim rows with


class Where:
    """The outbox of one test: its URL, its table, and connections to add rows with."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.namespace = new_namespace()
        self.table = f"{self.namespace}_outbox"
        self.path = tmp_path / "app.db"
        self.url = POSTGRES_URL if kind == "postgres" else f"sqlite:///{self.path}"

    def outbox(self) -> jobfence.Outbox:
        return jobfence.Outbox(self.url, table=self.table)

    def connect(self) -> Any:
        if self.kind == "postgres":
            import psycopg

            return psycopg.connect(POSTGRES_URL)
        return sqlite3.connect(self.path)

    def add(
        self,
        queue: str,
        bodies: list[Any],
        *,
        ids: list[str] | None = None,
        commit: bool = True,
        key: str | None = None,
    ) -> list[str]:
        """Add ``bodies`` in one transaction of the test's own, committed (or rolled back)."""
        conn = self.connect()
        try:
            with self.outbox() as outbox:
                added = outbox.add_many(conn, queue=queue, bodies=bodies, ids=ids, key=key)
            if commit:
                conn.commit()
            else:
                conn.rollback()
        finally:
            conn.close()
        return list(added)


@pytest.fixture(params=["postgres", "sqlite"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    made = Where(request.param, tmp_path)
    with made.outbox() as outbox:
        outbox.install()
    yield made
    with made.outbox() as outbox:
        outbox.drop()
    delete_redis_keys(f"*{made.namespace}*")
    if request.param == "postgres":
        [spec] = [s for s in SPECS if s.id == "postgres"]
        spec.cleanup(POSTGRES_URL, made.namespace)


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
        "JOBFENCE_URL": "",
        **extra,
    }


def _jobfence(*args: str, env: dict[str, str], stderr: Path) -> subprocess.Popen[str]:
    with stderr.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "jobfence.cli.app", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def _first_line(process: subprocess.Popen[str], stderr: Path) -> str:
    assert process.stdout is not None
    with ThreadPoolExecutor(1) as pool:
        line = pool.submit(process.stdout.readline).result(timeout=60)
    assert line, f"no start line; stderr: {stderr.read_text()}"
    return line


def _stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, then the rest of stdout (the process must exit by itself)."""
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    return out


def _wait_for(predicate: Callable[[], Any], what: str, limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _received(queue: jobfence.Queue, count: int) -> list[tuple[str, Any]]:
    """``(id, body)`` of the next ``count`` messages of ``queue``, acked."""
    got: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {got} of {count} messages arrived"
        for message in queue.receive(count - len(got), wait=1.0):
            got.append((message.id, message.body))
            message.ack()
    return got


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli, list(args), env={"JOBFENCE_URL": "", **(env or {})}, catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line]


# -- jobfence relay --------------------------------------------------------------------------


def test_relay_publishes_committed_rows_to_the_queue_and_stops_on_sigterm_with_its_stats(
    where: Where, tmp_path: Path
) -> None:
    orders, other = f"{where.namespace}-orders", f"{where.namespace}-other"
    first = where.add(orders, [{"n": 1}, {"n": 2}, {"n": 3}], ids=["o-1", "o-2", "o-3"])
    where.add(orders, [{"n": "rolled back"}], ids=["o-gone"], commit=False)
    where.add(other, [{"n": "not this relay's"}], ids=["x-1"])
    err = tmp_path / "relay.err"
    relay = _jobfence(
        "relay",
        where.url,
        "--table",
        where.table,
        "--to",
        REDIS_URL,
        "--queue",
        orders,
        "--poll",
        "0.2",
        env=_env(),
        stderr=err,
    )
    try:
        start = _first_line(relay, err)
        assert start.startswith("jobfence relay: ") and f"table {where.table}" in start
        assert f"-> {REDIS_URL}" in start and f"(queues: {orders};" in start
        with jobfence.Queue(REDIS_URL, orders) as queue:
            assert _received(queue, 3) == [("o-1", {"n": 1}), ("o-2", {"n": 2}), ("o-3", {"n": 3})]
            assert first == ["o-1", "o-2", "o-3"]
            # a row committed while the relay runs is published too
            where.add(orders, [{"n": 4}], ids=["o-4"])
            assert _received(queue, 1) == [("o-4", {"n": 4})]
        with where.outbox() as outbox:
            stats = _wait_for(
                lambda: (s := outbox.stats()).published == 4 and s, "the rows marked published"
            )
            assert (stats.pending, stats.claimed, stats.dead) == (1, 0, 0)  # x-1 waits
            [waiting] = outbox.entries(state="pending")
            assert waiting.id == "x-1"
    finally:
        out = _stop(relay)
    assert relay.returncode == 0, err.read_text()
    assert "jobfence relay stopped: published 4, failed 0, dead 0" in out, out
    with jobfence.Queue(REDIS_URL, orders) as queue:
        assert queue.stats().ready == 0  # the rolled back row never went out


def test_relay_to_a_target_callable_kills_the_row_it_refuses_and_retry_revives_it(
    where: Where, tmp_path: Path
) -> None:
    out_file = tmp_path / "sent.jsonl"
    queue = f"{where.namespace}-mail"
    where.add(queue, [{"to": "a"}, {"fail": True}, {"to": "b"}], ids=["m-1", "m-bad", "m-2"])
    err = tmp_path / "relay.err"
    relay = _jobfence(
        "relay",
        where.url,
        "--table",
        where.table,
        "--target",
        "tests.integration._outbox_targets:record",
        "--max-attempts",
        "1",
        "--poll",
        "0.2",
        env=_env(JF_OUT=str(out_file)),
        stderr=err,
    )
    try:
        start = _first_line(relay, err)
        assert "-> tests.integration._outbox_targets:record (queues: all;" in start
        assert "max attempts 1" in start
        with where.outbox() as outbox:
            _wait_for(lambda: outbox.stats().dead == 1, "the refused row to die")
            _wait_for(lambda: outbox.stats().published == 2, "the others to be published")
    finally:
        out = _stop(relay)
    assert relay.returncode == 0, err.read_text()
    assert "published 2, " in out and "dead 1" in out, out
    assert "last error: " in out and "refused by the target" in out
    sent = _lines(out_file.read_text())
    assert sorted(row[0] for row in sent) == ["m-1", "m-2"]
    assert {row[1] for row in sent} == {queue}

    code, shown, _ = _run("outbox", "dead", where.url, "--table", where.table, "--json")
    [dead] = _lines(shown)
    assert code == 0 and (dead["id"], dead["queue"], dead["state"]) == ("m-bad", queue, "dead")
    assert dead["attempts"] == 1 and "refused by the target" in dead["last_error"]
    assert dead["body"] == {"fail": True}

    code, said, _ = _run("outbox", "retry", where.url, "m-bad", "--table", where.table, "--json")
    assert (code, json.loads(said)) == (0, {"retried": 1})
    with where.outbox() as outbox:
        [again] = outbox.entries(state="pending")
        assert (again.id, again.attempts, outbox.stats().dead) == ("m-bad", 0, 0)


def test_worker_with_relay_handles_the_rows_the_application_commits(
    where: Where, tmp_path: Path
) -> None:
    out_file = tmp_path / "handled.jsonl"
    name = f"{where.namespace}-orders"
    err = tmp_path / "worker.err"
    worker = _jobfence(
        "worker",
        "tests.acceptance._cli_handlers:record",
        "--queue",
        REDIS_URL,
        "--name",
        name,
        "--no-live",
        "--relay",
        where.url,
        "--outbox-table",
        where.table,
        env=_env(JF_OUT=str(out_file)),
        stderr=err,
    )
    try:
        ids = where.add(name, [{"n": 1}, {"n": 2}])
        ids += where.add(name, [{"n": 3}], ids=["order-3"])
        where.add(f"{where.namespace}-elsewhere", [{"n": "no worker relays it"}], ids=["e-1"])
        _wait_for(
            lambda: out_file.exists() and len(out_file.read_text().splitlines()) >= 3,
            f"the handler to get the rows; stderr: {err.read_text() if err.exists() else ''}",
        )
        with where.outbox() as outbox:
            _wait_for(lambda: outbox.stats().published == 3, "the rows marked published")
    finally:
        _stop(worker)
    log = err.read_text()
    assert worker.returncode == 0, log
    handled = _lines(out_file.read_text())
    assert sorted(handled) == sorted([[i, 1] for i in ids])  # each once, first delivery
    assert "order-3" in ids
    assert "relaying the outbox" in log and f"(queues: {name})" in log
    assert "relay stopped: published 3, failed 0, dead 0" in log
    with where.outbox() as outbox:
        [left] = outbox.entries(state="pending")
        assert left.id == "e-1"  # the worker's relay takes its own queue's rows only


def test_an_async_worker_with_relay_stops_its_relay_with_it(tmp_path: Path) -> None:
    where = Where("sqlite", tmp_path)
    with where.outbox() as outbox:
        outbox.install()
    out_file = tmp_path / "handled.txt"
    name = f"{where.namespace}-slow"
    err = tmp_path / "worker.err"
    worker = _jobfence(
        "worker",
        "tests.acceptance._cli_handlers:slow",  # an async def: the worker runs asyncio
        "--queue",
        REDIS_URL,
        "--name",
        name,
        "--no-live",
        "--relay",
        where.url,
        "--outbox-table",
        where.table,
        env=_env(JF_OUT=str(out_file)),
        stderr=err,
    )
    try:
        [msg_id] = where.add(name, [{"seconds": 0}])
        _wait_for(
            lambda: out_file.exists() and f"finished {msg_id}" in out_file.read_text(),
            "the async handler to finish the row",
        )
    finally:
        _stop(worker)
        delete_redis_keys(f"*{where.namespace}*")
    log = err.read_text()
    assert worker.returncode == 0, log
    assert "relay stopped: published 1, failed 0, dead 0" in log
    assert out_file.read_text().splitlines() == [f"started {msg_id}", f"finished {msg_id}"]


# -- jobfence outbox -------------------------------------------------------------------------


def _one_of_each(where: Where) -> dict[str, str]:
    """A pending, a claimed, a published and a dead row (by the backend's verbs, as a relay
    settles them); their ids by state."""
    where.add("emails", [{"to": "a@example.com"}], ids=["r-published"], key="cust:1")
    where.add("emails", [{"to": "b@example.com"}], ids=["r-dead"])
    where.add("sms", [{"to": "+33"}], ids=["r-claimed"])
    with where.outbox() as outbox:
        rows = {row.id: row for row in outbox.backend.claim(RELAY, 10, 60.0)}
        assert set(rows) == {"r-published", "r-dead", "r-claimed"}
        assert outbox.backend.published(RELAY, [rows["r-published"].seq], 600.0) == 1
        assert outbox.backend.failed(RELAY, rows["r-dead"].seq, "SMTPError: relay refused", None)
    where.add("emails", [{"to": "c@example.com", "n": 1}], ids=["r-pending"])
    return {
        "published": "r-published",
        "dead": "r-dead",
        "claimed": "r-claimed",
        "pending": "r-pending",
    }


def test_outbox_admin_commands_show_and_act_on_the_rows(
    where: Where, caplog: pytest.LogCaptureFixture
) -> None:
    ids = _one_of_each(where)
    tb = ("--table", where.table)

    code, out, _ = _run("outbox", "stats", where.url, *tb, "--json")
    stats = json.loads(out)
    assert code == 0 and stats["table"] == where.table
    assert [stats[k] for k in ("pending", "claimed", "published", "dead")] == [1, 1, 1, 1]
    assert stats["oldest_pending"] is not None and stats["oldest_pending"] >= 0
    code, out, _ = _run("outbox", "stats", where.url, *tb)
    assert code == 0 and f"outbox {where.table}" in out and "oldest pending" in out

    code, out, _ = _run("outbox", "list", where.url, *tb, "--json")
    rows = _lines(out)
    assert code == 0
    assert [(r["id"], r["state"]) for r in rows] == [
        ("r-published", "published"),
        ("r-dead", "dead"),
        ("r-claimed", "claimed"),
        ("r-pending", "pending"),
    ]
    assert rows[0]["key"] == "cust:1" and rows[0]["published_at"] is not None
    assert rows[2]["claimed_by"] == RELAY and rows[2]["claimed_until"] is not None
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    for state, msg_id in ids.items():
        code, out, _ = _run("outbox", "list", where.url, *tb, "--state", state, "--json")
        assert [r["id"] for r in _lines(out)] == [msg_id], state
    code, out, _ = _run("outbox", "list", where.url, *tb, "--queue", "sms", "--json")
    assert [r["id"] for r in _lines(out)] == ["r-claimed"]
    code, out, _ = _run("outbox", "list", where.url, *tb, "--limit", "2", "--json")
    assert [r["id"] for r in _lines(out)] == ["r-published", "r-dead"]
    after = rows[1]["seq"]
    code, out, _ = _run("outbox", "list", where.url, *tb, "--after", str(after), "--json")
    assert [r["id"] for r in _lines(out)] == ["r-claimed", "r-pending"]
    code, out, _ = _run("outbox", "list", where.url, *tb)
    assert code == 0 and f"outbox {where.table} (4)" in out
    for msg_id in ids.values():
        assert msg_id in out
    assert "SMTPError: relay refused" in out

    code, out, _ = _run("outbox", "show", where.url, "r-pending", *tb, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["body"] == {"to": "c@example.com", "n": 1}
    assert (shown["queue"], shown["state"], shown["attempts"]) == ("emails", "pending", 0)
    code, out, _ = _run("outbox", "show", where.url, "r-dead", *tb)
    assert code == 0 and "last_error: SMTPError: relay refused" in out
    code, out, _ = _run("outbox", "show", where.url, "nosuch", *tb)
    assert code == 1 and "'nosuch' has no row in the outbox" in out
    # the URL may come from JOBFENCE_URL: the lone argument is the id
    code, out, _ = _run(
        "outbox", "show", "r-claimed", *tb, "--json", env={"JOBFENCE_URL": where.url}
    )
    assert code == 0 and json.loads(out)["state"] == "claimed"

    code, out, _ = _run("outbox", "dead", where.url, *tb, "--json")
    [dead] = _lines(out)
    assert (dead["id"], dead["attempts"], dead["last_error"]) == (
        "r-dead",
        1,
        "SMTPError: relay refused",
    )
    code, out, _ = _run("outbox", "dead", where.url, *tb)
    assert code == 0 and "1 dead" in out and "r-dead" in out and "relay refused" in out

    # retrying a row that is not dead changes nothing and says so
    code, out, err = _run("outbox", "retry", where.url, "r-pending", *tb)
    assert code == 1 and "retried 0 dead rows" in out and "were not dead rows" in err
    with caplog.at_level(logging.WARNING, logger="jobfence.cli"):
        code, out, _ = _run("outbox", "retry", where.url, "r-dead", *tb)
    assert code == 0 and f"retried 1 dead row of {where.table}" in out
    [record] = [r for r in caplog.records if "dead row(s) 'r-dead' retried" in r.getMessage()]
    assert "retried by" in record.getMessage() and where.table in record.getMessage()
    assert record.levelno == logging.WARNING
    with where.outbox() as outbox:
        stats_now = outbox.stats()
        [revived] = [e for e in outbox.entries(state="pending") if e.id == "r-dead"]
    assert (stats_now.dead, stats_now.pending, revived.attempts) == (0, 2, 0)
    assert revived.last_error in (None, "SMTPError: relay refused")

    with where.outbox() as outbox:
        [row] = [r for r in outbox.backend.claim(RELAY, 10, 60.0) if r.id == "r-dead"]
        assert outbox.backend.failed(RELAY, row.seq, "again", None)
    code, out, _ = _run("outbox", "retry", where.url, "--all", *tb, "--json")
    assert (code, json.loads(out)) == (0, {"retried": 1})

    code, out, _ = _run("outbox", "purge", where.url, *tb, "--json")
    assert (code, json.loads(out)) == (0, {"purged": 0})  # published 0 s ago, kept 600 s
    purged = _wait_for(  # published a moment ago: more than 0 s ago once the clock moved on
        lambda: (
            (r := _run("outbox", "purge", where.url, *tb, "--retention", "0"))[1].startswith(
                "purged 1 "
            )
            and r
        ),
        "the published row to be purged",
        limit=5,
    )
    assert purged[0] == 0 and f"purged 1 published row from {where.table}" in purged[1]
    with where.outbox() as outbox:
        assert outbox.stats().published == 0


def test_install_creates_the_table_that_add_needs(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    url = f"sqlite:///{path}"

    def add() -> str:
        conn = sqlite3.connect(path)
        try:
            with jobfence.Outbox(url, table="new_outbox") as outbox:
                added = outbox.add(conn, queue="emails", body={"n": 1}, id="n-1")
            conn.commit()
        finally:
            conn.close()
        return added

    with pytest.raises(jobfence.SchemaMissing) as caught:  # add never creates the table
        add()
    assert "install" in str(caught.value)
    code, out, _ = _run("outbox", "install", url, "--table", "new_outbox")
    assert (code, out) == (0, "outbox table new_outbox is installed\n")
    assert add() == "n-1"
    code, out, _ = _run("outbox", "stats", url, "--table", "new_outbox", "--json")
    assert code == 0 and json.loads(out)["pending"] == 1
    code, out, _ = _run("outbox", "install", url, "--table", "new_outbox")  # idempotent
    assert code == 0


def test_bad_options_name_the_option(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with jobfence.Outbox(url) as outbox:
        outbox.install()
    target = "tests.integration._outbox_targets"
    for args, word in (
        (["relay", "--to", REDIS_URL], "OUTBOX_URL"),
        (["relay", url], "--to URL or --target MODULE:OBJ"),
        (["relay", url, "--to", REDIS_URL, "--target", f"{target}:record"], "--to URL or"),
        (["relay", url, "--to", REDIS_URL, "--batch", "0"], "--batch"),
        (["relay", url, "--to", REDIS_URL, "--lease", "0"], "--lease"),
        (["relay", url, "--to", REDIS_URL, "--max-attempts", "0"], "--max-attempts"),
        (["relay", url, "--to", REDIS_URL, "--retention", "-1"], "--retention"),
        (["relay", url, "--to", REDIS_URL, "--poll", "0"], "--poll"),
        (["relay", url, "--to", REDIS_URL, "--queue", "bad name!"], "--queue"),
        (["relay", url, "--to", "nosuch://x"], "--to"),
        (["relay", "memory://", "--to", REDIS_URL], "OUTBOX_URL"),
        (["relay", url, "--target", "no_such_module_x:send"], "--target"),
        (["relay", url, "--target", "tests"], "module:object"),
        (["relay", url, "--target", f"{target}:not_a_target"], "--target"),
        (["relay", url, "--to", REDIS_URL, "--table", "bad table!"], "--table"),
        (["outbox", "list", url, "--state", "lost"], "--state"),
        (["outbox", "list", url, "--limit", "0"], "--limit"),
        (["outbox", "dead", url, "--limit", "0"], "--limit"),
        (["outbox", "purge", url, "--retention", "-1"], "--retention"),
        (["outbox", "retry", url], "--all"),
        (["outbox", "retry", url, "r-1", "--all"], "not both"),
        (["outbox", "show", url], "ID"),
        (["outbox", "stats"], "JOBFENCE_URL"),
        (["outbox", "stats", "memory://"], "memory"),
        (["worker", f"{target}:record", "--queue", REDIS_URL, "--name", "q",
          "--relay-queue", "q"], "--relay"),
        (["worker", f"{target}:record", "--queue", REDIS_URL, "--name", "q",
          "--relay", "memory://"], "--relay"),
    ):  # fmt: skip
        code, out, err = _run(*args)
        assert code == 2 and word in err, (args, out, err)
