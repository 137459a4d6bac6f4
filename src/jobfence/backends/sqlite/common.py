"""Helpers shared by the sync and async SQLite lock backends (hand-written, not generated).

Both twins must share one process-wide waiter registry, so that a release through a sync
``Locks`` wakes an ``AsyncLocks`` waiter on the same file and vice versa; it lives here, with
the URL parsing, the options and the SQL loader.
"""

from __future__ import annotations

from typing import Any

from ..._core.options import option_seconds
from ..._core.sqlfiles import load_sql
from ..._core.url import BackendURL
from ..._core.validate import check_namespace as _check_namespace
from ..._core.waiters import LocalWaiters
from ...errors import ConfigurationError
from ..base import LockCapabilities
from .dialect import DIALECT, NAMESPACE_LIMIT
from .path import sqlite_path

__all__ = [
    "CAPABILITIES",
    "QUEUE_CAPABILITIES",
    "SCHEMA_VERSION",
    "WAITERS",
    "SQLiteOptions",
    "check_namespace",
    "load_queries",
    "sqlite_path",
]

SCHEMA_VERSION = 1
DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_POLL_INITIAL = 0.0005
DEFAULT_POLL_MAX = 0.05
#: how long a waiter stays next in line without trying again (0: no reservation)
DEFAULT_NEXT_IN_LINE = 0.25

_SYNCHRONOUS = ("off", "normal", "full", "extra")

#: with ``next_in_line=0``: no wait queue, no fairness
CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=False, handoff=False, tokens_survive_data_loss=True
)
#: the default: a FIFO wait queue, and a release hands the lease to its head
QUEUE_CAPABILITIES = LockCapabilities(
    cross_process=True, ttl_expiry=True, fifo=True, handoff=True, tokens_survive_data_loss=True
)


def check_namespace(namespace: object) -> str:
    """The namespace becomes a table-name prefix: an SQL identifier of at most
    ``NAMESPACE_LIMIT`` characters (see ``dialect.py``)."""
    return _check_namespace(namespace, limit=NAMESPACE_LIMIT, backend="sqlite")


def load_queries(prefix: str) -> dict[str, str]:
    """The sections of ``sql/locks.sql`` for the namespace ``prefix`` (already validated):
    ``schema`` is a script (statements separated by ``;``, without the last one), every other
    section one statement with sqlite3's ``:name`` parameters."""
    return dict(
        load_sql(DIALECT.package, "locks.sql", names={"namespace": prefix}, quote=DIALECT.quote)
    )


_seconds = option_seconds


class SQLiteOptions:
    """The backend's options, from the URL query and keyword arguments (keywords win)."""

    def __init__(self, url: BackendURL, options: dict[str, Any]) -> None:
        merged: dict[str, Any] = {**url.options, **options}
        allowed = ("busy_timeout", "synchronous", "poll_initial", "poll_max", "next_in_line")
        unknown = sorted(set(merged) - set(allowed))
        if unknown:
            raise ConfigurationError(
                f"unknown sqlite option {unknown[0]!r}; allowed: " + ", ".join(allowed),
                argument=unknown[0],
            )
        self.busy_timeout = _seconds(
            merged.get("busy_timeout", DEFAULT_BUSY_TIMEOUT), "busy_timeout", 0.0, 3600.0
        )
        synchronous = str(merged.get("synchronous", "full")).lower()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}",
                argument="synchronous",
            )
        self.synchronous = synchronous
        self.poll_initial = _seconds(
            merged.get("poll_initial", DEFAULT_POLL_INITIAL), "poll_initial", 0.0001, 86400.0
        )
        self.poll_max = _seconds(
            merged.get("poll_max", DEFAULT_POLL_MAX), "poll_max", self.poll_initial, 86400.0
        )
        self.next_in_line = _seconds(
            merged.get("next_in_line", DEFAULT_NEXT_IN_LINE), "next_in_line", 0.0, 60.0
        )


#: process-wide in-process wake-ups, shared by the sync and async twins
WAITERS = LocalWaiters()
