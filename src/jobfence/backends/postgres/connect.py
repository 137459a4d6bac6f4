# Generated from backends/postgres/connect_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""Opening a connection to PostgreSQL, one way for every part (locks, inbox, queue):
``connect_async.py`` (psycopg's ``AsyncConnection``) and ``connect.py`` (``Connection``;
generated from it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import Connection

from ..._core.options import connect_timed_out
from ..._core.source import Source
from ..._core.url import BackendURL

__all__ = ["connect"]


def connect(
    url: BackendURL,
    conninfo: str,
    kwargs: Mapping[str, Any],
    *,
    prepare_threshold: int | None = 5,
    source: Source | None = None,
) -> Any:
    """An autocommit connection: one of the caller's ``source`` if one was passed in, else a
    new one to ``conninfo`` (:func:`~.common.libpq_uri`) with the libpq parameters ``kwargs``
    (:func:`~.common.connect_kwargs`). Opening it past ``connect_timeout`` raises
    ``TimeoutError``; a driver message that quotes the URL's password has it masked."""
    if source is not None:
        return source.get()
    try:
        return Connection.connect(
            conninfo, autocommit=True, prepare_threshold=prepare_threshold, **kwargs
        )
    except psycopg.errors.ConnectionTimeout as exc:
        raise connect_timed_out(kwargs["connect_timeout"]) from exc
    except psycopg.Error as exc:
        password = url.password
        if password and password in str(exc):  # never let a driver message leak it
            raise type(exc)(str(exc).replace(password, "***")) from None
        raise
