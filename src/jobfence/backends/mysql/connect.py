# Generated from backends/mysql/connect_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Opening a connection to MySQL / MariaDB, one way for every part (locks, inbox):
``connect_async.py`` (aiomysql) and ``connect.py`` (PyMySQL; generated from it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pymysql

from ..._core.options import connect_timed_out
from .common import is_timeout, use_request_timeouts

__all__ = ["connect"]


def connect(
    kwargs: Mapping[str, Any], database: str | None, *, connect_timeout: float, timeout: float
) -> Any:
    """A new connection of jobfence's own to ``database`` with the driver's ``kwargs``
    (host, port, user, password, charset, autocommit, ``connect_timeout``, ...). Opening it
    -- TCP, the server's greeting, the login -- waits at most ``connect_timeout`` (past it:
    ``TimeoutError``); then every reply waits at most ``timeout``."""
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
