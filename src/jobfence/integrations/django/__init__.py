"""Django support: jobfence's tables as a Django app, an inbox on Django's database, and a
retry hook that replaces broken connections.

Add the app, then ``manage.py migrate`` creates the inbox and fencing tables::

    INSTALLED_APPS = [..., "jobfence.integrations.django"]
    JOBFENCE_INBOX_TABLE = "jobfence_inbox"     # optional: these are the defaults
    JOBFENCE_FENCE_TABLE = "jobfence_fences"

``claim_in``, ``fence`` and ``versioned_update`` take ``django.db.connection`` (or
``connections[alias]``) inside ``transaction.atomic()`` as they are: no code from this module
is needed for that. :func:`get_inbox` opens an :class:`~jobfence.Inbox` on the database of a
Django alias (for ``claim_in`` and for ``jobfence.guarded``, whose claims must live in the same
table). :func:`close_broken_connections` is an ``on_retry`` hook for
:func:`jobfence.retry_unit`: Django keeps a connection that died until the end of the request,
so a unit retried after a dropped connection would fail again on it.

Importing this module imports Django; ``import jobfence`` never does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connections

from ..._core.sqlconn import check_ident
from ...backends import registered, sql_dialect
from ...errors import ConfigurationError
from ...fencing import DEFAULT_TABLE as _FENCING_DEFAULT_TABLE
from ...inbox import Inbox
from .idempotency import IdempotencyKeyMiddleware

__all__ = [
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_INBOX_TABLE",
    "IdempotencyKeyMiddleware",
    "close_broken_connections",
    "database_url",
    "fence_table",
    "get_inbox",
    "inbox_table",
]

DEFAULT_INBOX_TABLE = "jobfence_inbox"
"""The inbox table's name when the ``JOBFENCE_INBOX_TABLE`` setting is not set."""

DEFAULT_FENCE_TABLE = _FENCING_DEFAULT_TABLE
"""The fencing table's name when the ``JOBFENCE_FENCE_TABLE`` setting is not set (the
default of ``jobfence.fence``)."""


def _table_setting(name: str, default: str) -> str:
    value = getattr(settings, name, default)
    return check_ident(value, name)


def inbox_table() -> str:
    """The inbox table: the ``JOBFENCE_INBOX_TABLE`` setting, default ``jobfence_inbox``."""
    return _table_setting("JOBFENCE_INBOX_TABLE", DEFAULT_INBOX_TABLE)


def fence_table() -> str:
    """The fencing table: the ``JOBFENCE_FENCE_TABLE`` setting, default ``jobfence_fences``.
    Pass it to ``fence(..., table=fence_table())`` when it is not the default."""
    return _table_setting("JOBFENCE_FENCE_TABLE", DEFAULT_FENCE_TABLE)


def database_url(using: str = "default") -> str:
    """The jobfence URL of the database of Django's alias ``using`` (from ``DATABASES``:
    ``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT``; ``OPTIONS`` are not carried over).

    PostgreSQL, MySQL/MariaDB and SQLite files; an in-memory SQLite database has no URL
    another connection could open, so it raises ``ConfigurationError``.
    """
    if using not in settings.DATABASES:
        raise ConfigurationError(
            f"using: no database alias {using!r} in DATABASES; allowed: "
            f"{', '.join(settings.DATABASES)}",
            argument="using",
        )
    db = connections[using]
    entry = db.settings_dict
    vendor = db.vendor
    name = str(entry.get("NAME") or "")
    info = registered().get(vendor)  # Django's vendor names are jobfence's URL schemes
    dialect = sql_dialect(info.dialect) if info is not None and info.dialect else None
    if dialect is not None and dialect.in_process:
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ConfigurationError(
                f"using: the SQLite database of {using!r} is in memory; jobfence's inbox "
                "needs a database file",
                argument="using",
            )
        return f"{vendor}:///{name}"
    if dialect is None:
        raise ConfigurationError(
            f"using: Django database vendor {vendor!r} is not supported; allowed: "
            "postgresql, mysql, sqlite",
            argument="using",
        )
    user = quote(str(entry.get("USER") or ""), safe="")
    password = quote(str(entry.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(entry.get("HOST") or dialect.default_host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = f":{entry['PORT']}" if entry.get("PORT") else ""
    return f"{vendor}://{auth}{host}{port}/{quote(name, safe='')}"


def get_inbox(using: str = "default", **options: Any) -> Inbox:
    """An :class:`~jobfence.Inbox` on the database of Django's alias ``using``, on the table
    the migration created (``JOBFENCE_INBOX_TABLE``).

    Create it once (e.g. at module level in your tasks module) and share it: it keeps its own
    small connection pool and a renewer thread for ``claim(renew=True)``. ``claim_in`` runs on
    the connection you pass it (Django's); ``claim``, ``guarded`` and the result replay use the
    inbox's own connections to the same table. ``options`` go to :class:`~jobfence.Inbox`
    (``ttl``, ``retention``, ``serializer``, backend options).
    """
    options.setdefault("table", inbox_table())
    return Inbox(database_url(using), **options)


def close_broken_connections(
    attempt: int = 0, exc: BaseException | None = None, delay: float = 0.0
) -> None:
    """An ``on_retry`` hook for :func:`jobfence.retry_unit`: close every Django connection that
    had an error and no longer answers, so the next attempt opens a fresh one.

    Django replaces a dead connection only between requests (``close_old_connections``); a
    unit retried after ``pg_terminate_backend``, a failover or a network cut would otherwise
    meet the same dead connection on every attempt. Connections inside an ``atomic()`` block
    are left alone (closing one would end the enclosing transaction). Use it as
    ``@jobfence.retry_unit(on_retry=close_broken_connections)``; ``attempt``, ``exc`` and
    ``delay`` are what ``on_retry`` receives (the attempt that failed, its exception, the
    wait before the next one), and are not used.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and conn.errors_occurred:
            if not conn.is_usable():
                conn.close()
            else:
                conn.errors_occurred = False
