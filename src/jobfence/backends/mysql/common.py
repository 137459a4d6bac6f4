"""Helpers shared by the sync and async MySQL/MariaDB lock backends (hand-written, not generated).

Both twins share one process-wide waiter registry, so that a release through a sync ``Locks``
wakes an ``AsyncLocks`` waiter on the same server, namespace and name, and vice versa. The URL
parsing, the options, the SQL statements and the driver-error helpers live here too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..._core.options import option_seconds, option_timeouts
from ..._core.sqlconn import quiet_aiomysql_cursor
from ..._core.sqlfiles import convert, load_sql
from ..._core.url import BackendURL
from ..._core.validate import check_namespace as _check_namespace
from ..._core.waiters import LocalWaiters
from ...errors import ConfigurationError
from ..base import LockCapabilities
from .dialect import DIALECT, NAMESPACE_LIMIT

__all__ = [
    "CAPABILITIES",
    "SCHEMA_VERSION",
    "WAITERS",
    "MySQLOptions",
    "check_namespace",
    "is_deadlock",
    "is_disconnect",
    "is_timeout",
    "load_queries",
    "name_hash",
    "renew_statement",
    "use_request_timeouts",
]

SCHEMA_VERSION = 1
DEFAULT_PORT = 3306

#: the placeholder style of PyMySQL and aiomysql
STYLE = "pyformat"

CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=False, handoff=False, tokens_survive_data_loss=True
)

#: run once on every new connection (each is one statement: PyMySQL sends no multi-statements)
SESSION_SETUP = (
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    # the acquire statement relies on left-to-right ON DUPLICATE KEY UPDATE assignments;
    # sql_notes=0: no "table already exists" notes from CREATE TABLE IF NOT EXISTS
    "SET SESSION sql_notes = 0, sql_mode = TRIM(BOTH ',' FROM"
    " REPLACE(CONCAT(',', @@SESSION.sql_mode, ','), ',SIMULTANEOUS_ASSIGNMENT,', ','))",
)

# client-side error codes (pymysql.constants.CR) and server codes (ER) that mean the
# connection is gone and a new one may succeed
_DISCONNECT_CODES = {
    2006,  # CR_SERVER_GONE_ERROR
    2013,  # CR_SERVER_LOST
    2055,  # CR_SERVER_LOST_EXTENDED
    1053,  # ER_SERVER_SHUTDOWN
    1927,  # ER_CONNECTION_KILLED (MariaDB)
    4031,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+)
}
_DEADLOCK_CODES = {1213, 1205}  # ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT


def own_cursor(conn: Any) -> Any:
    """``conn.cursor()`` for jobfence's own statements on a pooled connection. On aiomysql, a
    cursor that neither fetches nor raises the server's warnings: aiomysql sends
    ``SHOW WARNINGS`` after a statement that has any (the schema's ``CREATE TABLE IF NOT
    EXISTS`` of a table that exists has a note) and raises each as a Python ``Warning``,
    which ``warnings.catch_warnings()`` around an ``await`` cannot hide safely (another task
    or thread restores the filters meanwhile). PyMySQL's cursor never fetches them."""
    if type(conn).__module__.startswith("aiomysql"):
        return conn.cursor(quiet_aiomysql_cursor())
    return conn.cursor()


def check_namespace(namespace: object) -> str:
    """The namespace becomes a table-name prefix: an SQL identifier of at most
    ``NAMESPACE_LIMIT`` characters (see ``dialect.py``)."""
    return _check_namespace(namespace, limit=NAMESPACE_LIMIT, backend="mysql")


def load_queries(prefix: str) -> dict[str, str]:
    """The sections of ``sql/locks.sql`` for the namespace ``prefix`` (already validated), in
    PyMySQL's placeholder style. ``renew`` and ``held`` keep their ``{hashes}``, ``{pairs}``
    and ``{ttl_us}`` for :func:`renew_statement` and :func:`held_statement`."""
    return dict(
        load_sql(
            DIALECT.package,
            "locks.sql",
            names={"namespace": prefix},
            quote=DIALECT.quote,
            slots=("hashes", "pairs", "ttl_us"),
            style=STYLE,
        )
    )


def name_hash(name: str) -> str:
    """The row key of ``name``: SHA-256 of its UTF-8 bytes, as lowercase hex (for UNHEX)."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


def renew_statement(
    template: str, items: Sequence[tuple[str, str, float]]
) -> tuple[str, dict[str, Any]]:
    """Fill the ``renew`` template for ``items`` of (hash, owner, ttl): (sql, parameters).

    Item ``i`` has the numbered parameters ``:h<i>`` (hash), ``:o<i>`` (owner) and ``:t<i>``
    (its ttl in microseconds, only when the ttls differ; else one ``:ttl_us``)."""
    n = range(len(items))
    args: dict[str, Any] = {}
    for i, (h, owner, _ttl) in enumerate(items):
        args[f"h{i}"], args[f"o{i}"] = h, owner
    ttls = {micros(ttl) for _h, _o, ttl in items}
    if len(ttls) == 1:
        ttl_sql = ":ttl_us"
        args["ttl_us"] = ttls.pop()
    else:
        ttl_sql = (
            "CASE "
            + " ".join(f"WHEN name_hash = UNHEX(:h{i}) AND owner = :o{i} THEN :t{i}" for i in n)
            + " END"
        )
        args.update({f"t{i}": micros(ttl) for i, (_h, _o, ttl) in enumerate(items)})
    sql = (
        template.replace("{ttl_us}", ttl_sql)
        .replace("{hashes}", ", ".join(f"UNHEX(:h{i})" for i in n))
        .replace("{pairs}", ", ".join(f"(UNHEX(:h{i}), :o{i})" for i in n))
    )
    return convert(sql, STYLE).sql, args


def held_statement(template: str, hashes: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Fill the ``held`` template for ``hashes``: (sql, parameters ``:h<i>``)."""
    sql = template.replace("{hashes}", ", ".join(f"UNHEX(:h{i})" for i in range(len(hashes))))
    return convert(sql, STYLE).sql, {f"h{i}": h for i, h in enumerate(hashes)}


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` (a PyMySQL/aiomysql error) means the connection is unusable."""
    if type(exc).__name__ == "InterfaceError":  # "(0, '')": used after the socket closed
        return True
    return _code(exc) in _DISCONNECT_CODES


def is_deadlock(exc: BaseException) -> bool:
    """InnoDB chose this statement as a deadlock victim (or a lock wait timed out)."""
    return _code(exc) in _DEADLOCK_CODES


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a request that got no reply in time: ``TimeoutError`` (the async
    deadline), or PyMySQL's "lost connection" raised while handling a socket timeout (the
    connection is closed then)."""
    return isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError)


def use_request_timeouts(conn: Any, timeout: float) -> None:
    """A PyMySQL connection opened with ``connect_timeout`` as its read and write timeouts
    (so the server's greeting and the login wait at most that long) waits ``timeout`` for
    every later reply. PyMySQL applies these attributes at the next read or write."""
    conn._read_timeout = timeout
    conn._write_timeout = timeout


_seconds = option_seconds


@dataclass
class MySQLOptions:
    """Connection parameters and options, from the URL and keyword arguments (keywords win)."""

    host: str
    port: int
    user: str | None
    password: str
    database: str
    unix_socket: str | None
    mode: str
    connect_timeout: float
    timeout: float
    poll_initial: float
    poll_max: float
    next_in_line: float

    ALLOWED = (
        "mode",
        "connect_timeout",
        "timeout",
        "poll_initial",
        "poll_max",
        "next_in_line",
        "unix_socket",
    )
    MODES = ("lease",)

    @classmethod
    def parse(cls, url: BackendURL, options: dict[str, Any]) -> MySQLOptions:
        merged: dict[str, Any] = {**url.options, **options}
        unknown = sorted(set(merged) - set(cls.ALLOWED))
        if unknown:
            raise ConfigurationError(
                f"unknown mysql option {unknown[0]!r}; allowed: " + ", ".join(cls.ALLOWED),
                argument=unknown[0],
            )
        database = url.path.lstrip("/")
        if not database or "/" in database:
            raise ConfigurationError(
                f"url {url.masked} names no database; use mysql://user:password@host:3306/dbname",
                argument="url",
            )
        mode = str(merged.get("mode", "lease")).lower()
        if mode not in cls.MODES:
            raise ConfigurationError(
                f"mode must be one of {', '.join(cls.MODES)}, got {mode!r}", argument="mode"
            )
        poll_initial = _seconds(merged.get("poll_initial", 0.002), "poll_initial", 0.0001, 60.0)
        socket = merged.get("unix_socket")
        timeouts = option_timeouts(options, url.options)
        return cls(
            host=url.host or "localhost",
            port=url.port or DEFAULT_PORT,
            user=url.username,
            password=url.password or "",
            database=database,
            unix_socket=str(socket) if socket else None,
            mode=mode,
            connect_timeout=timeouts.connect,
            timeout=timeouts.request,
            poll_initial=poll_initial,
            poll_max=_seconds(merged.get("poll_max", 0.05), "poll_max", poll_initial, 60.0),
            next_in_line=_seconds(merged.get("next_in_line", 0.25), "next_in_line", 0.0, 60.0),
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments common to ``pymysql.connect`` and ``aiomysql.connect``."""
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "autocommit": True,
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        return kwargs

    @property
    def server_key(self) -> str:
        return f"{self.unix_socket or self.host}:{self.port}/{self.database}"


#: process-wide in-process wake-ups, shared by the sync and async twins
WAITERS = LocalWaiters()
