#!/usr/bin/env python3
"""Generate the sync twin of every ``*_async.py`` module under ``src/jobfence``.

jobfence keeps one body of logic for sync and async: the async module is the source, and this
script writes the sync module next to it (``locks_async.py`` -> ``locks.py``). CI runs it with
``--check`` and fails when a generated file is out of date.

Rewrites (on whole words):

* ``async def``/``async with``/``async for`` -> ``def``/``with``/``for``; ``await x`` -> ``x``
* ``AsyncFoo`` -> ``Foo``; ``__aenter__``/``__aexit__`` -> ``__enter__``/``__exit__``
* module names ``foo_async`` -> ``foo``, ``_acompat`` -> ``_compat``
* the names in ``RENAMES`` below (drivers and helpers with a sync spelling)

Lines ending in ``# async-only`` and blocks between ``# begin-async-only`` and
``# end-async-only`` are dropped. Blocks between ``# begin-sync-only`` and ``# end-sync-only``
are written as comments in the async source and come out uncommented in the sync one.

Usage: ``python tools/async_to_sync.py [--check]``
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "jobfence"

RENAMES: dict[str, str] = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "asynccontextmanager": "contextmanager",
    "AsyncExitStack": "ExitStack",
    "aclose": "close",
    "ahook": "hook",
    "asleep": "sleep",
    "acompat": "compat",
    "aiosqlite": "sqlite3",
    "aiomysql": "pymysql",
    "acquire_async": "acquire",
}

HEADER = (
    "# Generated from {src} by tools/async_to_sync.py: do not edit.\n"
    "# Edit the async source and run: python tools/async_to_sync.py\n"
)

_DOTTED = [
    (re.compile(r"\bredis\.asyncio\b"), "redis"),
    (re.compile(r"\bfrom redis import asyncio as (\w+)"), r"import redis as \1"),
    (re.compile(r"\basynchronous=True\b"), "asynchronous=False"),
    (re.compile(r"\bAwaitable\[([^\[\]]+)\]"), r"\1"),
]
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def _rename(match: re.Match[str]) -> str:
    word = match.group(0)
    if word in RENAMES:
        return RENAMES[word]
    if word.startswith("Async") and len(word) > 5 and word[5].isupper():
        return word[5:]
    if word.endswith("_async") and len(word) > 6:
        return word[: -len("_async")]
    return word


def convert(text: str, src_name: str) -> str:
    out: list[str] = []
    mode = "both"
    for line in text.splitlines(keepends=True):
        marker = line.strip()
        if marker == "# begin-async-only":
            mode = "async"
            continue
        if marker == "# begin-sync-only":
            mode = "sync"
            continue
        if marker in ("# end-async-only", "# end-sync-only"):
            mode = "both"
            continue
        if mode == "async" or line.rstrip().endswith("# async-only"):
            continue
        if mode == "sync":
            indent = line[: len(line) - len(line.lstrip())]
            body = line.lstrip()
            if body.rstrip("\n") == "#":
                out.append("\n")
                continue
            if body.startswith("# "):
                body = body[2:]
            elif body.startswith("#"):
                body = body[1:]
            line = indent + body
        out.append(line)
    code = "".join(out)
    code = re.sub(r"\basync (def|with|for)\b", r"\1", code)
    code = re.sub(r"\bawait\s+", "", code)
    for pattern, repl in _DOTTED:
        code = pattern.sub(repl, code)
    code = _WORD.sub(_rename, code)
    return _format(HEADER.format(src=src_name) + code, src_name)


def _ruff(args: list[str], code: str, src_name: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", src_name, "-"],
        input=code,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if result.returncode != 0 and not result.stdout:
        raise SystemExit(f"ruff {args[0]} failed on the sync twin of {src_name}:\n{result.stderr}")
    return result.stdout


def _format(code: str, src_name: str) -> str:
    """Drop imports only the async code used, sort imports and format, all with ruff."""
    code = _ruff(
        ["check", "--fix-only", "--unsafe-fixes", "--select", "F401,I001,SIM117", "--quiet"],
        code,
        src_name,
    )
    return _ruff(["format"], code, src_name)


def targets() -> list[tuple[Path, Path]]:
    pairs = []
    for src in sorted(PACKAGE.rglob("*_async.py")):
        pairs.append((src, src.with_name(src.name[: -len("_async.py")] + ".py")))
    return pairs


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for src, dst in targets():
        rel = src.relative_to(PACKAGE).as_posix()
        new = convert(src.read_text(encoding="utf-8"), rel)
        old = dst.read_text(encoding="utf-8") if dst.exists() else None
        if old != new:
            if check:
                stale.append(dst.relative_to(ROOT).as_posix())
            else:
                dst.write_text(new, encoding="utf-8")
                print(f"wrote {dst.relative_to(ROOT).as_posix()}")
    if stale:
        print("out of date (run python tools/async_to_sync.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
