"""The one registry of backends: URL scheme -> the package that serves it.

Each server has one package under ``jobfence.backends`` holding everything jobfence does with
that server (its locks and its inbox, their helpers, their ``sql/`` or ``lua/`` files):

=================  =============================================  =================  ============
scheme             backend                                        parts              extra
=================  =============================================  =================  ============
``memory://``      in-process (tests, the testing toolkit)        locks inbox queue  --
``sqlite:///p``    SQLite file, cross-process on one host         locks inbox queue  ``[sqlite]``
                                                                  outbox
``redis://``       Redis (``rediss://`` for TLS; queue: Streams;  locks inbox queue  ``[redis]``
                   ``redis+sentinel://`` through Sentinel)
``postgresql://``  PostgreSQL (also ``postgres://``)              locks inbox queue  ``[postgres]``
                                                                  outbox
``mysql://``       MySQL 8 / MariaDB 10.6+ (also ``mariadb://``)  locks inbox        ``[mysql]``
                                                                  outbox
``amqp://``        RabbitMQ (``amqps://`` for TLS)                queue              ``[rabbitmq]``
``etcd://``        etcd 3.4+ (``etcds://`` for TLS; several       locks inbox        ``[etcd]``
                   members: ``etcd://h1:2379,h2:2379``)
=================  =============================================  =================  ============

(``[sqlite]`` brings ``aiosqlite`` for the async clients; the sync ones need only the standard
library.)

A part's classes follow one convention: the sync class ``<Stem>`` lives in
``<package>.<part>`` and the async class ``Async<Stem>`` in ``<package>.<part>_async`` (its
source; the sync module is generated from it), or both in ``<package>.<part>`` when
``twins`` is false.

Third-party backends register through the ``jobfence.backends`` entry point group: each entry
point names a :class:`BackendInfo` object, e.g. in ``pyproject.toml``::

    [project.entry-points."jobfence.backends"]
    etcd = "jobfence_etcd:BACKEND"

where ``jobfence_etcd.BACKEND = BackendInfo(name="etcd", schemes=("etcd",),
package="jobfence_etcd", parts={"locks": "EtcdLockBackend"}, extra=None)``. Built-in schemes
cannot be overridden.

A backend package may hold a ``doctor`` module: its ``inspect(report, url, timer)`` is what
``jobfence doctor`` checks on that server (:meth:`BackendInfo.doctor_checks` finds it; the same
holds for third-party packages).

A backend for an SQL server also names its ``dialect`` (as ``jobfence._core.sqlconn`` detects
it on a caller's connection): :func:`sql_dialect` then finds ``<package>.dialect.DIALECT``,
which tells ``fence``, ``claim_in``, ``versioned_update`` and ``inbox.install(conn)`` what
differs on that server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, cast

from .._core.url import BackendURL, parse_url
from ..errors import ConfigurationError
from .registry import (
    _PART_WORD,
    BACKENDS,
    ENTRY_POINT_GROUP,
    INBOX_BACKENDS,
    LOCK_BACKENDS,
    PARTS,
    BackendInfo,
    backend_for,
    load_class,
    parse_backend_url,
    registered,
)

if TYPE_CHECKING:
    from .._core.sqlconn import SQLDialect

__all__ = [
    "BACKENDS",
    "ENTRY_POINT_GROUP",
    "INBOX_BACKENDS",
    "LOCK_BACKENDS",
    "PARTS",
    "BackendInfo",
    "backend_for",
    "load_class",
    "open_backend",
    "open_inbox_backend",
    "open_lock_backend",
    "open_outbox_backend",
    "open_queue_backend",
    "parse_backend_url",
    "registered",
    "sql_dialect",
]


def open_backend(url: object, part: str, *, asynchronous: bool, **options: Any) -> Any:
    """Create the ``part`` backend (``"locks"``, ``"inbox"``) for ``url``; ``options`` go to
    its constructor.

    ``url`` may also be a caller's client (:mod:`jobfence.backends.clients`): the backend that
    serves it gets it as ``client=`` and uses it as it is."""
    if not isinstance(url, str) and url is not None:
        return _open_for_client(url, part, asynchronous=asynchronous, **options)
    parsed = parse_backend_url(url)
    info = backend_for(parsed.scheme, part)
    cls = load_class(info, part, asynchronous=asynchronous, scheme=parsed.scheme)
    return cls(parsed, **options)


def _open_for_client(client: object, part: str, *, asynchronous: bool, **options: Any) -> Any:
    from .clients import check_flavour, classify, unusable

    kind = classify(client)
    if kind is None:
        raise unusable(client)
    info = BACKENDS[kind.backend]
    if part not in info.parts:
        raise ConfigurationError(
            f"url: the {info.description} backend ({kind.label}) has no "
            f"{_PART_WORD.get(part, part)} part",
            argument="url",
        )
    check_flavour(kind, part, asynchronous=asynchronous)
    cls = load_class(info, part, asynchronous=asynchronous, scheme=kind.scheme)
    if kind.kind == "sqlalchemy":
        url = _engine_url(client, kind.scheme)
        if kind.backend == "sqlite":
            # SQLite: jobfence's own connections to the engine's database file (they need
            # WAL, autocommit and a busy timeout); the engine is left alone
            return cls(parse_url(url), **options)
        return cls(parse_url(url), client=client, **options)
    placeholder = BackendURL(
        raw=f"{kind.scheme}://",
        scheme=kind.scheme,
        host=None,
        port=None,
        username=None,
        password=None,
        path="",
    )
    return cls(placeholder, client=client, **options)


def _engine_url(engine: Any, scheme: str) -> str:
    """The server (or SQLite file) a SQLAlchemy engine points at, as a jobfence URL without
    its password (for messages, and for the server key of in-process wake-ups)."""
    from urllib.parse import quote

    sa_url = engine.url
    database = sa_url.database or ""
    if scheme == "sqlite":
        if not database or database == ":memory:" or database.startswith("file:"):
            raise ConfigurationError(
                "url: a SQLAlchemy engine on SQLite must point at a database file (jobfence "
                f"opens its own connections to it); got {database or 'an in-memory database'!r}",
                argument="url",
            )
        return "sqlite:///" + database
    user = quote(sa_url.username, safe="") + "@" if sa_url.username else ""
    host = sa_url.host or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = f":{sa_url.port}" if sa_url.port else ""
    return f"{scheme}://{user}{host}{port}/{quote(database, safe='')}"


def open_lock_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the lock backend for ``url`` (a str); ``options`` go to its constructor."""
    return open_backend(url, "locks", asynchronous=asynchronous, **options)


def open_inbox_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the inbox backend for ``url`` (a str); ``options`` go to its constructor."""
    return open_backend(url, "inbox", asynchronous=asynchronous, **options)


def open_outbox_backend(url: object, *, asynchronous: bool, **options: Any) -> Any:
    """Create the outbox backend for ``url`` (the relay's side of an outbox table);
    ``options`` go to its constructor."""
    return open_backend(url, "outbox", asynchronous=asynchronous, **options)


def open_queue_backend(url: object, name: str, *, asynchronous: bool, **options: Any) -> Any:
    """Create the queue backend of the queue ``name`` for ``url``; ``options`` go to its
    constructor."""
    return open_backend(url, "queue", asynchronous=asynchronous, name=name, **options)


def sql_dialect(name: str) -> SQLDialect:
    """The :class:`~jobfence._core.sqlconn.SQLDialect` of the backend whose server speaks the
    SQL dialect ``name`` (``<package>.dialect.DIALECT``)."""
    found = _DIALECTS.get(name)
    if found is None:
        info = next((i for i in BACKENDS.values() if i.dialect == name), None)
        if info is None:
            info = next((i for i in registered().values() if i.dialect == name), None)
        if info is None:
            raise ConfigurationError(f"no backend serves the SQL dialect {name!r}", argument="conn")
        module = importlib.import_module(f"{info.package}.dialect")
        found = _DIALECTS[name] = cast("SQLDialect", module.DIALECT)
    return found


_DIALECTS: dict[str, SQLDialect] = {}
