"""Lazy attributes for the backend packages.

A backend package re-exports its public names, but importing one of its modules (say the sync
``locks``) must not import every driver the package can use (the async client's driver, or
psycopg for a user who only passes asyncpg connections to ``claim_in``). So each package's
``__init__`` sets ``__getattr__ = lazy_attributes(__name__, {name: module, ...})``: a name is
imported from its module on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``names[name]`` on first use."""
    table = dict(names)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
