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

from .._core.clients import recognise
from ..errors import ConfigurationError
from .registry import registered

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
_CLASSES = {"locks": "Locks", "inbox": "Inbox", "queue": "Queue", "outbox": "Outbox"}
#: the scheme of the backend serving each kind of client; a SQLAlchemy engine's is the name
#: of its SQLAlchemy dialect, which is a scheme of the backend that serves it
_SCHEMES = {"redis": "redis", "psycopg_pool": "postgresql", "factory": "postgresql"}


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


def classify(client: object) -> ClientKind | None:
    """The :class:`ClientKind` of ``client``, or ``None`` if jobfence cannot use it."""
    found = recognise(client)
    if found is None:
        return None
    scheme = _SCHEMES.get(found.kind, found.engine_dialect)
    info = registered().get(scheme)
    if found.kind == "sqlalchemy" and (info is None or info.dialect is None):
        raise ConfigurationError(
            f"url: a SQLAlchemy engine for {found.engine_dialect!r} cannot serve jobfence; "
            "allowed: engines on postgresql (psycopg), mysql/mariadb (PyMySQL, aiomysql) and "
            "sqlite (sqlite3, aiosqlite)",
            argument="url",
        )
    assert info is not None
    return ClientKind(found.kind, info.name, found.asynchronous, found.label, scheme)


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
