# Generated from integrations/_http_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The Idempotency-Key core that talks to the inbox: ``AsyncIdempotencyCore`` on an
:class:`~jobfence.AsyncInbox` here, ``IdempotencyCore`` on an :class:`~jobfence.Inbox` in the
generated twin ``_http.py``. Every framework adapter (ASGI, Django, Flask) drives one of them:

1. :meth:`begin` with the request's method, target, headers, a body reader and the
   framework's request object: it checks the key, reads the body (at most ``max_body``),
   scopes and fingerprints the key, and claims it in the inbox. The :class:`Step` it returns
   holds an answer to send at once (400, 413, 409, 422, or a replayed response), or the
   request's claim (run the view), or neither (not covered: run the view as if there were no
   middleware).
2. Around the view, :meth:`Step.activate` / :meth:`Step.deactivate` make the claim
   :func:`jobfence.current_claim`, so the view's ``inbox.claim_in(conn)`` commits the key with
   its own write.
3. :meth:`finish` with the view's response: stores it as the claim's result (or releases the
   key for a 5xx), and returns the answer to send instead, if any. :meth:`abort` when the view
   raised: the key is released.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import telemetry
from .._core.clock import get_clock
from ..backends.base import ClaimState
from ..errors import ConfigurationError, FingerprintMismatch, JobfenceError
from ..inbox import Claim, Inbox
from ._http_spec import (
    DEFAULT_RETENTION,
    BodyTooLarge,
    HttpResponse,
    IdempotencyOptions,
    Step,
    applied,
    in_flight,
    missing,
    parse_key,
    replay,
    reused,
    storable,
    too_large,
)

__all__ = ["IdempotencyCore"]

log = logging.getLogger("jobfence.http")

#: the Retry-After (seconds) of a 409 to a duplicate of an in-flight request
RETRY_AFTER = 1
#: the first and the longest pause between two looks at an in-flight key (``wait``)
_FIRST_PAUSE = 0.02
_LONGEST_PAUSE = 0.25


class IdempotencyCore:
    """The inbox side of Idempotency-Key for one app: ``inbox`` is an
    :class:`~jobfence.AsyncInbox` / :class:`~jobfence.Inbox` (used as it is, never closed
    here) or its URL (opened on first use with the options' ``retention``, closed by
    :meth:`close`); ``options`` the checked :class:`IdempotencyOptions`."""

    def __init__(self, inbox: Inbox | str | None, options: IdempotencyOptions) -> None:
        self.options = options
        self._url: str | None = None
        self._inbox: Inbox | None = None
        if isinstance(inbox, str):
            self._url = inbox
        elif isinstance(inbox, Inbox):
            if options.retention is not None and options.retention != inbox.retention:
                raise ConfigurationError(
                    f"retention={options.retention:g} differs from the retention of the inbox "
                    f"given ({inbox.retention:g} s): the inbox stores the responses, so create "
                    f"it with retention={options.retention:g}, or pass its URL",
                    argument="retention",
                )
            self._inbox = inbox
        else:
            expected = Inbox.__name__
            raise ConfigurationError(
                f"inbox must be an {expected} or its URL (e.g. "
                f"'postgresql://...', 'redis://...'), got {type(inbox).__name__}",
                argument="inbox",
            )

    @property
    def inbox(self) -> Inbox:
        """The inbox (opened now if it was given as a URL)."""
        if self._inbox is None:
            assert self._url is not None
            retention = self.options.retention or DEFAULT_RETENTION
            self._inbox = Inbox(self._url, retention=retention)
        return self._inbox

    def close(self) -> None:
        """Close the inbox if it was opened here from a URL."""
        if self._url is not None and self._inbox is not None:
            inbox, self._inbox = self._inbox, None
            inbox.close()

    def begin(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        read_body: Any,
        request: Any,
    ) -> Step:
        """Decide what to do with a request (see the module's docstring). ``target`` is the
        path with its query string; ``headers`` its (name, value) pairs, values decoded as
        latin-1; ``read_body(limit)`` returns the whole body, raising
        :class:`BodyTooLarge` past ``limit`` bytes (an awaitable for ``AsyncIdempotencyCore``);
        ``request`` is the framework's request, given to the ``caller`` and ``fingerprint``
        hooks."""
        opts = self.options
        if not opts.covers(method):
            return Step()
        values = opts.header_values(headers)
        if not values:
            if opts.required:
                telemetry.http_idempotency("invalid")
                return Step(missing(opts.header))
            return Step()
        key = parse_key(values)
        if isinstance(key, HttpResponse):
            telemetry.http_idempotency("invalid")
            return Step(key)
        try:
            body = read_body(opts.max_body)
        except BodyTooLarge:
            telemetry.http_idempotency("invalid")
            return Step(too_large(opts.max_body))
        name = opts.inbox_key(key, request)
        fingerprint = opts.fingerprint_of(method, target, body, request)
        return self._claim(name, fingerprint)

    def _claim(self, name: str, fingerprint: str) -> Step:
        """Claim ``name``; while it is in flight, look again until ``wait`` has passed."""
        opts = self.options
        inbox = self.inbox
        clock = get_clock()
        deadline = clock.monotonic() + opts.wait
        pause = _FIRST_PAUSE
        while True:
            try:
                claim = inbox.claim(name, fingerprint=fingerprint, ttl=opts.ttl, renew=True)
            except FingerprintMismatch:
                telemetry.http_idempotency("mismatch")
                return Step(reused(), key=name)
            if claim.state is ClaimState.NEW:
                telemetry.http_idempotency("new")
                return Step(claim=claim, key=name)
            if claim.state is ClaimState.COMPLETED:
                telemetry.http_idempotency("replayed")
                return Step(replay(claim.result), key=name)
            left = deadline - clock.monotonic()
            if left <= 0:
                telemetry.http_idempotency("conflict")
                return Step(in_flight(RETRY_AFTER), key=name)
            clock.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)

    def finish(self, step: Step, response: HttpResponse) -> HttpResponse | None:
        """The view of ``step``'s claim answered ``response``: store it (or release the key
        for a 5xx, 408, 425 or 429) and return the answer to send instead of it, if any.

        When the view's ``claim_in`` found the key already applied (an earlier request
        committed the same key's changes, then died before its response was stored), the
        view's response describes nothing that happened now: the answer is the 409
        ``idempotency-key-applied`` problem, stored, so every retry gets it too."""
        claim: Claim = step.claim
        if claim.applied_before:
            answer = applied()
            self._store(claim, answer)
            return answer
        if not storable(response.status):
            self._release(claim)
            return None
        self._store(claim, response)
        return None

    def abort(self, step: Step) -> None:
        """The view of ``step``'s claim raised: give the key back (a retry runs it again)."""
        if step.claim is not None:
            self._release(step.claim)

    def _store(self, claim: Claim, response: HttpResponse) -> None:
        try:
            claim.complete(self.options.stored(response))
        except JobfenceError as err:
            # the response still goes out; the key was taken over (ClaimLost) or the inbox is
            # unreachable (then the claim expires after its ttl and a retry runs again)
            log.warning("the response to %r was not stored: %s", claim.key, err)

    def _release(self, claim: Claim) -> None:
        try:
            claim.release()
        except JobfenceError as err:
            log.warning(
                "the key %r was not released (it expires after its ttl): %s", claim.key, err
            )
