#!/usr/bin/env python3
"""Generate the sync twins of jobfence's async modules.

jobfence keeps one body of logic for sync and async: the async module is the source, and this
script writes the sync module from it (``locks_async.py`` -> ``locks.py``). CI runs it with
``--check`` and fails when a generated file is out of date.

Inputs
    ``TWINS`` maps every async source to the sync module generated from it (paths under
    ``src/jobfence``): every ``*_async.py`` there but those ``HAND_WRITTEN`` lists (modules
    with no generated twin), its twin the module of the same name without ``_async`` beside
    it. The run fails, naming the file or rule, when a listed source is missing, when a
    ``*_async.py`` is in neither list, when a file carries the generated-file header but no
    entry of ``TWINS`` produces it (a stale twin: delete it), when a rule of ``RENAMES`` or
    ``DOTTED_RULES`` was used by no input (delete the rule), or when the installed ruff is not
    the version pinned in ``pyproject.toml``.

Flavour branches
    Code that differs between the flavours is written as ``if ASYNC:`` / ``else:`` (or
    ``if not ASYNC:``) on the constant of ``jobfence._core.flavour``, imported on a line of
    its own (``from ._core.flavour import ASYNC``). The generator finds these statements with
    the AST, drops the async branch, keeps the sync branch dedented in place of the ``if``, and
    drops the import of ``ASYNC``; any other use of ``ASYNC`` is an error. Imports needed by
    one flavour only go in an ``if ASYNC:`` (``else:``) block after the other imports. mypy
    treats ``ASYNC`` as always true (``always_true`` in pyproject.toml): it checks the async
    branch in the source, and the sync branch where it runs, in the generated twin. The sync
    branch is renamed like the rest of the module, so it uses the source's names
    (``AsyncLease``, which comes out as ``Lease``).

Rewrites (on Python tokens, never on the text of comments or strings)
    * ``async def``/``async with``/``async for`` -> ``def``/``with``/``for``; ``await x`` -> ``x``
    * names: ``AsyncFoo`` -> ``Foo``, ``foo_async`` -> ``foo``, and the names in ``RENAMES``
      (dunders, drivers and helpers with another sync spelling)
    * ``DOTTED_RULES``: ``redis.asyncio`` -> ``redis``, ``asynchronous=True`` ->
      ``asynchronous=False``, ``Awaitable[X]`` -> ``X``
    * a string literal that is exactly one renamable name (an ``__all__`` entry) is renamed;
      every other string, docstrings and comments are left as written. Write them true for
      both flavours ("``AsyncLocks`` / ``Locks``"), or put a message that must differ in an
      ``if ASYNC:`` branch. Names inside f-string replacement fields are not renamed either:
      a renamable name or an ``await`` there is an error (assign the value first).
    * a name that still looks async after the rules (``asyncio``, ``aiofoo``, ``__aiter__``)
      is an error unless it is in ``KEEP``: a missing rule is reported, not generated.

The result gets the generated-file header, its unused imports removed and its imports sorted,
and is formatted, all with the pinned ruff.

Usage: ``python tools/async_to_sync.py [--check]``
"""

from __future__ import annotations

import ast
import functools
import io
import itertools
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "jobfence"
PYPROJECT = ROOT / "pyproject.toml"

#: ``*_async.py`` modules written by hand, with no generated twin
HAND_WRITTEN: tuple[str, ...] = ()


def discover_twins(package: Path, hand_written: Iterable[str] = ()) -> dict[str, str]:
    """Every ``*_async.py`` under ``package`` but the hand-written ones -> its sync twin, the
    module of the same name without ``_async`` beside it (paths relative to ``package``)."""
    skip = set(hand_written)
    twins = {}
    for path in sorted(package.rglob("*_async.py")):
        rel = path.relative_to(package).as_posix()
        if rel not in skip:
            twins[rel] = rel[: -len("_async.py")] + ".py"
    return twins


#: async source -> generated sync module, relative to src/jobfence: every ``*_async.py`` (a new
#: module, a new backend's, is generated without being listed anywhere)
TWINS: dict[str, str] = discover_twins(PACKAGE, HAND_WRITTEN)

#: names whose sync spelling the ``AsyncFoo`` / ``foo_async`` rules do not give
RENAMES: dict[str, str] = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "asynccontextmanager": "contextmanager",
    "aclose": "close",
    "ahook": "hook",
    "asleep": "sleep",
    "acompat": "compat",
    "aiosqlite": "sqlite3",
    "aiomysql": "pymysql",
    "aiter_lines": "iter_lines",
}

#: rules on a few tokens in a row (see _rewrite_tokens); each must be used by some input
DOTTED_RULES = ("redis.asyncio", "asynchronous=True", "Awaitable[...]")

#: a name left with an async spelling in a sync twin is an error (a missing rule) unless the
#: sync code means it as it is
ASYNC_LOOKING = re.compile(r"async|Async|^aio|^__a(?:enter|exit|iter|next|wait)__$")
KEEP: frozenset[str] = frozenset({"asynchronous"})

HEADER = (
    "# Generated from {src} by tools/async_to_sync.py: do not edit.\n"
    "# Edit the async source and run: python tools/async_to_sync.py\n"
)
_HEADER_START = HEADER.split("{", 1)[0]
FLAVOUR = "ASYNC"

#: the comment markers flavour branches replaced; a source still carrying one is refused
_OLD_MARKER = re.compile(r"#\s*(?:(?:begin|end)-)?(?:async|sync)-only\s*$")
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


class GeneratorError(Exception):
    """An input the generator refuses; the message names the file and what to do."""


# -- names -----------------------------------------------------------------------------------
def sync_name(word: str, renames: Mapping[str, str], used: set[str] | None = None) -> str | None:
    """The sync spelling of ``word``, or ``None`` if it has none (it stays as it is)."""
    if word in renames:
        if used is not None:
            used.add(word)
        return renames[word]
    if word.startswith("Async") and len(word) > 5 and word[5].isupper():
        return word[5:]
    if word.endswith("_async") and len(word) > len("_async"):
        return word[: -len("_async")]
    return None


# -- flavour branches ------------------------------------------------------------------------
def _is_flavour(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == FLAVOUR


def _flavour_test(test: ast.expr) -> bool | None:
    """True for ``ASYNC`` and ``ASYNC and ...`` (false in the sync twin, which keeps the
    ``else``), False for ``not ASYNC``, None for any other test."""
    if _is_flavour(test):
        return True
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return True if _is_flavour(test.values[0]) else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_flavour(test.operand):
        return False
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _dedent(lines: list[str], by: int, where: str) -> list[str]:
    out = []
    for line in lines:
        if not line.strip():
            out.append("\n")
        elif line[:by].strip(" "):
            raise GeneratorError(f"{where}: cannot dedent {line.strip()!r} out of its branch")
        else:
            out.append(line[by:])
    return out


def _statement_lists(tree: ast.AST) -> dict[int, list[ast.stmt]]:
    """id(statement) -> the statement list it sits in."""
    owner: dict[int, list[ast.stmt]] = {}
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                for stmt in stmts:
                    owner[id(stmt)] = stmts
        for handler in getattr(node, "handlers", ()):
            for stmt in handler.body:
                owner[id(stmt)] = handler.body
    return owner


def select_sync_branches(text: str, src_name: str) -> str:
    """Replace every ``if ASYNC``/``if not ASYNC`` statement by its sync branch, dedented, and
    drop the import of ``ASYNC``."""
    try:
        tree = ast.parse(text, src_name)
    except SyntaxError as exc:
        raise GeneratorError(f"{src_name}:{exc.lineno}: {exc.msg}") from None
    lines = text.splitlines(keepends=True)
    owner = _statement_lists(tree)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, end line, new lines), 0-based
    emptied: set[int] = set()  # flavour ifs that leave nothing in the sync twin
    flavour_ifs: list[tuple[ast.If, tuple[int, int, list[str]]]] = []
    for node in ast.walk(tree):
        where = f"{src_name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and any(a.name == FLAVOUR for a in node.names):
            if len(node.names) != 1 or node.names[0].asname:
                raise GeneratorError(f"{where}: import {FLAVOUR} on a line of its own")
            assert node.end_lineno is not None
            edits.append((node.lineno - 1, node.end_lineno, []))
            continue
        if not isinstance(node, ast.If):
            continue
        positive = _flavour_test(node.test)
        if positive is None:
            continue
        col = node.col_offset
        if node.body[0].lineno == node.lineno:
            raise GeneratorError(f"{where}: start the branches of `if {FLAVOUR}:` on new lines")
        if len(node.orelse) == 1 and lines[node.orelse[0].lineno - 1].lstrip().startswith("elif"):
            raise GeneratorError(f"{where}: no `elif` after `if {FLAVOUR}:`; use `else:`")
        assert node.end_lineno is not None
        end = node.end_lineno  # comments indented under the last branch belong to it
        probe = end
        while probe < len(lines):
            stripped = lines[probe].strip()
            if stripped.startswith("#") and _indent(lines[probe]) > col:
                end = probe + 1
            elif stripped:
                break
            probe += 1
        else_line = None
        if node.orelse:
            body_end = node.body[-1].end_lineno
            assert body_end is not None
            for idx in range(body_end, node.orelse[0].lineno - 1):
                if _indent(lines[idx]) == col and lines[idx].strip().startswith("else"):
                    else_line = idx
                    break
            assert else_line is not None, where
        if positive:
            branch = node.orelse
            chosen = lines[else_line + 1 : end] if else_line is not None else []
        else:
            branch = node.body
            chosen = lines[node.lineno : else_line if else_line is not None else end]
        if branch:
            new = _dedent(chosen, branch[0].col_offset - col, where)
        else:
            new = []
            emptied.add(id(node))
        edits.append((node.lineno - 1, end, new))
        flavour_ifs.append((node, edits[-1]))
    for node, (_, _, new) in flavour_ifs:
        block = owner[id(node)]
        if block[0] is node and all(id(stmt) in emptied for stmt in block):
            new.append(" " * node.col_offset + "pass\n")  # nothing is left of the block
    edits.sort()
    for (_, prev_end, _), (start, _, _) in itertools.pairwise(edits):
        if start < prev_end:
            raise GeneratorError(
                f"{src_name}:{start + 1}: an `if {FLAVOUR}` inside another one; flatten them"
            )
    for start, end, new in reversed(edits):
        lines[start:end] = new
    return "".join(lines)


# -- tokens ----------------------------------------------------------------------------------
def _check_fstrings(tree: ast.AST, src_name: str, renames: Mapping[str, str]) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value in node.values:
            if not isinstance(value, ast.FormattedValue):
                continue
            for inner in ast.walk(value):
                word = None
                if isinstance(inner, ast.Await):
                    word = "await"
                elif isinstance(inner, ast.Name) and sync_name(inner.id, renames) is not None:
                    word = inner.id
                elif isinstance(inner, ast.Attribute) and sync_name(inner.attr, renames):
                    word = inner.attr
                if word is not None:
                    raise GeneratorError(
                        f"{src_name}:{node.lineno}: {word!r} inside an f-string is not "
                        "rewritten; compute the value before the f-string"
                    )


def _string_rename(token: str, renames: Mapping[str, str], used: set[str]) -> str | None:
    """The literal renamed if it is exactly one renamable name (``"AsyncLease"``)."""
    prefix = token[: len(token) - len(token.lstrip("rRbBuUfF"))]
    if any(c in prefix.lower() for c in "bf"):
        return None
    body = token[len(prefix) :]
    quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
    value = body[len(quote) : -len(quote)]
    if not value.isidentifier():
        return None
    new = sync_name(value, renames, used)
    return None if new is None else prefix + quote + new + quote


def _rewrite_tokens(code: str, src_name: str, renames: Mapping[str, str], used: set[str]) -> str:
    tokens = [
        tok
        for tok in tokenize.generate_tokens(io.StringIO(code).readline)
        if tok.type not in (tokenize.NL, tokenize.COMMENT)
    ]
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    skip: set[int] = set()
    depth = 0  # inside an f-string (Python >= 3.12 splits them into tokens)
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else tok
        if _FSTRING_START is not None and tok.type == _FSTRING_START:
            depth += 1
        elif _FSTRING_END is not None and tok.type == _FSTRING_END:
            depth -= 1
        if depth or i in skip:
            continue
        if tok.type == tokenize.STRING:
            new = _string_rename(tok.string, renames, used)
            if new is not None:
                edits.append((tok.start, tok.end, new))
            continue
        if tok.type != tokenize.NAME:
            continue
        word = tok.string
        prev = tokens[i - 1] if i else tok
        if (word == "async" and nxt.string in ("def", "with", "for")) or word == "await":
            edits.append((tok.start, nxt.start, ""))
        elif word == FLAVOUR:
            raise GeneratorError(
                f"{src_name}:{tok.start[0]}: {FLAVOUR} may only start the test of an `if` "
                f"(`if {FLAVOUR}:`, `if {FLAVOUR} and ...:`, `if not {FLAVOUR}:`)"
            )
        elif word == "redis" and prev.string != "." and nxt.string == ".":
            after = tokens[i + 2] if i + 2 < len(tokens) else tok
            if after.string == "asyncio":
                used.add("redis.asyncio")
                edits.append((nxt.start, after.end, ""))
                skip.update((i + 1, i + 2))
        elif word == "asynchronous" and nxt.string == "=":
            value = tokens[i + 2] if i + 2 < len(tokens) else tok
            if value.string == "True":
                used.add("asynchronous=True")
                edits.append((value.start, value.end, "False"))
                skip.add(i + 2)
        elif word == "Awaitable" and nxt.string == "[":
            level = 0
            for j in range(i + 1, len(tokens)):
                if tokens[j].string in ("[", "(", "{"):
                    level += 1
                elif tokens[j].string in ("]", ")", "}"):
                    level -= 1
                    if level == 0:
                        break
            used.add("Awaitable[...]")
            edits.append((tok.start, nxt.end, ""))
            edits.append((tokens[j].start, tokens[j].end, ""))
            skip.update((i + 1, j))
        else:
            new = sync_name(word, renames, used)
            if new is not None:
                edits.append((tok.start, tok.end, new))
            elif word not in KEEP and ASYNC_LOOKING.search(word):
                raise GeneratorError(
                    f"{src_name}:{tok.start[0]}: {word!r} would stay in the sync twin; add its "
                    "sync spelling to RENAMES, move the code into an `if ASYNC:` branch, or "
                    "list the name in KEEP"
                )
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    out = code
    for start, end, new in sorted(edits, reverse=True):
        a = offsets[start[0] - 1] + start[1]
        b = offsets[end[0] - 1] + end[1]
        out = out[:a] + new + out[b:]
    return out


def convert(
    text: str,
    src_name: str,
    *,
    renames: Mapping[str, str] = RENAMES,
    used: set[str] | None = None,
) -> str:
    """The sync twin of the async module ``text``; the rules it used are added to ``used``."""
    for number, line in enumerate(text.splitlines(), 1):
        if _OLD_MARKER.search(line):
            raise GeneratorError(
                f"{src_name}:{number}: the comment marker {line.strip()!r} is no longer "
                f"supported; write the flavours as `if {FLAVOUR}:` / `else:` branches"
            )
    code = select_sync_branches(text, src_name)
    try:
        tree = ast.parse(code, src_name)
    except SyntaxError as exc:
        raise GeneratorError(
            f"{src_name}: without its async branches the module is not valid Python "
            f"(line {exc.lineno}: {exc.msg}); give each block a statement both flavours run"
        ) from None
    _check_fstrings(tree, src_name, renames)
    code = _rewrite_tokens(code, src_name, renames, used if used is not None else set())
    return _format(HEADER.format(src=src_name) + code, src_name)


# -- ruff ------------------------------------------------------------------------------------
def pinned_ruff(pyproject: Path = PYPROJECT) -> str:
    """The ruff version pinned (``ruff==X.Y.Z``) in pyproject.toml's ``test`` extra."""
    match = re.search(r"""["']ruff==([^"';\s]+)["']""", pyproject.read_text(encoding="utf-8"))
    if match is None:
        raise GeneratorError(f"{pyproject}: the test extra must pin ruff exactly (ruff==X.Y.Z)")
    return match.group(1)


def installed_ruff() -> str | None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    parts = result.stdout.split()
    return parts[1] if result.returncode == 0 and len(parts) >= 2 else None


@functools.cache
def require_pinned_ruff() -> None:
    """Refuse to format with another ruff than the pinned one: its output could differ."""
    want, have = pinned_ruff(), installed_ruff()
    if have != want:
        found = f"ruff {have}" if have else "no ruff"
        raise GeneratorError(
            f"the generated files are formatted with ruff {want} (pinned in pyproject.toml), "
            f"but {sys.executable} has {found}: run "
            f"{sys.executable} -m pip install ruff=={want}"
        )


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
        raise GeneratorError(
            f"ruff {args[0]} failed on the sync twin of {src_name}:\n{result.stderr}"
        )
    return result.stdout


def _format(code: str, src_name: str) -> str:
    """Drop imports only the async code used, sort imports and format, all with ruff."""
    require_pinned_ruff()
    code = _ruff(
        ["check", "--fix-only", "--unsafe-fixes", "--select", "F401,I001,SIM117", "--quiet"],
        code,
        src_name,
    )
    return _ruff(["format"], code, src_name)


# -- inputs ----------------------------------------------------------------------------------
def input_problems(
    package: Path, twins: Mapping[str, str], hand_written: Iterable[str] = ()
) -> list[str]:
    """What is wrong with the list of inputs: missing, unlisted and stale files."""
    problems = []
    hand_written = set(hand_written)
    for src, dst in twins.items():
        if not (package / src).is_file():
            problems.append(f"{src}: listed in TWINS but missing (remove its entry)")
        if src == dst or dst in twins:
            problems.append(f"{src}: its twin {dst} is itself an async source")
    for path in sorted(package.rglob("*_async.py")):
        rel = path.relative_to(package).as_posix()
        if rel not in twins and rel not in hand_written:
            problems.append(
                f"{rel}: not listed in TWINS (add it with the module to generate) "
                "nor in HAND_WRITTEN"
            )
    outputs = set(twins.values())
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        with path.open(encoding="utf-8") as fh:
            first = fh.readline()
        if first.startswith(_HEADER_START) and rel not in outputs:
            problems.append(f"{rel}: a generated file that no TWINS entry produces (delete it)")
    return problems


def run(
    *,
    package: Path = PACKAGE,
    twins: Mapping[str, str] = TWINS,
    hand_written: Iterable[str] = HAND_WRITTEN,
    renames: Mapping[str, str] = RENAMES,
    dotted: Iterable[str] = DOTTED_RULES,
    check: bool = False,
) -> int:
    """Generate (or with ``check``, compare) every twin; 0 when all is well."""
    try:
        problems = input_problems(package, twins, hand_written)
        if problems:
            raise GeneratorError("\n".join(problems))
        used: set[str] = set()
        outputs = {}
        for src, dst in sorted(twins.items()):
            text = (package / src).read_text(encoding="utf-8")
            outputs[dst] = convert(text, src, renames=renames, used=used)
        unused = [rule for rule in [*renames, *dotted] if rule not in used]
        if unused:
            raise GeneratorError(
                "rules no input uses (delete them from tools/async_to_sync.py): "
                + ", ".join(unused)
            )
    except GeneratorError as exc:
        print(f"async_to_sync: {exc}", file=sys.stderr)
        return 1
    stale = []
    for dst, new in outputs.items():
        path = package / dst
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == new:
            continue
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if check:
            stale.append(shown.as_posix())
        else:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {shown.as_posix()}")
    if stale:
        print("out of date (run python tools/async_to_sync.py):", *stale, sep="\n  ")
        return 1
    return 0


def main(argv: list[str]) -> int:
    unknown = [arg for arg in argv if arg != "--check"]
    if unknown:
        print(f"usage: python tools/async_to_sync.py [--check] (unknown: {unknown[0]})")
        return 2
    return run(check="--check" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
