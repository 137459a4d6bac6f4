"""Idempotency-Key for Django: ``IdempotencyKeyMiddleware``, sync and async capable.

::

    MIDDLEWARE = [
        ...,
        "jobfence.integrations.django.IdempotencyKeyMiddleware",
    ]
    JOBFENCE_IDEMPOTENCY = {"caller": "myapp.idempotency.caller", "wait": 2}

Settings (``JOBFENCE_IDEMPOTENCY``, a dict; every key optional): ``inbox`` -- the inbox's
URL, or an :class:`~jobfence.Inbox` (sync stack) / :class:`~jobfence.AsyncInbox` (async
stack) object; default: the ``default`` database's jobfence table
(``JOBFENCE_INBOX_TABLE``), the one the app's migration created and ``claim_in`` on
``django.db.connection`` writes; then the options of
:class:`jobfence.integrations.http.IdempotencyOptions` (``methods``, ``header``, ``required``,
``caller``, ``fingerprint``, ``ttl``, ``retention``, ``wait``, ``headers``, ``max_body``).
``caller`` and ``fingerprint`` may be dotted paths to the callables; they are given the
``HttpRequest`` (under ASGI they run on the event loop: no ORM query there, read
``request.auth``-style attributes set by an earlier middleware, or headers).

Django chooses the flavour: under WSGI (``runserver``, gunicorn) the middleware is sync and
uses an ``Inbox``; in an all-async middleware stack under ASGI it is async and uses an
``AsyncInbox``. Either way the view runs under the request's claim, so in the view::

    with transaction.atomic():
        if inbox.claim_in(connection):      # the request's key, with the view's own write
            Order.objects.create(...)

The rules are those of :mod:`jobfence.integrations.http`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from django.http import HttpResponse as DjangoResponse
from django.utils.module_loading import import_string

from ...errors import ConfigurationError
from ...inbox import Inbox
from ...inbox_async import AsyncInbox
from .._http import IdempotencyCore
from .._http_async import AsyncIdempotencyCore
from .._http_spec import BodyTooLarge, HttpResponse, IdempotencyOptions, Step

__all__ = ["IdempotencyKeyMiddleware"]

_OPTIONS = (
    "methods",
    "header",
    "required",
    "caller",
    "fingerprint",
    "ttl",
    "retention",
    "wait",
    "headers",
    "max_body",
)


def _config() -> tuple[Any, IdempotencyOptions]:
    """The inbox (object or URL) and the checked options of ``JOBFENCE_IDEMPOTENCY``."""
    raw = getattr(settings, "JOBFENCE_IDEMPOTENCY", {})
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"JOBFENCE_IDEMPOTENCY must be a dict, got {type(raw).__name__}",
            argument="JOBFENCE_IDEMPOTENCY",
        )
    unknown = sorted(set(raw) - {"inbox", *_OPTIONS})
    if unknown:
        raise ConfigurationError(
            f"JOBFENCE_IDEMPOTENCY: unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
            f"inbox, {', '.join(_OPTIONS)}",
            argument="JOBFENCE_IDEMPOTENCY",
        )
    options = {k: raw[k] for k in _OPTIONS if k in raw}
    for hook in ("caller", "fingerprint"):
        if isinstance(options.get(hook), str):
            options[hook] = import_string(options[hook])
    inbox = raw.get("inbox")
    if inbox is None:
        # the package (imported before this module, as every parent package is, and importing
        # it) knows Django's database and the inbox table its migration created
        package = sys.modules[__name__.rpartition(".")[0]]
        inbox = f"{package.database_url()}?table={quote(package.inbox_table())}"
    return inbox, IdempotencyOptions.of(**options)


def _read_body(request: HttpRequest, limit: int) -> bytes:
    length = request.META.get("CONTENT_LENGTH")
    if length and str(length).isdigit() and int(length) > limit:
        raise BodyTooLarge
    try:
        body = request.body
    except RequestDataTooBig:
        raise BodyTooLarge from None
    if len(body) > limit:
        raise BodyTooLarge
    return bytes(body)


def _target(request: HttpRequest) -> str:
    query = request.META.get("QUERY_STRING", "")
    return str(request.path) + (f"?{query}" if query else "")


def _django_response(answer: HttpResponse) -> DjangoResponse:
    response = DjangoResponse(answer.body, status=answer.status)
    if answer.header("content-type") is None:
        del response["Content-Type"]
    for name, value in answer.headers:
        response[name] = value  # one value per name: the stored headers are few and single
    return response


class IdempotencyKeyMiddleware:
    """Django middleware applying the Idempotency-Key rules (see the module's docstring for
    the ``JOBFENCE_IDEMPOTENCY`` settings). ``get_response``: Django's next handler."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        inbox, options = _config()
        self.options = options
        self.core: IdempotencyCore | AsyncIdempotencyCore
        if self.is_async:
            markcoroutinefunction(self)
            if isinstance(inbox, Inbox):
                raise ConfigurationError(
                    "JOBFENCE_IDEMPOTENCY['inbox'] is a sync Inbox, but this middleware stack "
                    "is async (ASGI): give an AsyncInbox or the inbox's URL",
                    argument="inbox",
                )
            self.core = AsyncIdempotencyCore(inbox, options)
        else:
            if isinstance(inbox, AsyncInbox):
                raise ConfigurationError(
                    "JOBFENCE_IDEMPOTENCY['inbox'] is an AsyncInbox, but this middleware stack "
                    "is sync (WSGI): give an Inbox or the inbox's URL",
                    argument="inbox",
                )
            self.core = IdempotencyCore(inbox, options)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        core = self.core
        assert isinstance(core, IdempotencyCore)
        if not self.options.covers(request.method or ""):
            return self.get_response(request)
        step = core.begin(
            request.method or "",
            _target(request),
            list(request.headers.items()),
            lambda limit: _read_body(request, limit),
            request,
        )
        if step.answer is not None:
            return _django_response(step.answer)
        if step.claim is None:
            return self.get_response(request)
        step.activate()
        try:
            response = self.get_response(request)
        except BaseException:
            step.deactivate()
            core.abort(step)
            raise
        step.deactivate()
        if response.streaming:  # buffered, to be stored
            body = b"".join(bytes(c) for c in response.streaming_content)
            response.streaming_content = [body]
        else:
            body = bytes(response.content)
        answer = core.finish(step, _seen(response, body))
        return response if answer is None else _django_response(answer)

    async def __acall__(self, request: HttpRequest) -> Any:
        core = self.core
        assert isinstance(core, AsyncIdempotencyCore)
        get_response: Callable[[HttpRequest], Awaitable[Any]] = self.get_response
        if not self.options.covers(request.method or ""):
            return await get_response(request)

        async def read_body(limit: int) -> bytes:
            return _read_body(request, limit)  # ASGI: the body was received before the view

        step: Step = await core.begin(
            request.method or "",
            _target(request),
            list(request.headers.items()),
            read_body,
            request,
        )
        if step.answer is not None:
            return _django_response(step.answer)
        if step.claim is None:
            return await get_response(request)
        step.activate()
        try:
            response = await get_response(request)
        except BaseException:
            step.deactivate()
            await core.abort(step)
            raise
        step.deactivate()
        if response.streaming:  # buffered, to be stored
            chunks = []
            if response.is_async:
                async for chunk in response.streaming_content:
                    chunks.append(bytes(chunk))
            else:
                chunks = [bytes(c) for c in response.streaming_content]
            body = b"".join(chunks)
            response.streaming_content = [body]
        else:
            body = bytes(response.content)
        answer = await core.finish(step, _seen(response, body))
        return response if answer is None else _django_response(answer)


def _seen(response: Any, body: bytes) -> HttpResponse:
    """The core's view of a Django response (its cookies are never stored)."""
    return HttpResponse(response.status_code, list(response.items()), body)
