"""Idempotency-Key for Flask.

::

    from flask import Flask
    import jobfence
    from jobfence.integrations.flask import IdempotencyKey

    app = Flask(__name__)
    IdempotencyKey(app, inbox=jobfence.Inbox("postgresql://.../app", retention=86400))

    # or, with an application factory:
    idempotency = IdempotencyKey(inbox="postgresql://.../app")
    idempotency.init_app(app)

A ``before_request`` handler checks the key of a covered request (``POST``, ``PATCH``), reads
its body (at most ``max_body`` bytes) and claims the key: it answers at once (400, 409, 413,
422, or the stored response with ``Idempotent-Replayed: true``), or lets the view run under
the request's claim (:func:`jobfence.current_claim`). An ``after_request`` handler stores the
view's response (or releases the key for a 5xx); a ``teardown_request`` handler releases it
when the view raised. The rules are those of :mod:`jobfence.integrations.http`.

Importing this module imports Flask; ``import jobfence`` never does.
"""

from __future__ import annotations

import flask

from ..inbox import Inbox
from ._http import IdempotencyCore
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
    Step,
)

__all__ = ["IdempotencyKey"]

#: where the core of an app lives (``app.extensions``) and a request's step (``flask.g``)
_EXTENSION = "jobfence_idempotency"
_STEP = "_jobfence_idempotency_step"


class IdempotencyKey:
    """Idempotency-Key for a Flask app: ``IdempotencyKey(app, inbox=...)``, or
    ``IdempotencyKey(inbox=...)`` then :meth:`init_app` for each app.

    Args:
        app: the Flask app (or ``None``, then :meth:`init_app`).
        inbox: an :class:`~jobfence.Inbox` (used as it is; you close it) or its URL (opened
            on the first request with ``retention``; :meth:`close` closes it). To commit the
            key with the view's own write (``claim_in``), the inbox must be on the view's
            database.
        methods: the methods covered (default ``("POST", "PATCH")``).
        header: the key's request header (default ``Idempotency-Key``).
        required: answer 400 to a covered request without a key (default: run it as is).
        caller: ``caller(request) -> str | None``, the caller's scope (user id, API key id,
            tenant), given ``flask.request``. Without it every client shares one key space.
        fingerprint: ``fingerprint(request, body) -> str | bytes``, what identifies the
            payload instead of the body's SHA-256 (method and path are always bound).
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
        app: flask.Flask | None = None,
        *,
        inbox: Inbox | str,
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
        self.core = IdempotencyCore(inbox, self.options)
        if app is not None:
            self.init_app(app)

    def init_app(self, app: flask.Flask) -> None:
        """Install the handlers on ``app``."""
        app.extensions[_EXTENSION] = self.core
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)

    def close(self) -> None:
        """Close the inbox if it was opened here from a URL."""
        self.core.close()

    def _before(self) -> flask.Response | None:
        request = flask.request
        core: IdempotencyCore = flask.current_app.extensions[_EXTENSION]
        if not core.options.covers(request.method):
            return None
        query = request.query_string.decode("latin-1")
        target = request.path + (f"?{query}" if query else "")

        def read_body(limit: int) -> bytes:
            length = request.content_length
            if length is not None and length > limit:
                raise BodyTooLarge
            body = request.get_data(cache=True)
            if len(body) > limit:
                raise BodyTooLarge
            return body

        step = core.begin(request.method, target, list(request.headers.items()), read_body, request)
        if step.answer is not None:
            return _flask_response(step.answer)
        if step.claim is not None:
            setattr(flask.g, _STEP, step)
            step.activate()
        return None

    def _after(self, response: flask.Response) -> flask.Response:
        step: Step | None = flask.g.pop(_STEP, None)
        if step is None:
            return response
        step.deactivate()
        core: IdempotencyCore = flask.current_app.extensions[_EXTENSION]
        seen = HttpResponse(response.status_code, list(response.headers.items()), b"")
        seen.body = response.get_data()  # a streamed response is buffered here
        answer = core.finish(step, seen)
        return response if answer is None else _flask_response(answer)

    def _teardown(self, exc: BaseException | None) -> None:
        step: Step | None = flask.g.pop(_STEP, None)
        if step is None:  # finished by _after
            return
        step.deactivate()
        core: IdempotencyCore = flask.current_app.extensions[_EXTENSION]
        core.abort(step)


def _flask_response(answer: HttpResponse) -> flask.Response:
    response = flask.Response(answer.body, status=answer.status)
    if answer.header("content-type") is None:
        del response.headers["Content-Type"]
    for name, value in answer.headers:
        if name.lower() == "content-type":
            response.headers["Content-Type"] = value
        else:
            response.headers.add(name, value)
    return response
