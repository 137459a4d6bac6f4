"""Idempotency-Key with real server processes killed mid-request.

The order API of ``tests/frameworks/_http_apps.py`` runs in a server subprocess -- uvicorn
serving the FastAPI app (ASGI middleware, ``AsyncInbox``), or Django's ``runserver
--noreload`` (sync middleware, ``Inbox``) -- with the inbox and the view's ledger on
PostgreSQL: the view writes each order in one transaction with ``inbox.claim_in(conn)`` (the
request's key). A client fires 50 concurrent requests over 10 keys. The first request of two
keys stalls before its commit, that of a third key after its commit (the view's write is in,
its response never stored). Once they all stalled and the rest answered, the server is
SIGKILLed and started again, and the client retries every key until it gets an answer other
than "in flight" (409 with Retry-After).

Then: each key's order is in the ledger exactly once; every answer a key ever got, before and
after the kill, is the same stored response (the same order id as the ledger's), replayed on
every retry; the key whose write committed before the kill answers the documented
``idempotency-key-applied`` problem (stored: every retry gets it) and its order is not
written again; a reused key with a different body is answered 422.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobfence.integrations import http
from tests.frameworks._http_apps import Ledger
from tests.frameworks._support import Workers, wait_until, workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"order-{i}" for i in range(10)]
STALL_BEFORE = {"order-3", "order-7"}  # killed before the view's commit
STALL_AFTER = {"order-5"}  # killed after the view's commit, before the response was stored
TTL = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(framework: str, port: int) -> list[str]:
    if framework == "fastapi":
        return [
            *(sys.executable, "-m", "uvicorn", "--factory"),
            "tests.frameworks._http_apps:fastapi_from_env",
            *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
        ]
    return [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"]


class Server:
    """The API in a subprocess on a fixed port, started (again) on demand."""

    def __init__(self, framework: str, ledger: Ledger, pool: Workers) -> None:
        self.framework = framework
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pool = pool
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "JF_HTTP_INBOX": ledger.inbox_url,
            "JF_HTTP_SCHEMA": ledger.schema,
            "JF_HTTP_TTL": str(TTL),
            "DJANGO_SETTINGS_MODULE": "tests.frameworks._http_django_settings",
        }

    def start(self) -> None:
        self.proc = self.pool.start(_argv(self.framework, self.port), self.env)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.pool.logs()
            try:
                return httpx.get(self.url + "/orders", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until("the server to answer", up, timeout=60)

    def kill(self) -> None:
        assert self.proc is not None
        self.pool.kill(self.proc)


def _post(url: str, key: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    """POST /orders; a connection refused or reset before an answer is sent again (as any
    client does: the key makes that safe). A request cut by the server's death raises."""
    while True:
        try:
            with httpx.Client(timeout=120) as client:
                return client.post(
                    url + "/orders",
                    content=json.dumps(body).encode(),
                    headers={"content-type": "application/json", "Idempotency-Key": key, **headers},
                )
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            if "reset" not in str(exc).lower() and not isinstance(exc, httpx.ConnectError):
                raise
            time.sleep(0.05)
        except httpx.ReadError as exc:
            if "reset" not in str(exc).lower():
                raise
            time.sleep(0.05)


def _type(response: httpx.Response) -> str | None:
    if response.headers.get("content-type") == "application/problem+json":
        return str(response.json()["type"])
    return None


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    led = Ledger()
    led.create()
    try:
        yield led
    finally:
        led.drop()


@pytest.mark.parametrize("framework", ["fastapi", "django"])
def test_killed_server_each_key_once_every_retry_the_stored_response(
    framework: str, ledger: Ledger, tmp_path: Path
) -> None:
    with workers(tmp_path) as pool:
        server = Server(framework, ledger, pool)
        server.start()
        barrier = threading.Barrier(50)
        outcomes: list[tuple[str, Any]] = []
        lock = threading.Lock()

        def fire(i: int) -> None:
            key = KEYS[i % 10]
            stall = "before" if key in STALL_BEFORE else "after" if key in STALL_AFTER else None
            barrier.wait()
            try:
                got: Any = _post(
                    server.url, key, {"item": key}, {"X-Stall": stall} if stall else {}
                )
            except httpx.TransportError as exc:  # the server died under this request
                got = exc
            with lock:
                outcomes.append((key, got))

        with ThreadPoolExecutor(50) as executor:
            futures = [executor.submit(fire, i) for i in range(50)]
            stalled = len(STALL_BEFORE | STALL_AFTER)
            wait_until("the stalling requests to stall", lambda: ledger.started() == stalled)
            # every request but the stalled ones has its answer
            wait_until("the other requests' answers", lambda: len(outcomes) == 50 - stalled)
            server.kill()  # SIGKILL, mid-request
            for future in futures:
                future.result(timeout=60)
        cut = [k for k, got in outcomes if isinstance(got, Exception)]
        assert sorted(cut) == sorted(STALL_BEFORE | STALL_AFTER), outcomes

        server.start()  # a new process, same port, same inbox
        restarted = time.monotonic()
        busy = 0
        retries: dict[str, list[httpx.Response]] = {k: [] for k in KEYS}
        for key in KEYS:
            deadline = time.monotonic() + 60
            while True:  # until the key is no longer in flight (its dead claim expires)
                got = _post(server.url, key, {"item": key}, {})
                if _type(got) != http.PROBLEM_IN_FLIGHT:
                    break
                assert time.monotonic() < deadline, "the dead request's key was never freed"
                busy += 1
                time.sleep(float(got.headers["retry-after"]))
            retries[key].append(got)
            for _ in range(3):  # and a few more retries: each the stored response
                retries[key].append(_post(server.url, key, {"item": key}, {}))
        reused = _post(server.url, KEYS[0], {"item": "something else"}, {})
        server.kill()
        answered = [got for _, got in outcomes if not isinstance(got, Exception)]
        fresh = sum(
            a.status_code == 201 and "idempotent-replayed" not in a.headers for a in answered
        )
        print(  # the figures of the run (pytest -s shows them)
            f"{framework}: before the kill {len(answered)} answers: "
            f"{fresh} first responses, "
            f"{sum(a.headers.get('idempotent-replayed') == 'true' for a in answered)} replays, "
            f"{sum(a.status_code == 409 for a in answered)} 409 in flight, {len(cut)} cut by "
            f"the kill; after the restart {busy} 409 in flight until the dead claims expired, "
            f"{sum(len(v) for v in retries.values())} retries answered in "
            f"{time.monotonic() - restarted:.1f} s"
        )

    rows = ledger.rows()
    assert rows == {f"http::{k}": 1 for k in KEYS}, rows  # each key's effect exactly once
    orders = ledger.orders()
    assert reused.status_code == 422 and _type(reused) == http.PROBLEM_REUSED
    for key in KEYS:
        answers = [got for k, got in outcomes if k == key and not isinstance(got, Exception)]
        successes = [a for a in answers if a.status_code == 201]
        after = retries[key]
        if key in STALL_AFTER:
            # its write committed, its response was never stored: the documented answer,
            # stored, on every retry; and the order was not written again
            assert after[0].status_code == http.APPLIED_STATUS
            assert _type(after[0]) == http.PROBLEM_APPLIED
            assert all(a.content == after[0].content for a in after)
            assert all(a.headers.get("idempotent-replayed") == "true" for a in after[1:])
            continue
        if key in STALL_BEFORE:
            assert not successes  # its only runner was killed before the commit
            assert after[0].status_code == 201  # the retry ran the view (once)
            first = after[0]
        else:
            assert successes, answers
            first = successes[0]
        assert first.json()["order"] == orders[f"http::{key}"]
        for answer in answers:  # before the kill: the first response, or "in flight"
            assert answer.status_code == 201 or _type(answer) == http.PROBLEM_IN_FLIGHT
            if answer.status_code == 201:
                assert answer.content == first.content
        for answer in after[1:] if key in STALL_BEFORE else after:
            assert answer.status_code == 201
            assert answer.headers["idempotent-replayed"] == "true"
            assert answer.content == first.content  # the same body as the first success
