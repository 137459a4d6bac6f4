"""The Idempotency-Key rules that need no I/O (shared by the sync and async cores and by every
framework adapter): the options, the key's syntax, its scope and fingerprint, the stored
response and the problem answers.

The drivers that talk to the inbox are ``_http_async.py`` (``AsyncIdempotencyCore``) and its
generated twin ``_http.py`` (``IdempotencyCore``); ``http.py`` is the public face of all three.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from .._guard_spec import current_claim_var
from ..errors import ConfigurationError

__all__ = [
    "APPLIED_STATUS",
    "DEFAULT_HEADERS",
    "DEFAULT_MAX_BODY",
    "DEFAULT_METHODS",
    "DEFAULT_RETENTION",
    "DEFAULT_TTL",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "BodyTooLarge",
    "HttpResponse",
    "IdempotencyOptions",
    "Step",
    "parse_key",
    "problem",
]

DEFAULT_METHODS = ("POST", "PATCH")
"""The methods whose requests the middleware covers by default."""
DEFAULT_HEADER = "Idempotency-Key"
DEFAULT_TTL = 60.0
"""Seconds an in-flight request's claim lives without a renewal (how soon a retry takes over
the key of a request whose server died)."""
DEFAULT_RETENTION = 24 * 3600.0
"""Seconds a key and its stored response are kept (the key's lifetime)."""
DEFAULT_HEADERS = ("content-type", "location")
"""Response headers stored with the response and replayed."""
DEFAULT_MAX_BODY = 1024 * 1024
"""The largest request body (bytes) read to fingerprint a request with a key; larger: 413."""
MAX_KEY_LENGTH = 255
"""The longest key accepted (characters, after unquoting)."""
REPLAYED_HEADER = "Idempotent-Replayed"
"""The header every replayed response carries (value ``true``)."""
APPLIED_STATUS = 409
"""The status of the answer to a key whose effect was committed by a request that died before
its response was stored (see :data:`PROBLEM_APPLIED`)."""

PROBLEM_INVALID = "urn:jobfence:problem:idempotency-key-invalid"
"""The ``type`` of the 400 answer to a malformed, empty or repeated key."""
PROBLEM_MISSING = "urn:jobfence:problem:idempotency-key-missing"
"""The ``type`` of the 400 answer to a covered request without a key (``required=True``)."""
PROBLEM_TOO_LARGE = "urn:jobfence:problem:idempotency-body-too-large"
"""The ``type`` of the 413 answer to a request with a key and a body over ``max_body``."""
PROBLEM_IN_FLIGHT = "urn:jobfence:problem:idempotency-key-in-flight"
"""The ``type`` of the 409 answer to a retry while the first request runs."""
PROBLEM_REUSED = "urn:jobfence:problem:idempotency-key-reused"
"""The ``type`` of the 422 answer to a key reused on another request."""
PROBLEM_APPLIED = "urn:jobfence:problem:idempotency-key-applied"
"""The ``type`` of the 409 answer to a key whose effect an earlier request committed before
it died without storing its response."""
#: the statuses never stored: server errors and the client errors a retry may cure
_NOT_STORED = frozenset({408, 425, 429})


class BodyTooLarge(Exception):
    """Raised by an adapter's body reader when the request body is over ``max_body``."""


@dataclass
class HttpResponse:
    """A response as the core sees it: ``status``, ``headers`` (name, value pairs, in order)
    and ``body`` (bytes)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)


def problem(
    status: int, kind: str, title: str, detail: str, headers: Iterable[tuple[str, str]] = ()
) -> HttpResponse:
    """An ``application/problem+json`` answer (RFC 9457) of HTTP ``status``: its ``type`` is
    ``kind`` (a URI), then ``title`` and ``detail`` for people; ``headers`` are added to the
    content type."""
    body = json.dumps(
        {"type": kind, "title": title, "status": status, "detail": detail},
        separators=(",", ":"),
    ).encode()
    return HttpResponse(status, [("content-type", "application/problem+json"), *headers], body)


def _printable(text: str) -> bool:
    return all(" " <= c <= "~" for c in text)


def parse_key(values: Sequence[str]) -> str | HttpResponse:
    """The key of a request's Idempotency-Key header ``values`` (one per header line), or the
    400 answer when it is not one valid key.

    The draft makes the header a Structured Field Item of type sf-string: ``"..."`` holding
    printable ASCII, with ``\\"`` and ``\\\\`` escapes. A bare token is accepted too (many
    clients send ``Idempotency-Key: 8e03978e-...``): printable ASCII without spaces, quotes or
    commas. Either way the key is 1 to :data:`MAX_KEY_LENGTH` characters. Two header lines, or
    a list (``"a", "b"``), are refused: one request has one key.
    """
    if len(values) != 1:
        return _invalid("the request has several Idempotency-Key headers; send exactly one")
    raw = values[0].strip(" \t")
    if not raw:
        return _invalid("the Idempotency-Key header is empty")
    if len(raw) > 2 * MAX_KEY_LENGTH + 2:
        return _invalid(f"the key is longer than {MAX_KEY_LENGTH} characters")
    if not _printable(raw):
        return _invalid("the key must be printable ASCII (sf-string)")
    if raw.startswith('"'):
        key = _sf_string(raw)
        if key is None:
            return _invalid(
                'the header is not one quoted string (sf-string): "..." with only \\" and '
                "\\\\ escapes, and nothing after the closing quote"
            )
    else:
        if any(c in raw for c in ' ",;\\'):
            return _invalid(
                "a bare key must not hold spaces, quotes, commas, semicolons or backslashes; "
                'send it quoted: Idempotency-Key: "..."'
            )
        key = raw
    if not key:
        return _invalid("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        return _invalid(f"the key is longer than {MAX_KEY_LENGTH} characters")
    return key


def _sf_string(raw: str) -> str | None:
    """The value of the sf-string ``raw`` (RFC 8941 3.3.3), or ``None`` if it is not one
    (parameters after it are refused too: the draft defines none)."""
    out = []
    i = 1
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in '"\\':
                return None
            out.append(raw[i + 1])
            i += 2
            continue
        if c == '"':
            return "".join(out) if i == len(raw) - 1 else None
        out.append(c)
        i += 1
    return None  # no closing quote


def _invalid(detail: str) -> HttpResponse:
    return problem(400, PROBLEM_INVALID, "Invalid Idempotency-Key", detail)


def missing(header: str) -> HttpResponse:
    """The 400 answer to a covered request without the (required) key."""
    return problem(
        400,
        PROBLEM_MISSING,
        "Idempotency-Key required",
        f"this request must carry an {header} header (a unique key per operation, the same "
        "on every retry of it)",
    )


def too_large(max_body: int) -> HttpResponse:
    """The 413 answer to a request with a key whose body is over ``max_body`` bytes."""
    return problem(
        413,
        PROBLEM_TOO_LARGE,
        "Request body too large for an idempotent request",
        f"the body of a request with an Idempotency-Key may be at most {max_body} bytes",
    )


def in_flight(retry_after: int) -> HttpResponse:
    """The 409 answer to a duplicate of a request still being processed."""
    return problem(
        409,
        PROBLEM_IN_FLIGHT,
        "A request with this Idempotency-Key is being processed",
        "an earlier request with this key has not finished yet; retry later to get its response",
        [("retry-after", str(retry_after))],
    )


def reused() -> HttpResponse:
    """The 422 answer to a key reused for another request (method, path or body)."""
    return problem(
        422,
        PROBLEM_REUSED,
        "Idempotency-Key reused for a different request",
        "this key was first used for a request with another method, path or body; a key "
        "identifies one operation: use a new key for a new request",
    )


def applied() -> HttpResponse:
    """The answer to a key whose effect an earlier request committed (``claim_in``) before
    dying without storing its response: the effect is not applied again, and the response it
    would have had is unknown."""
    return problem(
        APPLIED_STATUS,
        PROBLEM_APPLIED,
        "The request with this Idempotency-Key was applied; its response was lost",
        "an earlier request with this key committed its changes but stopped before its "
        "response was recorded; the changes are not applied again: look the result up "
        "instead of retrying",
    )


def storable(status: int) -> bool:
    """Whether a response of ``status`` is stored: not a server error (5xx), nor a client
    error a retry may cure (408, 425, 429); those release the key for the retry."""
    return status < 500 and status not in _NOT_STORED


def _check_seconds(value: object, argument: str, *, zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != value
        or value < 0
        or (value == 0 and not zero)
        or value == float("inf")
    ):
        allowed = "a number >= 0" if zero else "a number > 0"
        raise ConfigurationError(
            f"{argument} must be {allowed} (seconds), got {value!r}", argument=argument
        )
    return float(value)


#: a request -> the caller's scope (``None``: not scoped)
CallerHook = Callable[[Any], "str | None"]
#: (request, body) -> the request's fingerprint (replaces the body's SHA-256)
FingerprintHook = Callable[[Any, bytes], "str | bytes"]


@dataclass(frozen=True)
class IdempotencyOptions:
    """The options every adapter takes, checked once (same names on all three frameworks).

    * ``methods`` -- the methods covered (default ``("POST", "PATCH")``); others pass through.
    * ``header`` -- the request header holding the key (default ``Idempotency-Key``).
    * ``required`` -- answer 400 to a covered request without a key (default: pass it
      through).
    * ``caller`` -- ``caller(request) -> str | None``: the caller's scope (user, API key,
      tenant). Keys of different callers never meet; without it (the default) every client
      shares one key space, so a client that guesses or reuses another's key gets that
      client's response: set it wherever clients are not all trusted.
    * ``fingerprint`` -- ``fingerprint(request, body) -> str | bytes``: what identifies the
      request's payload instead of the body's SHA-256 (e.g. a canonical form of the JSON).
      The method and the path (with its query) are always part of the fingerprint.
    * ``ttl`` -- seconds an in-flight request's claim lives without renewal (default 60); the
      claim is renewed while the request runs, so a request may take longer; when its server
      dies, a retry takes the key over ``ttl`` after the last renewal.
    * ``retention`` -- seconds a key and its stored response are kept (default 24 h).
    * ``wait`` -- seconds a duplicate of an in-flight request waits for its response before
      answering 409 (default 0: at once).
    * ``headers`` -- response headers stored and replayed (default content-type, location).
    * ``max_body`` -- the largest request body read with a key (bytes, default 1 MiB): 413
      above it.
    """

    methods: tuple[str, ...] = DEFAULT_METHODS
    header: str = DEFAULT_HEADER
    required: bool = False
    caller: CallerHook | None = None
    fingerprint: FingerprintHook | None = None
    ttl: float = DEFAULT_TTL
    retention: float | None = None
    wait: float = 0.0
    headers: tuple[str, ...] = DEFAULT_HEADERS
    max_body: int = DEFAULT_MAX_BODY

    @classmethod
    def of(
        cls,
        *,
        methods: Iterable[str] = DEFAULT_METHODS,
        header: str = DEFAULT_HEADER,
        required: bool = False,
        caller: CallerHook | None = None,
        fingerprint: FingerprintHook | None = None,
        ttl: float = DEFAULT_TTL,
        retention: float | None = None,
        wait: float = 0.0,
        headers: Iterable[str] = DEFAULT_HEADERS,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> IdempotencyOptions:
        """Checked options; a bad one raises :class:`ConfigurationError` naming it."""
        if isinstance(methods, str) or not all(isinstance(m, str) and m.isalpha() for m in methods):
            raise ConfigurationError(
                f"methods must be a list of HTTP method names such as ('POST', 'PATCH'), got "
                f"{methods!r}",
                argument="methods",
            )
        checked = tuple(m.upper() for m in methods)
        if not checked:
            raise ConfigurationError("methods must not be empty", argument="methods")
        if not isinstance(header, str) or not header or not _token(header):
            raise ConfigurationError(
                f"header must be an HTTP header name such as 'Idempotency-Key', got {header!r}",
                argument="header",
            )
        if not isinstance(required, bool):
            raise ConfigurationError(
                f"required must be True or False, got {required!r}", argument="required"
            )
        for name, hook in (("caller", caller), ("fingerprint", fingerprint)):
            if hook is not None and not callable(hook):
                raise ConfigurationError(
                    f"{name} must be None or a callable, got {type(hook).__name__}",
                    argument=name,
                )
        if isinstance(headers, str) or not all(
            isinstance(h, str) and h and _token(h) for h in headers
        ):
            raise ConfigurationError(
                f"headers must be a list of header names such as ('content-type', "
                f"'location'), got {headers!r}",
                argument="headers",
            )
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 0:
            raise ConfigurationError(
                f"max_body must be an int >= 0 (bytes), got {max_body!r}", argument="max_body"
            )
        return cls(
            methods=checked,
            header=header,
            required=required,
            caller=caller,
            fingerprint=fingerprint,
            ttl=_check_seconds(ttl, "ttl"),
            retention=None if retention is None else _check_seconds(retention, "retention"),
            wait=_check_seconds(wait, "wait", zero=True),
            headers=tuple(h.lower() for h in headers),
            max_body=max_body,
        )

    def covers(self, method: str) -> bool:
        """Whether requests of ``method`` are covered."""
        return method.upper() in self.methods

    def header_values(self, headers: Iterable[tuple[str, str]]) -> list[str]:
        """Every value of the key header among ``headers`` (name, value)."""
        low = self.header.lower()
        return [v for k, v in headers if k.lower() == low]

    def inbox_key(self, key: str, request: Any) -> str:
        """The inbox key of ``key`` for ``request``: ``http:<caller>:<key>``, the caller's
        scope percent-escaped (so that no caller can end inside another's key space), and
        hashed when it is long (inbox keys are at most 1024 bytes). A caller of ``None`` or
        ``""`` is no scope: ``http::<key>``."""
        scope = ""
        if self.caller is not None:
            value = self.caller(request)
            if value is not None:
                if not isinstance(value, str):
                    raise ConfigurationError(
                        f"caller must return a str or None, got {type(value).__name__}",
                        argument="caller",
                    )
                scope = quote(value, safe="")
                if len(scope) > 512:  # "%s" is no escape quote() writes: no scope looks so
                    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
                    scope = f"%sha256-{digest}"
        return f"http:{scope}:{key}"

    def fingerprint_of(self, method: str, target: str, body: bytes, request: Any) -> str:
        """The request's fingerprint: a SHA-256 over the method, the target (path and query)
        and the body's SHA-256 (or what the ``fingerprint`` hook returns for it)."""
        if self.fingerprint is not None:
            part = self.fingerprint(request, body)
            if isinstance(part, str):
                part = part.encode("utf-8", "surrogatepass")
            if not isinstance(part, (bytes, bytearray)):
                raise ConfigurationError(
                    f"fingerprint must return str or bytes, got {type(part).__name__}",
                    argument="fingerprint",
                )
            body_part = b"hook:" + hashlib.sha256(bytes(part)).digest()
        else:
            body_part = b"body:" + hashlib.sha256(body).digest()
        digest = hashlib.sha256()
        digest.update(method.upper().encode() + b"\n")
        digest.update(target.encode("utf-8", "surrogateescape") + b"\n")
        digest.update(body_part)
        return "http-sha256:" + digest.hexdigest()

    def stored(self, response: HttpResponse) -> dict[str, Any]:
        """What the inbox stores for ``response``: status, the chosen headers, body."""
        kept = [[k.lower(), v] for k, v in response.headers if k.lower() in self.headers]
        return {
            "status": response.status,
            "headers": kept,
            "body": base64.b64encode(response.body).decode("ascii"),
        }


def replay(result: Any) -> HttpResponse:
    """The replayed response of a stored ``result`` (:meth:`IdempotencyOptions.stored`),
    with ``Idempotent-Replayed: true``; a key completed without a stored response (its
    effect applied by ``claim_in`` outside this middleware) gets :func:`applied`."""
    if not isinstance(result, dict) or "status" not in result:
        response = applied()
    else:
        response = HttpResponse(
            int(result["status"]),
            [(str(k), str(v)) for k, v in result.get("headers", [])],
            base64.b64decode(result.get("body", "")),
        )
    response.headers.append((REPLAYED_HEADER.lower(), "true"))
    return response


def _token(name: str) -> bool:
    return all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name) and name.isascii()


class Step:
    """What ``begin`` of the core decided for one request: ``answer`` (send it,
    do not run the view), or ``claim`` (run the view under it), or neither (not covered);
    ``key`` is the inbox key, once known."""

    __slots__ = ("_token", "answer", "claim", "key")

    def __init__(
        self, answer: HttpResponse | None = None, claim: Any = None, key: str | None = None
    ) -> None:
        self.answer = answer
        self.claim = claim
        #: the inbox key (``http:<caller>:<key>``), once known
        self.key = key
        self._token: Any = None

    def activate(self) -> None:
        """Make the request's claim :func:`jobfence.current_claim` in this context."""
        if self.claim is not None:
            self._token = current_claim_var.set(self.claim)

    def deactivate(self) -> None:
        """Undo :meth:`activate` (in the same context)."""
        token, self._token = self._token, None
        if token is not None:
            try:
                current_claim_var.reset(token)
            except ValueError:  # another context (a framework that hops threads)
                current_claim_var.set(None)
