"""The one registry of backends: URL scheme -> the package that serves it.

Each server has one package under ``jobfence.backends`` holding everything jobfence does with
that server (its locks and its inbox, their helpers, their ``sql/`` or ``lua/`` files):

=================  =============================================  =================  ============
scheme             backend                                        parts              extra
=================  =============================================  =================  ============
``memory://``      in-process (tests, the testing toolkit)        locks inbox queue  --
``sqlite:///p``    SQLite file, cross-process on one host         locks inbox queue  ``[sqlite]``
``redis://``       Redis (``rediss://`` for TLS; queue: Streams;  locks inbox queue  ``[redis]``
                   ``redis+sentinel://`` through Sentinel)
``postgresql://``  PostgreSQL (also ``postgres://``)              locks inbox queue  ``[postgres]``
``mysql://``       MySQL 8 / MariaDB 10.6+ (also ``mariadb://``)  locks inbox        ``[mysql]``
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
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, cast

from .._core.url import BackendURL, mask_url, parse_url
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .._core.sqlconn import SQLDialect

__all__ = [
    "BACKENDS",
    "INBOX_BACKENDS",
    "LOCK_BACKENDS",
    "PARTS",
    "BackendInfo",
    "backend_for",
    "load_class",
    "open_backend",
    "open_inbox_backend",
    "open_lock_backend",
    "open_queue_backend",
    "parse_backend_url",
    "registered",
    "sql_dialect",
]

log = logging.getLogger("jobfence.backends")

#: the parts a backend package may provide
PARTS = ("locks", "inbox", "queue")
ENTRY_POINT_GROUP = "jobfence.backends"


@dataclass(frozen=True)
class BackendInfo:
    """One backend package: the schemes it serves and the parts it provides.

    ``parts`` maps a part name (``"locks"``, ``"inbox"``) to the stem of its class names
    (``"PostgresLockBackend"``: ``PostgresLockBackend`` sync, ``AsyncPostgresLockBackend``
    async). ``extra`` is the pip extra that brings its driver (for the error message when the
    driver is missing).
    """

    name: str
    schemes: tuple[str, ...]
    package: str
    parts: Mapping[str, str]
    extra: str | None = None
    twins: bool = True
    description: str = field(default="", compare=False)
    #: the SQL dialect this backend's server speaks ("postgresql", "mysql", "sqlite"), if any
    dialect: str | None = None
    #: the module of the package holding the checks of ``jobfence doctor`` (its function
    #: ``inspect(report, url, timer)``); a package without that module has no server checks
    doctor: str | None = "doctor"

    def module_name(self, part: str, *, asynchronous: bool) -> str:
        suffix = "_async" if (asynchronous and self.twins) else ""
        return f"{self.package}.{part}{suffix}"

    def class_name(self, part: str, *, asynchronous: bool) -> str:
        return ("Async" if asynchronous else "") + self.parts[part]

    def doctor_checks(self) -> Callable[..., None] | None:
        """The ``inspect(report, url, timer)`` function of ``jobfence doctor`` for this
        backend's server (``<package>.doctor.inspect``), or None when the package has none.
        Importing it imports the server's driver: a missing driver raises."""
        if self.doctor is None:
            return None
        module_name = f"{self.package}.{self.doctor}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        return cast("Callable[..., None]", module.inspect)


def _builtin(
    name: str,
    schemes: tuple[str, ...],
    stem: str,
    extra: str | None,
    parts: tuple[str, ...] = ("locks", "inbox", "queue"),
    **kw: Any,
) -> BackendInfo:
    suffix = {"locks": "LockBackend", "inbox": "InboxBackend", "queue": "QueueBackend"}
    return BackendInfo(
        name=name,
        schemes=schemes,
        package=f"{__name__}.{name}",
        parts={part: stem + suffix[part] for part in parts},
        extra=extra,
        **kw,
    )


#: the built-in backends, by name
BACKENDS: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        _builtin("memory", ("memory",), "Memory", None, twins=False, description="in-process"),
        _builtin(
            "sqlite", ("sqlite",), "SQLite", "sqlite", description="SQLite file", dialect="sqlite"
        ),
        _builtin(
            "redis", ("redis", "rediss", "redis+sentinel"), "Redis", "redis", description="Redis"
        ),
        _builtin(
            "postgres",
            ("postgresql", "postgres"),
            "Postgres",
            "postgres",
            description="PostgreSQL",
            dialect="postgresql",
        ),
        _builtin(
            "mysql",
            ("mysql", "mariadb"),
            "MySQL",
            "mysql",
            parts=("locks", "inbox"),
            description="MySQL / MariaDB",
            dialect="mysql",
        ),
        _builtin(
            "rabbitmq",
            ("amqp", "amqps"),
            "Rabbit",
            "rabbitmq",
            parts=("queue",),
            twins=False,
            description="RabbitMQ",
        ),
        _builtin(
            "etcd", ("etcd", "etcds"), "Etcd", "etcd", parts=("locks", "inbox"), description="etcd"
        ),
    )
}

_BY_SCHEME: dict[str, BackendInfo] = {s: info for info in BACKENDS.values() for s in info.schemes}
_plugins_loaded = False


def _load_plugins() -> None:
    """Add the backends registered by installed distributions (once per process)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            info = ep.load()
        except Exception:
            log.exception("could not load the jobfence backend entry point %r", ep.value)
            continue
        if not isinstance(info, BackendInfo):
            log.error("jobfence backend entry point %r is not a BackendInfo", ep.value)
            continue
        for scheme in info.schemes:
            if scheme in _BY_SCHEME:
                log.warning("jobfence backend %r: scheme %s:// is taken", info.name, scheme)
                continue
            _BY_SCHEME[scheme] = info


def registered() -> dict[str, BackendInfo]:
    """Every scheme jobfence can open (built-in and plugins) -> its backend."""
    _load_plugins()
    return dict(_BY_SCHEME)


def parse_backend_url(url: object, *, argument: str = "url") -> BackendURL:
    """Parse ``url`` (:func:`~jobfence._core.url.parse_url`) and refuse a scheme no registered
    backend serves: :class:`ConfigurationError` naming ``argument``, listing the schemes."""
    parsed = parse_url(url, argument=argument)
    known = registered()
    if parsed.scheme not in known:
        raise ConfigurationError(
            f"{argument} has unknown scheme {parsed.scheme!r} in {mask_url(parsed.raw)}; "
            "allowed: " + ", ".join(f"{s}://" for s in known),
            argument=argument,
        )
    return parsed


def backend_for(scheme: str, part: str | None = None, *, argument: str = "url") -> BackendInfo:
    """The backend serving ``scheme`` (and providing ``part``); ConfigurationError if none."""
    info = _BY_SCHEME.get(scheme)
    if info is None:
        _load_plugins()
        info = _BY_SCHEME.get(scheme)
    if info is None or (part is not None and part not in info.parts):
        serving = [s for s, i in _BY_SCHEME.items() if part is None or part in i.parts]
        what = f"has no {_PART_WORD.get(part, part)} backend" if part else "is not known"
        raise ConfigurationError(
            f"{argument} scheme {scheme!r} {what}; allowed: "
            + ", ".join(f"{s}://" for s in serving),
            argument=argument,
        )
    return info


_PART_WORD = {"locks": "lock", "inbox": "inbox", "queue": "queue"}

# Views by part, kept for callers of the earlier per-part tables: scheme -> backend.
LOCK_BACKENDS: Mapping[str, BackendInfo] = {
    s: i for s, i in _BY_SCHEME.items() if "locks" in i.parts
}
INBOX_BACKENDS: Mapping[str, BackendInfo] = {
    s: i for s, i in _BY_SCHEME.items() if "inbox" in i.parts
}


def load_class(info: BackendInfo, part: str, *, asynchronous: bool, scheme: str = "") -> Any:
    """Import the class of ``part`` from ``info``'s package (sync or async)."""
    module_name = info.module_name(part, asynchronous=asynchronous)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigurationError(
                f"the {scheme or info.name}:// backend has no module {module_name!r}",
                argument="url",
            ) from exc
        hint = f" Install it with: pip install 'jobfence[{info.extra}]'" if info.extra else ""
        raise ConfigurationError(
            f"the {scheme or info.name}:// backend needs the missing package {exc.name!r}.{hint}",
            argument="url",
        ) from exc
    return getattr(module, info.class_name(part, asynchronous=asynchronous))


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
