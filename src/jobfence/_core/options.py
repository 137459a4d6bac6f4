"""Parsing of backend options (URL query values are strings; keywords may be numbers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError

__all__ = ["option_bool", "option_int", "option_seconds", "reject_unknown"]

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
