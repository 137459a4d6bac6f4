"""Helpers shared by the sync and async MySQL/MariaDB lock backends (hand-written, not generated).

Both twins share one process-wide waiter registry, so that a release through a sync ``Locks``
wakes an ``AsyncLocks`` waiter on the same server, namespace and name, and vice versa. The URL
parsing, the options, the SQL loader and the driver-error helpers live here too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..._core.options import option_seconds
from ..._core.url import BackendURL
from ..._core.waiters import LocalWaiters
from ...errors import ConfigurationError
from ..base import LockCapabilities

__all__ = [
    "CAPABILITIES",
    "SCHEMA_VERSION",
    "WAITERS",
    "MySQLOptions",
    "check_namespace",
    "is_deadlock",
    "is_disconnect",
    "load_queries",
    "name_hash",
    "renew_statement",
]

SCHEMA_VERSION = 1
DEFAULT_PORT = 3306

# The longest table suffix is "_schema"/"_locks" (7); MySQL identifiers are at most 64 chars.
# Leave room for other components' tables under the same prefix ("_lock_tokens", "_inbox"...).
_NAMESPACE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_SECTION = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

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


def check_namespace(namespace: object) -> str:
    """The namespace becomes a table-name prefix: it must be a plain SQL identifier."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ConfigurationError(
            "namespace must be an SQL identifier for the mysql backend: a letter or '_' "
            f"then up to 47 letters, digits or '_' (table names are at most 64 characters); "
            f"got {namespace!r}",
            argument="namespace",
        )
    return namespace


def load_queries(prefix: str) -> dict[str, str]:
    """The sections of ``sql/mysql_locks.sql`` with ``{prefix}`` filled in, comments removed."""
    text = resources.files("jobfence.backends.mysql").joinpath("sql/locks.sql")
    source = text.read_text(encoding="utf-8").replace("{prefix}", prefix)
    parts = _SECTION.split(source)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = []
        for line in body.splitlines():
            code = line.split("--", 1)[0].rstrip() if "--" in line else line.rstrip()
            if code.strip():
                lines.append(code)
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def name_hash(name: str) -> str:
    """The row key of ``name``: SHA-256 of its UTF-8 bytes, as lowercase hex (for UNHEX)."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


def renew_statement(
    template: str, items: Sequence[tuple[str, str, float]]
) -> tuple[str, list[Any]]:
    """Fill the ``renew`` template for ``items`` of (hash, owner, ttl): (sql, positional args)."""
    hashes = ", ".join(["UNHEX(%s)"] * len(items))
    pairs = ", ".join(["(UNHEX(%s), %s)"] * len(items))
    ttls = {micros(ttl) for _h, _o, ttl in items}
    args: list[Any] = []
    if len(ttls) == 1:
        ttl_sql = "%s"
        args.append(ttls.pop())
    else:
        ttl_sql = "CASE " + " ".join(
            ["WHEN name_hash = UNHEX(%s) AND owner = %s THEN %s"] * len(items)
        )
        ttl_sql += " END"
        for h, owner, ttl in items:
            args += [h, owner, micros(ttl)]
    args += [h for h, _o, _t in items]
    for h, owner, _t in items:
        args += [h, owner]
    sql = template.replace("{ttl_us}", ttl_sql).replace("{hashes}", hashes)
    return sql.replace("{pairs}", pairs), args


def held_statement(template: str, hashes: Sequence[str]) -> tuple[str, list[Any]]:
    return template.replace("{hashes}", ", ".join(["UNHEX(%s)"] * len(hashes))), list(hashes)


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
        return cls(
            host=url.host or "localhost",
            port=url.port or DEFAULT_PORT,
            user=url.username,
            password=url.password or "",
            database=database,
            unix_socket=str(socket) if socket else None,
            mode=mode,
            connect_timeout=_seconds(
                merged.get("connect_timeout", 10.0), "connect_timeout", 0.01, 3600.0
            ),
            timeout=_seconds(merged.get("timeout", 10.0), "timeout", 0.01, 3600.0),
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
