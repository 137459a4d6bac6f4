"""Idempotency-Key on FastAPI (ASGI middleware), Flask and Django: one spec, run on each
framework through its own test client, with the inbox on PostgreSQL, Redis and SQLite; then
concurrent duplicates and a client timeout through real HTTP servers.

Every test counts how many times the view ran (``state.calls``) or, with the PostgreSQL
ledger, how many rows each key wrote in the view's own transaction (``claim_in``).
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import jobfence
from jobfence.integrations import http
from tests.frameworks._http_apps import Ledger, State
from tests.frameworks._http_harness import (
    FRAMEWORKS,
    Reply,
    http_post,
    real_server,
    wait_for,
    with_test_client,
)
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = [
    pytest.mark.timeout(120),
    # starlette's TestClient asks for httpx2, which the suite does not install
    pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`"),
]

BACKENDS = ("postgres", "redis", "sqlite")


def _url(backend: str, tmp_path: Path) -> str:
    table = f"jf_http_{uuid.uuid4().hex[:10]}"
    if backend == "postgres":
        return f"{POSTGRES_URL}?table={table}"
    if backend == "redis":
        return f"{REDIS_URL}?table={table}"
    return f"sqlite:///{tmp_path / 'inbox.db'}?table={table}"


@pytest.fixture(params=BACKENDS)
def inbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = _url(request.param, tmp_path)
    yield url
    with jobfence.Inbox(url) as inbox:
        inbox.drop()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    url = _url("redis", tmp_path)
    yield url
    with jobfence.Inbox(url) as inbox:
        inbox.drop()


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    led = Ledger()
    led.create()
    try:
        yield led
    finally:
        led.drop()


def _problem(reply: Reply, status: int, kind: str) -> dict[str, Any]:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = reply.json()
    assert body["type"] == kind and body["status"] == status, body
    return body


def _inbox_key(key: str, caller: str = "") -> str:
    return f"http:{caller}:{key}"


# --- the spec, on every framework and inbox backend --------------------------------------------


def test_a_retry_gets_the_first_response_and_the_view_runs_once(
    framework: str, inbox_url: str
) -> None:
    with with_test_client(framework, inbox_url) as app:
        first = app.post("k-1", body={"item": "tea"})
        again = app.post("k-1", body={"item": "tea"})
        other = app.post("k-2", body={"item": "tea"})
        assert first.status == 201 and not first.replayed
        assert again.status == 201 and again.replayed
        assert again.body == first.body  # the same order, not a new one
        assert again.headers["location"] == first.headers["location"]
        assert again.headers["content-type"] == "application/json"
        assert "x-extra" in first.headers and "x-extra" not in again.headers  # not stored
        assert other.status == 201 and other.json()["order"] != first.json()["order"]
        assert app.state.calls == 2


def test_the_same_key_on_another_request_is_422(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url) as app:
        assert app.post("k", body={"item": "tea"}).status == 201
        _problem(app.post("k", body={"item": "coffee"}), 422, http.PROBLEM_REUSED)
        _problem(app.request("POST", "/orders?x=1", key="k"), 422, http.PROBLEM_REUSED)
        _problem(app.request("PATCH", "/orders", key="k"), 422, http.PROBLEM_REUSED)
        assert app.state.calls == 1
        assert app.post("k", body={"item": "tea"}).replayed  # the original still replays


def test_requests_without_a_key_or_not_covered_run_every_time(
    framework: str, inbox_url: str
) -> None:
    with with_test_client(framework, inbox_url) as app:
        assert app.post().status == 201
        assert app.post().status == 201
        got = app.request("GET", "/orders", body=b"", key="k-get")
        assert got.status == 200 and not got.replayed
        assert app.request("GET", "/orders", body=b"", key="k-get").status == 200
        assert app.state.calls == 2


def test_required_key_missing_is_400(framework: str, redis_url: str) -> None:
    with with_test_client(framework, redis_url, required=True) as app:
        _problem(app.post(), 400, http.PROBLEM_MISSING)
        assert app.request("GET", "/orders", body=b"").status == 200
        assert app.post("k").status == 201
        assert app.state.calls == 1


def test_a_duplicate_in_flight_is_409_with_retry_after_then_replays(
    framework: str, inbox_url: str
) -> None:
    with with_test_client(framework, inbox_url) as app:
        first: list[Reply] = []
        slow = threading.Thread(
            target=lambda: first.append(app.post("k-slow", headers=[("X-Sleep", "3")]))
        )
        slow.start()
        with jobfence.Inbox(inbox_url) as inbox:
            wait_for("the first request's claim", lambda: inbox.claim_info(_inbox_key("k-slow")))
        busy = app.post("k-slow")
        _problem(busy, 409, http.PROBLEM_IN_FLIGHT)
        assert busy.headers["retry-after"] == "1"
        slow.join(30)
        assert first[0].status == 201
        later = app.post("k-slow")
        assert later.replayed and later.body == first[0].body
        assert app.state.calls == 1


def test_wait_turns_the_409_into_the_first_response(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url, wait=10) as app:
        first: list[Reply] = []
        slow = threading.Thread(
            target=lambda: first.append(app.post("k-wait", headers=[("X-Sleep", "1")]))
        )
        slow.start()
        with jobfence.Inbox(inbox_url) as inbox:
            wait_for("the first request's claim", lambda: inbox.claim_info(_inbox_key("k-wait")))
        waited = app.post("k-wait")
        slow.join(30)
        assert waited.status == 201 and waited.replayed
        assert waited.body == first[0].body
        assert app.state.calls == 1


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_are_not_stored(framework: str, redis_url: str, status: int) -> None:
    with with_test_client(framework, redis_url) as app:
        failed = app.post("k-err", headers=[("X-Status", str(status))])
        assert failed.status == status and not failed.replayed
        ok = app.post("k-err")
        assert ok.status == 201 and not ok.replayed  # the view ran again
        assert app.post("k-err").body == ok.body
        assert app.state.calls == 2


def test_an_exception_releases_the_key(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url) as app:
        assert app.post("k-raise", headers=[("X-Raise", "1")]).status == 500
        ok = app.post("k-raise")
        assert ok.status == 201 and not ok.replayed
        assert app.state.calls == 1  # the raising run never counted


def test_client_errors_are_stored(framework: str, redis_url: str) -> None:
    with with_test_client(framework, redis_url) as app:
        refused = app.post("k-400", headers=[("X-Status", "400")])
        again = app.post("k-400")
        assert refused.status == again.status == 400
        assert again.replayed and again.body == refused.body
        assert app.state.calls == 1


def _caller_hook(framework: str) -> Any:
    if framework == "fastapi":
        return lambda scope: dict(scope["headers"]).get(b"x-user", b"").decode() or None
    if framework == "flask":
        return lambda request: request.headers.get("X-User")
    return lambda request: request.headers.get("X-User")


def test_caller_scope_keeps_callers_apart(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url, caller=_caller_hook(framework)) as app:
        alice = app.post("shared", headers=[("X-User", "alice")])
        bob = app.post("shared", headers=[("X-User", "bob")])
        assert alice.status == bob.status == 201
        assert alice.json()["order"] != bob.json()["order"]  # bob did not get alice's order
        assert alice.json()["key"] == "http:alice:shared"
        # a caller named like another's scope plus key cannot reach it: ':' is escaped
        mallory = app.post("shared", headers=[("X-User", "alice:shared")])
        assert mallory.json()["key"] == "http:alice%3Ashared:shared"
        again = app.post("shared", headers=[("X-User", "alice")])
        assert again.replayed and again.body == alice.body
        assert app.state.calls == 3


def test_a_dead_requests_key_is_taken_over_after_its_ttl(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url, ttl=1) as app:
        with jobfence.Inbox(inbox_url) as dead:
            # a server that claimed the key, then died (never completed, never released)
            dead.claim(_inbox_key("k-dead"), ttl=1)
            _problem(app.post("k-dead"), 409, http.PROBLEM_IN_FLIGHT)
            wait_for(
                "the dead claim's ttl",
                lambda: (info := dead.claim_info(_inbox_key("k-dead"))) and info.expires_in <= 0,
            )
        taken = app.post("k-dead")
        assert taken.status == 201 and not taken.replayed
        assert app.post("k-dead").body == taken.body
        assert app.state.calls == 1


def test_a_key_lives_for_its_retention_then_is_new(framework: str, inbox_url: str) -> None:
    with with_test_client(framework, inbox_url, retention=1) as app:
        first = app.post("k-short")
        assert app.post("k-short").replayed
        with jobfence.Inbox(inbox_url) as inbox:
            wait_for(
                "the key's retention to end",
                lambda: (
                    (info := inbox.claim_info(_inbox_key("k-short"))) is None
                    or info.expires_in <= 0
                ),
            )
        later = app.post("k-short")
        assert later.status == 201 and not later.replayed  # a new operation under an old key
        assert later.json()["order"] != first.json()["order"]
        assert app.state.calls == 2


def test_a_view_slower_than_ttl_keeps_its_key(framework: str, redis_url: str) -> None:
    """The claim is renewed while the view runs: a retry during a view that outlasts ``ttl``
    is still "in flight", never a second run."""
    with with_test_client(framework, redis_url, ttl=0.6) as app:
        first: list[Reply] = []
        slow = threading.Thread(
            target=lambda: first.append(app.post("k-long", headers=[("X-Sleep", "4")]))
        )
        slow.start()
        with jobfence.Inbox(redis_url) as inbox:
            wait_for("the first request's claim", lambda: inbox.claim_info(_inbox_key("k-long")))
            renewed = wait_for(
                "a renewal past the first ttl",
                lambda: (
                    (info := inbox.claim_info(_inbox_key("k-long")))
                    and info.claimed_at is not None
                    and info.expires_in > 0
                    and slow.is_alive()
                    and _claimed_for(info) > 0.9
                ),
            )
        assert renewed
        _problem(app.post("k-long"), 409, http.PROBLEM_IN_FLIGHT)
        slow.join(30)
        assert first[0].status == 201
        assert app.post("k-long").body == first[0].body
        assert app.state.calls == 1


def _claimed_for(info: Any) -> float:
    """Seconds since the claim of ``info`` was taken."""
    import datetime

    return (datetime.datetime.now(datetime.timezone.utc) - info.claimed_at).total_seconds()


# --- the view's own write: claim_in (PostgreSQL) ------------------------------------------------


def test_claim_in_commits_the_key_with_the_views_write(framework: str, ledger: Ledger) -> None:
    with with_test_client(framework, ledger.inbox_url, State(ledger)) as app:
        first = app.post("k-ledger", body={"item": "tea"})
        again = app.post("k-ledger", body={"item": "tea"})
        assert again.replayed and again.body == first.body
        assert ledger.rows() == {_inbox_key("k-ledger"): 1}
        assert ledger.orders()[_inbox_key("k-ledger")] == first.json()["order"]
        app.state.close()


def test_a_key_applied_by_a_request_that_died_is_never_applied_again(
    framework: str, ledger: Ledger
) -> None:
    key = _inbox_key("k-applied")
    with jobfence.Inbox(ledger.inbox_url) as dead:
        # a server claimed the key, committed the view's write with claim_in, then died
        # before storing the response
        dead.claim(key, ttl=1)
        import psycopg

        with psycopg.connect(ledger.dsn) as conn, conn.transaction():
            assert dead.claim_in(conn, key)
            conn.execute(
                f"INSERT INTO {ledger.schema}.orders (k, order_id) VALUES (%s, 'lost')", (key,)
            )
        wait_for("the dead claim's ttl", lambda: dead.claim_info(key).expires_in <= 0)
    with with_test_client(framework, ledger.inbox_url, State(ledger), ttl=1) as app:
        answer = app.post("k-applied")
        body = _problem(answer, http.APPLIED_STATUS, http.PROBLEM_APPLIED)
        assert not answer.replayed
        again = app.post("k-applied")
        assert again.replayed and again.json() == body  # stored: every retry gets it
        assert ledger.rows() == {key: 1}  # the order was not written a second time
        app.state.close()


# --- hostile input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("x" * 256, id="256-chars"),
        pytest.param("x" * 20_000, id="20000-chars"),
        pytest.param("", id="empty"),
        pytest.param('""', id="empty-quoted"),
        pytest.param("ключ".encode(), id="non-ascii-utf8"),
        pytest.param("a\x01b", id="control-char"),
        pytest.param("a b", id="bare-with-space"),
        pytest.param('"abc', id="unclosed-quote"),
        pytest.param('"a"; p=1', id="sf-parameters"),
        pytest.param('"a", "b"', id="a-list"),
        pytest.param('"a\\xb"', id="bad-escape"),
    ],
)
def test_invalid_keys_are_400_and_run_nothing(
    framework: str, redis_url: str, value: str | bytes
) -> None:
    with with_test_client(framework, redis_url) as app:
        got = app.post(headers=[("Idempotency-Key", value)])
        _problem(got, 400, http.PROBLEM_INVALID)
        assert app.state.calls == 0


def test_two_key_headers_are_400(framework: str, redis_url: str) -> None:
    with with_test_client(framework, redis_url) as app:
        got = app.post(headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
        _problem(got, 400, http.PROBLEM_INVALID)
        assert app.state.calls == 0


def test_quoted_and_bare_forms_are_one_key(framework: str, redis_url: str) -> None:
    with with_test_client(framework, redis_url) as app:
        bare = app.post("abc-123")
        quoted = app.post('"abc-123"')
        assert quoted.replayed and quoted.body == bare.body
        escaped = app.post('"say \\"hi\\" 255"')
        assert escaped.status == 201 and escaped.json()["key"] == 'http::say "hi" 255'
        longest = app.post("k" * 255)
        assert longest.status == 201
        assert app.state.calls == 3


def test_a_body_over_max_body_is_413(framework: str, redis_url: str) -> None:
    with with_test_client(framework, redis_url, max_body=1000) as app:
        big = app.post("k-big", body={"item": "x" * 5000})
        _problem(big, 413, "urn:jobfence:problem:idempotency-body-too-large")
        assert app.post("k-small", body={"item": "x" * 100}).status == 201
        assert app.post(body={"item": "x" * 5000}).status == 201  # no key: not our business
        assert app.state.calls == 2


# --- real HTTP servers ------------------------------------------------------------------------


def test_50_concurrent_requests_over_10_keys_apply_each_key_once(
    framework: str, ledger: Ledger
) -> None:
    keys = [f"order-{i}" for i in range(10)]
    with real_server(framework, ledger.inbox_url, State(ledger)) as (url, state):
        barrier = threading.Barrier(50)

        def fire(i: int) -> Reply:
            key = keys[i % 10]
            with httpx.Client(timeout=60) as client:
                barrier.wait()
                return http_post(client, url, key, {"item": key}, headers={"X-Sleep": "0.2"})

        with ThreadPoolExecutor(50) as pool:
            replies = list(pool.map(fire, range(50)))
        # then every key once more, after all finished: the stored response
        with httpx.Client(timeout=60) as client:
            final = {k: http_post(client, url, k, {"item": k}) for k in keys}
        state.close()
    rows = ledger.rows()
    assert rows == {_inbox_key(k): 1 for k in keys}, rows  # each key's effect exactly once
    orders = ledger.orders()
    for i, reply in enumerate(replies):
        key = keys[i % 10]
        if reply.status == 409:
            assert reply.json()["type"] == http.PROBLEM_IN_FLIGHT
            continue
        assert reply.status == 201, (reply.status, reply.body)
        assert reply.json()["order"] == orders[_inbox_key(key)]  # the one stored response
    fresh = [r for r in replies if r.status == 201 and not r.replayed]
    assert len(fresh) == 10
    for key, reply in final.items():
        assert reply.replayed and reply.json()["order"] == orders[_inbox_key(key)]


def test_a_retry_after_a_client_timeout_gets_the_stored_response(
    framework: str, inbox_url: str
) -> None:
    with real_server(framework, inbox_url) as (url, state):
        with httpx.Client(timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
            http_post(impatient, url, "k-timeout", {"item": "tea"}, headers={"X-Sleep": "1.5"})
        with jobfence.Inbox(inbox_url) as inbox:
            wait_for(
                "the slow request's stored response",
                lambda: (
                    (info := inbox.claim_info(_inbox_key("k-timeout")))
                    and info.state is jobfence.ClaimState.COMPLETED
                ),
            )
        with httpx.Client(timeout=30) as client:
            retry = http_post(client, url, "k-timeout", {"item": "tea"})
        assert retry.status == 201 and retry.replayed
        assert retry.json()["n"] == 1 and state.calls == 1


# --- telemetry, options ------------------------------------------------------------------------


def test_the_outcomes_are_counted(redis_url: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from jobfence import telemetry

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry.configure(meter_provider=meters)
    try:
        with with_test_client("fastapi", redis_url) as app:
            app.post("k")
            app.post("k")
            app.post("k", body={"item": "other"})
            app.post("bad key")
        counts: dict[str, int] = {}
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data is not None else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "jobfence.http.idempotency":
                        for point in metric.data.data_points:
                            counts[str(point.attributes["outcome"])] = int(point.value)
        assert counts == {"new": 1, "replayed": 1, "mismatch": 1, "invalid": 1}
    finally:
        telemetry.configure()
        meters.shutdown()


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"methods": "POST"}, "methods"),
        ({"header": "Bad Header"}, "header"),
        ({"ttl": 0}, "ttl"),
        ({"wait": -1}, "wait"),
        ({"max_body": -1}, "max_body"),
        ({"caller": "not callable"}, "caller"),
        ({"headers": ["ok", "not ok"]}, "headers"),
    ],
)
def test_bad_options_name_the_argument(options: dict[str, Any], argument: str) -> None:
    from jobfence.integrations.asgi import IdempotencyKeyMiddleware

    with pytest.raises(jobfence.ConfigurationError) as err:
        IdempotencyKeyMiddleware(lambda *a: None, inbox="redis://127.0.0.1:6379/0", **options)
    assert err.value.argument == argument


def test_a_retention_differing_from_the_inbox_is_refused() -> None:
    from jobfence.integrations.flask import IdempotencyKey

    with jobfence.Inbox("memory://", retention=100) as inbox:
        with pytest.raises(jobfence.ConfigurationError) as err:
            IdempotencyKey(inbox=inbox, retention=200)
        assert err.value.argument == "retention"
        IdempotencyKey(inbox=inbox, retention=100)


def test_stored_responses_are_json(redis_url: str) -> None:
    """What the inbox stores is the documented shape (readable with ``inbox.claims``)."""
    with with_test_client("flask", redis_url) as app:
        first = app.post("k-shape")
    with jobfence.Inbox(redis_url) as inbox:
        claim = inbox.claim(_inbox_key("k-shape"))
        assert claim.state is jobfence.ClaimState.COMPLETED
        stored = claim.result
    assert stored["status"] == 201
    assert dict(map(tuple, stored["headers"]))["location"] == first.headers["location"]
    assert json.loads(base64.b64decode(stored["body"])) == first.json()


# --- Django's async middleware stack (ASGI) ---------------------------------------------------


async def test_django_async_stack_uses_an_async_inbox(ledger: Ledger) -> None:
    from django.test import AsyncClient
    from django.test.utils import override_settings

    from jobfence.integrations.django import IdempotencyKeyMiddleware
    from tests.frameworks import _http_apps as apps
    from tests.frameworks._http_harness import _django_setup

    _django_setup()
    inbox = jobfence.AsyncInbox(ledger.inbox_url)
    state = State(ledger)
    apps.DJANGO_STATE = state
    try:
        with override_settings(JOBFENCE_IDEMPOTENCY={"inbox": inbox}):
            client = AsyncClient()
            kw: dict[str, Any] = {
                "content_type": "application/json",
                "headers": {"Idempotency-Key": "k-async"},
            }
            first = await client.post("/orders", b'{"item": "tea"}', **kw)
            again = await client.post("/orders", b'{"item": "tea"}', **kw)
            other = await client.post("/orders", b'{"item": "cake"}', **kw)
            with pytest.raises(jobfence.ConfigurationError):  # a sync stack needs an Inbox
                IdempotencyKeyMiddleware(lambda request: None)
    finally:
        apps.DJANGO_STATE = None
        state.close()
        await inbox.close()
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert other.status_code == 422
    assert ledger.rows() == {_inbox_key("k-async"): 1}  # claim_in in the sync view's thread
    assert state.calls == 1


def test_django_settings_are_checked_and_hooks_may_be_dotted_paths(redis_url: str) -> None:
    from django.test.utils import override_settings

    from jobfence.integrations.django import IdempotencyKeyMiddleware
    from tests.frameworks._http_harness import _django_setup

    _django_setup()
    with override_settings(JOBFENCE_IDEMPOTENCY={"inbox": redis_url, "wiat": 1}):
        with pytest.raises(jobfence.ConfigurationError) as err:
            IdempotencyKeyMiddleware(lambda request: None)
        assert "'wiat'" in str(err.value)
    hook = "tests.frameworks.test_http_idempotency._django_caller"
    with override_settings(JOBFENCE_IDEMPOTENCY={"inbox": redis_url, "caller": hook}):
        middleware = IdempotencyKeyMiddleware(lambda request: None)
        assert middleware.options.caller is _django_caller
        middleware.core.close()


def _django_caller(request: Any) -> str | None:
    return None


def test_inbox_keys_of_callers_never_meet() -> None:
    """The scope is escaped (and a long one hashed) so that no caller's scope plus key is
    another's."""
    from jobfence.integrations.http import IdempotencyOptions

    opts = IdempotencyOptions.of(caller=lambda request: request)
    long = "u" * 600
    keys = {
        opts.inbox_key("k", None),
        opts.inbox_key("k", "a"),
        opts.inbox_key("b:k", "a"),
        opts.inbox_key("k", "a:b"),
        opts.inbox_key("k", "a%3Ab"),
        opts.inbox_key("k", long),
        opts.inbox_key("k", long + "v"),
    }
    assert len(keys) == 7
    assert opts.inbox_key("k", long).startswith("http:%sha256-")
    assert len(opts.inbox_key("k" * 255, long).encode()) <= 1024


def test_the_asgi_middleware_and_the_core_import_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, jobfence.integrations.asgi, jobfence.integrations.http; "
        "print(sorted(m for m in ('starlette', 'fastapi', 'flask', 'django') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
