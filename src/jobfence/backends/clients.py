"""Clients a caller passes instead of a URL: which backend serves each, and whether it is a
blocking or an asyncio one.

``Locks``, ``Inbox`` and ``Queue`` (and their async twins) take, in place of the URL:

==========================================  ==========  =====================================
client                                      backend     flavour
==========================================  ==========  =====================================
``redis.Redis``, ``redis.cluster``          redis       ``Locks`` / ``Inbox`` / ``Queue``
``.RedisCluster`` (also ``Sentinel
.master_for(...)``)
``redis.asyncio.Redis``, ``redis.asyncio``  redis       ``AsyncLocks`` / ``AsyncInbox`` /
``.cluster.RedisCluster``                               ``AsyncQueue``
``psycopg_pool.ConnectionPool``             postgres    sync
``psycopg_pool.AsyncConnectionPool``        postgres    async
a callable returning a psycopg connection   postgres    the connection's (checked when called)
``sqlalchemy.Engine``                       its URL's   sync (psycopg, PyMySQL, sqlite3)
``sqlalchemy.ext.asyncio.AsyncEngine``      its URL's   async (psycopg, aiomysql, aiosqlite)
==========================================  ==========  =====================================

Clients are recognised by the module and class names of their type (and its bases), so
nothing here imports redis-py, psycopg or SQLAlchemy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "Client",
    "ClientKind",
    "check_flavour",
    "classify",
    "describe",
    "describe_target",
    "unusable",
]

#: a caller's client passed in place of a URL (see the table above); typed loosely so that
#: jobfence need not import redis-py, psycopg or SQLAlchemy
Client = Any

#: the public class of each part, for messages
_CLASSES = {"locks": "Locks", "inbox": "Inbox", "queue": "Queue"}
#: SQLAlchemy dialect name -> jobfence backend
_SA_BACKENDS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


@dataclass(frozen=True)
class ClientKind:
    """What a caller's client is: ``kind`` (``"redis"``, ``"psycopg_pool"``, ``"factory"``,
    ``"sqlalchemy"``), the ``backend`` that serves it, whether it is an asyncio client
    (``None``: not known until used, a connection factory), and its class name for messages."""

    kind: str
    backend: str
    asynchronous: bool | None
    label: str
    scheme: str


def _names(obj: object) -> list[tuple[str, str]]:
    return [(cls.__module__, cls.__name__) for cls in type(obj).__mro__]


def classify(client: object) -> ClientKind | None:
    """The :class:`ClientKind` of ``client``, or ``None`` if jobfence cannot use it."""
    for module, name in _names(client):
        label = f"{module.split('.')[0]}.{name}"
        if module.startswith("redis.") and name in ("Redis", "RedisCluster"):
            asynchronous = module.startswith("redis.asyncio")
            label = ("redis.asyncio." if asynchronous else "redis.") + name
            return ClientKind("redis", "redis", asynchronous, label, "redis")
        if module.startswith("psycopg_pool") and name in ("ConnectionPool", "AsyncConnectionPool"):
            return ClientKind(
                "psycopg_pool", "postgres", name.startswith("Async"), label, "postgresql"
            )
        if module.startswith("sqlalchemy") and name in ("Engine", "AsyncEngine"):
            dialect = str(getattr(getattr(client, "dialect", None), "name", ""))
            backend = _SA_BACKENDS.get(dialect)
            if backend is None:
                raise ConfigurationError(
                    f"url: a SQLAlchemy engine for {dialect!r} cannot serve jobfence; allowed: "
                    "engines on postgresql (psycopg), mysql/mariadb (PyMySQL, aiomysql) and "
                    "sqlite (sqlite3, aiosqlite)",
                    argument="url",
                )
            scheme = "postgresql" if backend == "postgres" else dialect
            return ClientKind("sqlalchemy", backend, name == "AsyncEngine", label, scheme)
    if callable(client) and not isinstance(client, type):
        return ClientKind("factory", "postgres", None, "connection factory", "postgresql")
    return None


def describe(kind: ClientKind) -> str:
    """How a client backed ``Locks.url`` reads (messages and ``repr``): never a secret."""
    return f"{kind.scheme}:// (caller's {kind.label})"


def check_flavour(kind: ClientKind, part: str, *, asynchronous: bool) -> None:
    """A blocking client for ``Locks``, an asyncio one for ``AsyncLocks``; else a
    :class:`ConfigurationError` that says which class takes it."""
    if kind.asynchronous is None or kind.asynchronous == asynchronous:
        return
    cls = _CLASSES.get(part, part)
    if asynchronous:
        raise ConfigurationError(
            f"Async{cls} needs an asyncio client, got the blocking {kind.label}: pass it to "
            f"{cls}, or pass its asyncio counterpart (redis.asyncio.Redis, "
            "psycopg_pool.AsyncConnectionPool, a SQLAlchemy AsyncEngine)",
            argument="url",
        )
    raise ConfigurationError(
        f"{cls} needs a blocking client, got the asyncio {kind.label}: pass it to Async{cls}, "
        "or pass its blocking counterpart (redis.Redis, psycopg_pool.ConnectionPool, a "
        "SQLAlchemy Engine)",
        argument="url",
    )


def unusable(client: Any) -> ConfigurationError:
    """The error for an object that is neither a URL nor a client jobfence can use."""
    return ConfigurationError(
        "url must be a non-empty URL string, or a client to use as it is: redis.Redis / "
        "redis.asyncio.Redis (also RedisCluster), psycopg_pool.ConnectionPool / "
        "AsyncConnectionPool, a callable returning a psycopg connection, or a SQLAlchemy "
        f"Engine / AsyncEngine; got {type(client).__module__}.{type(client).__qualname__}",
        argument="url",
    )


def describe_target(url: object) -> str:
    """The text ``Locks.url`` shows for what it was given: the masked URL, or a description
    of a caller's client."""
    if isinstance(url, str):
        from .._core.url import mask_url

        return mask_url(url)
    kind = classify(url)
    return describe(kind) if kind is not None else type(url).__name__
