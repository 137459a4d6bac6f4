"""The registry of backends: which package serves each URL scheme, and with which parts.

:mod:`jobfence.backends` re-exports all of it; this module imports no backend package and no
client helper, so everything that needs the registry (the client recognition in
``backends.clients``, the doctor) can import it without a cycle.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, cast
from urllib.parse import urlsplit

from .._core.url import BackendURL, mask_url, parse_url
from ..errors import ConfigurationError

__all__ = [
    "BACKENDS",
    "ENTRY_POINT_GROUP",
    "INBOX_BACKENDS",
    "LOCK_BACKENDS",
    "PARTS",
    "BackendInfo",
    "backend_for",
    "load_class",
    "parse_backend_url",
    "registered",
]

log = logging.getLogger("jobfence.backends")

#: the parts a backend package may provide
PARTS = ("locks", "inbox", "queue", "outbox")
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
    #: the schemes whose URLs may name several hosts (``h1:2379,h2:2379``): the backend reads
    #: them from ``BackendURL.netloc`` (its ``port`` is then None)
    many_hosts: tuple[str, ...] = ()

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
    suffix = {
        "locks": "LockBackend",
        "inbox": "InboxBackend",
        "queue": "QueueBackend",
        "outbox": "OutboxBackend",
    }
    return BackendInfo(
        name=name,
        schemes=schemes,
        package=f"{__package__}.{name}",
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
            "sqlite",
            ("sqlite",),
            "SQLite",
            "sqlite",
            parts=("locks", "inbox", "queue", "outbox"),
            description="SQLite file",
            dialect="sqlite",
        ),
        _builtin(
            "redis",
            ("redis", "rediss", "redis+sentinel"),
            "Redis",
            "redis",
            description="Redis",
            many_hosts=("redis+sentinel",),
        ),
        _builtin(
            "postgres",
            ("postgresql", "postgres"),
            "Postgres",
            "postgres",
            parts=("locks", "inbox", "queue", "outbox"),
            description="PostgreSQL",
            dialect="postgresql",
        ),
        _builtin(
            "mysql",
            ("mysql", "mariadb"),
            "MySQL",
            "mysql",
            parts=("locks", "inbox", "outbox"),
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
            "etcd",
            ("etcd", "etcds"),
            "Etcd",
            "etcd",
            parts=("locks", "inbox"),
            description="etcd",
            many_hosts=("etcd", "etcds"),
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


#: the URLs parsed so far, by ``(url, argument)``: clients are made again and again for the
#: same few URLs (two or three per schedule of ``jobfence.testing``, one per request in some
#: applications), and parsing one costs more than the rest of a client's set-up. Only URLs
#: without user-info, query or fragment are kept: no secret outlives its clients here.
_PARSED: dict[tuple[str, str], BackendURL] = {}
_PARSED_KEPT = 256


def parse_backend_url(url: object, *, argument: str = "url") -> BackendURL:
    """Parse ``url`` (:func:`~jobfence._core.url.parse_url`) and refuse a scheme no registered
    backend serves: :class:`ConfigurationError` naming ``argument``, listing the schemes."""
    if isinstance(url, str) and not any(c in url for c in "@?#"):
        parsed = _PARSED.get((url, argument))
        if parsed is None:
            parsed = _parse_backend_url(url, argument)
            if len(_PARSED) >= _PARSED_KEPT:
                _PARSED.clear()
            _PARSED[(url, argument)] = parsed
        # each caller gets a copy with options of its own (a frozen BackendURL holds a dict)
        mine = object.__new__(BackendURL)
        fields = mine.__dict__
        fields.update(parsed.__dict__)
        fields["options"] = dict(parsed.options)
        return mine
    return _parse_backend_url(url, argument)


def _parse_backend_url(url: object, argument: str) -> BackendURL:
    known = registered()
    try:
        scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    except ValueError:  # parse_url says what is wrong with it
        scheme = ""
    info = known.get(scheme)
    parsed = parse_url(
        url, argument=argument, many_hosts=info is not None and scheme in info.many_hosts
    )
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


_PART_WORD = {"locks": "lock", "inbox": "inbox", "queue": "queue", "outbox": "outbox"}

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
