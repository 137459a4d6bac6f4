# Generated from backends/etcd/client_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The etcd v3 client both parts use (``client_async.py``; ``client.py`` is generated from it):
etcd's JSON gRPC gateway (``POST /v3/...``) over httpx.

Why this client: one async source gives both flavours (the sync module is generated from it,
as for every other backend), and it needs no gRPC or protobuf package. python-etcd3 is
unmaintained and pins an old protobuf; aetcd is async only. etcd 3.4's gateway serves every
call jobfence makes (``kv/range``, ``kv/txn``, ``kv/deleterange``, ``lease/grant``,
``lease/keepalive``, ``lease/revoke``, ``lease/timetolive``, ``watch``,
``maintenance/status``, ``cluster/member/list``); keys and values travel base64-encoded in
JSON, and 64-bit integers as strings.

Endpoints: ``etcd://h1:2379,h2:2379,h3:2379`` names several members (``etcds://`` for TLS;
default port 2379). A request goes to the current endpoint; on a connection error, a timeout,
or an answer that the member cannot serve it now (gRPC codes UNAVAILABLE and
DEADLINE_EXCEEDED: no leader, leader changed) the client moves to the next endpoint and
tries again, until ``timeout`` seconds have passed since the request began. Every request
jobfence makes is safe to send again: writes are transactions that compare first, or
deletes and revocations that report what they found. Reads are linearizable (etcd's
default).

URL options (or keywords): ``timeout`` (seconds per call, failover included; default 5),
``connect_timeout`` (seconds to open one connection; default 2), and for ``etcds://``
``ca_file``, ``cert_file``, ``key_file`` (PEM files: the CA that signed the server's
certificate, and a client certificate and key for mutual TLS). User names and passwords
(etcd's own authentication) are not supported.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from typing import Any

import httpx

from ..._core.clock import get_clock
from ..._core.url import BackendURL
from ...errors import BackendError, ConfigurationError
from .keys import range_end

__all__ = [
    "EtcdClient",
    "EtcdError",
    "b64",
    "connect_etcd",
    "endpoints_of",
    "unb64",
]

DEFAULT_PORT = 2379
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0
#: gRPC status codes of an answer another member (or the same one, a moment later) may serve
_RETRYABLE = {4, 14}  # DEADLINE_EXCEEDED, UNAVAILABLE
#: gRPC status code NOT_FOUND (a lease that expired or was revoked)
NOT_FOUND = 5
#: the options this module reads (never handed on)
OWN_OPTIONS = ("timeout", "connect_timeout", "ca_file", "cert_file", "key_file")


class EtcdError(BackendError):
    """etcd answered a call with an error (``code`` is its gRPC status code)."""

    def __init__(self, message: str, *, code: int, operation: str) -> None:
        super().__init__(message, backend="etcd", operation=operation)
        self.code = code


def b64(value: str | bytes) -> str:
    """``value`` (text as UTF-8) base64-encoded, as the gateway takes keys and values."""
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return base64.b64encode(raw).decode("ascii")


def unb64(value: str | None) -> bytes:
    return base64.b64decode(value) if value else b""


def endpoints_of(url: BackendURL) -> list[str]:
    """The base URLs (``http://h:p``) of the members ``url`` names, in order."""
    rest = url.raw.split("://", 1)[1]
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in netloc:
        raise ConfigurationError(
            "url: etcd's user names and passwords are not supported by the etcd backend "
            f"(use TLS client certificates: etcds://...?cert_file=...): {url.masked}",
            argument="url",
        )
    scheme = "https" if url.scheme == "etcds" else "http"
    found = []
    for part in netloc.split(","):
        host, port = part or "127.0.0.1", DEFAULT_PORT
        if part.startswith("["):  # [ipv6]:port
            close = part.find("]")
            host, tail = part[: close + 1], part[close + 1 :]
            if tail.startswith(":"):
                port = _port(tail[1:], url)
        elif ":" in part:
            host, _, raw_port = part.rpartition(":")
            port = _port(raw_port, url)
        found.append(f"{scheme}://{host}:{port}")
    return found


def _port(raw: str, url: BackendURL) -> int:
    if raw.isdigit() and 0 < int(raw) < 65536:
        return int(raw)
    raise ConfigurationError(
        f"url: an etcd endpoint's port must be a number from 1 to 65535: {url.masked}",
        argument="url",
    )


def _seconds(url: BackendURL, options: dict[str, Any], name: str, default: float) -> float:
    raw = options.pop(name, url.options.get(name, default))
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not (0.0 < value <= 3600.0):
        raise ConfigurationError(
            f"{name} must be a number of seconds above 0 and at most 3600, got {raw!r}",
            argument=name,
        )
    return value


def connect_etcd(url: BackendURL, options: dict[str, Any], *, what: str) -> EtcdClient:
    """The client of ``url`` with the options it reads taken out of ``options`` (left over
    options are refused)."""
    timeout = _seconds(url, options, "timeout", DEFAULT_TIMEOUT)
    connect = _seconds(url, options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    files = {
        name: options.pop(name, url.options.get(name))
        for name in ("ca_file", "cert_file", "key_file")
    }
    unknown = sorted(set(options) | (set(url.options) - set(OWN_OPTIONS) - {"table"}))
    if unknown:
        raise ConfigurationError(
            f"{what}: unknown option(s) {', '.join(unknown)}; the etcd backend reads "
            + ", ".join(OWN_OPTIONS),
            argument=unknown[0],
        )
    return EtcdClient(
        endpoints_of(url),
        timeout=timeout,
        connect_timeout=connect,
        ca_file=files["ca_file"],
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        label=url.masked,
    )


class EtcdClient:
    """A few etcd v3 calls over its JSON gateway, with failover between endpoints."""

    def __init__(
        self,
        endpoints: Iterable[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        label: str = "",
    ) -> None:
        self.endpoints = list(endpoints)
        if not self.endpoints:
            raise ConfigurationError("url: no etcd endpoint given", argument="url")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.label = label or ",".join(self.endpoints)
        self._verify: Any = ca_file if ca_file else True
        self._cert: Any = (cert_file, key_file) if cert_file and key_file else cert_file
        #: index of the endpoint requests go to first
        self.current = 0
        self._http: httpx.Client | None = None
        #: what the HTTP client's connections belong to: this process and (async) the event
        #: loop that opened them
        self._owner: object = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"

    @staticmethod
    def _current_owner() -> object:
        """This process and, for the asyncio client, the running event loop: an
        ``AsyncLocks`` made once and used under ``asyncio.run`` once per job (a Celery or RQ
        task) gets connections of the job's own loop, never of a closed one."""
        return os.getpid()

    def _client(self) -> httpx.Client:
        owner = self._current_owner()
        if self._http is None or self._owner != owner:
            # the connections of another loop (or the parent process) are left behind, not
            # closed through a loop that may not run any more: they close when collected
            self._owner = owner
            self._http = httpx.Client(
                verify=self._verify,
                cert=self._cert,
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            )
        return self._http

    # -- the one request path --------------------------------------------------------------
    def call(
        self, path: str, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>``; the decoded answer. Fails over between endpoints
        (see the module's docstring) until ``timeout`` (default: the client's) has passed."""
        clock = get_clock()
        budget = self.timeout if timeout is None else timeout
        deadline = clock.monotonic() + budget
        problems: list[str] = []
        pause = 0.02
        while True:
            endpoint = self.endpoints[self.current]
            left = deadline - clock.monotonic()
            try:
                reply = self._client().post(
                    f"{endpoint}/v3/{path}",
                    json=body,
                    timeout=httpx.Timeout(
                        max(left, 0.05), connect=min(self.connect_timeout, max(left, 0.05))
                    ),
                )
                answer = reply.json()
            except (httpx.TransportError, ValueError) as exc:
                problems.append(f"{endpoint}: {type(exc).__name__}: {exc}")
                retry: BaseException | None = exc
                code = None
            else:
                if reply.status_code == 200 and "error" not in answer:
                    return answer  # type: ignore[no-any-return]
                code = int(answer.get("code", -1)) if isinstance(answer, dict) else -1
                message = answer.get("message") if isinstance(answer, dict) else reply.text
                if code not in _RETRYABLE:
                    raise EtcdError(
                        f"etcd {path} failed at {endpoint} (code {code}): {message}",
                        code=code,
                        operation=path,
                    )
                problems.append(f"{endpoint}: code {code}: {message}")
                retry = None
            # this endpoint cannot serve it now: the next one, after a short pause once every
            # endpoint was tried
            self.current = (self.current + 1) % len(self.endpoints)
            if clock.monotonic() + pause >= deadline:
                raise EtcdError(
                    f"etcd {path}: no endpoint of {self.label} answered within {budget:g} s "
                    f"({'; '.join(problems[-len(self.endpoints) :])})",
                    code=code if code is not None else 14,
                    operation=path,
                ) from retry
            if self.current == 0 or len(self.endpoints) == 1:
                clock.sleep(pause)
                pause = min(pause * 2, 0.5)

    # -- kv --------------------------------------------------------------------------------
    @staticmethod
    def range_request(
        key: str | bytes,
        *,
        prefix: bool = False,
        limit: int = 0,
        sort_target: str | None = None,
        sort_order: str = "ASCEND",
        keys_only: bool = False,
        count_only: bool = False,
    ) -> dict[str, Any]:
        raw = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key
        body: dict[str, Any] = {"key": b64(raw)}
        if prefix:
            body["range_end"] = b64(range_end(raw))
        if limit:
            body["limit"] = limit
        if sort_target:
            body["sort_target"] = sort_target
            body["sort_order"] = sort_order
        if keys_only:
            body["keys_only"] = True
        if count_only:
            body["count_only"] = True
        return body

    def range(self, key: str | bytes, **kw: Any) -> list[dict[str, Any]]:
        """The key-values of ``key`` (``prefix=True``: of every key starting with it)."""
        answer = self.call("kv/range", self.range_request(key, **kw))
        return list(answer.get("kvs", ()))

    def range_all(self, prefix: str) -> list[dict[str, Any]]:
        """Every key-value under ``prefix``, in pages of 1000 (key order)."""
        found: list[dict[str, Any]] = []
        start = prefix.encode("utf-8", "surrogateescape")
        end = b64(range_end(start))
        while True:
            answer = self.call("kv/range", {"key": b64(start), "range_end": end, "limit": 1000})
            kvs = list(answer.get("kvs", ()))
            found.extend(kvs)
            if not answer.get("more") or not kvs:
                return found
            start = unb64(kvs[-1]["key"]) + b"\0"

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> tuple[bool, list[dict[str, Any]]]:
        """One transaction: ``(succeeded, responses)``."""
        body: dict[str, Any] = {"compare": compare, "success": success}
        if failure:
            body["failure"] = failure
        answer = self.call("kv/txn", body)
        return bool(answer.get("succeeded")), list(answer.get("responses", ()))

    def delete_prefix(self, prefix: str) -> int:
        raw = prefix.encode("utf-8", "surrogateescape")
        answer = self.call("kv/deleterange", {"key": b64(raw), "range_end": b64(range_end(raw))})
        return int(answer.get("deleted", 0))

    def delete(self, key: str) -> int:
        answer = self.call("kv/deleterange", {"key": b64(key)})
        return int(answer.get("deleted", 0))

    # -- leases ----------------------------------------------------------------------------
    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` whole seconds; its id."""
        answer = self.call("lease/grant", {"TTL": ttl})
        if answer.get("error"):
            raise EtcdError(
                f"etcd lease/grant failed: {answer['error']}", code=-1, operation="lease/grant"
            )
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease`` to its granted ttl; the ttl it now has (0 or less: it is gone)."""
        answer = self.call("lease/keepalive", {"ID": lease})
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    def revoke(self, lease: int) -> bool:
        """Revoke ``lease`` (deleting every key attached to it); False if it was gone."""
        try:
            self.call("lease/revoke", {"ID": lease})
        except EtcdError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise
        return True

    def time_to_live(self, lease: int) -> tuple[int, int]:
        """``(ttl left, granted ttl)`` of ``lease`` in seconds; ttl left is -1 if it is gone."""
        answer = self.call("lease/timetolive", {"ID": lease})
        return int(answer.get("TTL", -1)), int(answer.get("grantedTTL", 0))

    # -- watch -----------------------------------------------------------------------------
    def wait_deleted(self, key: str, revision: int, timeout: float) -> bool:
        """Watch ``key`` from ``revision`` on until it is deleted (True) or ``timeout`` seconds
        passed (False). One streamed request; the gateway sends each event as a JSON line."""
        clock = get_clock()
        deadline = clock.monotonic() + timeout
        body = {
            "create_request": {
                "key": b64(key),
                "start_revision": revision,
                "filters": ["NOPUT"],
            }
        }
        endpoint = self.endpoints[self.current]
        try:
            with self._client().stream(
                "POST",
                f"{endpoint}/v3/watch",
                json=body,
                timeout=httpx.Timeout(max(timeout, 0.01), connect=self.connect_timeout),
            ) as reply:
                if reply.status_code != 200:
                    return False
                for line in reply.iter_lines():
                    if not line.strip():
                        continue
                    event = _json(line).get("result", {})
                    if event.get("canceled") or event.get("compact_revision"):
                        return True  # look again: what the watch missed is in the store
                    if any(e.get("type") == "DELETE" for e in event.get("events", ())):
                        return True
                    if clock.monotonic() >= deadline:
                        return False
        except httpx.TimeoutException:
            return False
        except httpx.TransportError:
            self.current = (self.current + 1) % len(self.endpoints)
            return False
        return False

    # -- maintenance -----------------------------------------------------------------------
    def status(self, endpoint: str | None = None) -> dict[str, Any]:
        """``maintenance/status`` of one member (``endpoint``), or of the current one."""
        if endpoint is None:
            return self.call("maintenance/status", {})
        reply = self._client().post(f"{endpoint}/v3/maintenance/status", json={})
        answer: dict[str, Any] = reply.json()
        if reply.status_code != 200 or "error" in answer:
            raise EtcdError(
                f"etcd maintenance/status failed at {endpoint}: {answer.get('message')}",
                code=int(answer.get("code", -1)),
                operation="maintenance/status",
            )
        return answer

    def members(self) -> list[dict[str, Any]]:
        answer = self.call("cluster/member/list", {})
        return list(answer.get("members", ()))

    def close(self) -> None:
        if self._http is not None and self._owner == self._current_owner():
            self._http.close()
        self._http = None

    def after_fork(self) -> None:
        """Forget the connections inherited from the parent (no I/O): the next call opens
        its own."""
        self._http = None
        self._owner = None


def _json(line: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
