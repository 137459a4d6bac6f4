# Generated from outbox_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The transactional outbox: queue messages inside the caller's database transaction.

``AsyncOutbox`` lives in ``outbox_async.py``; ``Outbox`` in ``outbox.py``, generated from it.

Writing a row and then publishing a message are two writes to two systems (the dual-write
problem): a crash between them loses the message, a publish before a rollback sends one for
a write that never happened. :meth:`AsyncOutbox.add` writes the message as a row of the
outbox table with ONE statement on the caller's own connection, inside the caller's open
transaction, so the message commits or rolls back with the caller's writes; a relay
(``jobfence.Relay``) then claims the committed rows through the outbox's backend
(:attr:`AsyncOutbox.backend`) and publishes them. See docs/concepts/outbox.md.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from . import telemetry
from ._core import forks
from ._core.hooks import get_hook, hook
from ._core.options import option_seconds
from ._core.sqlconn import WARNING_KINDS, adapt, is_undefined_table
from ._core.transaction import own_transaction
from ._core.url import parse_url
from ._core.validate import MAX_LISTING, check_name, check_namespace, check_queue_name
from .backends import open_outbox_backend, sql_dialect
from .backends._sql.outbox_rows import DEFAULT_OUTBOX_TABLE, STATES
from .backends.base import (
    OutboxBackend,
    OutboxEntry,
    OutboxStats,
)
from .backends.clients import Client, describe_target
from .errors import BackendError, ConfigurationError, JobfenceError, SchemaMissing
from .queue import _check_delay, _check_headers

__all__ = ["DEFAULT_OUTBOX_URL", "DEFAULT_RETENTION", "Outbox"]

log = logging.getLogger("jobfence.outbox")

T = TypeVar("T")

#: the embedded default, used when no URL is given and JOBFENCE_URL is not set (as Queue)
DEFAULT_OUTBOX_URL = "sqlite:///jobfence.db"
#: how long published rows are kept for the admin views, by default (seconds)
DEFAULT_RETENTION = 600.0
#: the most rows one add_many takes (one statement)
MAX_ADD_MANY = 10_000
_MAX_RETENTION = 366 * 86400.0


def _encode_body(body: Any) -> str:
    """``body`` as the queue's default serializer encodes it (compact JSON, UTF-8), as text;
    anything JSON cannot hold raises :class:`ConfigurationError` naming ``body``."""
    try:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"body must be a JSON value (dict, list, str, int, float, bool or None; no NaN, "
            f"no lone surrogates): {type(body).__name__} cannot be encoded "
            f"({type(exc).__name__}: {exc})",
            argument="body",
        ) from exc
    return text


def _check_key(key: object) -> str | None:
    """``None``, or an ordering key: a str of 1 to 1024 bytes of UTF-8, without NUL."""
    if key is None:
        return None
    key = check_name(key, argument="key")
    if "\0" in key:
        raise ConfigurationError("key must not contain NUL characters", argument="key")
    return key


def _check_id(value: object, argument: str = "id") -> str:
    """A message id: a str of 1 to 1024 bytes of UTF-8, without NUL."""
    value = check_name(value, argument=argument)
    if "\0" in value:
        raise ConfigurationError(f"{argument} must not contain NUL characters", argument=argument)
    return value


def _headers_text(headers: Mapping[str, str] | None) -> str | None:
    """Headers (checked as a queue checks them) as the JSON text the table stores."""
    checked = _check_headers(headers)
    if not checked:
        return None
    text = json.dumps(checked, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: only their \\u escapes can be stored
        text = json.dumps(checked, separators=(",", ":"))
    return text


def _check_state(state: object) -> str | None:
    if state is None:
        return None
    if isinstance(state, str) and state in STATES:
        return state
    raise ConfigurationError(
        f"state must be None or one of {', '.join(STATES)}, got {state!r}", argument="state"
    )


class Outbox:
    """An outbox table in a PostgreSQL, MySQL/MariaDB or SQLite database.

    ``url``: ``"postgresql://..."``, ``"mysql://..."`` (MariaDB too) or ``"sqlite:///path.db"``:
    the database where the application's own rows live (the outbox's rows must commit in the
    same transactions). Without a URL, ``$JOBFENCE_URL`` or the embedded SQLite file
    ``jobfence.db``, as for :class:`~jobfence.Queue`. It may instead be a pool or engine of
    your own (``psycopg_pool``, a SQLAlchemy engine), used as configured and never closed,
    or an outbox backend. ``memory://`` is refused: an outbox lives in the caller's database
    transaction.

    * ``table`` -- the outbox table: an SQL identifier (``^[A-Za-z_][A-Za-z0-9_]*$``) of at
      most 53 characters on PostgreSQL (lower-cased), 64 on MySQL, 63 on SQLite; default
      ``jobfence_outbox``. Also a URL option.
    * ``retention`` -- how long :meth:`purge` keeps published rows (seconds, default 600).
    * ``**options`` -- the backend's own options: ``pool_size``, ``connect_timeout``,
      ``timeout`` (PostgreSQL, MySQL), ``busy_timeout`` (SQLite).

    :meth:`add` / :meth:`add_many` run on the caller's connection; :attr:`backend` (the
    relay's side: claim, published, failed...) and the admin views run on the outbox's own
    connections.
    """

    def __init__(
        self,
        url: str | OutboxBackend | Client | None = None,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        retention: float = DEFAULT_RETENTION,
        **options: Any,
    ) -> None:
        self.retention = option_seconds(retention, "retention", 0.0, _MAX_RETENTION)
        if isinstance(url, OutboxBackend):
            self.backend = url
            self.url = f"{url.kind}://"
        else:
            if url is None:
                url = os.environ.get("JOBFENCE_URL") or DEFAULT_OUTBOX_URL
            if isinstance(url, str):
                self._refuse_memory(url)
            self.backend = open_outbox_backend(url, asynchronous=False, table=table, **options)
            self.url = describe_target(url)
        self.table: str = self.backend.table
        #: the statements of ``add`` by the SQL dialect of the caller's connection (the
        #: table name checked against that server's limit once, not on every add)
        self._add_queries: dict[str, Any] = {}
        self._closed = False
        forks.register(self)  # a child process forked from here resets it: _after_fork

    @staticmethod
    def _refuse_memory(url: str) -> None:
        try:
            scheme = parse_url(url, argument="url").scheme
        except ConfigurationError:
            return  # the backend registry says what is wrong with it
        if scheme == "memory":
            raise ConfigurationError(
                "url: an outbox cannot live in memory://: its rows must commit in the same "
                "database transaction as your own writes; use the URL of that database "
                "(postgresql://, mysql://, sqlite:///file.db), or jobfence.testing's "
                "simulated tables in tests",
                argument="url",
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} table={self.table}>"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this Outbox is closed", argument="self")

    def _call(self, operation: str, fn: Callable[..., T], *args: Any) -> T:
        """The I/O hook at ``outbox.manage`` (``operation``: ``install``, ``entries``,
        ``stats``, ``retry_dead``, ``purge``, ``drop``), then ``fn(*args)`` on the backend;
        driver errors (and faults a hook injects, which stand for them) wrapped in
        :class:`BackendError` whose operation is ``outbox.<operation>``."""
        try:
            if get_hook() is not None:
                hook("outbox.manage", operation=operation, backend=self.backend.kind)
            return fn(*args)
        except (JobfenceError, NotImplementedError):
            raise
        except Exception as exc:
            raise BackendError(
                f"{self.backend.kind} outbox ({self.url}): outbox.{operation} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=self.backend.kind,
                operation=f"outbox.{operation}",
            ) from exc

    # -- adding, in the caller's transaction ---------------------------------------------
    def add(
        self,
        conn: Any,
        *,
        queue: str,
        body: Any,
        id: str | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> str:
        """Add one message to the outbox INSIDE the caller's open transaction on ``conn``;
        return its id (``id``, or a new random one).

        ONE statement on ``conn``: the row commits or rolls back with the caller's own
        writes, and a relay publishes it only once it is committed. ``queue`` is where it
        goes (a queue name, or a task name for a framework target); ``body`` a JSON value,
        encoded as :class:`~jobfence.Queue` encodes bodies; ``key`` (optional) orders it
        after every earlier row of the same key; ``headers`` go with the message; ``delay``
        seconds before a relay may publish it. An ``id`` already in the outbox (pending,
        dead, or published and still retained) is not added again. Never creates the table:
        :class:`SchemaMissing` says to run :meth:`install` first. On PostgreSQL the same
        statement wakes the relays (delivered at commit), and a statement that failed
        leaves the caller's transaction aborted: roll it back. ``add`` never begins a
        transaction: on a connection in autocommit mode with no transaction open, the row
        commits at once on its own, apart from the caller's other writes.

        ``conn``: a PostgreSQL, MySQL/MariaDB or SQLite connection (psycopg, asyncpg,
        PyMySQL, aiomysql, sqlite3, aiosqlite, SQLAlchemy Connection / Session, Django
        connection), in the flavour of this outbox (``AsyncOutbox``: the asyncio ones). An
        ``AsyncOutbox`` also takes a simulated table or transaction of
        :mod:`jobfence.testing` (an object with ``__jobfence_transaction__``).
        """
        ids = self._add(conn, queue, [body], None if id is None else [id], key, headers, delay)
        return ids[0]

    def add_many(
        self,
        conn: Any,
        *,
        queue: str,
        bodies: Iterable[Any],
        ids: Iterable[str] | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> list[str]:
        """:meth:`add` for many bodies in ONE statement (in their order: a relay publishes
        rows of one ``key`` in this order); ``ids`` (one per body) default to new random
        ids. Returns the ids."""
        body_list = bodies if isinstance(bodies, list) else list(bodies)
        id_list = None if ids is None else list(ids)
        return self._add(conn, queue, body_list, id_list, key, headers, delay)

    def _add(
        self,
        conn: Any,
        queue: str,
        bodies: list[Any],
        ids: list[str] | None,
        key: str | None,
        headers: Mapping[str, str] | None,
        delay: float,
    ) -> list[str]:
        self._check_open()
        queue = check_queue_name(queue, argument="queue")
        key = _check_key(key)
        head = _headers_text(headers)
        delay = _check_delay(delay)
        if len(bodies) > MAX_ADD_MANY:
            raise ConfigurationError(
                f"bodies: at most {MAX_ADD_MANY} rows per call, got {len(bodies)}",
                argument="bodies",
            )
        if ids is None:
            id_list = [uuid.uuid4().hex for _ in bodies]
        else:
            id_list = [_check_id(i, "id" if len(bodies) == 1 else "ids") for i in ids]
            if len(id_list) != len(bodies):
                raise ConfigurationError(
                    f"ids must have one id per body: {len(id_list)} ids for {len(bodies)} bodies",
                    argument="ids",
                )
        texts = [_encode_body(body) for body in bodies]
        if not texts:
            return []
        tx = own_transaction(conn)
        if tx is not None:  # a jobfence.testing simulated table or transaction
            return self._add_in_transaction(tx, queue, id_list, texts, key, head, delay)
        sc = adapt(conn, argument="conn", operation="outbox.add")
        queries = self._add_queries.get(sc.dialect)
        if queries is None:
            dialect = sql_dialect(sc.dialect)
            table = check_namespace(
                self.table, limit=dialect.outbox_table_limit, backend=sc.dialect, argument="table"
            )
            queries = self._add_queries[sc.dialect] = dialect.outbox_queries(table)
        # a key or headers that are None are left out: a missing member reads as NULL on
        # every server (a JSON null may not, in MySQL's JSON_TABLE)
        common: dict[str, Any] = {"queue": queue, "delay": delay}
        common["delay_us"] = round(delay * 1_000_000)
        if key is not None:
            common["key"] = key
        if head is not None:
            common["headers"] = head
        rows = [
            {"id": id_, **common, "body": text} for id_, text in zip(id_list, texts, strict=True)
        ]
        params: dict[str, Any]
        if len(rows) == 1 and "add_one" in queries:
            # one row: a plain INSERT ... VALUES (no JSON array to encode and parse; on
            # MySQL the JSON form also sorts on the server, even for one row)
            statement = queries["add_one"]
            params = {"key": None, "headers": None, **rows[0]}
        else:
            statement = queries["add"]
            params = {"rows": json.dumps(rows, ensure_ascii=False, separators=(",", ":"))}
        try:
            hook("outbox.add", queue=queue, ids=id_list, backend=sc.dialect)
            sc.execute(statement, params)
        except JobfenceError:
            raise
        except Exception as exc:
            if is_undefined_table(exc):
                raise SchemaMissing(
                    f"the outbox table {self.table!r} does not exist in this {sc.dialect} "
                    "database: run outbox.install() (or outbox.install(conn)) first; add "
                    "never creates tables inside your transaction",
                    backend=sc.dialect,
                    operation="outbox.add",
                ) from exc
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): outbox.add of {len(rows)} row(s) "
                f"for queue {queue!r} failed: {type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="outbox.add",
            ) from exc
        telemetry.outbox_added(sc.dialect, queue, len(rows))
        return id_list

    def _add_in_transaction(
        self,
        tx: Any,
        queue: str,
        ids: list[str],
        texts: list[str],
        key: str | None,
        headers: str | None,
        delay: float,
    ) -> list[str]:
        """:meth:`add` on an object that is a transaction of its own (see
        ``jobfence._core.transaction``): ``tx.outbox_add(table, row)`` per row, with the
        same hook point and telemetry."""
        head = None if headers is None else json.loads(headers)
        try:
            hook("outbox.add", queue=queue, ids=ids, backend=tx.dialect)
            for id_, text in zip(ids, texts, strict=True):
                row = {
                    "id": id_,
                    "queue": queue,
                    "key": key,
                    "body": text.encode("utf-8"),
                    "headers": dict(head or {}),
                    "delay": delay,
                }
                tx.outbox_add(self.table, row)
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{tx.dialect} transaction: outbox.add for queue {queue!r} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=tx.dialect,
                operation="outbox.add",
            ) from exc
        telemetry.outbox_added(tx.dialect, queue, len(ids))
        return ids

    # -- schema --------------------------------------------------------------------------
    def install(self, conn: Any = None) -> None:
        """Create the outbox table (idempotent, versioned).

        Without ``conn``: on the outbox's own connection (the backend also does this on
        first use). With ``conn``: on that caller connection, in the caller's transaction
        (the caller commits). The SQL also ships in
        ``jobfence/backends/<server>/sql/outbox.sql`` for migration tools.
        """
        self._check_open()
        if conn is None:
            self._call("install", self.backend.install)
            return
        sc = adapt(conn, argument="conn", operation="outbox.install")
        dialect = sql_dialect(sc.dialect)
        table = check_namespace(
            self.table, limit=dialect.outbox_table_limit, backend=sc.dialect, argument="table"
        )
        try:
            hook("outbox.manage", operation="install", backend=sc.dialect)
            for statement in dialect.outbox_queries(table).statements("schema"):
                if sc.kind in WARNING_KINDS and dialect.name == "mysql":
                    with warnings.catch_warnings():  # see WARNING_KINDS
                        warnings.filterwarnings("ignore", message=".*already exists")
                        sc.execute(statement, {})
                else:
                    sc.execute(statement, {})
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{sc.dialect} connection ({sc.driver}): outbox.install failed: "
                f"{type(exc).__name__}: {exc}",
                backend=sc.dialect,
                operation="outbox.install",
            ) from exc

    # -- admin views ---------------------------------------------------------------------
    def entries(
        self,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> list[OutboxEntry]:
        """Up to ``limit`` (1 to 100000) rows in insertion (``seq``) order, after the row
        ``seq == after`` when given, of one ``state`` (``"pending"``, ``"claimed"``,
        ``"published"``, ``"dead"``) and one ``queue`` when given. For operators and
        dashboards; read-only."""
        self._check_open()
        checked = _check_state(state)
        if queue is not None:
            queue = check_queue_name(queue, argument="queue")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTING:
            raise ConfigurationError(
                f"limit must be an int from 1 to {MAX_LISTING}, got {limit!r}", argument="limit"
            )
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int) or after < 0
        ):
            raise ConfigurationError(
                f"after must be None or a seq number (an int >= 0), got {after!r}",
                argument="after",
            )
        return self._call("entries", self.backend.entries, checked, queue, limit, after)

    def stats(self) -> OutboxStats:
        """How many rows are pending, claimed, published (retained) and dead, and the age of
        the oldest row still to publish."""
        self._check_open()
        return self._call("stats", self.backend.stats)

    def retry_dead(self, ids: Iterable[str] | None = None) -> int:
        """Make the dead rows ``ids`` (every dead row when None) pending again, their
        attempts reset; returns how many. A revived row with a ``key`` is published after
        the later rows of its key that went out while it was dead (out of the key's order),
        and before the rows of its key that are still waiting."""
        self._check_open()
        id_list: Sequence[str] | None = None
        if ids is not None:
            if isinstance(ids, str):
                raise ConfigurationError(
                    "ids must be an iterable of ids, not one str", argument="ids"
                )
            id_list = [_check_id(i, "ids") for i in ids]
        return self._call("retry_dead", self.backend.retry_dead, id_list)

    def purge(self, retention: float | None = None) -> int:
        """Delete the rows published more than ``retention`` seconds ago (default: the
        outbox's ``retention``; 0: every published row); returns how many."""
        self._check_open()
        keep = (
            self.retention
            if retention is None
            else option_seconds(retention, "retention", 0.0, _MAX_RETENTION)
        )
        return self._call("purge", self.backend.purge, keep)

    def drop(self) -> None:
        """Drop the outbox table (tests, uninstall)."""
        self._call("drop", self.backend.drop)

    def close(self) -> None:
        """Close the backend's connections (a caller's pool or engine is left open)."""
        if self._closed:
            return
        self._closed = True
        self.backend.close()

    def _after_fork(self) -> None:
        """In a child process right after ``fork()`` (``jobfence/_core/forks.py``): a backend
        that opens its own connections."""
        self.backend.after_fork()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
