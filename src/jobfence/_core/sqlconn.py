"""Run one statement on the *caller's* database connection, inside the caller's transaction.

``fence()``, ``versioned_update()`` and ``Inbox.claim_in()`` work on a connection the
application already holds, so that their write commits or rolls back together with the
application's own writes. This module hides the differences between the drivers:

===========================  ===========  ===============================================
connection type              dialect      placeholder sent to the driver (``:name`` SQL)
===========================  ===========  ===============================================
psycopg ``Connection``       postgresql   ``%(name)s``
PyMySQL ``Connection``       mysql        ``%(name)s``
``sqlite3.Connection``       sqlite       ``:name``
SQLAlchemy ``Connection``,   from         ``:name`` with ``text()``
``Session``                  ``.dialect``
psycopg ``AsyncConnection``  postgresql   ``%(name)s``                            (async)
asyncpg ``Connection`` and   postgresql   ``$1, $2, ...``                         (async)
pool connection proxy
aiomysql ``Connection``      mysql        ``%(name)s``                            (async)
aiosqlite ``Connection``     sqlite       ``:name``                               (async)
SQLAlchemy                   from         ``:name`` with ``text()``               (async)
``AsyncConnection``,         ``.dialect``
``AsyncSession``
Django ``connection``,       from         ``%s``, through Django's cursor
``connections[alias]``       ``.vendor``
===========================  ===========  ===============================================

MariaDB counts as ``mysql``. Drivers are recognised by module and class name (the MRO is
walked, so subclasses work), so no optional driver is ever imported here.

A Django connection (``django.db.connection``, a proxy to the current thread's connection of
the default alias, or ``django.db.connections[alias]``, a ``BaseDatabaseWrapper``) is
connected with ``ensure_connection()`` and its statements run through Django's own cursor,
not on the driver connection underneath: Django then sees them as its own queries. A broken
``atomic()`` block refuses them (``TransactionManagementError``) instead of sending them into
an aborted transaction; a failed statement sets the wrapper's ``errors_occurred``, so Django's
health checks replace a dead connection; ``execute_wrapper()`` instrumentation and
``connection.queries`` see them; and errors arrive as Django wraps them
(``django.db.utils.OperationalError`` ... with the driver's error as ``__cause__``), as the
rest of the application's queries do. Any driver Django's ``postgresql`` (psycopg 3 or
psycopg2), ``sqlite3`` and ``mysql`` (mysqlclient, or PyMySQL installed as ``MySQLdb``)
backends use works, since the driver is never called directly. Django has no asyncio
connections: in async code call the sync functions through ``asgiref``'s ``sync_to_async``.

API (stable: other modules build on it)::

    sc = adapt(conn)                  # SqlConn, for sync connections
    sc = adapt_async(conn)            # AsyncSqlConn, for asyncio connections
    sc.dialect                        # "postgresql" | "mysql" | "sqlite"
    sc.driver                         # "psycopg", "asyncpg", "pymysql", "aiomysql", "sqlite3",
                                      # "aiosqlite", "sqlalchemy+<driver>" or "django+<driver>"
    result = sc.execute(sql, params)  # (await it for AsyncSqlConn) -> Result
    result.rows, result.rowcount, result.lastrowid, result.columns
    sc.closed()                       # whether the caller's connection is closed

A statement that fails on a connection the driver reports closed (closed by the caller, or
lost) raises :class:`~jobfence.BackendError` naming the dialect, the driver, the operation
(``adapt(conn, operation="fence")``) and that the connection is closed, with the driver's
error as ``__cause__``; every other driver error comes through unchanged.

SQL is written once with named ``:name`` parameters and a dict of values, the convention of
every shipped ``.sql`` file; ``execute`` converts it for the driver with
:func:`jobfence._core.sqlfiles.convert` (``::`` casts and quoted text are left alone; a
literal ``%`` is doubled for the ``%(name)s`` drivers). Ad-hoc SQL may instead use ``?``
placeholders with a sequence of values (``%s``, ``$n`` or ``:p0, :p1, ...`` for the driver);
never put a ``?`` inside a string literal of such SQL: pass values as parameters.

``execute`` never begins, commits or rolls back a transaction and never touches autocommit:
the statement runs in whatever transaction the caller has open (drivers that begin one
implicitly before the first statement, like psycopg, sqlite3 and SQLAlchemy, still do that).
Rows always come back as plain tuples, whatever row factory or cursor class the caller's
connection is configured with. ``rowcount`` is the driver's count of affected rows for
INSERT/UPDATE/DELETE (on MySQL: *changed* rows unless the client sets ``CLIENT_FOUND_ROWS``)
and the number of returned rows for statements that return rows.

Helpers: :func:`check_ident` validates a table or column name (``^[A-Za-z_][A-Za-z0-9_]{0,62}$``,
optionally ``schema.table``), :meth:`SQLDialect.quote` quotes a validated name for a
dialect, and :func:`is_undefined_table` recognises every driver's "table does not exist" error.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BackendError, ConfigurationError
from .sqlfiles import Queries, convert, load_sql

__all__ = [
    "AsyncSqlConn",
    "Result",
    "SQLDialect",
    "SqlConn",
    "adapt",
    "adapt_async",
    "check_ident",
    "is_old_schema",
    "is_undefined_column",
    "is_undefined_table",
]

DIALECTS = ("postgresql", "mysql", "sqlite")

SYNC_SUPPORTED = (
    "psycopg.Connection, pymysql.Connection, sqlite3.Connection, sqlalchemy Connection or "
    "Session, Django connection (django.db.connection or connections[alias])"
)
#: the Django ``connection.vendor`` names jobfence runs on: they are the dialect names
_DJANGO_VENDORS = ("postgresql", "sqlite", "mysql")
ASYNC_SUPPORTED = (
    "psycopg.AsyncConnection, asyncpg Connection (or pool connection), aiomysql.Connection, "
    "aiosqlite.Connection, sqlalchemy AsyncConnection or AsyncSession"
)


@dataclass
class Result:
    """What one statement produced: rows as tuples, affected-row count, last insert id."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = -1
    lastrowid: int | None = None
    columns: list[str] = field(default_factory=list)


# -- identifiers ----------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_ident(name: object, argument: str, *, qualified: bool = True) -> str:
    """Validate a table/column name; ``schema.table`` is allowed when ``qualified``.

    Names are matched against ``^[A-Za-z_][A-Za-z0-9_]{0,62}$`` per part, so nothing that
    could end an identifier or start SQL can get through.
    """
    if not isinstance(name, str):
        raise ConfigurationError(
            f"{argument} must be a str identifier, got {type(name).__name__}", argument=argument
        )
    parts = name.split(".")
    if len(parts) > (2 if qualified else 1) or not all(_IDENT.fullmatch(p) for p in parts):
        allowed = "optionally schema-qualified as schema.name, " if qualified else ""
        raise ConfigurationError(
            f"{argument} must be an SQL identifier: letters, digits and _, not starting with a "
            f"digit, at most 63 characters, {allowed}got {name!r}",
            argument=argument,
        )
    return name


# -- dialects -------------------------------------------------------------------------------


class SQLDialect:
    """What the features that run on a caller's connection -- ``fence``, ``claim_in``,
    ``versioned_update``, ``inbox.install(conn)`` -- need to know about one SQL dialect.

    Each SQL backend package has one, in ``backends/<server>/dialect.py`` (hand-written, no
    I/O); ``jobfence.backends.sql_dialect(name)`` finds it for the dialect :func:`adapt`
    detected. The defaults here suit a dialect with ``RETURNING`` and exact affected-row
    counts; a dialect overrides what differs.
    """

    #: the dialect name :func:`adapt` reports ("postgresql", "mysql", "sqlite")
    name: str = ""
    #: the server's name in messages
    title: str = ""
    #: the backend package that ships the dialect's ``sql/`` files
    package: str = ""
    #: how the server quotes identifiers
    quote_char = '"'
    #: the longest lock namespace and inbox ``table`` (see ``check_namespace``)
    namespace_limit = 63
    table_limit = 63
    #: the longest outbox ``table`` (its index names are made from it)
    outbox_table_limit = 63
    #: the ``{slot}`` placeholders of ``sql/outbox.sql`` the backend fills per call
    outbox_slots: tuple[str, ...] = ()
    #: a failed statement aborts the caller's whole transaction (PostgreSQL)
    failure_aborts_transaction = False
    #: appended to ``versioned_update``'s re-read of a row that did not match, so that it
    #: sees the latest committed row rather than the transaction's snapshot
    locking_read = ""
    #: sections ``claim_in`` runs, in order, while the ones before affected no row (the first
    #: one's affected-row count is the answer where one statement decides it)
    claim_in_steps: tuple[str, ...] = ("claim_in",)

    #: the connection classes (module prefix, class name) a backend of this dialect takes
    #: from a caller's pool, engine or factory, by flavour (asyncio: ``True``), and how
    #: messages name that driver; empty where backends take no caller's connections
    drivers: Mapping[bool, tuple[tuple[str, str], ...]] = {}
    driver_names: Mapping[bool, str] = {}

    #: the database is a file opened in this process (SQLite): no server, no host
    in_process = False
    #: the host a URL made for the server names when its settings give none
    default_host = ""
    #: a plain DB-API connection's parameter placeholder
    dbapi_param = "%s"
    #: what starts a transaction that takes the write lock at its first read ("": none
    #: needed, the reads lock rows with :attr:`row_lock`)
    begin_write = ""
    #: the suffix of a SELECT that locks the rows it reads until the transaction ends
    row_lock = " FOR UPDATE"
    #: statements that set up a database file before first use (SQLite: WAL)
    setup_statements: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<SQLDialect {self.name}>"

    def quote(self, name: str) -> str:
        """Quote a validated identifier (``a.b`` quotes each part)."""
        q = self.quote_char
        return ".".join(f"{q}{part}{q}" for part in name.split("."))

    def inbox_quote(self, name: str) -> str:
        """Quote an inbox table name (as the inbox's tables have always been named)."""
        return self.quote(name)

    def sql_file(self, filename: str) -> str:
        """Where a shipped SQL file lives, for messages (``jobfence/backends/x/sql/y.sql``)."""
        return f"{self.package.replace('.', '/')}/sql/{filename}"

    def fence_queries(self, table: str, *, style: str = "named") -> Queries:
        """``sql/fence.sql`` for the fencing table ``table`` (validated)."""
        return load_sql(
            self.package, "fence.sql", names={"table": table}, quote=self.quote, style=style
        )

    def inbox_queries(self, table: str, *, style: str = "named") -> Queries:
        """``sql/inbox.sql`` for the inbox table ``table`` (validated)."""
        return load_sql(
            self.package, "inbox.sql", names={"table": table}, quote=self.inbox_quote, style=style
        )

    def outbox_table(self, name: str) -> str:
        """An outbox table name (validated) as the server names the table."""
        return name

    def outbox_queries(self, table: str, *, style: str = "named") -> Queries:
        """``sql/outbox.sql`` for the outbox table ``table`` (validated): ``add`` runs on the
        caller's connection (``Outbox.add``), ``schema`` there too (``Outbox.install(conn)``),
        the rest on the outbox backend's own connections."""
        return load_sql(
            self.package,
            "outbox.sql",
            names={"table": self.outbox_table(table)},
            quote=self.quote,
            slots=self.outbox_slots,
            style=style,
        )

    def db_key(self, key: str) -> str:
        """An idempotency key as the inbox table stores it."""
        return key

    def check_resource(self, resource: str) -> None:
        """Raise ``ConfigurationError`` if the fencing table cannot store ``resource``."""

    def fence_params(self, resource: str, token: int) -> dict[str, Any]:
        return {"resource": resource, "token": token}

    def newest_params(self, resource: str) -> dict[str, Any]:
        return {"resource": resource}

    def fence_outcome(self, result: Result, token: int) -> int | None:
        """The token the fencing row holds after the ``fence`` statement, if the result says;
        ``None``: run ``newest`` to read it. ``fence`` returns a row iff it recorded ``token``."""
        return token if result.rows else None

    def claim_in_params(
        self, key: str, fingerprint: str | None, retention: float
    ) -> dict[str, Any]:
        return {"key": self.db_key(key), "fingerprint": fingerprint, "retention": retention}

    def autocommit(self, conn: Any) -> bool:
        """Whether the driver connection ``conn`` is in autocommit mode."""
        return bool(conn.autocommit)

    def set_autocommit(self, conn: Any, on: bool) -> Any:
        """Switch ``conn``'s autocommit mode: the driver call's result (an awaitable for an
        asyncio driver)."""
        return conn.set_autocommit(on)

    def dbapi_connect(self, url: str) -> Any:
        """A plain DB-API connection to the database of ``url`` (transactions begin
        implicitly and end with ``commit``/``rollback``), for scripts such as the demo."""
        raise NotImplementedError(f"no DB-API connection for {self.name}")


# -- errors ---------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or any(cur is s for s in seen):
            continue
        seen.append(cur)
        todo.extend([getattr(cur, "orig", None), cur.__cause__])
    return seen


def is_undefined_table(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error inside it) says that a table does not exist.

    PostgreSQL SQLSTATE 42P01 (psycopg ``UndefinedTable``, psycopg2 ``pgcode``, asyncpg
    ``UndefinedTableError``), MySQL/MariaDB error 1146, SQLite ``no such table``; SQLAlchemy and
    Django wrappers are unwrapped.
    """
    for e in _chain(exc):
        if "42P01" in (getattr(e, "sqlstate", None), getattr(e, "pgcode", None)):
            return True
        args = getattr(e, "args", ())
        top = type(e).__module__.split(".")[0]
        if args and args[0] == 1146 and top in ("pymysql", "aiomysql", "MySQLdb"):
            return True
        if isinstance(e, sqlite3.OperationalError) and "no such table" in str(e):
            return True
    return False


def is_undefined_column(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error inside it) says that a column does not exist: a
    table of an older schema version. PostgreSQL SQLSTATE 42703, MySQL/MariaDB error 1054,
    SQLite ``no such column`` / ``has no column named``."""
    for e in _chain(exc):
        if "42703" in (getattr(e, "sqlstate", None), getattr(e, "pgcode", None)):
            return True
        args = getattr(e, "args", ())
        top = type(e).__module__.split(".")[0]
        if args and args[0] == 1054 and top in ("pymysql", "aiomysql", "MySQLdb"):
            return True
        if isinstance(e, sqlite3.OperationalError) and (
            "no such column" in str(e) or "has no column named" in str(e)
        ):
            return True
    return False


def is_old_schema(exc: BaseException) -> bool:
    """Whether ``exc`` says that a table or a column is missing: the schema is not installed,
    or is of an older version (``install()`` creates or upgrades it)."""
    return is_undefined_table(exc) or is_undefined_column(exc)


# -- placeholders ---------------------------------------------------------------------------

_QMARK = re.compile(r"\?")


def _to_format(sql: str) -> str:
    return _QMARK.sub("%s", sql.replace("%", "%%"))


def _to_dollar(sql: str) -> str:
    counter = iter(range(1, 1 << 30))
    return _QMARK.sub(lambda _m: f"${next(counter)}", sql)


def _to_named(sql: str, params: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    counter = iter(range(1 << 30))
    text = _QMARK.sub(lambda _m: f":p{next(counter)}", sql)
    return text, {f"p{i}": v for i, v in enumerate(params)}


#: the placeholder style of each driver (see :func:`jobfence._core.sqlfiles.convert`)
_STYLE = {
    "psycopg": "pyformat",
    "psycopg-async": "pyformat",
    "pymysql": "pyformat",
    "aiomysql": "pyformat",
    "sqlite3": "named",
    "aiosqlite": "named",
    "asyncpg": "numeric",
    "django": "format",
}

Params = Mapping[str, Any] | Sequence[Any]


def _prepare(kind: str, sql: str, params: Params) -> tuple[str, Any]:
    """The statement and its parameters as the driver of ``kind`` takes them.

    A mapping goes with ``:name`` SQL; a sequence with ``?`` SQL. ``None`` for the parameters
    of a statement that has none (so that no driver reads ``%`` in it).
    """
    style = _STYLE.get(kind, "sqlalchemy")
    if isinstance(params, Mapping):
        converted = convert(sql, style)
        if style == "numeric" or (style == "format" and converted.names):
            return converted.sql, [params[name] for name in converted.names]
        if not converted.names:
            return converted.sql, None
        return converted.sql, {name: params[name] for name in converted.names}
    values = tuple(params)
    if style in ("pyformat", "format"):
        return (_to_format(sql), values) if values else (sql, None)
    if style == "numeric":
        return _to_dollar(sql), list(values)
    if style == "named":
        return sql, values
    return _to_named(sql, values)


_RETURNS_ROWS_RE = re.compile(r"^\s*(SELECT|WITH|VALUES|SHOW)\b|\bRETURNING\b", re.IGNORECASE)
# quoted identifiers and string literals, blanked before looking for RETURNING
_QUOTED = re.compile(r'"(?:[^"]|"")*"|`(?:[^`]|``)*`|\'(?:[^\']|\'\')*\'')


class _ReturnsRows:
    """Does a statement return rows? Keywords inside quotes (a column named "returning")
    do not count."""

    @staticmethod
    def search(sql: str) -> bool:
        return _RETURNS_ROWS_RE.search(_QUOTED.sub("''", sql)) is not None


_RETURNS_ROWS = _ReturnsRows()


def _count(rows: Sequence[Any], rowcount: int, cols: Sequence[str] | None = None) -> int:
    """Row-returning statements count their rows (sqlite3 reports -1 for them)."""
    return len(rows) if (rows or cols) else rowcount


def _status_count(status: str) -> int:
    # asyncpg command status: "INSERT 0 1", "UPDATE 3", "DELETE 0", "CREATE TABLE"
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else -1


# -- detection ------------------------------------------------------------------------------


def _classes(conn: object) -> list[tuple[str, str]]:
    return [(c.__module__, c.__qualname__) for c in type(conn).__mro__]


def _kind(conn: object) -> str | None:
    """A driver key for ``conn``, from module/class names only (never imports a driver)."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite3"
    for module, name in _classes(conn):
        top = module.split(".")[0]
        if top == "psycopg" and name in ("Connection", "AsyncConnection"):
            return "psycopg" if name == "Connection" else "psycopg-async"
        if top == "pymysql" and name == "Connection":
            return "pymysql"
        if top == "asyncpg" and name in ("Connection", "PoolConnectionProxy", "_ConnectionProxy"):
            return "asyncpg"
        if top == "aiomysql" and name == "Connection":
            return "aiomysql"
        if top == "aiosqlite" and name == "Connection":
            return "aiosqlite"
        if module == "django.db.backends.base.base" and name == "BaseDatabaseWrapper":
            return "django"
        if module == "django.utils.connection" and name == "ConnectionProxy":
            return "django"
        if top == "sqlalchemy":
            if name == "Connection":
                return "sa-conn"
            if name in ("Session", "scoped_session"):
                return "sa-session"
            if name == "AsyncConnection":
                return "sa-aconn"
            if name in ("AsyncSession", "async_scoped_session"):
                return "sa-asession"
    return None


_ASYNC_KINDS = {"psycopg-async", "asyncpg", "aiomysql", "aiosqlite", "sa-aconn", "sa-asession"}
_DIALECT = {
    "psycopg": "postgresql",
    "psycopg-async": "postgresql",
    "asyncpg": "postgresql",
    "pymysql": "mysql",
    "aiomysql": "mysql",
    "sqlite3": "sqlite",
    "aiosqlite": "sqlite",
}


def _sa_dialect(conn: Any, argument: str) -> tuple[str, str]:
    dialect = conn.dialect if hasattr(conn, "dialect") else conn.get_bind().dialect
    name = {"mariadb": "mysql", "postgres": "postgresql"}.get(dialect.name, dialect.name)
    if name not in DIALECTS:
        raise ConfigurationError(
            f"{argument}: SQLAlchemy dialect {dialect.name!r} is not supported; "
            f"allowed: {', '.join(DIALECTS)} (MariaDB counts as mysql)",
            argument=argument,
        )
    return name, f"sqlalchemy+{dialect.driver}"


def _django_wrapper(conn: Any) -> Any:
    """The ``BaseDatabaseWrapper`` behind ``conn``: ``django.db.connection`` is a proxy to the
    current thread's connection of the default alias."""
    if type(conn).__name__ == "ConnectionProxy":
        return conn._connections[conn._alias]
    return conn


def _django_dialect(conn: Any, argument: str) -> tuple[str, str]:
    vendor = getattr(conn, "vendor", None)
    dialect = vendor if vendor in _DJANGO_VENDORS else None
    if dialect is None:
        raise ConfigurationError(
            f"{argument}: Django database vendor {vendor!r} is not supported; allowed: "
            f"{', '.join(_DJANGO_VENDORS)}",
            argument=argument,
        )
    conn.ensure_connection()
    driver = type(conn.connection).__module__.split(".")[0]
    return dialect, f"django+{driver}"


def _unsupported(conn: object, argument: str, *, want_async: bool) -> ConfigurationError:
    kind = _kind(conn)
    cls = f"{type(conn).__module__}.{type(conn).__qualname__}"
    if kind == "django" and want_async:
        return ConfigurationError(
            f"{argument}: {cls} is not supported here: Django's database connections are "
            "blocking; call the sync function (from async code through "
            "asgiref.sync.sync_to_async)",
            argument=argument,
        )
    if kind is not None and (kind in _ASYNC_KINDS) != want_async:
        hint = (
            "it is an asyncio connection: use the *_async function"
            if not want_async
            else "it is a blocking connection: use the sync function"
        )
        return ConfigurationError(
            f"{argument}: {cls} is not supported here, {hint}", argument=argument
        )
    supported = ASYNC_SUPPORTED if want_async else SYNC_SUPPORTED
    return ConfigurationError(
        f"{argument}: unsupported connection type {cls}; supported: {supported}",
        argument=argument,
    )


# -- closed connections ---------------------------------------------------------------------


def _is_closed(kind: str, conn: Any) -> bool:
    """Whether the driver reports ``conn`` closed (by its owner, or lost); ``False`` where it
    cannot tell. Reads the driver's state only: no I/O."""
    try:
        if kind == "sqlite3":
            try:
                conn.in_transaction  # noqa: B018  (raises on a closed connection)
            except sqlite3.ProgrammingError:
                return True
            return False
        if kind in ("psycopg", "psycopg-async", "aiomysql", "sa-conn", "sa-aconn"):
            return bool(conn.closed)
        if kind == "pymysql":
            return not conn.open
        if kind == "asyncpg":
            return bool(conn.is_closed())
        if kind == "aiosqlite":
            # aiosqlite has no public flag: its sqlite3 connection is dropped on close
            return getattr(conn, "_connection", False) is None
    except Exception:  # a driver without the attribute: cannot tell
        return False
    return False


def _closed_error(sc: SqlConn | AsyncSqlConn, exc: BaseException) -> BackendError:
    operation = sc.operation or "a statement"
    return BackendError(
        f"{sc.dialect} connection ({sc.driver}): {operation} failed: the connection is "
        f"closed ({type(exc).__name__}: {exc}); pass an open connection, inside the "
        "transaction the write belongs to",
        backend=sc.dialect,
        operation=sc.operation,
    )


# -- sync -----------------------------------------------------------------------------------


class SqlConn:
    """A caller's blocking connection, seen through one ``execute`` method."""

    def __init__(
        self, conn: Any, kind: str, dialect: str, driver: str, operation: str = ""
    ) -> None:
        self.raw = conn
        self.kind = kind
        self.dialect = dialect
        self.driver = driver
        #: what the statements are for, in the error of a closed connection ("fence")
        self.operation = operation

    def __repr__(self) -> str:
        return f"<SqlConn {self.dialect} via {self.driver}>"

    def closed(self) -> bool:
        """Whether the driver reports the connection closed (by its owner, or lost);
        ``False`` where it cannot tell (Django, SQLAlchemy sessions). No I/O."""
        return _is_closed(self.kind, self.raw)

    def execute(self, sql: str, params: Params = ()) -> Result:
        """Run ``sql`` with ``params`` in the caller's transaction: ``:name`` parameters with a
        mapping, or ``?`` placeholders with a sequence. On a closed connection:
        :class:`~jobfence.BackendError` (the driver's error as ``__cause__``)."""
        try:
            return self._execute(sql, params)
        except Exception as exc:
            if self.closed():
                raise _closed_error(self, exc) from exc
            raise

    def _execute(self, sql: str, params: Params) -> Result:
        kind, conn = self.kind, self.raw
        query, args = _prepare(kind, sql, params)
        if kind == "psycopg":
            from psycopg.rows import tuple_row

            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(query, args)
                rows = cur.fetchall() if cur.description else []
                cols = [c.name for c in cur.description or ()]
                return Result(list(rows), _count(rows, cur.rowcount), None, cols)
        if kind == "pymysql":
            from pymysql.cursors import Cursor

            with conn.cursor(Cursor) as cur:
                cur.execute(query, args)
                rows = list(cur.fetchall()) if cur.description else []
                cols = [c[0] for c in cur.description or ()]
                return Result(rows, _count(rows, cur.rowcount, cols), cur.lastrowid, cols)
        if kind == "django":
            # Django's cursor: its transaction state, error wrapping and instrumentation apply
            with conn.cursor() as cur:
                cur.execute(query, args)
                rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
                cols = [c[0] for c in cur.description or ()]
                lastrowid = getattr(cur, "lastrowid", None)
                return Result(rows, _count(rows, cur.rowcount, cols), lastrowid, cols)
        if kind == "sqlite3":
            cur = conn.cursor()
            try:
                cur.execute(query, () if args is None else args)
                rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
                cols = [c[0] for c in cur.description or ()]
                return Result(rows, _count(rows, cur.rowcount, cols), cur.lastrowid, cols)
            finally:
                cur.close()
        # SQLAlchemy Connection / Session: text() with named binds
        from sqlalchemy import text

        target = conn.connection() if kind == "sa-session" else conn
        res = target.execute(text(query), args)
        return _sa_result(res)


def _sa_result(res: Any) -> Result:
    if res.returns_rows:
        rows = [tuple(r) for r in res.fetchall()]
        return Result(rows, len(rows), None, list(res.keys()))
    lastrowid = None
    try:
        lastrowid = res.lastrowid
    except Exception:  # not every dialect/driver provides it
        lastrowid = None
    return Result([], res.rowcount, lastrowid, [])


def adapt(conn: object, *, argument: str = "conn", operation: str = "") -> SqlConn:
    """Wrap a caller's blocking connection; ``ConfigurationError`` names unsupported types.
    ``operation`` names what the statements are for in the error of a closed connection."""
    kind = _kind(conn)
    if kind is None or kind in _ASYNC_KINDS:
        raise _unsupported(conn, argument, want_async=False)
    if kind in ("sa-conn", "sa-session"):
        dialect, driver = _sa_dialect(conn, argument)
        return SqlConn(conn, kind, dialect, driver, operation)
    if kind == "django":
        wrapper = _django_wrapper(conn)
        dialect, driver = _django_dialect(wrapper, argument)
        return SqlConn(wrapper, kind, dialect, driver, operation)
    driver = "psycopg" if kind == "psycopg" else kind
    return SqlConn(conn, kind, _DIALECT[kind], driver, operation)


# -- async ----------------------------------------------------------------------------------


class AsyncSqlConn:
    """A caller's asyncio connection, seen through one ``execute`` coroutine."""

    def __init__(
        self, conn: Any, kind: str, dialect: str, driver: str, operation: str = ""
    ) -> None:
        self.raw = conn
        self.kind = kind
        self.dialect = dialect
        self.driver = driver
        #: what the statements are for, in the error of a closed connection ("fence")
        self.operation = operation

    def __repr__(self) -> str:
        return f"<AsyncSqlConn {self.dialect} via {self.driver}>"

    def closed(self) -> bool:
        """Whether the driver reports the connection closed (by its owner, or lost);
        ``False`` where it cannot tell (Django, SQLAlchemy sessions). No I/O."""
        return _is_closed(self.kind, self.raw)

    async def execute(self, sql: str, params: Params = ()) -> Result:
        """Run ``sql`` with ``params`` in the caller's transaction: ``:name`` parameters with a
        mapping, or ``?`` placeholders with a sequence. On a closed connection:
        :class:`~jobfence.BackendError` (the driver's error as ``__cause__``)."""
        try:
            return await self._execute(sql, params)
        except Exception as exc:
            if self.closed():
                raise _closed_error(self, exc) from exc
            raise

    async def _execute(self, sql: str, params: Params) -> Result:
        kind, conn = self.kind, self.raw
        query, args = _prepare(kind, sql, params)
        if kind == "psycopg-async":
            from psycopg.rows import tuple_row

            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, args)
                rows = await cur.fetchall() if cur.description else []
                cols = [c.name for c in cur.description or ()]
                return Result(list(rows), _count(rows, cur.rowcount), None, cols)
        if kind == "asyncpg":
            if _RETURNS_ROWS.search(sql):
                records = await conn.fetch(query, *args)
                cols = list(records[0].keys()) if records else []
                return Result([tuple(r) for r in records], len(records), None, cols)
            status = await conn.execute(query, *args)
            return Result([], _status_count(status), None, [])
        if kind == "aiomysql":
            async with conn.cursor(quiet_aiomysql_cursor()) as cur:
                await cur.execute(query, args)
                rows = list(await cur.fetchall()) if cur.description else []
                cols = [c[0] for c in cur.description or ()]
                return Result(rows, _count(rows, cur.rowcount, cols), cur.lastrowid, cols)
        if kind == "aiosqlite":
            cursor = await conn.execute(query, () if args is None else args)
            try:
                rows = [tuple(r) for r in await cursor.fetchall()] if cursor.description else []
                cols = [c[0] for c in cursor.description or ()]
                return Result(rows, _count(rows, cursor.rowcount, cols), cursor.lastrowid, cols)
            finally:
                await cursor.close()
        from sqlalchemy import text

        target = await conn.connection() if kind == "sa-asession" else conn
        res = await target.execute(text(query), args)
        return _sa_result(res)


#: the kinds of caller's connection whose MySQL driver may turn a statement's server warning
#: into a Python ``Warning``: SQLAlchemy's asyncio connections and sessions, whose aiomysql
#: adapter does (on a bare aiomysql connection jobfence's statements use a cursor that does
#: not, and PyMySQL does not). ``claim_in``'s ``INSERT IGNORE`` of a key already applied gets
#: one ("Duplicate entry"), ``outbox.install(conn)``'s ``CREATE TABLE IF NOT EXISTS`` of a
#: table that exists another ("already exists"): each is filtered out there.
#: ``catch_warnings`` saves and restores the process's warning filters, which concurrent
#: calls could restore out of order, so it is entered only where a warning can come.
WARNING_KINDS = frozenset({"sa-aconn", "sa-asession"})


#: what :func:`quiet_aiomysql_cursor` made (aiomysql is imported only when a caller's
#: aiomysql connection is used)
_QUIET_CURSOR: Any = None


def quiet_aiomysql_cursor() -> Any:
    """aiomysql's plain ``Cursor``, without its ``SHOW WARNINGS``: after any statement the
    server answers with a warning, aiomysql sends ``SHOW WARNINGS`` (one more round trip, inside
    the caller's transaction) and raises each warning as a Python ``Warning``. jobfence's own
    statements on a caller's connection mean the warnings they may get (``claim_in``'s
    ``INSERT IGNORE`` of a key already applied: "Duplicate entry", its everyday answer to a
    redelivered message; the schema's ``CREATE TABLE IF NOT EXISTS`` of a table that exists:
    "already exists"), so they are neither fetched nor shown."""
    global _QUIET_CURSOR
    if _QUIET_CURSOR is None:
        from aiomysql import Cursor

        class QuietCursor(Cursor):  # type: ignore[misc]
            async def _show_warnings(self, conn: Any) -> None:
                return None

        _QUIET_CURSOR = QuietCursor
    return _QUIET_CURSOR


def adapt_async(conn: object, *, argument: str = "conn", operation: str = "") -> AsyncSqlConn:
    """Wrap a caller's asyncio connection; ``ConfigurationError`` names unsupported types.
    ``operation`` names what the statements are for in the error of a closed connection."""
    kind = _kind(conn)
    if kind is None or kind not in _ASYNC_KINDS:
        raise _unsupported(conn, argument, want_async=True)
    if kind in ("sa-aconn", "sa-asession"):
        dialect, driver = _sa_dialect(conn, argument)
        return AsyncSqlConn(conn, kind, dialect, driver, operation)
    driver = {"psycopg-async": "psycopg"}.get(kind, kind)
    return AsyncSqlConn(conn, kind, _DIALECT[kind], driver, operation)
