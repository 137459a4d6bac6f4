"""The database file a ``sqlite:///`` URL names, checked before anything opens it."""

from __future__ import annotations

import os

from ..._core.url import BackendURL
from ...errors import ConfigurationError

__all__ = ["sqlite_path"]


def sqlite_path(url: BackendURL) -> str:
    """The absolute file path of a ``sqlite:///`` lock URL; ConfigurationError if unusable."""
    hint = (
        "use sqlite:///relative/path.db or sqlite:////absolute/path.db "
        "(memory:// for locks within one process)"
    )
    if url.host or url.port:
        raise ConfigurationError(
            f"url {url.masked} names a host; a SQLite URL has none: {hint}", argument="url"
        )
    path = url.path[1:] if url.path.startswith("/") else ""
    if not path or path == ":memory:" or path.startswith("file:") or "mode=memory" in url.raw:
        raise ConfigurationError(
            f"url {url.masked} names no database file; an in-memory SQLite database cannot be "
            f"shared between processes, so it cannot hold locks: {hint}",
            argument="url",
        )
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise ConfigurationError(
            f"url {url.masked} names a directory, not a database file: {hint}", argument="url"
        )
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise ConfigurationError(
            f"url {url.masked}: the directory {directory!r} does not exist (jobfence does not "
            "create it); create it first or point the URL at an existing directory",
            argument="url",
        )
    return path
