"""What the operator commands (``jobfence locks``, ``jobfence inbox``) share: where the URL
comes from, the console they print to, who ran them (for the log of a destructive one), and
how ``module:name`` arguments are imported."""

from __future__ import annotations

import getpass
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console

from ..errors import ConfigurationError, JobfenceError

__all__ = [
    "NAMESPACE_ENV",
    "URL_ENV",
    "client",
    "console",
    "duration_text",
    "load_object",
    "url_and",
    "user",
]

C = TypeVar("C")

#: where a command finds the backend URL when none is given
URL_ENV = "JOBFENCE_URL"
#: where a command finds the lock namespace when no --namespace is given
NAMESPACE_ENV = "JOBFENCE_NAMESPACE"


def load_object(spec: str, param_hint: str, what: str = "object") -> Any:
    """``module:name`` (``name`` may be dotted: ``module:Class.attr``) -> that object,
    imported with the current directory on ``sys.path``; a usage error (``what`` names the
    kind expected in it: ``module:function``, ``module:object``) when it cannot be found."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"{spec!r} is not module:{what}", param_hint=param_hint)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint=param_hint
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise click.BadParameter(
                f"{module_name!r} has no {attr!r}", param_hint=param_hint
            ) from None
    return obj


def console() -> Console:
    """Rich output on stdout; not on a terminal, tables are not cut to 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=1000)


def user() -> str:
    """The login name of who runs the command, for the log of what it changed."""
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown user"


def url_and(url: str | None, second: str | None, what: str) -> tuple[str | None, str]:
    """``URL <what>``, or ``<what>`` alone with the URL from ``JOBFENCE_URL``: Click fills the
    positional arguments in order, so a lone argument arrives as ``url``."""
    if second is None:
        if url is None:
            raise click.UsageError(f"give the {what}")
        return os.environ.get(URL_ENV) or None, url
    return url, second


@contextmanager
def client(url: str | None, make: Callable[[str], C]) -> Iterator[C]:
    """The command's client ``make(url)``, closed after the command; a missing URL or bad
    input is a usage error (exit 2), a backend failure an error (exit 1)."""
    if not url:
        raise click.UsageError(f"give the backend URL, or set {URL_ENV}")
    try:
        made = make(url)
    except JobfenceError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        yield made
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        closer: Any = getattr(made, "close", None)
        try:
            closer()
        except JobfenceError:
            pass


def duration_text(seconds: float | None) -> str:
    """``12.5s``, ``3m 20s``, ``5h 2m``, ``6d 23h``; negative with a ``-``; "" if unknown."""
    if seconds is None:
        return ""
    sign, left = ("-" if seconds < 0 else ""), abs(seconds)
    if left < 60:
        return f"{sign}{left:.1f}s"
    whole = int(left)
    for unit, size, minor, minor_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            return f"{sign}{whole // size}{unit} {whole % size // minor_size}{minor}"
    raise AssertionError("unreachable")  # pragma: no cover
