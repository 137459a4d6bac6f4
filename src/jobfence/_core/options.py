"""Parsing of backend options (URL query values are strings; keywords may be numbers)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "TIMEOUT_OPTIONS",
    "Timeouts",
    "connect_timed_out",
    "option_bool",
    "option_int",
    "option_pool_size",
    "option_seconds",
    "option_timeouts",
    "reject_unknown",
    "request_timed_out",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def option_seconds(value: object, argument: str, low: float, high: float) -> float:
    """A number of seconds in ``[low, high]``, else ``ConfigurationError`` naming it."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not (low <= number <= high):
        raise ConfigurationError(
            f"{argument} must be a number of seconds from {low} to {high}, got {value!r}",
            argument=argument,
        )
    return number


def option_int(value: object, argument: str, low: int, high: int) -> int:
    """An integer in ``[low, high]``, else ``ConfigurationError`` naming it."""
    try:
        number = int(str(value).strip()) if not isinstance(value, bool) else low - 1
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ConfigurationError(
            f"{argument} must be an integer from {low} to {high}, got {value!r}",
            argument=argument,
        )
    return number


def option_bool(value: object, argument: str) -> bool:
    """true/false (also 1/0, yes/no, on/off), else ``ConfigurationError`` naming it."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(
        f"{argument} must be true or false (also 1/0, yes/no, on/off), got {value!r}",
        argument=argument,
    )


def reject_unknown(options: Mapping[str, Any], allowed: Iterable[str], what: str) -> None:
    """Raise ``ConfigurationError`` naming the first option not in ``allowed``."""
    allowed = sorted(set(allowed))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigurationError(
            f"unknown {what} option(s) {unknown}; allowed: {allowed}", argument=unknown[0]
        )


#: the most idle connections a pool may keep
MAX_POOL_SIZE = 1000


def option_pool_size(
    options: Mapping[str, Any], url_options: Mapping[str, Any], default: int
) -> int:
    """``pool_size``: how many idle connections a client's pool keeps for reuse (keywords win
    over the URL). ``max_idle`` is its deprecated former name (a ``DeprecationWarning``)."""
    if "max_idle" in options or "max_idle" in url_options:
        warnings.warn(
            "the max_idle option is deprecated: it is called pool_size now",
            DeprecationWarning,
            stacklevel=_user_stacklevel(),
        )
    for source in (options, url_options):
        for argument in ("pool_size", "max_idle"):
            if argument in source:
                return option_int(source[argument], argument, 0, MAX_POOL_SIZE)
    return default


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by our caller point at the first frame
    outside jobfence (the user's code), where the default filters show it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame = frame.f_back
        level += 1
    return level


#: seconds a new connection may take to open (every network backend)
DEFAULT_CONNECT_TIMEOUT = 5.0
#: seconds one request may wait for its reply (every network backend)
DEFAULT_TIMEOUT = 5.0
#: the options that set them, as URL query options or keywords
TIMEOUT_OPTIONS = ("connect_timeout", "timeout")
#: the longest either may be set to
MAX_TIMEOUT = 3600.0
#: the shortest either may be set to
MIN_TIMEOUT = 0.01


@dataclass(frozen=True)
class Timeouts:
    """The deadlines of a network backend's calls, in seconds.

    ``connect``: opening a new connection. ``request``: one request, from sending it to its
    reply; a request that waits in the server on purpose (a blocking lock wait) gets its wait
    on top.
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    request: float = DEFAULT_TIMEOUT


def option_timeouts(options: Mapping[str, Any], url_options: Mapping[str, Any]) -> Timeouts:
    """``connect_timeout`` and ``timeout`` (seconds, keywords win over the URL), each from
    ``MIN_TIMEOUT`` to ``MAX_TIMEOUT``; the defaults where not given."""
    values: dict[str, float] = {}
    defaults = {"connect_timeout": DEFAULT_CONNECT_TIMEOUT, "timeout": DEFAULT_TIMEOUT}
    for argument, default in defaults.items():
        raw = options.get(argument, url_options.get(argument))
        values[argument] = (
            default if raw is None else option_seconds(raw, argument, MIN_TIMEOUT, MAX_TIMEOUT)
        )
    return Timeouts(connect=values["connect_timeout"], request=values["timeout"])


def connect_timed_out(seconds: float) -> TimeoutError:
    """The error of a connection that could not be opened within ``connect_timeout``."""
    return TimeoutError(f"could not connect within {seconds:g} s (the connect_timeout option)")


def request_timed_out(seconds: float) -> TimeoutError:
    """The error of a request whose reply did not come within ``timeout``."""
    return TimeoutError(
        f"no reply from the server within {seconds:g} s (the timeout option); "
        "the connection was closed"
    )
