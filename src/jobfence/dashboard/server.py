"""The dashboard's HTTP server: the page (``static/``) and its JSON API.

``GET /`` is the page, ``GET /app.js`` and ``GET /app.css`` its script and style (served from
the package, nothing from elsewhere: it works offline), ``GET /api/state`` what it shows.
The actions are ``POST /api/locks/break``, ``/api/inbox/forget``, ``/api/inbox/purge`` and
``/api/queues/requeue`` with a JSON body naming the target (its ``id`` in the state) and the
object, and ``POST /api/schedules/pause``, ``/resume`` and ``/trigger`` with a JSON body naming
the scheduler (its ``id`` in the state's ``schedulers``) and the schedule (``name``), and
``POST /api/outbox/retry`` with a JSON body naming the outbox (its ``id`` in the state's
``outboxes``) and the dead rows' ``ids`` (``null``: every dead row).

Defences, as the server is reachable by any page the operator's browser opens:

* every request must carry a ``Host`` the server answers to (``127.0.0.1``, ``localhost``,
  ``[::1]`` or the bound host, with the port): a page on another site that rebinds its DNS name
  to 127.0.0.1 sends its own name and gets 421;
* actions are refused with 403 unless the server was made with ``allow_actions``, and then
  need the per-process random token, which only the page served here has (in a ``<meta>``
  tag), in the ``X-Jobfence-Token`` header, a same-origin ``Origin`` if any, and
  ``Content-Type: application/json`` (415 otherwise): a cross-site form cannot send them;
* the page's Content-Security-Policy allows scripts, styles and requests to itself only.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import socket
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..errors import ConfigurationError, JobfenceError
from .schedules import SchedulerSource
from .state import Dashboard, Target

__all__ = ["TOKEN_HEADER", "DashboardServer", "make_server"]

log = logging.getLogger("jobfence.dashboard")

#: the request header that carries the action token
TOKEN_HEADER = "X-Jobfence-Token"
#: the largest action body accepted, in bytes
MAX_BODY = 64 * 1024

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
}

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@cache
def _static(name: str) -> str:
    return (
        resources.files("jobfence.dashboard").joinpath("static").joinpath(name).read_text("utf-8")
    )


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class DashboardServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` serving one :class:`Dashboard`."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        dashboard: Dashboard,
        *,
        allow_actions: bool = False,
    ) -> None:
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.dashboard = dashboard
        self.allow_actions = allow_actions
        #: the action token, new for each server; only the page served here carries it
        self.token = secrets.token_urlsafe(32)
        self.host = host
        self.port = int(self.server_address[1])
        self.wildcard = host in ("", "0.0.0.0", "::")

    @property
    def url(self) -> str:
        """The page's address, for the operator (the loopback one when bound to all)."""
        host = "127.0.0.1" if self.wildcard else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    @property
    def loopback(self) -> bool:
        """Whether the server listens on a loopback address only (reachable from this machine
        alone)."""
        try:
            return ipaddress.ip_address(str(self.server_address[0]).split("%", 1)[0]).is_loopback
        except ValueError:
            return False

    def exposure_warning(self) -> str | None:
        """What to tell the operator when the page is reachable from other machines (it has
        no login), or ``None`` on a loopback address."""
        if self.loopback:
            return None
        where = "every interface" if self.wildcard else self.host
        bound = f"{self.host or '*'}:{self.port} ({where})"
        if self.allow_actions:
            return (
                f"the dashboard listens on {bound} with --allow-actions, and the page has no "
                "login: anyone who can reach this port can break locks, forget inbox records "
                "(their work runs again), requeue dead letters, retry dead outbox rows and "
                "pause, resume or trigger the schedules shown. Bind 127.0.0.1 (the "
                "default) and reach it through an SSH tunnel, or put an authenticating proxy "
                "in front of it."
            )
        return (
            f"the dashboard listens on {bound}, and the page has no login: anyone who can "
            "reach this port sees the lock names and holders, the inbox keys, the dead "
            "letters' message ids and errors, the schedules' records and the outbox's dead "
            "rows (read-only: no actions)."
        )

    def host_allowed(self, value: str | None) -> bool:
        """Whether a request's ``Host`` names this server: the loopback names, the bound host
        (any IP address literal when bound to all interfaces: a rebound DNS name is never
        one) or this machine's name, with the server's port."""
        if not value:
            return False
        try:
            parts = urlsplit(f"//{value}")
            name, port = parts.hostname, parts.port
        except ValueError:
            return False
        if name is None or (port if port is not None else 80) != self.port:
            return False
        name = name.lower()
        if name in ("localhost", "127.0.0.1", "::1", self.host.lower()):
            return True
        if not self.wildcard:
            return False
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return name in (socket.gethostname().lower(), socket.getfqdn().lower())

    def page(self) -> str:
        """The page, with whether actions are allowed and, if they are, the token."""
        return (
            _static("index.html")
            .replace("{{actions}}", "1" if self.allow_actions else "0")
            .replace("{{token}}", self.token if self.allow_actions else "")
        )


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "jobfence-dashboard"
    protocol_version = "HTTP/1.1"

    ACTIONS: ClassVar[dict[str, str]] = {
        "/api/locks/break": "_break_lock",
        "/api/inbox/forget": "_forget",
        "/api/inbox/purge": "_purge",
        "/api/queues/requeue": "_requeue",
        "/api/schedules/pause": "_pause",
        "/api/schedules/resume": "_resume",
        "/api/schedules/trigger": "_trigger",
        "/api/outbox/retry": "_outbox_retry",
    }

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # -- responses ----------------------------------------------------------------------------

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in _SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: HTTPStatus, payload: Any) -> None:
        body = json.dumps(payload).encode("utf-8")
        self._send(status, body, "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._json(status, {"error": message})

    def _check_host(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            raise _HTTPError(
                HTTPStatus.MISDIRECTED_REQUEST,
                "this server answers only to its own address (Host header refused)",
            )

    # -- GET ----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        try:
            self._check_host()
            path = urlsplit(self.path).path
            if path == "/api/state":
                state = self.server.dashboard.state()
                state["actions"] = self.server.allow_actions
                self._json(HTTPStatus.OK, state)
                return
            if path == "/favicon.ico":  # none: say so without an error in the console
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
                return
            if path in _STATIC:
                name, content_type = _STATIC[path]
                text = self.server.page() if name == "index.html" else _static(name)
                self._send(HTTPStatus.OK, text.encode("utf-8"), content_type)
                return
            raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such page: {path}")
        except _HTTPError as exc:
            self._error(exc.status, str(exc))

    do_HEAD = do_GET

    # -- POST ---------------------------------------------------------------------------------

    def do_POST(self) -> None:
        try:
            length = self._body_length()
            self._check_host()
            path = urlsplit(self.path).path
            method = self.ACTIONS.get(path)
            if method is None:
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such action: {path}")
            self._check_action()
            body = self._body(length)
            dashboard = self.server.dashboard
            try:
                result = getattr(self, method)(body)
            except ConfigurationError as exc:
                raise _HTTPError(HTTPStatus.BAD_REQUEST, dashboard.mask(exc, typed=False)) from exc
            except JobfenceError as exc:
                raise _HTTPError(HTTPStatus.BAD_GATEWAY, dashboard.mask(exc)) from exc
            self._json(HTTPStatus.OK, result)
        except _HTTPError as exc:
            self.close_connection = True
            self._error(exc.status, str(exc))

    def _body_length(self) -> int:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if not 0 <= length <= MAX_BODY:
            raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "the body is too large")
        return length

    def _check_action(self) -> None:
        if not self.server.allow_actions:
            raise _HTTPError(
                HTTPStatus.FORBIDDEN,
                "read-only dashboard: start it with --allow-actions to allow actions",
            )
        sent = self.headers.get(TOKEN_HEADER) or ""
        if not hmac.compare_digest(sent.encode("utf-8"), self.server.token.encode("utf-8")):
            raise _HTTPError(HTTPStatus.FORBIDDEN, f"missing or wrong {TOKEN_HEADER} header")
        origin = self.headers.get("Origin")
        if origin is not None and not self.server.host_allowed(urlsplit(origin).netloc):
            raise _HTTPError(HTTPStatus.FORBIDDEN, "cross-origin request refused")
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        if content_type.lower() != "application/json":
            raise _HTTPError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "actions take Content-Type: application/json"
            )

    def _body(self, length: int) -> dict[str, Any]:
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return body

    # -- the actions --------------------------------------------------------------------------

    @staticmethod
    def _text(body: dict[str, Any], field: str) -> str:
        value = body.get(field)
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"{field} must be a non-empty string", argument=field)
        return value

    def _target(self, body: dict[str, Any]) -> Target:
        return self.server.dashboard.target(body.get("target"))

    def _scheduler(self, body: dict[str, Any]) -> SchedulerSource:
        return self.server.dashboard.scheduler(body.get("scheduler"))

    def _break_lock(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._target(body).break_lock(self._text(body, "name"))

    def _forget(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._target(body).forget(self._text(body, "key"))

    def _purge(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._target(body).purge_inbox()

    def _pause(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._scheduler(body).pause(self._text(body, "name"))

    def _resume(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._scheduler(body).resume(self._text(body, "name"))

    def _trigger(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._scheduler(body).trigger(self._text(body, "name"))

    def _outbox_retry(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.server.dashboard.outbox(body.get("outbox")).retry(body.get("ids"))

    def _requeue(self, body: dict[str, Any]) -> dict[str, Any]:
        target = self._target(body)
        ids = body.get("ids")
        if ids is not None and not (
            isinstance(ids, list) and ids and all(isinstance(i, str) and i for i in ids)
        ):
            raise ConfigurationError(
                "ids must be a non-empty list of message ids, or null for all", argument="ids"
            )
        return target.requeue(self._text(body, "queue"), ids)


def make_server(
    dashboard: Dashboard,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allow_actions: bool = False,
) -> DashboardServer:
    """A :class:`DashboardServer` bound to ``host``:``port`` (``0``: a free port); run it
    with ``serve_forever()``. Bound to an address other machines can reach, it logs a
    WARNING on the ``jobfence.dashboard`` logger: the page has no login
    (:meth:`DashboardServer.exposure_warning`)."""
    server = DashboardServer((host, port), dashboard, allow_actions=allow_actions)
    warning = server.exposure_warning()
    if warning is not None:
        log.warning("%s", warning)
    return server
