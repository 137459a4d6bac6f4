"""One way to build the redis-py client of every Redis backend (``redis.asyncio.Redis`` in
``client_async.py``, ``redis.Redis`` in the generated ``client.py``): the same option checks
and the same defaults for locks and the inbox.

Defaults: ``socket_timeout`` and ``socket_connect_timeout`` of 5 s (redis-py's default is to
wait forever, which would hide a lost lease or hang a claim), and one immediate retry on a
connection error instead of redis-py's backoff, so an unreachable server is reported in
milliseconds. Every verb jobfence sends is safe to re-send: acquire, renew, extend,
complete and claim are idempotent for their owner, and a release remembers who released.
"""

from __future__ import annotations

import inspect
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..._core import forks
from ..._core.flavour import ASYNC
from ..._core.url import BackendURL
from ...errors import ConfigurationError

if ASYNC:
    import asyncio

__all__ = ["DEFAULT_SOCKET_TIMEOUT", "check_database", "connect_redis", "forget_connections"]

DEFAULT_SOCKET_TIMEOUT = 5.0


def connect_redis(
    url: BackendURL, options: dict[str, Any], *, what: str, own: tuple[str, ...] = ()
) -> Redis:
    """A client for ``url`` (its query options minus ``own`` go to redis-py) with the keyword
    ``options`` (keyword arguments of ``redis.Redis``); a bad option or URL raises
    :class:`ConfigurationError` naming it. ``what`` names the backend in messages."""
    allowed = set(inspect.signature(Redis.__init__).parameters) - {"self"}
    allowed.add("connection_class")  # a connection-pool option
    for key in options:
        if key not in allowed:
            extra = "".join(f"{name}, " for name in own)
            raise ConfigurationError(
                f"unknown option {key!r} for the {what}; allowed: {extra}the keyword "
                "arguments of redis.Redis (socket_timeout, max_connections, ssl_ca_certs, ...)",
                argument=key,
            )
    kwargs: dict[str, Any] = {
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "socket_connect_timeout": DEFAULT_SOCKET_TIMEOUT,
        "retry": Retry(NoBackoff(), 1),
    }
    kwargs.update(options)
    check_database(url)
    try:
        return Redis.from_url(url.without_options(*own), **kwargs)
    except ValueError as exc:  # redis-py's message names the option, never a secret's value
        raise ConfigurationError(
            f"invalid redis url {url.masked}: {url.redact(str(exc))}", argument="url"
        ) from None


def check_database(url: BackendURL) -> None:
    """The URL's path is empty or a database number (``/0``): redis-py would silently use
    database 0 for anything else (``/notadb``)."""
    number = url.path.removeprefix("/").removesuffix("/")
    if number and not (number.isascii() and number.isdigit()):
        raise ConfigurationError(
            f"url {url.masked}: the path must be a database number, as in "
            "redis://host:6379/0 (or nothing, for database 0)",
            argument="url",
        )


def forget_connections(client: Redis) -> None:
    """In a child process right after ``fork()``: the client's pool forgets the connections
    inherited from the parent, without closing them (:func:`jobfence._core.forks.keep`), and
    opens its own on first use. redis-py's blocking pool does that by itself when it sees a
    new process id; its asyncio pool does not."""
    if ASYNC:
        pool = client.connection_pool
        forks.keep(
            [
                *getattr(pool, "_available_connections", ()),
                *getattr(pool, "_in_use_connections", ()),
            ]
        )
        pool.reset()  # type: ignore[no-untyped-call]
        if hasattr(pool, "_lock"):  # an asyncio.Lock, perhaps bound to the parent's loop
            pool._lock = asyncio.Lock()
