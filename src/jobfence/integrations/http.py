"""Idempotency-Key for HTTP APIs: the framework-free core the ASGI, Django and Flask
middlewares share.

A client that retries ``POST /orders`` after a timeout must not create a second order. With
the ``Idempotency-Key`` request header (draft-ietf-httpapi-idempotency-key-header) it sends a
unique key per operation, the same on every retry; the server runs the operation once and
answers every retry with the first response. Each rule is here, once:

* the key: one header, an sf-string (``"..."``) or a bare token, 1 to 255 printable ASCII
  characters; anything else is answered 400 with an ``application/problem+json`` body;
* its scope: the ``caller`` hook's value (user, API key, tenant) is part of the inbox key
  ``http:<caller>:<key>``, so callers never share keys;
* its binding to the request: the method, the path with its query and the body's SHA-256
  (or the ``fingerprint`` hook's value) make the fingerprint stored with the key; the same key
  on a different request is answered 422;
* one atomic claim of the key in a jobfence inbox: the first request runs the view; a
  duplicate while it runs is answered 409 with ``Retry-After`` (or waits up to ``wait``
  seconds); a duplicate after it gets the stored response (status, the ``headers`` chosen,
  body) with ``Idempotent-Replayed: true``;
* server errors (5xx, and 408, 425, 429) and exceptions are not stored: the key is released,
  a retry runs again; a request whose server died is taken over ``ttl`` seconds after its
  claim's last renewal; a key lives ``retention`` seconds;
* inside the view, :func:`jobfence.current_claim` is the request's claim, so
  ``inbox.claim_in(conn)`` commits the key with the view's own write. If the server dies after
  that commit but before the response is stored, a retry's view finds the key applied
  (``claim_in`` returns False: the write is not done again) and the answer is a stored 409
  ``urn:jobfence:problem:idempotency-key-applied`` problem: the changes were made, the
  response is lost.

:class:`IdempotencyOptions` holds the options; ``AsyncIdempotencyCore`` (on an
:class:`~jobfence.AsyncInbox`) and ``IdempotencyCore`` (on an :class:`~jobfence.Inbox`) are
the drivers an adapter calls: ``begin`` before the view, ``finish`` or ``abort`` after it.
The adapters: :mod:`jobfence.integrations.asgi`, :mod:`jobfence.integrations.flask` and
``jobfence.integrations.django.IdempotencyKeyMiddleware``.
"""

from __future__ import annotations

from ._http import IdempotencyCore
from ._http_async import AsyncIdempotencyCore
from ._http_spec import (
    APPLIED_STATUS,
    DEFAULT_HEADERS,
    DEFAULT_MAX_BODY,
    DEFAULT_METHODS,
    DEFAULT_RETENTION,
    DEFAULT_TTL,
    MAX_KEY_LENGTH,
    PROBLEM_APPLIED,
    PROBLEM_IN_FLIGHT,
    PROBLEM_INVALID,
    PROBLEM_MISSING,
    PROBLEM_REUSED,
    PROBLEM_TOO_LARGE,
    REPLAYED_HEADER,
    BodyTooLarge,
    HttpResponse,
    IdempotencyOptions,
    Step,
    parse_key,
    problem,
    replay,
    storable,
)

__all__ = [
    "APPLIED_STATUS",
    "DEFAULT_HEADERS",
    "DEFAULT_MAX_BODY",
    "DEFAULT_METHODS",
    "DEFAULT_RETENTION",
    "DEFAULT_TTL",
    "MAX_KEY_LENGTH",
    "PROBLEM_APPLIED",
    "PROBLEM_INVALID",
    "PROBLEM_IN_FLIGHT",
    "PROBLEM_MISSING",
    "PROBLEM_REUSED",
    "PROBLEM_TOO_LARGE",
    "REPLAYED_HEADER",
    "AsyncIdempotencyCore",
    "BodyTooLarge",
    "HttpResponse",
    "IdempotencyCore",
    "IdempotencyOptions",
    "Step",
    "parse_key",
    "problem",
    "replay",
    "storable",
]
