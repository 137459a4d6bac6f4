"""Idempotency-Key for any ASGI application (Starlette, FastAPI, Quart, Litestar, ...).

::

    from fastapi import FastAPI
    import jobfence
    from jobfence.integrations.asgi import IdempotencyKeyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyKeyMiddleware, inbox="postgresql://.../app")

A pure ASGI middleware: it imports no framework. For a covered request (``POST``, ``PATCH``)
with an ``Idempotency-Key`` header it reads the body (at most ``max_body`` bytes), then claims
the key in the inbox and either answers at once (400, 409, 413, 422, or the stored response
with ``Idempotent-Replayed: true``) or runs the application under the request's claim
(:func:`jobfence.current_claim`) with the body replayed to it, buffers its response, stores
it, and sends it. The rules are those of :mod:`jobfence.integrations.http`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..inbox_async import AsyncInbox
from ._http_async import AsyncIdempotencyCore
from ._http_spec import (
    DEFAULT_HEADER,
    DEFAULT_HEADERS,
    DEFAULT_MAX_BODY,
    DEFAULT_METHODS,
    DEFAULT_TTL,
    BodyTooLarge,
    CallerHook,
    FingerprintHook,
    HttpResponse,
    IdempotencyOptions,
)

__all__ = ["IdempotencyKeyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Disconnected(Exception):
    """The client left before its request body was read."""


class IdempotencyKeyMiddleware:
    """Idempotency-Key for the ASGI application ``app``.

    Args:
        app: the ASGI application to wrap (with Starlette/FastAPI, ``app.add_middleware``
            passes it).
        inbox: an :class:`~jobfence.AsyncInbox` (used as it is; you close it), or its URL
            (``"postgresql://..."``, ``"redis://..."``, ``"sqlite:///..."``): opened on the
            first request with ``retention``, closed at the application's lifespan shutdown
            or by :meth:`aclose`. To commit the key with the view's own write
            (``claim_in``), the inbox must be on the view's database.
        methods: the methods covered (default ``("POST", "PATCH")``).
        header: the key's request header (default ``Idempotency-Key``).
        required: answer 400 to a covered request without a key (default: run it as is).
        caller: ``caller(scope) -> str | None``, the caller's scope (user id, API key
            id, tenant); receives the ASGI ``scope`` (``scope["user"]``, ``scope["state"]``
            or the headers, once your authentication middleware, outside this one, set them).
            Without it every client shares one key space.
        fingerprint: ``fingerprint(scope, body) -> str | bytes``, what identifies the payload
            instead of the body's SHA-256 (method and path are always bound).
        ttl: seconds an in-flight request's claim lives without renewal (default 60).
        retention: seconds a key and its response are kept (default 24 h; with an inbox
            object, the inbox's own retention, which must then agree).
        wait: seconds a duplicate of an in-flight request waits for its response before the
            409 (default 0).
        headers: response headers stored and replayed (default content-type, location).
        max_body: the largest request body with a key, in bytes (default 1 MiB): 413 above.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        inbox: AsyncInbox | str,
        methods: tuple[str, ...] | list[str] = DEFAULT_METHODS,
        header: str = DEFAULT_HEADER,
        required: bool = False,
        caller: CallerHook | None = None,
        fingerprint: FingerprintHook | None = None,
        ttl: float = DEFAULT_TTL,
        retention: float | None = None,
        wait: float = 0.0,
        headers: tuple[str, ...] | list[str] = DEFAULT_HEADERS,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.app = app
        self.options = IdempotencyOptions.of(
            methods=methods,
            header=header,
            required=required,
            caller=caller,
            fingerprint=fingerprint,
            ttl=ttl,
            retention=retention,
            wait=wait,
            headers=headers,
            max_body=max_body,
        )
        self.core = AsyncIdempotencyCore(inbox, self.options)

    async def aclose(self) -> None:
        """Close the inbox if this middleware opened it from a URL."""
        await self.core.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope["type"] != "http" or not self.options.covers(scope["method"]):
            await self.app(scope, receive, send)
            return
        await self._handle(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.aclose()
            await send(message)

        return lifespan_send

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        query = scope.get("query_string", b"").decode("latin-1")
        target = scope["path"] + (f"?{query}" if query else "")
        read: list[bytes] = []

        async def read_body(limit: int) -> bytes:
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            read.append(b"".join(chunks))
            return read[0]

        try:
            step = await self.core.begin(scope["method"], target, headers, read_body, scope)
        except _Disconnected:
            return
        if step.answer is not None:
            await _send(send, step.answer)
            return
        app_receive = receive if not read else _replaying(read[0], receive)
        if step.claim is None:
            await self.app(scope, app_receive, send)
            return
        captured = _Captured()
        step.activate()
        try:
            await self.app(scope, app_receive, captured.send)
        except BaseException:
            step.deactivate()
            await self.core.abort(step)
            raise
        step.deactivate()
        response = captured.response()
        answer = await self.core.finish(step, response)
        if answer is not None:
            await _send(send, answer)
        else:
            await captured.forward(send)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then the client's own messages."""
    given = False

    async def replay_receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay_receive


class _Captured:
    """The application's response, buffered."""

    def __init__(self) -> None:
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.extra: list[Message] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))
        else:  # trailers, extensions: forwarded as they are, not stored
            self.extra.append(message)

    def response(self) -> HttpResponse:
        if self.start is None:  # the application sent nothing: a server error
            return HttpResponse(500)
        headers = [
            (bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
            for k, v in self.start.get("headers", [])
        ]
        return HttpResponse(int(self.start["status"]), headers, b"".join(self.chunks))

    async def forward(self, send: Send) -> None:
        if self.start is None:
            await _send(send, HttpResponse(500, [("content-type", "text/plain")], b"no response"))
            return
        await send(self.start)
        await send({"type": "http.response.body", "body": b"".join(self.chunks)})
        for message in self.extra:
            await send(message)


async def _send(send: Send, response: HttpResponse) -> None:
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in response.headers
        if k.lower() != "content-length"
    ]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
