#!/usr/bin/env python3
"""Generate the sync twins of the conformance specs.

The conformance specs are written once, as async tests over the async API (``AsyncLocks``);
this script writes their sync twin with the rewriting ``tools/async_to_sync.py`` applies to
the library (``async def`` -> ``def``, ``await x`` -> ``x``, ``AsyncFoo`` -> ``Foo``,
``foo_async`` -> ``foo``, ``if ASYNC:`` branches dropped, the ``else:`` branch kept). So a sync
spec calls ``locks.acquire(...)`` and ``with lease:`` directly, on the test's own thread, with
no event loop in between, and the two flavours still run one body of assertions.

A spec reaches the few concurrency steps it needs (a second actor, a pause, waiting for an
event) through ``tests/conformance/flow_async.py``, which the rewriting turns into its sync
counterpart ``tests/conformance/flow.py``; its fixtures ``env_async`` / ``ienv_async`` /
``qenv_async`` (``AsyncEnv`` / ``AsyncInboxEnv`` / ``AsyncQueueEnv``) become ``env`` /
``ienv`` / ``qenv`` (``Env`` / ``InboxEnv`` / ``QueueEnv``).

``tests/conformance/test_twins.py`` runs ``--check``, which fails when a twin is out of date.

Usage: ``python tools/conformance_twins.py [--check]``
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

SPECS = "tests/conformance"

#: async spec file -> its generated sync twin, relative to the repository root
TWINS: dict[str, str] = {
    f"{SPECS}/test_lock_conformance.py": f"{SPECS}/test_lock_conformance_sync.py",
    f"{SPECS}/test_limit_conformance.py": f"{SPECS}/test_limit_conformance_sync.py",
    f"{SPECS}/test_inbox_conformance.py": f"{SPECS}/test_inbox_conformance_sync.py",
    f"{SPECS}/test_queue_conformance.py": f"{SPECS}/test_queue_conformance_sync.py",
    f"{SPECS}/test_schedule_conformance.py": f"{SPECS}/test_schedule_conformance_sync.py",
    f"{SPECS}/test_outbox_conformance.py": f"{SPECS}/test_outbox_conformance_sync.py",
}

HEADER = (
    "# Generated from {src} by tools/conformance_twins.py: do not edit.\n"
    "# Edit the async specs and run: python tools/conformance_twins.py\n"
)


def _rewriter() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "async_to_sync", ROOT / "tools" / "async_to_sync.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def twin(text: str, src: str) -> str:
    """The sync twin of the async spec file ``text`` (named ``src``)."""
    rewriter = _rewriter()
    code = rewriter.convert(text, src)
    first, second, rest = code.split("\n", 2)
    assert first.startswith("# Generated from") and second.startswith("# Edit"), code[:200]
    return HEADER.format(src=Path(src).name) + rest


def run(*, check: bool = False) -> int:
    """Generate (or with ``check``, compare) every twin; 0 when all is well."""
    stale = []
    for src, dst in sorted(TWINS.items()):
        try:
            new = twin((ROOT / src).read_text(encoding="utf-8"), src)
        except Exception as exc:  # a GeneratorError names the file and the rule
            print(f"conformance_twins: {exc}", file=sys.stderr)
            return 1
        path = ROOT / dst
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == new:
            continue
        if check:
            stale.append(dst)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {dst}")
    if stale:
        print("out of date (run python tools/conformance_twins.py):", *stale, sep="\n  ")
        return 1
    return 0


def main(argv: list[str]) -> int:
    unknown = [arg for arg in argv if arg != "--check"]
    if unknown:
        print(f"usage: python tools/conformance_twins.py [--check] (unknown: {unknown[0]})")
        return 2
    return run(check="--check" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
