"""One client interface over the three frameworks' apps of ``_http_apps``: through each
framework's test client (:func:`with_test_client`) or a real HTTP server in a thread of this
process (:func:`real_server`: uvicorn, werkzeug's threaded server, Django's threaded WSGI
server), so that one spec runs on all of them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

import jobfence
from tests.frameworks import _http_apps as apps
from tests.frameworks._http_apps import State

FRAMEWORKS = ("fastapi", "flask", "django")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names (the last value of a repeated header)
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


Headers = list[tuple[str, str | bytes]]


class Harness:
    """An app of one framework under the middleware, and a way to send it requests."""

    framework: str
    state: State
    post_fn: Callable[[str, str, bytes, Headers], Reply]

    def request(
        self,
        method: str = "POST",
        path: str = "/orders",
        body: bytes | dict[str, Any] = b'{"item": "tea"}',
        headers: Headers | None = None,
        key: str | None = None,
    ) -> Reply:
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        all_headers: Headers = [("content-type", "application/json"), *(headers or [])]
        if key is not None:
            all_headers.append(("Idempotency-Key", key))
        return self.post_fn(method, path, body, all_headers)

    def post(self, key: str | None = None, **kw: Any) -> Reply:
        return self.request("POST", key=key, **kw)


def _reply(status: int, headers: Any, body: bytes) -> Reply:
    return Reply(status, {k.lower(): v for k, v in headers}, body)


def _django_setup() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(**apps.DJANGO_SETTINGS)
        django.setup()


@contextlib.contextmanager
def _django_settings(inbox: Any, options: dict[str, Any]) -> Iterator[None]:
    from django.test.utils import override_settings

    _django_setup()
    with override_settings(JOBFENCE_IDEMPOTENCY={"inbox": inbox, **options}):
        yield


def _django_meta(headers: Headers) -> dict[str, str]:
    """Django test-client keyword arguments: repeated headers joined by ", " (as a WSGI server
    does), CONTENT_TYPE apart."""
    meta: dict[str, str] = {}
    for name, value in headers:
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if name.lower() == "content-type":
            meta["CONTENT_TYPE"] = text
            continue
        meta_name = "HTTP_" + name.upper().replace("-", "_")
        meta[meta_name] = f"{meta[meta_name]}, {text}" if meta_name in meta else text
    return meta


@contextlib.contextmanager
def with_test_client(
    framework: str, inbox_url: str, state: State | None = None, **options: Any
) -> Iterator[Harness]:
    """The app of ``framework`` on the inbox at ``inbox_url`` with ``options``, driven by the
    framework's own test client."""
    h = Harness()
    h.framework = framework
    h.state = state or State()
    if framework == "fastapi":
        from starlette.testclient import TestClient

        app = apps.fastapi_app(h.state, inbox_url, **options)
        with TestClient(app, raise_server_exceptions=False) as client:

            def post(method: str, path: str, body: bytes, headers: Headers) -> Reply:
                r = client.request(method, path, content=body, headers=headers)
                return _reply(r.status_code, r.headers.multi_items(), r.content)

            h.post_fn = post
            yield h
        return
    inbox = jobfence.Inbox(inbox_url, retention=options.get("retention", 86400.0))
    try:
        if framework == "flask":
            app = apps.flask_app(h.state, inbox, **options)
            client = app.test_client()

            def post(method: str, path: str, body: bytes, headers: Headers) -> Reply:
                r = client.open(path, method=method, data=body, headers=headers)
                return _reply(r.status_code, r.headers.items(), r.get_data())

            h.post_fn = post
            yield h
        elif framework == "django":
            from django.test import Client

            with _django_settings(inbox, options):
                apps.DJANGO_STATE = h.state
                client = Client(raise_request_exception=False)

                def post(method: str, path: str, body: bytes, headers: Headers) -> Reply:
                    meta = _django_meta(headers)
                    content_type = meta.pop("CONTENT_TYPE", "application/octet-stream")
                    r = client.generic(method, path, body, content_type=content_type, **meta)
                    return _reply(r.status_code, r.items(), r.content)

                h.post_fn = post
                yield h
                apps.DJANGO_STATE = None
        else:
            raise ValueError(framework)
    finally:
        inbox.close()


@contextlib.contextmanager
def real_server(
    framework: str, inbox_url: str, state: State | None = None, **options: Any
) -> Iterator[tuple[str, State]]:
    """The app of ``framework`` served over HTTP on 127.0.0.1 by a server thread; yields its
    base URL and state."""
    state = state or State()
    if framework == "fastapi":
        import uvicorn

        app = apps.fastapi_app(state, inbox_url, **options)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", workers=None
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
        thread.start()
        _until(lambda: server.started or not thread.is_alive())
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}", state
        finally:
            server.should_exit = True
            thread.join(30)
        return
    inbox = jobfence.Inbox(inbox_url, retention=options.get("retention", 86400.0))
    try:
        if framework == "flask":
            from werkzeug.serving import make_server

            app = apps.flask_app(state, inbox, **options)
            wsgi_server: Any = make_server("127.0.0.1", 0, app, threaded=True)
            with _serving(wsgi_server) as url:
                yield url, state
        elif framework == "django":
            from django.core.handlers.wsgi import WSGIHandler
            from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

            with _django_settings(inbox, options):
                apps.DJANGO_STATE = state
                handler = WSGIHandler()  # loads the middleware with these settings
                # a listen backlog for 50 clients at once (Django's is 10)
                server_class = type("Server", (ThreadedWSGIServer,), {"request_queue_size": 128})
                server = server_class(("127.0.0.1", 0), WSGIRequestHandler)
                server.set_app(handler)
                with _serving(server) as url:
                    yield url, state
                apps.DJANGO_STATE = None
        else:
            raise ValueError(framework)
    finally:
        inbox.close()


@contextlib.contextmanager
def _serving(server: Any) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, name="test-wsgi", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)


def http_post(
    client: httpx.Client, url: str, key: str | None, body: dict[str, Any], **kw: Any
) -> Reply:
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    r = client.post(url + "/orders", content=json.dumps(body).encode(), headers=headers, **kw)
    return _reply(r.status_code, r.headers.multi_items(), r.content)


def _until(condition: Callable[[], Any], limit: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def wait_for(what: str, condition: Callable[[], Any], limit: float = 30.0) -> Any:
    """Poll ``condition`` (a state of a server, never elapsed time) until it is true."""
    import time

    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
