# Generated from inbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The inbox: atomic idempotency claims, result replay, and the transactional claim.

``AsyncInbox``/``AsyncClaim`` live in ``inbox_async.py``; ``Inbox``/``Claim`` in ``inbox.py``,
generated from it.

Check-then-mark idempotency ("has it been processed? ... do the work ... mark it processed")
has three holes: two workers can both pass the check; a crash between the work and the mark
re-runs the work; the mark can fail after the work. The inbox's ``claim`` closes the first
(one atomic claim, states new / in progress / completed, takeover of a dead worker's claim
after its ttl); its ``claim_in`` closes the other two for database effects (the marker
commits in the same transaction as the effect). See docs/inbox.md.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
import warnings
from collections.abc import Callable
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from ._core import compat
from ._core.hooks import hook
from ._core.inbox_support import (
    DEFAULT_CLAIM_TTL,
    DEFAULT_RETENTION,
    DEFAULT_TABLE,
    ClaimLost,
    JSONSerializer,
    Serializer,
    check_fingerprint,
)
from ._core.sqlconn import adapt, is_undefined_table
from ._core.url import mask_url
from ._core.validate import check_name, check_namespace, check_ttl
from .backends import open_inbox_backend, sql_dialect
from .backends.base import ClaimRecord, ClaimState, InboxBackend
from .errors import (
    BackendError,
    ConfigurationError,
    FingerprintMismatch,
    InboxError,
    JobfenceError,
    SchemaMissing,
)
from .retry import mark_protected

__all__ = ["DEFAULT_URL", "Claim", "Inbox"]

log = logging.getLogger("jobfence.inbox")

T = TypeVar("T")

#: how long an interrupted claim waits for the give-back of a key it may have been given
CLEANUP_WAIT = 1.0

#: the embedded default backend, used when no URL is given and JOBFENCE_URL is not set
DEFAULT_URL = "sqlite:///jobfence.db"

_HOST = socket.gethostname()[:64]
_MISSING: Any = object()


def _new_owner() -> str:
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def _serialize(serializer: Serializer, result: Any) -> bytes:
    """The bytes ``complete`` stores for ``result``; a result the serializer cannot turn into
    bytes (or UTF-8 text) raises :class:`ConfigurationError` naming ``result``, before
    anything is sent, so the claim stays owned and ``complete`` may be called again."""
    name = getattr(serializer, "__name__", None) or type(serializer).__name__
    try:
        data = serializer.dumps(result)
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
    except Exception as exc:
        raise ConfigurationError(
            f"result cannot be stored: {name}.dumps failed on a "
            f"{type(result).__name__} ({type(exc).__name__}: {exc}); pass a value the inbox's "
            "serializer can store (JSON by default), or give the Inbox another serializer",
            argument="result",
        ) from exc
    if not isinstance(data, bytes):
        raise ConfigurationError(
            f"result cannot be stored: {name}.dumps returned "
            f"{type(data).__name__}, not bytes or str",
            argument="result",
        )
    return data


class Claim:
    """The outcome of one :meth:`AsyncInbox.claim` / :meth:`Inbox.claim`.

    ``state`` is :attr:`ClaimState.NEW` (the key is yours: do the work, then
    :meth:`complete` or :meth:`release`), :attr:`ClaimState.IN_PROGRESS` (``owner`` holds it
    until ``expires_at``) or :attr:`ClaimState.COMPLETED` (``result`` is the stored result).
    ``attempt`` is 1 for a key's first claim and grows by one with each takeover of an expired
    or released claim. Used as ``async with claim:`` (sync: ``with claim:``), a NEW claim is
    released if the block raises or ends without :meth:`complete`.
    """

    def __init__(self, inbox: Inbox, key: str, record: ClaimRecord, owner: str | None) -> None:
        self._inbox = inbox
        self.key = key
        self.state = ClaimState.NEW if record.mine else record.state
        self.attempt = record.attempt
        #: who owns the claim: this claim's owner id when NEW, the other worker's when
        #: IN_PROGRESS (``None`` for a released one), ``None`` when COMPLETED
        self.owner = record.owner if record.state is ClaimState.IN_PROGRESS else None
        #: IN_PROGRESS / NEW: the claim's deadline; COMPLETED: when the record expires (UTC)
        self.expires_at: datetime | None = record.expires_at
        self.fingerprint = record.fingerprint
        self._raw_result = record.result
        self._result: Any = _MISSING
        self._mine = owner if record.mine else None
        self._finished: str | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.key!r} {self.state.name} attempt={self.attempt}"
            + (f" owner={self.owner!r}" if self.state is ClaimState.IN_PROGRESS else "")
            + ">"
        )

    @property
    def result(self) -> Any:
        """The stored result when ``state`` is COMPLETED (deserialised), else ``None``."""
        if self.state is not ClaimState.COMPLETED:
            return None
        if self._result is _MISSING:
            raw = self._raw_result
            self._result = None if raw is None else self._inbox.serializer.loads(raw)
        return self._result

    @property
    def owned(self) -> bool:
        """True while this claim is NEW and neither completed nor released by us."""
        return self._mine is not None and self._finished is None

    def complete(self, result: Any = None) -> None:
        """Store ``result`` and mark the key completed (kept for the inbox's ``retention``).

        Owner-checked on the backend: raises :class:`ClaimLost` if the claim expired and was
        taken over, was released, or was purged; :class:`InboxError` if this claim was never
        ours (IN_PROGRESS / COMPLETED) or was already completed (a claim completes once).
        A ``result`` the inbox's serializer cannot store raises :class:`ConfigurationError`
        (``argument="result"``) before anything is sent: the claim stays owned, and
        ``complete`` may be called again with a result that can be stored.
        """
        if self._mine is None:
            raise InboxError(
                f"the claim on {self.key!r} is {self.state.name}, not NEW: only the worker "
                "that claimed a key can complete it",
                key=self.key,
            )
        if self._finished == "released":
            raise ClaimLost(f"the claim on {self.key!r} was released", key=self.key)
        if self._finished == "completed":
            raise InboxError(
                f"the claim on {self.key!r} is already completed: its stored result is what "
                "duplicates replay, and it is never overwritten",
                key=self.key,
            )
        inbox = self._inbox
        data = _serialize(inbox.serializer, result)
        ok = inbox._call(
            "inbox.complete",
            self.key,
            inbox.backend.complete,
            self.key,
            self._mine,
            data,
            inbox.retention,
        )
        if not ok:
            self._finished = "lost"
            raise ClaimLost(
                f"the claim on {self.key!r} (attempt {self.attempt}) is no longer ours: it "
                "expired and was taken over, or was released or purged; result not stored",
                key=self.key,
            )
        self._finished = "completed"
        self.state = ClaimState.COMPLETED
        self._result = result
        self.owner = None

    def release(self) -> bool:
        """Give the key back so that a redelivery can retry it (its ``attempt`` + 1).

        Returns False if the claim was not ours any more (or never was)."""
        if self._mine is None or self._finished is not None:
            return False
        inbox = self._inbox
        released = bool(  # a failed call leaves the claim ours: release() may be retried
            inbox._call("inbox.release", self.key, inbox.backend.release, self.key, self._mine)
        )
        self._finished = "released" if released else "lost"
        return released

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.owned:
            try:
                self.release()
            except JobfenceError as err:
                if exc is None:
                    raise
                log.warning("releasing the claim on %r failed (it will expire): %s", self.key, err)


class Inbox:
    """An idempotency inbox on one backend, chosen by URL.

    The URL: ``"postgresql://..."``, ``"mysql://..."``, ``"sqlite:///path.db"``,
    ``"redis://..."`` or ``"memory://"``; without a URL, ``$JOBFENCE_URL`` or the embedded
    SQLite file ``jobfence.db``.

    * ``table`` -- the table (SQL) or key prefix (Redis, memory): an SQL identifier
      (``^[A-Za-z_][A-Za-z0-9_]*$``) within the backend's limit (63 characters; 64 on
      MySQL/MariaDB); default ``jobfence_inbox``. Also a URL option. The backend validates it.
    * ``ttl`` -- default lifetime of an in-progress claim (seconds, default 300).
    * ``retention`` -- how long completed records are kept for replay (default 7 days);
      older ones are deleted by :meth:`purge` (Redis expires them natively).
    * ``serializer`` -- an object with ``dumps``/``loads`` for results (default JSON).
    """

    def __init__(
        self,
        url: str | InboxBackend | None = None,
        *,
        table: str = DEFAULT_TABLE,
        ttl: float = DEFAULT_CLAIM_TTL,
        retention: float = DEFAULT_RETENTION,
        serializer: Serializer | None = None,
        **options: Any,
    ) -> None:
        self.ttl = check_ttl(ttl)
        self.retention = check_ttl(retention, argument="retention")
        if serializer is None:
            serializer = JSONSerializer()
        elif not (
            callable(getattr(serializer, "dumps", None))
            and callable(getattr(serializer, "loads", None))
        ):
            raise ConfigurationError(
                "serializer must have dumps(obj) -> str | bytes and loads(bytes) -> obj "
                f"(e.g. the json or pickle module), got {serializer!r}",
                argument="serializer",
            )
        self.serializer: Serializer = serializer
        if isinstance(url, InboxBackend):
            self.backend = url
            self.url = f"{url.kind}://"
        else:
            if url is None:
                url = os.environ.get("JOBFENCE_URL") or DEFAULT_URL
            self.backend = open_inbox_backend(
                url, asynchronous=False, table=table, retention=self.retention, **options
            )
            self.url = mask_url(url)
        self.table = self.backend.table
        self._closed = False
        self._cleanups: set[Any] = set()  # clean-ups still running (async; sync ones finish)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} table={self.table}>"

    @property
    def capabilities(self) -> Any:
        return self.backend.capabilities

    def _call(self, operation: str, key: str | None, fn: Callable[..., T], *args: Any) -> T:
        """Call the I/O hook, then ``fn(*args)``; wrap driver errors -- and faults a hook
        injects, which stand for them -- in BackendError."""
        try:
            hook(operation, key=key, backend=self.backend.kind)
            return fn(*args)
        except JobfenceError:
            raise
        except Exception as exc:
            what = f"{operation} of {key!r}" if key is not None else operation
            raise BackendError(
                f"{self.backend.kind} inbox ({self.url}): {what} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=self.backend.kind,
                operation=operation,
            ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this Inbox is closed", argument="self")

    def claim(self, key: str, *, fingerprint: str | None = None, ttl: float | None = None) -> Claim:
        """Claim ``key`` in ONE atomic backend operation; see :class:`AsyncClaim` / :class:`Claim`.

        ``fingerprint`` (e.g. a digest of the payload) is stored with the key; claiming a
        known key with a different one raises :class:`FingerprintMismatch` rather than
        replaying another payload's result. ``ttl`` (default: the inbox's) bounds how long the
        claim lives unless completed or released; after it, another worker may take it over.
        """
        self._check_open()
        key = check_name(key, argument="key")
        fingerprint = check_fingerprint(fingerprint)
        ttl = self.ttl if ttl is None else check_ttl(ttl)
        owner = _new_owner()
        try:
            record = self._call(
                "inbox.claim", key, self.backend.claim, key, owner, fingerprint, ttl
            )
        except BaseException:
            # cancelled, interrupted, or the reply was lost: the backend may have given us the
            # key all the same, and nobody else would release it before its ttl
            self._abandon_quietly(key, owner)
            raise
        if (
            not record.mine
            and fingerprint is not None
            and record.fingerprint is not None
            and record.fingerprint != fingerprint
        ):
            raise FingerprintMismatch(
                f"idempotency key {key!r} was claimed with fingerprint {record.fingerprint!r}, "
                f"not {fingerprint!r}: the key was reused for another payload",
                key=key,
            )
        return Claim(self, key, record, owner)

    def _abandon(self, key: str, owner: str) -> None:
        """A claim was interrupted: give back the key in case the backend gave it to us (the
        release is owner-checked: a no-op when it did not)."""
        try:
            hook("inbox.abandon", key=key, backend=self.backend.kind)
            self.backend.release(key, owner)
        except Exception as exc:
            log.warning("could not give back the claim on %r (it expires): %r", key, exc)

    def _abandon_quietly(self, key: str, owner: str) -> None:
        compat.clean_up(partial(self._abandon, key, owner), self._cleanups, CLEANUP_WAIT)

    def claim_in(self, conn: Any, key: str, *, fingerprint: str | None = None) -> bool:
        """Mark ``key`` applied INSIDE the caller's open transaction on ``conn``.

        Returns True iff this transaction is the first to apply ``key`` (the marker row was
        inserted, or a key held by :meth:`claim` was marked applied): do the effect in the
        same transaction, and both commit or roll back together. False: already applied, do
        nothing. A concurrent duplicate waits on the unique key, then sees False. One
        statement (MySQL: a second one only on the duplicate path). Never creates the table:
        :class:`SchemaMissing` says to run :meth:`install` first.

        ``conn``: a PostgreSQL, MySQL/MariaDB or SQLite connection (psycopg, asyncpg,
        PyMySQL, aiomysql, sqlite3, aiosqlite, SQLAlchemy Connection / Session).
        """
        self._check_open()
        key = check_name(key, argument="key")
        fingerprint = check_fingerprint(fingerprint)
        sc = adapt(conn, argument="conn")
        dialect = sql_dialect(sc.dialect)
        table = check_namespace(
            self.table, limit=dialect.table_limit, backend=sc.dialect, argument="table"
        )
        queries = dialect.inbox_queries(table)
        params = dialect.claim_in_params(key, fingerprint, self.retention)
        try:
            hook("inbox.claim_in", key=key, backend=sc.dialect)
            # the dialect's statements, each only while the ones before affected no row
            for step in dialect.claim_in_steps:
                with warnings.catch_warnings():  # a MySQL driver may warn on an ignored duplicate
                    warnings.filterwarnings("ignore", message="Duplicate entry")
                    res = sc.execute(queries[step], params)
                # From here a repeat of this unit's commit is detectable (its next claim_in
                # sees the marker), so retry_unit may re-run it after "commit outcome unknown".
                mark_protected()
                if res.rowcount == 1:
                    return True
            if fingerprint is not None:
                res = sc.execute(queries["fingerprint"], {"key": params["key"]})
                stored = _text(res.rows[0][0]) if res.rows else None
                if stored is not None and stored != fingerprint:
                    raise FingerprintMismatch(
                        f"idempotency key {key!r} was applied with fingerprint {stored!r}, "
                        f"not {fingerprint!r}: the key was reused for another payload",
                        key=key,
                    )
            return False
        except JobfenceError:
            raise
        except Exception as exc:
            if is_undefined_table(exc):
                raise SchemaMissing(
                    f"the inbox table {self.table!r} does not exist in this {sc.dialect} "
                    f"database: run inbox.install() (or inbox.install(conn)) first; claim_in "
                    "never creates tables inside your transaction",
                    backend=sc.dialect,
                    operation="inbox.claim_in",
                ) from exc
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): inbox.claim_in of {key!r} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="inbox.claim_in",
            ) from exc

    def install(self, conn: Any = None) -> None:
        """Create the inbox table (idempotent, versioned).

        Without ``conn``: on the inbox's own backend (SQL backends also do this on first
        use). With ``conn``: on that caller connection (PostgreSQL, MySQL, SQLite), for use
        with :meth:`claim_in`; the caller commits. The SQL also ships in
        ``jobfence/backends/<server>/sql/inbox.sql`` for migration tools.
        """
        self._check_open()
        if conn is None:
            self._call("inbox.install", None, self.backend.install)
            return
        sc = adapt(conn, argument="conn")
        dialect = sql_dialect(sc.dialect)
        table = check_namespace(
            self.table, limit=dialect.table_limit, backend=sc.dialect, argument="table"
        )
        try:
            hook("inbox.install", key=None, backend=sc.dialect)
            for statement in dialect.inbox_queries(table).statements("schema"):
                sc.execute(statement, {})
        except Exception as exc:
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): inbox.install failed: "
                f"{type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="inbox.install",
            ) from exc

    def purge(self) -> int:
        """Delete completed records older than ``retention`` (and in-progress claims abandoned
        for longer than that past their deadline). Returns how many were deleted; 0 on Redis,
        where records expire by themselves."""
        self._check_open()
        return self._call("inbox.purge", None, self.backend.purge, self.retention)

    def drop(self) -> None:
        """Delete the inbox's table / keys entirely (tests, uninstall)."""
        self._call("inbox.drop", None, self.backend.drop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.backend.close()

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
