"""Argument validation shared by every public entry point."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ..errors import BackendError, ConfigurationError

MAX_NAME_BYTES = 1024
#: the longest ttl of a lease or claim, and the longest retention of a record (one year)
MAX_TTL = 366 * 86400


def check_name(name: object, *, argument: str = "name") -> str:
    """A lock/key name: a non-empty ``str`` of at most 1024 bytes in UTF-8."""
    if not isinstance(name, str):
        raise ConfigurationError(
            f"{argument} must be a str, got {type(name).__name__}", argument=argument
        )
    if not name:
        raise ConfigurationError(f"{argument} must not be empty", argument=argument)
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{argument} must be encodable as UTF-8 (lone surrogates are not allowed)",
            argument=argument,
        ) from None
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"{argument} must be at most {MAX_NAME_BYTES} bytes in UTF-8, got {size} bytes",
            argument=argument,
        )
    return name


MAX_LISTING = 100_000


def check_listing(prefix: object, limit: object) -> tuple[str, int]:
    """The ``prefix`` and ``limit`` of a listing (``holders()``, ``claims()``): a ``str`` of
    at most 1024 bytes in UTF-8 (empty: everything), and an ``int`` from 1 to 100000."""
    if not isinstance(prefix, str):
        raise ConfigurationError(
            f"prefix must be a str, got {type(prefix).__name__}", argument="prefix"
        )
    if prefix:
        check_name(prefix, argument="prefix")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTING:
        raise ConfigurationError(
            f"limit must be an int from 1 to {MAX_LISTING}, got {limit!r}", argument="limit"
        )
    return prefix, limit


def _number(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(
            f"{argument} must be a number of seconds, got {type(value).__name__}",
            argument=argument,
        )
    if math.isnan(value) or math.isinf(value):
        raise ConfigurationError(f"{argument} must be finite, got {value!r}", argument=argument)
    return float(value)


def check_ttl(ttl: object, *, argument: str = "ttl") -> float:
    """A lease lifetime: seconds, > 0 and at most one year, at millisecond resolution."""
    kind = type(ttl)
    if (kind is float or kind is int) and 0.001 <= ttl <= MAX_TTL:  # type: ignore[operator]
        return float(ttl)  # type: ignore[arg-type]  # the common case (NaN fails the test)
    value = _number(ttl, argument)
    if value < 0.001 or value > MAX_TTL:
        raise ConfigurationError(
            f"{argument} must be > 0 seconds (at least 0.001) and at most one year, got {ttl!r}",
            argument=argument,
        )
    return value


def check_timeout(timeout: object, *, argument: str = "timeout") -> float | None:
    """A wait limit: ``None`` (wait forever) or seconds >= 0."""
    if timeout is None:
        return None
    value = _number(timeout, argument)
    if value < 0:
        raise ConfigurationError(
            f"{argument} must be None (wait forever) or >= 0 seconds, got {timeout!r}",
            argument=argument,
        )
    return value


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_namespace(
    value: object,
    *,
    limit: int,
    backend: str,
    argument: str = "namespace",
    identifier: bool = True,
) -> str:
    """A namespace (lock tables / keys) or an inbox ``table``, for one backend.

    SQL backends (``identifier=True``): an SQL identifier -- a letter or ``_``, then letters,
    digits or ``_`` -- of at most ``limit`` characters, so that it can be spliced into table
    names (and then quoted) without any risk of injection. Redis and memory namespaces
    (``identifier=False``) are key prefixes: any non-empty str of at most ``limit``
    characters. Each backend package declares its limits (``NAMESPACE_LIMIT``,
    ``TABLE_LIMIT``), derived from its longest table name and its server's identifier limit.
    """
    if identifier:
        if isinstance(value, str) and len(value) <= limit and _IDENTIFIER.fullmatch(value):
            return value
        raise ConfigurationError(
            f"{argument} must be an SQL identifier for the {backend} backend: a letter or '_', "
            f"then letters, digits or '_', at most {limit} characters (so that every table name "
            f"made from it fits the server's limit); got {value!r}",
            argument=argument,
        )
    if isinstance(value, str) and value and len(value) <= limit:
        return value
    raise ConfigurationError(
        f"{argument} must be a non-empty str of at most {limit} characters for the {backend} "
        f"backend; got {value!r}",
        argument=argument,
    )


def check_schema_version(
    row: Sequence[Any] | None, supported: int, *, backend: str, tables: str
) -> None:
    """Raise :class:`BackendError` unless ``row`` (the schema-version row read back after an
    install; ``None`` if there was none) holds ``supported``. ``tables`` names them in the
    message (e.g. ``"lock tables jobs_*"``)."""
    found = None if row is None else int(row[0])
    if found != supported:
        raise BackendError(
            f"the {backend} {tables} have schema version {found}; this jobfence supports "
            f"version {supported}",
            backend=backend,
            operation="install",
        )


#: a queue name: what every queue server accepts as a name (a RabbitMQ queue, a Redis key
#: part, a value of the SQL queue tables' ``queue`` column)
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")


def check_queue_name(name: object, *, argument: str = "name") -> str:
    """A queue name: 1 to 128 characters of ``A-Z a-z 0-9 _ . : -``, not starting with
    ``.``, ``:`` or ``-``."""
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{argument} must be a queue name: 1 to 128 characters of A-Z a-z 0-9 _ . : - "
            f"(not starting with . : or -), got {name!r}",
            argument=argument,
        )
    return name
