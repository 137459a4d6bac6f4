"""Classify driver errors as *conflicts* or *transient* failures.

:func:`is_conflict` and :func:`is_transient` answer one question for :func:`jobfence.retry_unit`
and for your own code: *would running the whole unit of work again, from its reads, help?*

``conflict``
    Another transaction changed (or locked) the data this unit read or wrote: serialization
    failure, deadlock, lock-wait timeout, a stale optimistic version, a Redis ``WATCH`` abort,
    SQLite ``database is locked``. The database has rolled the work back (or the caller must);
    re-run the unit from its reads.
``transient``
    The infrastructure failed, not the data: connection lost or refused, server restarting,
    statement timeout, pool exhausted. Re-running on a fresh connection may succeed. A transient
    error that struck *during a commit* leaves the outcome unknown (see
    :func:`is_commit_outcome_unknown`); :func:`jobfence.retry_unit` retries those only for
    protected units.
``lease_lost``
    :class:`~jobfence.StaleToken` and :class:`~jobfence.LockLost`: the lease this unit runs under
    is gone. Neither a conflict nor transient: re-running under the same lease cannot succeed.
    Acquire a new lease (``guarded`` does) or stop.

Classification is table-driven (the tables below are the documentation) and never imports a
driver: classes are recognised by module and class name, so an optional driver that is not
installed costs nothing. An exception is classified by the first link of its chain that the
tables know: the exception itself, then SQLAlchemy's ``.orig``, ``__cause__`` and
``__context__`` (unless suppressed with ``raise ... from None``). Django's database errors
(``django.db.utils.OperationalError``, ``IntegrityError``, ...) carry the driver's error as
``__cause__`` and are classified by it: a serialization failure or deadlock raised through
Django's ORM or cursor is a conflict, a dropped connection transient. A link the tables mark as
*never retry* (e.g. :class:`~jobfence.ConfigurationError`, SQLAlchemy's
``PendingRollbackError``, Django's ``TransactionManagementError``, Redis authentication
errors) stops the walk. ``KeyboardInterrupt``,
``SystemExit`` and ``asyncio.CancelledError`` are never classified.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from enum import Enum

from .errors import (
    CommitOutcomeUnknown,
    ConfigurationError,
    ConflictError,
    InboxError,
    LockError,
    LockLost,
    NotReplicated,
    SchemaMissing,
    StaleToken,
)

__all__ = [
    "MYSQL_ERROR_CODES",
    "POSTGRES_SQLSTATES",
    "ErrorKind",
    "classify",
    "is_commit_outcome_unknown",
    "is_conflict",
    "is_transient",
]


class ErrorKind(str, Enum):
    """What :func:`classify` found. ``str`` values, so ``kind == "conflict"`` works."""

    CONFLICT = "conflict"
    TRANSIENT = "transient"
    LEASE_LOST = "lease_lost"


CONFLICT = ErrorKind.CONFLICT
TRANSIENT = ErrorKind.TRANSIENT
LEASE_LOST = ErrorKind.LEASE_LOST


class _Never:
    """Table value: a known error that must never be retried; stops the chain walk."""


NEVER = _Never()

_Result = ErrorKind | _Never | None

# PostgreSQL SQLSTATEs (psycopg 3 ``.sqlstate``, psycopg2 ``.pgcode``, asyncpg ``.sqlstate``,
# SQLAlchemy's asyncpg adapter). A whole class is written as its two-character prefix.
POSTGRES_SQLSTATES: dict[str, ErrorKind] = {
    "40001": CONFLICT,  # serialization_failure (SERIALIZABLE / REPEATABLE READ write conflict)
    "40P01": CONFLICT,  # deadlock_detected
    "55P03": CONFLICT,  # lock_not_available (lock_timeout expired, FOR UPDATE NOWAIT)
    "40003": TRANSIENT,  # statement_completion_unknown (also: commit outcome unknown)
    "57014": TRANSIENT,  # query_canceled: statement_timeout (also pg_cancel_backend)
    "57P01": TRANSIENT,  # admin_shutdown: pg_terminate_backend, fast shutdown
    "57P02": TRANSIENT,  # crash_shutdown
    "57P03": TRANSIENT,  # cannot_connect_now: server starting up / in recovery
    "57P05": TRANSIENT,  # idle_session_timeout
    "53300": TRANSIENT,  # too_many_connections
    "25P03": TRANSIENT,  # idle_in_transaction_session_timeout (session terminated)
    "25P04": TRANSIENT,  # transaction_timeout (PostgreSQL 17; session terminated)
    "08": TRANSIENT,  # class 08, connection_exception: every 08xxx
}

# MySQL / MariaDB error numbers (PyMySQL, aiomysql, mysqlclient ``args[0]``;
# mysql-connector ``.errno``).
MYSQL_ERROR_CODES: dict[int, ErrorKind] = {
    1213: CONFLICT,  # ER_LOCK_DEADLOCK: the whole transaction was rolled back
    # ER_LOCK_WAIT_TIMEOUT: only the *statement* was rolled back (unless the server runs with
    # innodb_rollback_on_timeout); the transaction is still open. retry_unit re-runs the whole
    # unit, so the unit must roll its transaction back on error (a ``with`` block does).
    1205: CONFLICT,
    3572: CONFLICT,  # ER_LOCK_NOWAIT (FOR UPDATE NOWAIT)
    1020: CONFLICT,  # ER_CHECKREAD: record changed since last read (MariaDB snapshot isolation)
    2002: TRANSIENT,  # CR_CONNECTION_ERROR (socket)
    2003: TRANSIENT,  # CR_CONN_HOST_ERROR: can't connect
    2006: TRANSIENT,  # CR_SERVER_GONE_ERROR: server has gone away
    2013: TRANSIENT,  # CR_SERVER_LOST: lost connection during query
    2055: TRANSIENT,  # CR_SERVER_LOST_EXTENDED
    1040: TRANSIENT,  # ER_CON_COUNT_ERROR: too many connections
    1053: TRANSIENT,  # ER_SERVER_SHUTDOWN
    1927: TRANSIENT,  # ER_CONNECTION_KILLED (MariaDB: KILL)
    4031: TRANSIENT,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: idle connection closed)
    1317: TRANSIENT,  # ER_QUERY_INTERRUPTED (KILL QUERY)
    3024: TRANSIENT,  # ER_QUERY_TIMEOUT (MySQL max_execution_time)
    1969: TRANSIENT,  # ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
}

# (module prefix, class name) -> kind, matched along the exception's MRO, most specific first.
_CLASS_TABLE: dict[tuple[str, str], _Result] = {
    # redis-py (sync and redis.asyncio share redis.exceptions)
    ("redis", "AuthenticationError"): NEVER,  # a ConnectionError subclass, but not transient
    ("redis", "AuthorizationError"): NEVER,
    ("redis", "ExternalAuthProviderError"): NEVER,
    ("redis", "WatchError"): CONFLICT,  # a watched key changed: MULTI/EXEC aborted
    ("redis", "BusyLoadingError"): TRANSIENT,  # server loading its dataset
    ("redis", "ConnectionError"): TRANSIENT,  # includes MaxConnectionsError (pool exhausted)
    ("redis", "TimeoutError"): TRANSIENT,
    ("redis", "TryAgainError"): TRANSIENT,  # cluster resharding
    ("redis", "ClusterDownError"): TRANSIENT,  # includes MasterDownError
    ("redis", "ReadOnlyError"): TRANSIENT,  # wrote to a replica during failover
    # SQLAlchemy
    ("sqlalchemy", "StaleDataError"): CONFLICT,  # version_id_col mismatch / row vanished
    ("sqlalchemy", "PendingRollbackError"): NEVER,  # retrying inside a failed transaction
    ("sqlalchemy", "DisconnectionError"): TRANSIENT,
    ("sqlalchemy", "TimeoutError"): TRANSIENT,  # pool checkout timed out
    # Django: a query inside an atomic() block that already failed; the block must end first
    ("django", "TransactionManagementError"): NEVER,
    # psycopg_pool
    ("psycopg_pool", "PoolClosed"): NEVER,
    ("psycopg_pool", "PoolTimeout"): TRANSIENT,
    ("psycopg_pool", "TooManyRequests"): TRANSIENT,
    # task-framework brokers (the outbox relay's framework targets): cannot reach the broker
    ("kombu", "OperationalError"): TRANSIENT,  # Celery: connection refused/lost after retries
    ("dramatiq", "BrokerConnectionError"): TRANSIENT,  # ConnectionFailed, ConnectionClosed
    ("pika", "AMQPConnectionError"): TRANSIENT,
    # builtins: ConnectionRefusedError, ConnectionResetError, BrokenPipeError, ...
    ("builtins", "ConnectionError"): TRANSIENT,
}

_PG_MODULES = ("psycopg", "psycopg2", "asyncpg", "sqlalchemy.dialects.postgresql")
_MYSQL_MODULES = ("pymysql", "aiomysql", "MySQLdb", "mysql.connector", "asyncmy")
_SQLITE_LOCKED_MESSAGES = (
    "database is locked",
    "database table is locked",
    "database schema is locked",
)
_MAX_CHAIN = 32


def _module_of(cls: type) -> str:
    return getattr(cls, "__module__", "") or ""


def _startswith(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _own(exc: BaseException) -> _Result:
    if isinstance(exc, (CommitOutcomeUnknown, NotReplicated)):  # replicas may catch up
        return TRANSIENT
    if isinstance(exc, ConflictError):  # StaleVersion and other optimistic conflicts
        return CONFLICT
    if isinstance(exc, (StaleToken, LockLost)):
        return LEASE_LOST
    if isinstance(exc, (ConfigurationError, SchemaMissing, InboxError, LockError)):
        return NEVER
    return None  # BackendError and others: classified by their cause


#: words in psycopg's SQLSTATE-less OperationalError messages that mean the connection failed
_PSYCOPG_CONNECTION_WORDS = (
    "connection",
    "server closed",
    "terminat",
    "ssl",
    "could not receive",
    "could not send",
    "timeout expired",
    "eof detected",
    "no route to host",
)


def _sqlstate_kind(code: object) -> ErrorKind | None:
    if not isinstance(code, str) or len(code) != 5:
        return None
    return POSTGRES_SQLSTATES.get(code) or POSTGRES_SQLSTATES.get(code[:2])


def _postgres(exc: BaseException, module: str) -> _Result:
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    kind = _sqlstate_kind(code)
    if kind is not None:
        return kind
    names = {c.__name__ for c in type(exc).__mro__}
    if module.startswith("psycopg") and code is None and "OperationalError" in names:
        # psycopg raises OperationalError without a SQLSTATE when the connection fails
        # (refused, closed by the server, "the connection is lost") -- but also for
        # client-side errors on a healthy connection (too many parameters), which a retry
        # cannot fix: transient only if there is no connection or it is not OK any more.
        pgconn = getattr(exc, "pgconn", None)
        status = getattr(pgconn, "status", None)
        if status is not None and int(status) != 0:  # 0: CONNECTION_OK
            return TRANSIENT
        message = str(exc).lower()
        if any(word in message for word in _PSYCOPG_CONNECTION_WORDS):
            return TRANSIENT
        return None
    if module.startswith("asyncpg") and "InterfaceError" in names:
        message = str(exc).lower()
        if "connection is closed" in message or "connection was closed" in message:
            return TRANSIENT
    return None


def _mysql(exc: BaseException) -> _Result:
    code = getattr(exc, "errno", None)
    if not isinstance(code, int) and exc.args and isinstance(exc.args[0], int):
        code = exc.args[0]
    if isinstance(code, int) and code in MYSQL_ERROR_CODES:
        return MYSQL_ERROR_CODES[code]
    if any(c.__name__ == "InterfaceError" for c in type(exc).__mro__):
        # PyMySQL/aiomysql: InterfaceError(0, '') / "Not connected": the connection is closed.
        return TRANSIENT
    return None


def _sqlite(exc: BaseException) -> _Result:
    # SQLITE_BUSY / SQLITE_LOCKED (and extended codes such as SQLITE_BUSY_SNAPSHOT): another
    # connection holds a conflicting lock. Treated as a conflict, like MySQL's lock-wait timeout:
    # retrying the statement inside the same transaction can deadlock (a deferred transaction
    # that cannot upgrade to a write lock must roll back and start again).
    name = getattr(exc, "sqlite_errorname", None)
    if isinstance(name, str) and name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return CONFLICT
    message = str(exc).lower()
    if any(m in message for m in _SQLITE_LOCKED_MESSAGES):
        return CONFLICT
    return None


def _one(exc: BaseException) -> _Result:
    """Classify one exception (not its chain)."""
    own = _own(exc)
    if own is not None:
        return own
    cls = type(exc)
    module = _module_of(cls)
    for klass in cls.__mro__:
        kmod = _module_of(klass)
        for (prefix, name), kind in _CLASS_TABLE.items():
            if klass.__name__ == name and _startswith(kmod, (prefix,)):
                return kind
    if _startswith(module, _PG_MODULES):
        return _postgres(exc, module)
    if _startswith(module, _MYSQL_MODULES) or _startswith(module, ("pymysql.err",)):
        return _mysql(exc)
    if module == "sqlite3" or _startswith(module, ("aiosqlite",)):
        return _sqlite(exc)
    if module.startswith("sqlalchemy") and getattr(exc, "connection_invalidated", False):
        return TRANSIENT  # DBAPIError whose connection SQLAlchemy detected as disconnected
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then (breadth-first) ``.orig``, ``__cause__``, ``__context__``."""
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue and len(seen) < _MAX_CHAIN:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        orig = getattr(e, "orig", None)
        if isinstance(orig, BaseException):
            queue.append(orig)
        if e.__cause__ is not None:
            queue.append(e.__cause__)
        if e.__context__ is not None and not e.__suppress_context__:
            queue.append(e.__context__)


def _is_control_flow(exc: BaseException) -> bool:
    # KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError, trio.Cancelled ...
    return not isinstance(exc, Exception)


def _classify_link(exc: BaseException) -> tuple[_Result, BaseException | None]:
    for link in _chain(exc):
        if _is_control_flow(link):
            return NEVER, link
        kind = _one(link)
        if kind is not None:
            return kind, link
    return None, None


def never_retry(exc: BaseException) -> bool:
    """True for errors no retry may ever repeat, whatever a policy's ``retry_on`` says: a lost
    lease or a stale token (the unit no longer owns its resource), jobfence's configuration,
    schema and inbox errors, failed authentication, a failed SQLAlchemy transaction."""
    link: BaseException | None = exc
    while link is not None:  # the error and the errors it wraps (__cause__), not __context__
        if not _is_control_flow(link):  # e.g. TimeoutError raised from CancelledError
            kind = _one(link)
            if kind is not None:
                return kind is NEVER or kind is LEASE_LOST
        link = link.__cause__
    return False


def classify(exc: BaseException) -> ErrorKind | None:
    """Return :class:`ErrorKind` for ``exc`` (walking its chain), or ``None`` if unknown."""
    if _is_control_flow(exc):
        return None
    kind, _ = _classify_link(exc)
    return kind if isinstance(kind, ErrorKind) else None


def is_conflict(exc: BaseException) -> bool:
    """True if another transaction's change (or lock) made this unit fail: re-run it from its reads.

    Serialization failure (40001), deadlock (40P01, MySQL 1213), lock-wait timeout (MySQL 1205,
    PostgreSQL 55P03), SQLite ``database is locked``, Redis ``WatchError``, SQLAlchemy
    ``StaleDataError``, :class:`~jobfence.StaleVersion`. ``exc`` is the exception the unit
    raised.
    """
    return classify(exc) is CONFLICT


def is_transient(exc: BaseException) -> bool:
    """True if the infrastructure failed (connection lost/refused, restart, timeout), not the data.

    Includes :class:`~jobfence.CommitOutcomeUnknown`; check :func:`is_commit_outcome_unknown`
    before blindly retrying a transient error that may have struck a commit. ``exc`` is the
    exception the unit raised.
    """
    return classify(exc) is TRANSIENT


# Functions whose frames mark "this error was raised while committing". Module prefix ->
# predicate on the function name. Used only for errors already classified transient.
_COMMIT_DRIVERS = (
    "psycopg",
    "psycopg2",
    "asyncpg",
    "pymysql",
    "aiomysql",
    "MySQLdb",
    "sqlalchemy",
    "django.db.backends",  # BaseDatabaseWrapper.commit()
)


# The commit of jobfence.testing's simulated tables (``async with db.transaction()``), which
# stand for a driver's connection in a simulation: a fault injected there is recognised as a
# driver's failing commit is. Their writes outside a transaction are not commits, as a
# statement in autocommit mode is not.
_SIMULATED_COMMITS = frozenset(
    {("jobfence.testing.table", "commit"), ("jobfence.testing.table_real", "commit")}
)


def _frames(tb: types.TracebackType | None) -> Iterator[types.FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _raised_in_commit(exc: BaseException) -> bool:
    for frame in _frames(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if not isinstance(module, str):
            continue
        name = frame.f_code.co_name
        if (module, name) in _SIMULATED_COMMITS:
            return True
        if _startswith(module, _COMMIT_DRIVERS):
            if "commit" in name.lower():
                return True
            # psycopg ``with conn.transaction():`` commits in Transaction.__exit__ when the
            # block raised nothing.
            if (
                module.startswith("psycopg")
                and name in ("__exit__", "__aexit__")
                and "exc_type" in frame.f_locals
                and frame.f_locals["exc_type"] is None
                and type(frame.f_locals.get("self")).__name__.endswith("Transaction")
            ):
                return True
        # redis-py MULTI/EXEC: the connection failed while EXEC was in flight.
        if _startswith(module, ("redis",)) and name == "_execute_transaction":
            return True
    return False


def is_commit_outcome_unknown(exc: BaseException) -> bool:
    """True if ``exc`` means "the commit may or may not have been applied".

    Recognised: :class:`~jobfence.CommitOutcomeUnknown` anywhere in the chain; PostgreSQL
    SQLSTATE 40003 (statement_completion_unknown); and a *transient* (connection) error raised
    from inside a driver's commit: psycopg ``commit()`` / ``with conn:`` /
    ``with conn.transaction():``, asyncpg ``Transaction.commit`` / ``async with
    conn.transaction():``, PyMySQL/aiomysql ``commit()``, SQLAlchemy ``commit()`` (which also
    covers its flush), redis-py ``MULTI/EXEC`` pipelines; and, in a simulation, the commit of a
    :mod:`jobfence.testing` table's transaction.

    Not recognisable: ``execute("COMMIT")`` issued as a plain statement, and statements run in
    autocommit mode (each one is its own commit). Raise :class:`~jobfence.CommitOutcomeUnknown`
    yourself there, or declare the unit protected.
    """
    if _is_control_flow(exc):
        return False
    links = list(_chain(exc))
    for link in links:
        if isinstance(link, CommitOutcomeUnknown):
            return True
        code = getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)
        if code == "40003":
            return True
    # A conflict raised at COMMIT (e.g. PostgreSQL SERIALIZABLE failing at commit) has a known
    # outcome: rolled back. Only a transient (connection) failure leaves it unknown.
    return classify(exc) is TRANSIENT and any(_raised_in_commit(link) for link in links)
