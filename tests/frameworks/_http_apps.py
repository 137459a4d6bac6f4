"""The same small order API in FastAPI, Flask and Django, for the Idempotency-Key tests.

``POST /orders`` creates an order: a JSON answer ``{"order": <new id>, "item": ..., "n": <how
many times a view ran in this app>, "pid": ...}``, status 201, headers ``Location`` and
``X-Extra`` (the second is not stored by default). Request headers steer it: ``X-Sleep``
(seconds to sleep first), ``X-Status`` (answer this status instead), ``X-Raise`` (raise).
With a :class:`Ledger`, the view writes the order into PostgreSQL inside one transaction that
also runs ``inbox.claim_in(conn)`` (the request's key): ``X-Stall: before|after`` then records
a ``started`` row and sleeps (until the process is killed) before or after that commit.
``GET /orders`` answers 200 (a method the middleware does not cover).

The apps are built in-process by :func:`fastapi_app`, :func:`flask_app` and the Django URLconf
of this module, and in server subprocesses from the environment (``JF_HTTP_*``; see
:func:`state_from_env`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import flask
import psycopg
from fastapi import FastAPI, Request, Response

import jobfence
from jobfence.integrations.asgi import IdempotencyKeyMiddleware
from jobfence.integrations.flask import IdempotencyKey

DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Ledger:
    """The PostgreSQL tables the views write: ``<schema>.orders`` (one row per applied
    effect: the request's inbox key and the order id) and ``<schema>.started`` (one row per
    run of a stalling request)."""

    schema: str = field(default_factory=lambda: f"jf_http_{uuid.uuid4().hex[:10]}")
    dsn: str = DSN

    @property
    def inbox_table(self) -> str:
        return f"{self.schema}_inbox"

    @property
    def inbox_url(self) -> str:
        return f"{self.dsn}?table={self.inbox_table}"

    def create(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(
                f"CREATE TABLE {self.schema}.orders (id serial PRIMARY KEY, k text, "
                "order_id text, item text, pid int)"
            )
            conn.execute(f"CREATE TABLE {self.schema}.started (id serial PRIMARY KEY, k text)")
        with jobfence.Inbox(self.inbox_url) as inbox:
            inbox.install()

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            conn.execute(f'DROP TABLE IF EXISTS "{self.inbox_table}"')

    def rows(self) -> dict[str, int]:
        """Inbox key -> how many orders it wrote."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            got = conn.execute(f"SELECT k, count(*) FROM {self.schema}.orders GROUP BY k")
            return {k: n for k, n in got.fetchall()}

    def orders(self) -> dict[str, str]:
        """Inbox key -> its order id (of its first row)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            got = conn.execute(f"SELECT k, order_id FROM {self.schema}.orders ORDER BY id")
            out: dict[str, str] = {}
            for k, order in got.fetchall():
                out.setdefault(k, order)
            return out

    def started(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.schema}.started").fetchone()
            return int(row[0]) if row else 0


class State:
    """What one app's views share: how many times a view ran, and the optional ledger (with
    the inboxes its ``claim_in`` runs on: the middleware's table)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.ledger = ledger
        self.inbox: jobfence.Inbox | None = None
        self.ainbox: jobfence.AsyncInbox | None = None
        if ledger is not None:
            self.inbox = jobfence.Inbox(ledger.inbox_url)

    def count(self) -> int:
        with self.lock:
            self.calls += 1
            return self.calls

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()


def state_from_env() -> State:
    """The state of a server subprocess: ``JF_HTTP_SCHEMA`` names the ledger's schema."""
    schema = os.environ.get("JF_HTTP_SCHEMA")
    return State(Ledger(schema) if schema else None)


def _answer(state: State, body: bytes, headers: dict[str, str], key: str | None) -> Any:
    status = int(headers.get("x-status", "201"))
    n = state.count()
    try:
        item = json.loads(body or b"{}").get("item")
    except ValueError:
        item = None
    order = uuid.uuid4().hex
    payload = {"order": order, "item": item, "n": n, "pid": os.getpid(), "key": key}
    out_headers = [
        ("content-type", "application/json"),
        ("location", f"/orders/{order}"),
        ("x-extra", "yes"),
    ]
    return status, out_headers, json.dumps(payload).encode()


def _stall(headers: dict[str, str], when: str) -> bool:
    return headers.get("x-stall") == when


def handle_sync(state: State, body: bytes, headers: dict[str, str]) -> Any:
    """The view, sync."""
    headers = {k.lower(): v for k, v in headers.items()}
    if "x-sleep" in headers:
        time.sleep(float(headers["x-sleep"]))
    if "x-raise" in headers:
        raise RuntimeError("the view failed")
    claim = jobfence.current_claim()
    key = claim.key if claim is not None else None
    status, out_headers, payload = _answer(state, body, headers, key)
    ledger = state.ledger
    if ledger is not None and key is not None and state.inbox is not None:
        order = json.loads(payload)["order"]
        with psycopg.connect(ledger.dsn) as conn:
            if headers.get("x-stall"):
                conn.execute(f"INSERT INTO {ledger.schema}.started (k) VALUES (%s)", (key,))
                conn.commit()
            if _stall(headers, "before"):
                time.sleep(3600)  # killed here: nothing of this request committed
            with conn.transaction():
                if state.inbox.claim_in(conn):
                    conn.execute(
                        f"INSERT INTO {ledger.schema}.orders (k, order_id, item, pid) "
                        "VALUES (%s, %s, %s, %s)",
                        (key, order, json.loads(payload)["item"], os.getpid()),
                    )
            if _stall(headers, "after"):
                time.sleep(3600)  # killed here: the order is committed, no response stored
    return status, out_headers, payload


async def handle_async(state: State, body: bytes, headers: dict[str, str]) -> Any:
    """The view, async (psycopg's async connection, ``AsyncInbox.claim_in``)."""
    headers = {k.lower(): v for k, v in headers.items()}
    if "x-sleep" in headers:
        await asyncio.sleep(float(headers["x-sleep"]))
    if "x-raise" in headers:
        raise RuntimeError("the view failed")
    claim = jobfence.current_claim()
    key = claim.key if claim is not None else None
    status, out_headers, payload = _answer(state, body, headers, key)
    ledger = state.ledger
    if ledger is not None and key is not None:
        if state.ainbox is None:
            state.ainbox = jobfence.AsyncInbox(ledger.inbox_url)
        order = json.loads(payload)["order"]
        async with await psycopg.AsyncConnection.connect(ledger.dsn) as conn:
            if headers.get("x-stall"):
                await conn.execute(f"INSERT INTO {ledger.schema}.started (k) VALUES (%s)", (key,))
                await conn.commit()
            if _stall(headers, "before"):
                await asyncio.sleep(3600)
            async with conn.transaction():
                if await state.ainbox.claim_in(conn):
                    await conn.execute(
                        f"INSERT INTO {ledger.schema}.orders (k, order_id, item, pid) "
                        "VALUES (%s, %s, %s, %s)",
                        (key, order, json.loads(payload)["item"], os.getpid()),
                    )
            if _stall(headers, "after"):
                await asyncio.sleep(3600)
    return status, out_headers, payload


# --- FastAPI ---------------------------------------------------------------------------------


def fastapi_app(state: State, inbox: Any, **options: Any) -> Any:
    """The API in FastAPI, under the ASGI middleware on ``inbox``."""
    app = FastAPI()

    @app.post("/orders")
    async def create(request: Request) -> Response:
        body = await request.body()
        status, headers, payload = await handle_async(state, body, dict(request.headers))
        return Response(payload, status_code=status, headers=dict(headers))

    @app.get("/orders")
    async def listing() -> dict[str, int]:
        return {"calls": state.calls}

    app.add_middleware(IdempotencyKeyMiddleware, inbox=inbox, **options)
    return app


def fastapi_from_env() -> Any:
    """The app of a uvicorn subprocess (``uvicorn --factory``): its inbox is ``JF_HTTP_INBOX``
    and its ``ttl`` ``JF_HTTP_TTL``."""
    state = state_from_env()
    return fastapi_app(
        state, os.environ["JF_HTTP_INBOX"], ttl=float(os.environ.get("JF_HTTP_TTL", "60"))
    )


# --- Flask ----------------------------------------------------------------------------------


def flask_app(state: State, inbox: Any, **options: Any) -> Any:
    """The API in Flask, under ``IdempotencyKey``."""
    app = flask.Flask(__name__)

    @app.post("/orders")
    def create() -> Any:
        status, headers, payload = handle_sync(
            state, flask.request.get_data(), dict(flask.request.headers)
        )
        return flask.Response(payload, status=status, headers=headers)

    @app.get("/orders")
    def listing() -> Any:
        return {"calls": state.calls}

    app.extensions["jf_test_idempotency"] = IdempotencyKey(app, inbox=inbox, **options)
    return app


# --- Django ---------------------------------------------------------------------------------

#: the state of the Django views (in-process tests set it; a server subprocess reads its env)
DJANGO_STATE: State | None = None


def django_state() -> State:
    global DJANGO_STATE
    if DJANGO_STATE is None:
        DJANGO_STATE = state_from_env()
    return DJANGO_STATE


def _django_create(request: Any) -> Any:
    from django.http import HttpResponse

    status, headers, payload = handle_sync(django_state(), request.body, dict(request.headers))
    response = HttpResponse(payload, status=status)
    for name, value in headers:
        response[name] = value
    return response


def _django_orders(request: Any) -> Any:
    from django.http import JsonResponse

    if request.method == "POST":
        return _django_create(request)
    return JsonResponse({"calls": django_state().calls})


def _urlpatterns() -> list[Any]:
    try:
        from django.urls import path
        from django.views.decorators.csrf import csrf_exempt
    except ImportError:  # pragma: no cover - Django is a test dependency
        return []
    return [path("orders", csrf_exempt(_django_orders))]


urlpatterns = _urlpatterns()

DJANGO_SETTINGS: dict[str, Any] = {
    "DEBUG": False,
    "SECRET_KEY": "jobfence-tests-only",
    "ALLOWED_HOSTS": ["*"],
    "ROOT_URLCONF": __name__,
    "MIDDLEWARE": ["jobfence.integrations.django.IdempotencyKeyMiddleware"],
    "INSTALLED_APPS": [],
    "DATABASES": {},
    "USE_TZ": True,
}
