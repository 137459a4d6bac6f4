"""Backend plugins, chosen by URL scheme.

=================  ===========================================  ==================
scheme             backend                                      extra
=================  ===========================================  ==================
``memory://``      in-process (tests, the testing toolkit)      --
``sqlite:///p``    SQLite file, cross-process on one host       ``[sqlite]`` async
``redis://``       Redis (``rediss://`` for TLS)                ``[redis]``
``postgresql://``  PostgreSQL                                   ``[postgres]``
``mysql://``       MySQL 8 / MariaDB 10.6+                      ``[mysql]``
=================  ===========================================  ==================
"""

from __future__ import annotations

import importlib
from typing import Any

from .._url import BackendURL, parse_url
from ..errors import ConfigurationError

__all__ = ["LOCK_BACKENDS", "open_lock_backend"]

# scheme -> (module stem, class stem, pip extra)
LOCK_BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "memory": ("memory", "MemoryLockBackend", None),
    "sqlite": ("sqlite", "SQLiteLockBackend", "sqlite"),
    "redis": ("redis", "RedisLockBackend", "redis"),
    "rediss": ("redis", "RedisLockBackend", "redis"),
    "postgresql": ("postgres", "PostgresLockBackend", "postgres"),
    "postgres": ("postgres", "PostgresLockBackend", "postgres"),
    "mysql": ("mysql", "MySQLLockBackend", "mysql"),
    "mariadb": ("mysql", "MySQLLockBackend", "mysql"),
}

#: modules whose sync and async classes live in one hand-written file
_SINGLE_FILE = {"memory"}


def load_class(
    table: dict[str, tuple[str, str, str | None]],
    url: BackendURL,
    *,
    asynchronous: bool,
    what: str,
    package: str = __name__,
) -> Any:
    """The backend class for ``url`` from ``table`` (scheme -> module stem, class stem,
    extra) in ``package``: ``Async<class>`` from ``<module>_async`` for async clients (from
    ``<module>`` itself for the single-file memory backends)."""
    try:
        module_stem, class_stem, extra = table[url.scheme]
    except KeyError:
        raise ConfigurationError(
            f"url scheme {url.scheme!r} has no {what} backend; allowed: "
            + ", ".join(f"{s}://" for s in table),
            argument="url",
        ) from None
    module_name = (
        module_stem
        if (module_stem in _SINGLE_FILE or not asynchronous)
        else (module_stem + "_async")
    )
    try:
        module = importlib.import_module(f"{package}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(f"{package}."):
            raise ConfigurationError(
                f"the {url.scheme}:// {what} backend is not available yet in this version",
                argument="url",
            ) from None
        hint = f" Install it with: pip install 'jobfence[{extra}]'" if extra else ""
        raise ConfigurationError(
            f"the {url.scheme}:// backend needs the missing package {exc.name!r}.{hint}",
            argument="url",
        ) from exc
    return getattr(module, ("Async" if asynchronous else "") + class_stem)


def open_lock_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the lock backend for ``url`` (a str); ``options`` go to its constructor."""
    parsed = parse_url(url)
    cls = load_class(LOCK_BACKENDS, parsed, asynchronous=asynchronous, what="lock")
    return cls(parsed, **options)
