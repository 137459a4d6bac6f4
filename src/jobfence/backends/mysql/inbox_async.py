"""``mysql://`` / ``mariadb://`` inbox backend: on aiomysql in ``inbox_async.py``, on PyMySQL in
``inbox.py`` (generated from it).

A claim of a NEW key is ONE short insert whose OK packet carries the claim's deadline
(``LAST_INSERT_ID(expr)``; 0 when the key exists). When the key exists, a second round
trip runs ONE atomic ``INSERT ... ON DUPLICATE KEY UPDATE`` whose assignments take the key
over only when its claim has expired (see ``sql/inbox.sql``); MySQL has no
``RETURNING``, so the read of the outcome travels in the same round trip as a second
statement (multi-statement packet on the inbox's own autocommit connection). Time is the
server's clock (``UTC_TIMESTAMP(6)``). The table is created on first use or by
``install()``.

URL / keyword options: ``table`` (default ``jobfence_inbox``), ``pool_size`` (idle connections
kept for reuse, default 8; ``max_idle`` is a deprecated name for it), ``connect_timeout`` and
``timeout`` (seconds, default 5 each: opening a connection -- TCP, greeting, login -- and one
request's reply; a connection whose request timed out is closed, never reused).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, TypeVar

from pymysql.constants import CLIENT

from ..._core import acompat
from ..._core.flavour import ASYNC
from ..._core.inbox_support import DEFAULT_TABLE, as_utc, inbox_table
from ..._core.options import (
    TIMEOUT_OPTIONS,
    option_timeouts,
    request_timed_out,
)
from ..._core.pool_async import DEFAULT_POOL_SIZE, AsyncConnPool
from ..._core.source_async import AsyncSource, open_source
from ..._core.sqlconn import is_old_schema, is_undefined_table
from ..._core.url import BackendURL
from ...errors import ConfigurationError
from ..base import (
    AsyncInboxBackend,
    ClaimInfo,
    ClaimRecord,
    ClaimState,
    InboxCapabilities,
    RenewItem,
    info_from_row,
    record_from_row,
)
from .common import STYLE, is_timeout, own_cursor
from .connect_async import connect
from .dialect import DIALECT, TABLE_LIMIT

if not ASYNC:
    pass

__all__ = ["AsyncMySQLInboxBackend"]

T = TypeVar("T")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return bytes(value).decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _duplicate_column(exc: BaseException) -> bool:
    """MySQL/MariaDB error 1060, "Duplicate column name"."""
    args: tuple[Any, ...] = getattr(exc, "args", ())
    return bool(args) and args[0] == 1060


#: the client flags every inbox connection needs (a caller's engine must set them)
_NEEDED_FLAGS = CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros(seconds: float) -> int:
    return max(1, int(seconds * 1_000_000))


class AsyncMySQLInboxBackend(AsyncInboxBackend):
    kind = "mysql"
    capabilities = InboxCapabilities(cross_process=True, transactional=True)

    def __init__(
        self, url: BackendURL, *, table: str = DEFAULT_TABLE, client: Any = None, **options: Any
    ) -> None:
        #: a caller's SQLAlchemy engine, whose pool lends the connections
        self._source: AsyncSource | None = None
        if client is not None:
            if "connect_timeout" in options:
                raise ConfigurationError(
                    "option 'connect_timeout' configures the connections the mysql inbox "
                    "opens; with a client passed in, configure its connections instead",
                    argument="connect_timeout",
                )
            self._source = open_source(client, DIALECT, "mysql inbox")
        self.table = inbox_table(
            url, table, options, backend="mysql", limit=TABLE_LIMIT, extra=TIMEOUT_OPTIONS
        )
        self.timeouts = option_timeouts(options, url.options)
        self._params: dict[str, Any] = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "root",
            "password": url.password or "",
            "charset": "utf8mb4",
            "autocommit": True,
            # one round trip for claim + the read of its outcome; rowcount = matched rows
            "client_flag": CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS,
            "connect_timeout": self.timeouts.connect,
        }
        self._database = url.path.lstrip("/") or None
        self._sql = q = DIALECT.inbox_queries(self.table, style=STYLE)
        self._claim_new_sql = q["claim_new"]
        # one multi-statement round trip; both statements take the same parameters
        self._claim_sql = q["claim"] + ";\n" + q["peek"]
        self._renew_sql = q["renew"] + ";\n" + q["renewed"]
        self._installed = False
        source = self._source
        self._pool = AsyncConnPool.configured(
            self._connect,
            self._close,
            options,
            url.options,
            DEFAULT_POOL_SIZE,
            put=source.put if source is not None else None,
            loop_bound=True,  # an aiomysql connection works on the loop that opened it only
        )

    async def _connect(self) -> Any:
        if self._source is not None:
            conn = await self._source.get()
            flags: int = getattr(conn, "client_flag", 0) or getattr(conn, "_client_flag", 0)
            if flags & _NEEDED_FLAGS != _NEEDED_FLAGS:
                await self._source.put(conn)
                raise ConfigurationError(
                    "the mysql inbox sends a claim and the read of its outcome in one round "
                    "trip and counts matched rows: create the engine with connect_args="
                    "{'client_flag': CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS} "
                    "(from pymysql.constants import CLIENT)",
                    argument="url",
                )
            return conn
        return await connect(
            self._params,
            self._database,
            connect_timeout=self.timeouts.connect,
            timeout=self.timeouts.request,
        )

    async def _close(self, conn: Any) -> None:
        if self._source is not None:  # one of the caller's: back to its pool, to be replaced
            await self._source.discard(conn)
            return
        conn.close()

    async def _run(
        self, sql: str, params: Mapping[str, Any], *, second: bool = False
    ) -> tuple[list[Any], int]:
        """Run ``sql``; with ``second``, return the rows of its second statement. Creates
        the table on first use."""
        rows, count, _ = await self._execute(sql, params, second=second)
        return rows, count

    async def _execute(
        self, sql: str, params: Mapping[str, Any], *, second: bool = False
    ) -> tuple[list[Any], int, int | None]:
        """:meth:`_run`, also returning the OK packet's last insert id."""
        for _ in range(2):
            try:
                async with self._pool.connection() as conn, conn.cursor() as cur:
                    return await self._bounded(partial(self._request, cur, sql, params, second))
            except Exception as exc:
                if self._installed or not is_old_schema(exc):
                    raise
                await self.install()
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    async def _request(
        cur: Any, sql: str, params: Mapping[str, Any], second: bool
    ) -> tuple[list[Any], int, int | None]:
        await cur.execute(sql, params)
        count, last_id = cur.rowcount, cur.lastrowid
        if second:
            await cur.nextset()
        rows = list(await cur.fetchall()) if cur.description else []
        return rows, count, last_id

    async def _bounded(self, request: Callable[[], Awaitable[T]]) -> T:
        """Run one request within the ``timeout`` (PyMySQL: its read and write timeouts;
        aiomysql: a deadline around it). A timed-out request raises ``TimeoutError``; its
        connection is closed by the pool (it closes a connection that saw an error)."""
        try:
            if ASYNC:
                result: T = await acompat.call_bounded(request, self.timeouts.request)
                return result
            else:
                return await request()
        except Exception as exc:
            if is_timeout(exc):
                raise request_timed_out(self.timeouts.request) from exc
            raise

    async def _statements(self, section: str, tolerated: Callable[[Exception], bool]) -> None:
        """Run the statements of ``section`` of the SQL file in order, each bounded by the
        request timeout; an error ``tolerated`` accepts is skipped. ``own_cursor``: no
        ``SHOW WARNINGS`` for the server's notes ("table already exists" and the like)."""
        async with self._pool.connection() as conn, own_cursor(conn) as cur:
            for statement in self._sql.statements(section):
                try:
                    await self._bounded(partial(cur.execute, statement))
                except Exception as exc:
                    if not tolerated(exc):
                        raise

    async def install(self) -> None:
        # two installs upgrading a version-1 table at once: both read that claimed_at is
        # missing, the second ALTER finds it added (1060)
        await self._statements("schema", _duplicate_column)
        self._installed = True

    async def claim(self, key: str, owner: str, fingerprint: str | None, ttl: float) -> ClaimRecord:
        ttl_us = _micros(ttl)
        params = {"key": key, "owner": owner, "fingerprint": fingerprint, "ttl_us": ttl_us}
        _, _, deadline = await self._execute(self._claim_new_sql, params)
        if deadline:  # the key was unknown: it is ours (0: it exists)
            return ClaimRecord(
                mine=True,
                state=ClaimState.IN_PROGRESS,
                attempt=1,
                owner=owner,
                fingerprint=fingerprint,
                expires_at=_EPOCH + timedelta(microseconds=deadline),
            )
        while True:
            rows, _ = await self._run(self._claim_sql, params, second=True)
            if rows:
                break
            # purged between the two statements: claim again
        return record_from_row(rows[0], as_utc, _text)

    async def complete(self, key: str, owner: str, result: bytes, retention: float) -> bool:
        params = {"result_hex": result.hex(), "retention_us": _micros(retention)}
        _, count = await self._run(self._sql["complete"], {**params, "key": key, "owner": owner})
        return count == 1

    async def release(self, key: str, owner: str) -> bool:
        _, count = await self._run(self._sql["release"], {"key": key, "owner": owner})
        return count == 1

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        params = {"key": key, "owner": owner, "ttl_us": _micros(ttl)}
        _, count = await self._run(self._sql["extend"], params)
        return count == 1

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every claim of ``items`` with ONE statement, sent in one round trip with
        the read of which ones it extended."""
        if not items:
            return []
        data = json.dumps([[key, owner, _micros(ttl)] for key, owner, ttl in items])
        rows, _ = await self._run(self._renew_sql, {"items": data}, second=True)
        renewed = {int(row[0]) for row in rows}
        return [n in renewed for n in range(1, len(items) + 1)]

    async def purge(self, retention: float) -> int:
        _, count = await self._run(self._sql["purge"], {"retention_us": _micros(retention)})
        return max(count, 0)

    def _info(self, key: str, row: Sequence[Any]) -> ClaimInfo:
        state, owner, attempt, fingerprint, claimed_at, left_us = row
        return info_from_row(
            key,
            (state, owner, attempt, fingerprint, claimed_at, int(left_us) / 1_000_000),
            as_utc,
            _text,
        )

    async def claim_infos(
        self, state: ClaimState | None, prefix: str, limit: int
    ) -> list[ClaimInfo]:
        params = {"prefix": prefix, "state": None if state is None else state.value}
        rows, _ = await self._run(self._sql["claims"], {**params, "limit": limit})
        return [self._info(_text(row[0]) or "", row[1:]) for row in rows]

    async def claim_info(self, key: str) -> ClaimInfo | None:
        rows, _ = await self._run(self._sql["claim_info"], {"key": key})
        return self._info(key, rows[0][1:]) if rows else None

    async def forget(self, key: str) -> bool:
        _, count = await self._run(self._sql["forget"], {"key": key})
        return count == 1

    async def drop(self) -> None:
        await self._statements("drop", is_undefined_table)
        self._installed = False

    async def close(self) -> None:
        await self._pool.close()

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the pooled connections
        inherited from the parent (see ``jobfence/_core/forks.py``)."""
        self._pool.after_fork()
