"""Opening a connection to MySQL / MariaDB, one way for every part (locks, inbox):
``connect_async.py`` (aiomysql) and ``connect.py`` (PyMySQL; generated from it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiomysql

from ..._core import acompat
from ..._core.flavour import ASYNC
from ..._core.options import connect_timed_out
from .common import is_timeout, use_request_timeouts

if not ASYNC:
    import pymysql

__all__ = ["connect"]


async def connect(
    kwargs: Mapping[str, Any], database: str | None, *, connect_timeout: float, timeout: float
) -> Any:
    """A new connection of jobfence's own to ``database`` with the driver's ``kwargs``
    (host, port, user, password, charset, autocommit, ``connect_timeout``, ...). Opening it
    -- TCP, the server's greeting, the login -- waits at most ``connect_timeout`` (past it:
    ``TimeoutError``); then every reply waits at most ``timeout``."""
    if ASYNC:
        # aiomysql bounds only the TCP connection: bound the greeting and login too
        try:
            return await acompat.call_bounded(
                lambda: aiomysql.connect(db=database, **kwargs), connect_timeout
            )
        except TimeoutError:
            raise connect_timed_out(connect_timeout) from None
    else:
        try:
            # the greeting and the login wait connect_timeout; then each reply timeout
            conn = pymysql.connect(
                database=database,
                read_timeout=connect_timeout,
                write_timeout=connect_timeout,
                **kwargs,
            )
        except pymysql.err.OperationalError as exc:
            if is_timeout(exc):
                raise connect_timed_out(connect_timeout) from exc
            raise
        use_request_timeouts(conn, timeout)
        return conn
