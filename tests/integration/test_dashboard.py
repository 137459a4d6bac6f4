"""``jobfence dashboard``: a real dashboard process against real Redis and SQLite, over HTTP
with urllib (the JSON API and its defences) and in a real headless Chromium driven by
Playwright (the page: rows, countdown, confirmation dialog, actions)."""

from __future__ import annotations

import re
import socket
import textwrap
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from tests.conformance.specs import new_namespace
from tests.netproxy import FaultProxy
from tests.servers import REDIS_URL, delete_redis_keys

from ._dashboard import Running, dashboard

pytestmark = pytest.mark.timeout(120)

TTL = 60.0
CHROMIUM = Path("/usr/bin/chromium")
JSON = {"Content-Type": "application/json"}
#: a time left as the page shows it
LEFT = re.compile(r"^\d+\.\ds$")


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = new_namespace()
    yield ns
    delete_redis_keys(f"{ns}*")


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dead_letter(url: str, queue: str, error: str) -> str:
    """Publish a message to ``queue`` and move it to the dead letters; its id."""
    with jobfence.Queue(url, queue) as q:
        msg_id = q.publish({"order": 42})
        [message] = q.receive(1, wait=5)
        assert message.dead_letter(error)
    return msg_id


def _action(board: Running, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    return board.request(
        path, body=body, headers={**JSON, "X-Jobfence-Token": board.token(), **headers}
    )


# -- the JSON API ---------------------------------------------------------------------------


def test_state_lists_each_url_and_reports_a_down_backend_alone(
    namespace: str, tmp_path: Path
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'q.db'}"
    down_url = f"redis://:s3cret-pw@127.0.0.1:{_closed_port()}/0"
    dead_id = _dead_letter(sqlite_url, "emails", "SMTPError: relay refused")
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("orders:42", ttl=TTL)
        args = ("--namespace", namespace, "--queue", "emails")
        with dashboard(REDIS_URL, down_url, sqlite_url, *args, tmp_path=tmp_path) as board:
            status, state = board.request("/api/state")
            raw = urllib.request.urlopen(board.base + "/api/state", timeout=30).read().decode()
            page = urllib.request.urlopen(board.base + "/", timeout=30).read().decode()
        assert lease.release()
    assert status == 200 and state["actions"] is False
    redis_t, down_t, sqlite_t = state["targets"]
    assert [t["id"] for t in state["targets"]] == [0, 1, 2]
    assert [t["backend"] for t in state["targets"]] == ["redis", "redis", "sqlite"]

    assert redis_t["locks"]["status"] == "ok" and redis_t["locks"]["namespace"] == namespace
    [row] = redis_t["locks"]["items"]
    assert (row["name"], row["owner"], row["token"]) == ("orders:42", lease.owner, lease.token)
    assert 0 < row["expires_in"] <= TTL

    # the backend that is down: an error on each of its panels, the others unaffected
    assert down_t["locks"]["status"] == "error" and "Connection" in down_t["locks"]["error"]
    assert down_t["inbox"]["status"] == "error" and "Connection" in down_t["inbox"]["error"]
    [down_queue] = down_t["queues"]
    assert down_queue["status"] == "error" and down_queue["name"] == "emails"
    assert "s3cret-pw" not in raw and "s3cret-pw" not in page  # masked everywhere
    assert down_t["url"] == f"redis://:***@127.0.0.1:{down_url.rsplit(':', 1)[1]}"

    [queue] = sqlite_t["queues"]
    assert queue["status"] == "ok"
    assert (queue["ready"], queue["delayed"], queue["in_flight"], queue["dead"]) == (0, 0, 0, 1)
    [dead] = queue["dead_letters"]
    assert dead["id"] == dead_id and dead["error"] == "SMTPError: relay refused"
    assert dead["deliveries"] == 1
    assert sqlite_t["locks"] == {
        "status": "ok",
        "namespace": namespace,
        "items": [],
        "truncated": False,
    }
    inbox = sqlite_t["inbox"]
    assert (inbox["status"], inbox["available"], inbox["table"]) == ("ok", True, "jobfence_inbox")
    assert inbox["counts"] == {"in_progress": 0, "completed": 0} and inbox["items"] == []


def test_a_backend_that_hangs_is_reported_while_the_others_answer(
    namespace: str, tmp_path: Path
) -> None:
    port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy(port) as proxy, jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("orders:42", ttl=TTL)
        hanging_url = proxy.url_for(REDIS_URL, port)
        args = ("--namespace", namespace)
        with dashboard(hanging_url, REDIS_URL, *args, tmp_path=tmp_path) as board:
            _, state = board.request("/api/state")
            assert [t["locks"]["status"] for t in state["targets"]] == ["ok", "ok"]
            proxy.stall()
            _, state = board.request("/api/state")
            hanging, working = state["targets"]
            assert hanging["locks"]["status"] == "error"
            assert [r["token"] for r in working["locks"]["items"]] == [lease.token]
            _, again = board.request("/api/state")  # the hung call is not started twice
            assert again["targets"][0]["locks"]["status"] == "error"
            assert [r["token"] for r in again["targets"][1]["locks"]["items"]] == [lease.token]
            proxy.resume()
            for _ in range(60):  # the hung call ends (answered or timed out), then it recovers
                _, state = board.request("/api/state")
                if state["targets"][0]["locks"]["status"] == "ok":
                    break
            assert [r["token"] for r in state["targets"][0]["locks"]["items"]] == [lease.token]
        assert lease.release()


def test_read_only_refuses_every_action(namespace: str, tmp_path: Path) -> None:
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("orders:42", ttl=TTL)
        with dashboard(REDIS_URL, "--namespace", namespace, tmp_path=tmp_path) as board:
            assert board.token() == ""  # the page carries no token
            page = urllib.request.urlopen(board.base + "/", timeout=30).read().decode()
            assert '<meta name="jobfence-actions" content="0">' in page
            for path, body in (
                ("/api/locks/break", {"target": 0, "name": "orders:42"}),
                ("/api/inbox/forget", {"target": 0, "key": "k"}),
                ("/api/inbox/purge", {"target": 0}),
                ("/api/queues/requeue", {"target": 0, "queue": "q", "ids": None}),
                ("/api/schedules/pause", {"scheduler": 0, "name": "beat"}),
                ("/api/schedules/resume", {"scheduler": 0, "name": "beat"}),
                ("/api/schedules/trigger", {"scheduler": 0, "name": "beat"}),
                ("/api/outbox/retry", {"outbox": 0, "ids": None}),
            ):
                status, answer = board.request(path, body=body, headers=JSON)
                assert status == 403 and "--allow-actions" in answer["error"], path
        assert locks.holder("orders:42") is not None  # still held
        assert lease.release()


def test_actions_need_the_token_the_host_and_json(namespace: str, tmp_path: Path) -> None:
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("orders:42", ttl=TTL)
        args = ("--namespace", namespace, "--allow-actions")
        with dashboard(REDIS_URL, *args, tmp_path=tmp_path) as board:
            token = board.token()
            assert len(token) >= 32
            body = {"target": 0, "name": "orders:42"}
            path = "/api/locks/break"

            status, answer = board.request(path, body=body, headers=JSON)
            assert status == 403 and "X-Jobfence-Token" in answer["error"]
            status, _ = board.request(
                path, body=body, headers={**JSON, "X-Jobfence-Token": token[:-1] + "x"}
            )
            assert status == 403
            # a rebound DNS name: refused for reading and for acting, even with the token
            foreign = {"Host": f"attacker.example:{board.port}"}
            status, answer = board.request("/api/state", headers=foreign)
            assert status == 421 and "Host" in answer["error"]
            status, _ = _action(board, path, body, **foreign)
            assert status == 421
            status, _ = _action(board, path, body, Host=f"127.0.0.1:{board.port + 1}")
            assert status == 421
            status, _ = _action(board, path, body, Origin="http://attacker.example")
            assert status == 403
            status, answer = _action(board, path, body, **{"Content-Type": "text/plain"})
            assert status == 415 and "application/json" in answer["error"]
            status, _ = _action(board, path, b"name=orders:42", **{"Content-Type": "text/plain"})
            assert status == 415
            status, answer = _action(board, path, {"target": 7, "name": "orders:42"})
            assert status == 400 and "target" in answer["error"]
            status, answer = _action(board, path, b"{not json")
            assert status == 400
            assert locks.holder("orders:42") is not None  # nothing refused went through

            # localhost names the server too
            status, answer = _action(board, path, body, Host=f"localhost:{board.port}")
            assert status == 200 and answer == {
                "broken": True,
                "owner": lease.owner,
                "token": lease.token,
            }
            assert locks.holder("orders:42") is None
            with pytest.raises(jobfence.LockLost):
                lease.extend()
            assert lease.lost
            status, answer = _action(board, path, body)
            assert status == 200 and answer["broken"] is False
        log = board.log()
    [line] = [line for line in log.splitlines() if "broken from the dashboard" in line]
    assert "WARNING jobfence.cli" in line and "'orders:42'" in line
    assert lease.owner in line and f"token {lease.token}" in line


def test_requeue_over_http(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    first = _dead_letter(url, "emails", "boom")
    second = _dead_letter(url, "emails", "boom again")
    with dashboard(url, "--queue", "emails", "--allow-actions", tmp_path=tmp_path) as board:
        path = "/api/queues/requeue"
        status, answer = _action(board, path, {"target": 0, "queue": "other", "ids": None})
        assert status == 400 and "other" in answer["error"]
        status, _ = _action(board, path, {"target": 0, "queue": "emails", "ids": []})
        assert status == 400
        status, answer = _action(board, path, {"target": 0, "queue": "emails", "ids": [first]})
        assert (status, answer) == (200, {"requeued": 1})
        _, state = board.request("/api/state")
        [queue] = state["targets"][0]["queues"]
        assert (queue["ready"], queue["dead"]) == (1, 1)
        assert [d["id"] for d in queue["dead_letters"]] == [second]
        status, answer = _action(board, path, {"target": 0, "queue": "emails", "ids": None})
        assert (status, answer) == (200, {"requeued": 1})
        log = board.log()
    assert "requeued from the dashboard" in log and "WARNING jobfence.cli" in log
    with jobfence.Queue(url, "emails") as q:
        counts = q.stats()
    assert (counts.ready, counts.dead) == (2, 0)
    # the queues the table holds are listed without --queue, unless told not to
    with dashboard(url, tmp_path=tmp_path) as board:
        _, state = board.request("/api/state")
        assert [q["name"] for q in state["targets"][0]["queues"]] == ["emails"]
    with dashboard(url, "--no-discover-queues", tmp_path=tmp_path) as board:
        _, state = board.request("/api/state")
        assert state["targets"][0]["queues"] == []


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from jobfence.cli.app import cli

    url = f"sqlite:///{tmp_path / 'x.db'}"
    for args, word in (
        ([], "JOBFENCE_URL"),
        (["nosuch://x"], "nosuch"),
        ([url, "--queue", "bad name!"], "name"),
        ([url, "--namespace", "not a namespace"], "namespace"),
        ([url, "--limit", "0"], "limit"),
        ([url, "--scheduler", "no_such_module_x:sched"], "--scheduler"),
        ([url, "--scheduler", "jobfence"], "module:object"),
        ([url, "--scheduler", "jobfence:Locks"], "not a jobfence Scheduler"),
    ):
        result = CliRunner().invoke(cli, ["dashboard", *args], env={"JOBFENCE_URL": ""})
        assert result.exit_code == 2 and word in result.stderr, (args, result.output)


def test_a_page_other_machines_can_reach_is_announced_on_stderr(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    # all interfaces, with the actions: a loud banner and a WARNING record
    with dashboard(url, "--host", "0.0.0.0", "--allow-actions", tmp_path=tmp_path) as board:
        status, _ = board.request("/api/state")
        assert status == 200  # it serves (on every interface, the loopback one included)
        err = board.log()
    assert "WARNING jobfence.dashboard:" in err
    assert f"listens on 0.0.0.0:{board.port} (every interface) with --allow-actions" in err
    assert "the page has no login" in err
    for action in ("break locks", "forget inbox records", "requeue dead letters"):
        assert action in err, err
    assert f"WARNING: anyone who can reach port {board.port} can break locks" in err
    assert "!" * 78 in err

    # all interfaces, read-only: the milder warning, no banner
    with dashboard(url, "--host", "0.0.0.0", tmp_path=tmp_path) as board:
        err = board.log()
    assert f"listens on 0.0.0.0:{board.port} (every interface), and the page has no login" in err
    assert "sees the lock names" in err and "read-only" in err
    assert "can break locks" not in err and "!" * 78 not in err

    # the default loopback address: nothing to warn about
    with dashboard(url, "--allow-actions", tmp_path=tmp_path) as board:
        err = board.log()
    assert "no login" not in err and "WARNING" not in err, err


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


def test_the_page_breaks_a_lock_after_confirmation(
    namespace: str, tmp_path: Path, page: Any
) -> None:
    from playwright.sync_api import expect

    name = "orders:42"
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire(name, ttl=TTL)
        other = locks.acquire("reports:nightly", ttl=TTL)
        args = ("--namespace", namespace)
        with dashboard(REDIS_URL, *args, tmp_path=tmp_path, page=page) as board:
            page.goto(board.base + "/")
            row = page.locator(f'tr[data-lock="{name}"]')
            expect(row).to_contain_text(lease.owner)
            expect(row.locator("td.token")).to_have_text(str(lease.token))
            expect(page.locator("#mode")).to_have_text("read-only")
            expect(page.get_by_role("button", name="Break")).to_have_count(0)

        with dashboard(REDIS_URL, *args, "--allow-actions", tmp_path=tmp_path, page=page) as board:
            page.goto(board.base + "/")
            row = page.locator(f'tr[data-lock="{name}"]')
            expect(row).to_contain_text(lease.owner)
            expect(row.locator("td.token")).to_have_text(str(lease.token))
            left = row.locator("td.left")
            expect(left).to_have_text(LEFT)
            first = left.inner_text()
            expect(left).not_to_have_text(first)  # it counts down between polls

            # Cancel leaves the lock alone
            row.get_by_role("button", name="Break").click()
            dialog = page.get_by_role("dialog")
            question = f"Break lock {name} held by {lease.owner} token {lease.token}?"
            expect(dialog).to_contain_text(question)
            dialog.get_by_role("button", name="Cancel").click()
            expect(dialog).to_be_hidden()
            assert locks.holder(name) is not None

            row.get_by_role("button", name="Break").click()
            expect(dialog).to_contain_text(question)
            dialog.get_by_role("button", name="Confirm").click()
            expect(row).to_have_count(0)
            expect(page.locator("#message")).to_have_text(f"broke {name}")
            expect(page.locator('tr[data-lock="reports:nightly"]')).to_have_count(1)
            log = board.log()
        assert locks.holder(name) is None
        with pytest.raises(jobfence.LockLost):
            lease.extend()
        assert lease.lost
        assert locks.holder("reports:nightly") is not None and other.release()
    assert "broken from the dashboard" in log


def test_the_page_requeues_a_dead_letter(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'q.db'}"
    dead_id = _dead_letter(url, "emails", "SMTPError: relay refused")
    args = ("--allow-actions",)  # no --queue: the dashboard finds the queue in the table
    with dashboard(url, *args, tmp_path=tmp_path, page=page) as board:
        page.goto(board.base + "/")
        queue = page.locator('section[data-queue="emails"]')
        expect(queue.locator("td.dead")).to_have_text("1")
        row = queue.locator(f'tr[data-dead="{dead_id}"]')
        expect(row).to_contain_text("SMTPError: relay refused")
        row.get_by_role("button", name="Requeue").click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text(f"Requeue dead letter {dead_id} of queue emails")
        dialog.get_by_role("button", name="Confirm").click()
        expect(row).to_have_count(0)
        expect(queue.locator("td.dead")).to_have_text("0")
        expect(queue.locator("td.ready")).to_have_text("1")
    with jobfence.Queue(url, "emails") as q:
        counts = q.stats()
    assert (counts.ready, counts.dead) == (1, 0)


def test_the_page_shows_a_down_backend_beside_a_working_one(
    namespace: str, tmp_path: Path, page: Any
) -> None:
    from playwright.sync_api import expect

    down_url = f"redis://:s3cret-pw@127.0.0.1:{_closed_port()}/0"
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("orders:42", ttl=TTL)
        with dashboard(
            down_url, REDIS_URL, "--namespace", namespace, tmp_path=tmp_path, page=page
        ) as b:
            page.goto(b.base + "/")
            down = page.locator('article[data-target="0"]')
            expect(down.locator(".locks .error")).to_contain_text("Connection")
            expect(page.locator('tr[data-lock="orders:42"]')).to_contain_text(lease.owner)
            assert "s3cret-pw" not in page.content()
        assert lease.release()


# -- inbox claims ----------------------------------------------------------------------------


def _until(check: Any, what: str) -> None:
    """Poll ``check()`` (a backend read) until it is true, for at most 30 s."""
    for _ in range(600):
        if check():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"never became true: {what}")


def _inbox_with_claims(url: str) -> tuple[Any, Any]:
    """An inbox at ``url`` with one completed record whose retention has passed, one claim in
    progress and one stuck claim; returns (the claim in progress, the stuck claim)."""
    with jobfence.Inbox(url, retention=0.2) as short:
        short.install()
        short.claim("order-1").complete({"ok": True})
    with jobfence.Inbox(url) as inbox:
        working = inbox.claim("order-2", ttl=TTL)
        stuck = inbox.claim("order-3", ttl=0.2)
        _until(lambda: inbox.claim_info("order-3").stuck, "order-3 is stuck")
        _until(lambda: inbox.claim_info("order-1").expires_in <= 0, "order-1 expired")
    return working, stuck


def test_inbox_claims_forget_and_purge_over_http(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    working, stuck = _inbox_with_claims(url)
    with dashboard(url, "--allow-actions", tmp_path=tmp_path) as board:
        _, state = board.request("/api/state")
        panel = state["targets"][0]["inbox"]
        assert panel["status"] == "ok" and panel["available"] is True
        assert panel["counts"] == {"in_progress": 2, "completed": 1}
        [row] = panel["items"]
        assert (row["key"], row["state"], row["stuck"]) == ("order-3", "in_progress", True)
        assert row["owner"] == stuck.owner and row["expires_in"] <= 0 and row["attempt"] == 1
        [row] = panel["in_progress"]
        assert (row["key"], row["owner"], row["stuck"]) == ("order-2", working.owner, False)
        assert 0 < row["expires_in"] <= TTL

        status, answer = _action(board, "/api/inbox/forget", {"target": 0, "key": "order-3"})
        assert (status, answer) == (200, {"forgotten": True})
        status, answer = _action(board, "/api/inbox/forget", {"target": 0, "key": "order-3"})
        assert (status, answer) == (200, {"forgotten": False})
        status, answer = _action(board, "/api/inbox/purge", {"target": 0})
        assert (status, answer) == (200, {"purged": 1})
        _, state = board.request("/api/state")
        panel = state["targets"][0]["inbox"]
        assert panel["counts"] == {"in_progress": 1, "completed": 0} and panel["items"] == []
        log = board.log()
    assert "'order-3'" in log and "forgotten from the dashboard" in log
    assert "purged from the dashboard" in log
    with jobfence.Inbox(url) as inbox:
        assert inbox.claim_info("order-3") is None and inbox.claim_info("order-1") is None
        assert inbox.claim_info("order-2") is not None


def test_the_page_lists_a_stuck_claim_and_forgets_it(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    _, stuck = _inbox_with_claims(url)
    with dashboard(url, "--allow-actions", tmp_path=tmp_path, page=page) as board:
        page.goto(board.base + "/")
        inbox = page.locator("section.inbox")
        expect(inbox.locator("p.counts")).to_have_text("in progress: 2, completed: 1; stuck: 1")
        row = inbox.locator('tr[data-claim="order-3"]')
        expect(row).to_contain_text("(stuck)")
        expect(row).to_contain_text(stuck.owner)
        expect(row.locator("td.left")).to_have_text("expired")
        row.get_by_role("button", name="Forget").click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text("Forget inbox key order-3")
        dialog.get_by_role("button", name="Confirm").click()
        expect(row).to_have_count(0)
        expect(inbox.locator('tr[data-claim="order-2"]')).to_have_count(1)
    with jobfence.Inbox(url) as inbox:
        assert inbox.claim_info("order-3") is None


# -- schedules -------------------------------------------------------------------------------

SCHEDULE_APP = """
import jobfence

sched = jobfence.Scheduler({url!r}, namespace={table!r}, pod="dashboard-pod")


@sched.every(seconds=60, name="beat")
def beat() -> None:
    pass


@sched.cron("30 3 * * *", tz="Europe/Paris", name="nightly")
def nightly() -> None:
    pass
"""


def _schedule_app(tmp_path: Path, url: str, table: str) -> tuple[str, jobfence.Scheduler]:
    """Write the application's scheduler module into ``tmp_path`` (the dashboard's working
    directory); return its ``MODULE:OBJ`` and the same schedules as a worker process of the
    test builds them, after it fired ``beat``'s current slot."""
    module = "sched_" + uuid.uuid4().hex[:8]
    source = SCHEDULE_APP.format(url=url, table=table)
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    worker = jobfence.Scheduler(url, namespace=table, pod="worker-1")
    worker.add("beat", every=60, target=lambda: None)
    worker.add("nightly", cron="30 3 * * *", tz="Europe/Paris", target=lambda: None)
    [fired] = worker.tick()
    assert fired.outcome == "fired"
    return f"{module}:sched", worker


def test_schedule_actions_refuse_what_the_dashboard_does_not_show(
    namespace: str, tmp_path: Path
) -> None:
    table = f"{namespace}_inbox"
    spec, worker = _schedule_app(tmp_path, REDIS_URL, table)
    with worker, jobfence.Inbox(REDIS_URL, table=table) as inbox:
        before = [info.key for info in inbox.claims(prefix="schedule", limit=100)]
        args = ("--scheduler", spec, "--allow-actions")
        with dashboard(REDIS_URL, *args, tmp_path=tmp_path, cwd=tmp_path) as board:
            _, state = board.request("/api/state")
            [source] = state["schedulers"]
            assert (source["label"], source["status"]) == (spec, "ok")
            assert [s["name"] for s in source["schedules"]] == ["beat", "nightly"]
            assert source["schedules"][0]["last"]["pod"] == "worker-1"
            for path in ("/api/schedules/pause", "/api/schedules/trigger"):
                status, answer = _action(board, path, {"scheduler": 0, "name": "nosuch"})
                assert status == 400, answer
                assert answer["error"] == (
                    f"no schedule named 'nosuch' in scheduler {spec}; known: ['beat', 'nightly']"
                )
                for body, word in (
                    ({"scheduler": 1, "name": "beat"}, "scheduler must be from 0 to 0"),
                    ({"name": "beat"}, "scheduler must be an int"),
                    ({"scheduler": 0}, "name must be a non-empty string"),
                    ({"scheduler": 0, "name": ["beat"]}, "name must be a non-empty string"),
                ):
                    status, answer = _action(board, path, body)
                    assert status == 400 and word in answer["error"], (body, answer)
            # nothing refused went through
            assert [info.key for info in inbox.claims(prefix="schedule", limit=100)] == before
            assert worker.info("beat").paused is False

            status, answer = _action(
                board, "/api/schedules/pause", {"scheduler": 0, "name": "beat"}
            )
            assert (status, answer) == (
                200,
                {"schedule": "beat", "paused": True, "was_paused": False},
            )
            assert worker.info("beat").paused is True
            log = board.log()
    assert f"schedule 'beat' of scheduler {spec} paused from the dashboard by" in log
    assert "WARNING jobfence.cli" in log

    # without --scheduler there is no scheduler to act on
    with dashboard(REDIS_URL, "--allow-actions", tmp_path=tmp_path) as board:
        status, answer = _action(board, "/api/schedules/resume", {"scheduler": 0, "name": "beat"})
        assert status == 400 and "--scheduler" in answer["error"]
    with jobfence.Scheduler(REDIS_URL, namespace=table) as reader:
        reader.add("beat", every=60, target=lambda: None)
        assert reader.info("beat").paused is True


def test_the_page_shows_the_schedules_and_pauses_one(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'app.db'}"
    spec, worker = _schedule_app(tmp_path, url, "app_inbox")
    with worker:
        args = ("--scheduler", spec)
        with dashboard(url, *args, tmp_path=tmp_path, page=page, cwd=tmp_path) as board:
            page.goto(board.base + "/")
            article = page.locator('article[data-scheduler="0"]')
            expect(article.locator("h2")).to_contain_text(f"scheduler {spec}")
            expect(article.locator('tr[data-schedule="beat"] td.state')).to_have_text("active")
            expect(article.get_by_role("button", name="Pause")).to_have_count(0)

        args = ("--scheduler", spec, "--allow-actions")
        with dashboard(url, *args, tmp_path=tmp_path, page=page, cwd=tmp_path) as board:
            page.goto(board.base + "/")
            article = page.locator('article[data-scheduler="0"]')
            beat = article.locator('tr[data-schedule="beat"]')
            expect(beat.locator("td.spec")).to_have_text("every 60")
            expect(beat.locator("td.tz")).to_have_text("UTC")
            expect(beat.locator("td.state")).to_have_text("active")
            expect(beat.locator("td.last")).to_contain_text("fired by worker-1 lag ")
            expect(beat.locator("td.misses")).to_have_text("0")
            expect(beat.locator("td.counts")).to_have_text("last 1 record(s): 1 fired")
            expect(beat.locator("td.next .next-at")).to_have_text(
                re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:00Z$")
            )
            next_in = beat.locator("td.next .next-in")
            expect(next_in).to_have_text(re.compile(r"^in \d+\.\ds$"))
            first = next_in.inner_text()
            expect(next_in).not_to_have_text(first)  # it counts down between polls
            history = article.locator('table[data-history="beat"] tbody tr')
            expect(history).to_have_count(1)
            expect(history).to_contain_text("worker-1")
            nightly = article.locator('tr[data-schedule="nightly"]')
            expect(nightly.locator("td.spec")).to_have_text("cron 30 3 * * * Europe/Paris")
            expect(nightly.locator("td.tz")).to_have_text("Europe/Paris")
            expect(nightly.locator("td.last")).to_have_text("never")

            # Cancel leaves it running
            beat.get_by_role("button", name="Pause").click()
            dialog = page.get_by_role("dialog")
            question = f"Pause schedule beat of {spec} on every process?"
            expect(dialog).to_contain_text(question)
            dialog.get_by_role("button", name="Cancel").click()
            expect(dialog).to_be_hidden()
            assert worker.info("beat").paused is False

            beat.get_by_role("button", name="Pause").click()
            expect(dialog).to_contain_text(question)
            dialog.get_by_role("button", name="Confirm").click()
            expect(page.locator("#message")).to_have_text("paused beat")
            expect(beat.locator("td.state")).to_have_text("paused")
            expect(beat.get_by_role("button", name="Resume")).to_have_count(1)
            assert worker.info("beat").paused is True  # every process sees it

            # a trigger fires in the dashboard's process
            nightly.get_by_role("button", name="Trigger").click()
            expect(dialog).to_contain_text(f"Fire schedule nightly of {spec} once now")
            dialog.get_by_role("button", name="Confirm").click()
            expect(page.locator("#message")).to_contain_text("nightly: fired schedule:nightly@")
            expect(nightly.locator("td.last")).to_contain_text("(triggered) by dashboard-pod")
            log = board.log()
        [fire] = worker.history("nightly")
        assert (fire.outcome, fire.pod) == ("fired", "dashboard-pod")
        assert "+manual-" in fire.key
    assert "paused from the dashboard" in log and "triggered from the dashboard" in log
