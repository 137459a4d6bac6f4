"""The API reference covers the public API: every public name has an entry on the site, and
every public function and class a caller constructs explains each of its parameters.

The public names are ``jobfence.__all__``, ``jobfence.testing.__all__`` and the ``__all__`` of
each framework integration. A parameter counts as explained when the docstring (for a class,
its own or its ``__init__``'s) names it as code (``name``, ``**name``) or lists it in an
``Args:`` section, the Google-style section the site renders as a table (``mkdocs.yml``:
``docstring_style: google``).
"""

from __future__ import annotations

import importlib
import inspect
import re
from types import ModuleType
from typing import Any

import pytest

MODULES = [
    "jobfence",
    "jobfence.testing",
    "jobfence.testing.faults",
    "jobfence.testing.strategies",
    *(
        f"jobfence.integrations.{m}"
        for m in (
            "celery",
            "rq",
            "dramatiq",
            "arq",
            "sqlalchemy",
            "schedule_targets",
            "outbox_targets",
            "celery_beat",
            "http",
            "asgi",
            "flask",
        )
    ),
    "jobfence.integrations.django",
]

#: classes jobfence creates and hands to you (you use their attributes and methods, never
#: their constructor), the exceptions it raises and the protocols it types against (never
#: instantiated): their constructors are not public
NOT_CONSTRUCTED = {
    "jobfence": {
        "Renewable",
        "Lease",
        "AsyncLease",
        "Claim",
        "AsyncClaim",
        "Message",
        "AsyncMessage",
        "ClaimInfo",
        "ClaimState",
        "OutboxRow",
        "OutboxEntry",
        "OutboxStats",
        "LockHolder",
        "WorkerStats",
        "RelayStats",
    },
    "jobfence.testing": {
        "SimTask",
        "SimClock",
        "SimTable",
        "SimTransaction",
        "Simulation",
        "Write",
        "Violation",
        "Failure",
        "Report",
        "Tape",
        "HookPoint",
    },
}


def public(module: ModuleType) -> list[tuple[str, Any]]:
    return [(name, getattr(module, name)) for name in module.__all__ if name != "__version__"]


def modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in MODULES]


def documented_parameters(obj: Any) -> tuple[inspect.Signature, str] | None:
    """The signature callers use and the docstring text that should explain it."""
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return None
        doc = inspect.getdoc(obj) or ""
        init = obj.__dict__.get("__init__")
        if init is not None:
            doc += "\n" + (inspect.getdoc(init) or "")
    elif inspect.isfunction(obj):
        doc = inspect.getdoc(obj) or ""
    else:
        return None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a Protocol, a typing alias
        return None
    return signature, doc


def undocumented(signature: inspect.Signature, doc: str) -> list[str]:
    missing = []
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls"):
            continue
        prefix = {parameter.VAR_POSITIONAL: r"\*?", parameter.VAR_KEYWORD: r"(\*\*)?"}.get(
            parameter.kind, ""
        )
        as_code = re.search(rf"`{prefix}{re.escape(name)}\b", doc)
        in_args = re.search(rf"(?m)^\s+{re.escape(name)}( \([^)]*\))?:", doc)
        if not (as_code or in_args):
            missing.append(name)
    return missing


def test_every_public_callable_explains_its_parameters() -> None:
    gaps = []
    for module in modules():
        skip = NOT_CONSTRUCTED.get(module.__name__, set())
        for name, obj in public(module):
            if name in skip:
                continue
            found = documented_parameters(obj)
            if found is None:
                continue
            missing = undocumented(*found)
            if missing:
                gaps.append(f"{module.__name__}.{name}: {', '.join(missing)}")
    assert not gaps, "parameters no docstring explains:\n" + "\n".join(gaps)


def test_the_parameter_check_finds_an_unexplained_parameter() -> None:
    def documented(conn: Any, *, table: str = "t", **options: Any) -> None:
        """Write on ``conn`` into ``table``; ``**options`` go to the driver."""

    def half(conn: Any, ttl: float) -> None:
        """Write on ``conn``.

        Args:
            conn: The connection.
        """

    assert undocumented(*documented_parameters(documented)) == []  # type: ignore[misc]
    assert undocumented(*documented_parameters(half)) == ["ttl"]  # type: ignore[misc]


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_a_docstring(module: str) -> None:
    mod = importlib.import_module(module)
    bare = [
        name
        for name, obj in public(mod)
        if (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj))
        and not (obj.__doc__ or "").strip()
    ]
    assert not bare, f"{module}: public names without a docstring: {bare}"
