"""Load the SQL and Lua files that ship with the backend packages (one loader for all of them).

``<package>/sql/<file>.sql`` is split into sections by lines ``-- name: <section>``. For every
file the same steps run, and the result is cached:

1. **Comments** (``-- ...`` to the end of the line, ``/* ... */``) are removed, but never
   inside a string literal or a quoted identifier; lines left empty are dropped; a trailing
   ``;`` is removed. A ``$jobfence$ ... $jobfence$`` block (PostgreSQL ``DO``) is SQL too:
   its comments go, and its ``;`` do not end a statement.
2. **Identifiers**: ``{key}`` followed by identifier characters (``{namespace}_locks``,
   ``{table}``, ``{table}_expires``) is one identifier: the value of ``key`` plus the
   suffix, quoted by the dialect's ``quote`` function. Inside a string literal or a quoted
   identifier (``'{table}'``) the bare value is written. Values are validated identifiers
   (:func:`jobfence._core.validate.check_namespace`), so nothing else can get in. ``values``
   fills ``{key}`` with an integer (e.g. an advisory-lock key). A placeholder that is given
   no value is an error, unless it is a ``slot`` the caller fills later (the MySQL batched
   renewal builds ``{hashes}``/``{pairs}`` per call).
3. **Parameters** are named, ``:name`` (never inside quotes; ``::`` is a PostgreSQL cast,
   not a parameter) and converted to the driver's style (:func:`convert`):

   ==============  ================================  ========================================
   style           drivers                           placeholder
   ==============  ================================  ========================================
   ``pyformat``    PyMySQL, aiomysql, psycopg        ``%(name)s``; a literal ``%`` is doubled
                                                     (only when the statement has parameters)
   ``psycopg``     psycopg (jobfence's connections)  as ``pyformat``, but an array parameter
                                                     (``CAST(:name AS type[])`` or
                                                     ``:name::type[]``) is ``%(name)b``: sent
                                                     in binary, without quoting each element
   ``named``       sqlite3, aiosqlite                ``:name`` (unchanged)
   ``sqlalchemy``  SQLAlchemy ``text()``             ``:name``; other colons that ``text()``
                                                     would read as parameters are escaped
   ``numeric``     asyncpg                           ``$1``, ``$2``... (one number per name)
   ``format``      Django's cursors                  ``%s``; a literal ``%`` is doubled (only
                                                     when the statement has parameters)
   ==============  ================================  ========================================

A section holds one statement, or several separated by ``;`` (a script such as a schema):
``queries[section]`` is the whole section, ``queries.statements(section)`` its statements.

Lua scripts (``<package>/lua/<file>.lua``) are read as they are (:func:`load_lua`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import cache, lru_cache
from importlib.resources import files
from typing import NamedTuple

__all__ = [
    "STYLES",
    "Converted",
    "Queries",
    "convert",
    "fill",
    "load_lua",
    "load_sections",
    "load_sql",
    "split_statements",
    "strip_comments",
]

STYLES = ("named", "pyformat", "psycopg", "numeric", "sqlalchemy", "format")
#: what follows an array parameter: `` AS type[])`` of a CAST, or a ``::type[]`` cast
_ARRAY_CAST = re.compile(r"\s+AS\s+[A-Za-z0-9_ ]+\[\]\s*\)|::[A-Za-z0-9_ ]+\[\]", re.IGNORECASE)

_SECTION = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_TOKEN = re.compile(
    r"""
     (?P<literal>'(?:[^']|'')*')
    |(?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
    |(?P<comment>--[^\n]*|/\*.*?\*/)
    |(?P<dollar>\$jobfence\$)
    |(?P<slot>\{(?P<key>[A-Za-z_]\w*)\}(?P<suffix>\w*))
    |(?P<cast>::)
    |(?P<param>(?<![\w:]):(?P<name>[A-Za-z_]\w*))
    |(?P<semicolon>;)
    """,
    re.VERBOSE | re.DOTALL,
)
_INNER_SLOT = re.compile(r"\{([A-Za-z_]\w*)\}")
# what SQLAlchemy's text() takes for a bind parameter (sqlalchemy.sql.elements.TextClause)
_SA_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?![:\w])")


def _tokens(sql: str) -> Iterator[tuple[str, str, re.Match[str] | None]]:
    """``(kind, text, match)`` for every piece of ``sql``; plain SQL comes as ``"code"``."""
    pos = 0
    for match in _TOKEN.finditer(sql):
        if match.start() > pos:
            yield "code", sql[pos : match.start()], None
        kind = match.lastgroup
        if kind in ("key", "suffix", "name"):  # pragma: no cover - inner groups never last
            kind = None
        assert kind is not None
        yield kind, match.group(0), match
        pos = match.end()
    if pos < len(sql):
        yield "code", sql[pos:], None


def strip_comments(sql: str) -> str:
    """``sql`` without comments and empty lines, and without a trailing ``;``."""
    text = "".join(text for kind, text, _m in _tokens(sql) if kind != "comment")
    lines = [line.rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip()).strip().rstrip(";").rstrip()


def split_statements(sql: str) -> tuple[str, ...]:
    """The statements of ``sql``: split at ``;`` outside quotes and ``$jobfence$`` blocks."""
    statements: list[str] = []
    current: list[str] = []
    in_block = False
    for kind, text, _m in _tokens(sql):
        if kind == "dollar":
            in_block = not in_block
        if kind == "semicolon" and not in_block:
            statements.append("".join(current).strip())
            current = []
        else:
            current.append(text)
    statements.append("".join(current).strip())
    return tuple(s for s in statements if s)


def fill(
    sql: str,
    names: Mapping[str, str],
    quote: Callable[[str], str],
    *,
    values: Mapping[str, int] | None = None,
    slots: Collection[str] = (),
) -> str:
    """Fill ``{key}`` placeholders: identifiers from ``names`` (quoted with ``quote``, with the
    identifier characters that follow), integers from ``values``; ``slots`` are left as they
    are. Inside quotes the bare value is written. ``KeyError`` names a placeholder without a
    value."""
    values = values or {}

    def bare(match: re.Match[str]) -> str:
        key = match.group(1)
        if key in slots:
            return match.group(0)
        if key in values:
            return str(int(values[key]))
        return names[key]

    out: list[str] = []
    for kind, text, match in _tokens(sql):
        if kind == "slot":
            assert match is not None
            key, suffix = match.group("key"), match.group("suffix")
            if key in slots:
                out.append(text)
            elif key in values:
                out.append(str(int(values[key])) + suffix)
            else:
                out.append(quote(names[key] + suffix))
        elif kind in ("literal", "quoted"):
            out.append(_INNER_SLOT.sub(bare, text))
        else:
            out.append(text)
    return "".join(out)


class Converted(NamedTuple):
    """A statement in a driver's placeholder style, and its parameter names in order of first
    appearance (for ``numeric``: ``$1`` is ``names[0]``); for ``format``, one name per ``%s``
    in order (a name used twice is listed twice)."""

    sql: str
    names: tuple[str, ...]


#: the styles whose placeholders start with ``%``: a literal ``%`` is doubled
_PERCENT_STYLES = ("pyformat", "psycopg", "format")


@lru_cache(maxsize=2048)
def convert(sql: str, style: str) -> Converted:
    """``sql`` with ``:name`` parameters in the placeholder style of a driver (see above)."""
    if style not in STYLES:
        raise ValueError(f"unknown placeholder style {style!r}; allowed: {', '.join(STYLES)}")
    pieces = list(_tokens(sql))
    names: list[str] = []
    for kind, _text, match in pieces:
        if kind == "param":
            assert match is not None
            if match.group("name") not in names:
                names.append(match.group("name"))
    if style == "named" or not names:
        return Converted(sql, tuple(names))
    out: list[str] = []
    starts: set[int] = set()  # where our parameters start (sqlalchemy)
    positional: list[str] = []  # the name of each %s (format)
    for index, (kind, text, match) in enumerate(pieces):
        if kind != "param":
            out.append(text.replace("%", "%%") if style in _PERCENT_STYLES else text)
            continue
        assert match is not None
        name = match.group("name")
        following = "".join(piece[1] for piece in pieces[index + 1 : index + 3])
        if style == "pyformat":
            out.append(f"%({name})s")
        elif style == "psycopg":
            out.append(f"%({name})b" if _ARRAY_CAST.match(following) else f"%({name})s")
        elif style == "format":
            out.append("%s")
            positional.append(name)
        elif style == "numeric":
            out.append(f"${names.index(name) + 1}")
        else:
            starts.add(sum(len(p) for p in out))
            # text() does not take ":name" right before a colon (a "::" cast): add a space
            out.append(f":{name} " if following.startswith(":") else f":{name}")
    text = "".join(out)
    if style == "format":
        return Converted(text, tuple(positional))
    if style == "sqlalchemy":
        text = _SA_BIND.sub(
            lambda m: m.group(0) if m.start() in starts else "\\" + m.group(0), text
        )
    return Converted(text, tuple(names))


class Queries(Mapping[str, str]):
    """The sections of one SQL file, filled and converted: ``queries[section]`` is the whole
    section (one statement, or a script), :meth:`statements` its statements."""

    def __init__(self, sections: Mapping[str, str], style: str) -> None:
        self.style = style
        self._sections = {name: convert(sql, style).sql for name, sql in sections.items()}
        self._statements = {
            name: tuple(convert(s, style).sql for s in split_statements(sql))
            for name, sql in sections.items()
        }

    def __getitem__(self, name: str) -> str:
        return self._sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def __repr__(self) -> str:
        return f"<Queries {', '.join(self._sections)} ({self.style})>"

    def statements(self, name: str) -> tuple[str, ...]:
        """The statements of section ``name``, each without its ``;``."""
        return self._statements[name]


def _read(package: str, path: str) -> str:
    return files(package).joinpath(path).read_text(encoding="utf-8")


@cache
def load_sections(package: str, filename: str) -> dict[str, str]:
    """The sections of ``<package>/sql/<filename>``, comments removed, nothing filled in."""
    parts = _SECTION.split(_read(package, f"sql/{filename}"))
    return {name: strip_comments(body) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@lru_cache(maxsize=512)
def _load(
    package: str,
    filename: str,
    names: tuple[tuple[str, str], ...],
    quote: Callable[[str], str],
    values: tuple[tuple[str, int], ...],
    slots: tuple[str, ...],
    style: str,
) -> Queries:
    named, numbers = dict(names), dict(values)
    sections = {
        section: fill(sql, named, quote, values=numbers, slots=slots)
        for section, sql in load_sections(package, filename).items()
    }
    return Queries(sections, style)


def load_sql(
    package: str,
    filename: str,
    *,
    names: Mapping[str, str],
    quote: Callable[[str], str],
    values: Mapping[str, int] | None = None,
    slots: Collection[str] = (),
    style: str = "named",
) -> Queries:
    """``<package>/sql/<filename>`` with its identifiers filled in (``names``, already
    validated; ``quote`` is the dialect's), parameters in ``style`` (cached)."""
    return _load(
        package,
        filename,
        tuple(sorted(names.items())),
        quote,
        tuple(sorted((values or {}).items())),
        tuple(sorted(slots)),
        style,
    )


#: a library's function: from ``local function NAME(`` to the next ``end`` that starts a line
_LUA_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end[ \t]*$", re.MULTILINE | re.DOTALL)
#: a Lua line that is only a comment
_LUA_COMMENT_LINE = re.compile(r"^[ \t]*--[^\n]*$", re.MULTILINE)


@cache
def load_lua(package: str, *filenames: str, needed_only: bool = False) -> str:
    """The Lua files ``<package>/lua/<filename>``, joined in order (libraries first, the
    script last).

    ``needed_only``: of the libraries' functions, only those the script calls, directly or
    through another one, in the libraries' order. Every function of a library is defined
    again by each call of a script (a closure made per run), so a script that defines only
    what it uses costs the server less per call. A library with anything but functions and
    comments at its top level is kept whole."""
    texts = [_read(package, f"lua/{name}") for name in filenames]
    if not needed_only:
        return "\n".join(texts)
    *libs, script = texts
    # the libraries in order: a function (its name, its text), or a whole library (name None)
    pieces: list[tuple[str | None, str]] = []
    for lib in libs:
        outside = _LUA_COMMENT_LINE.sub("", _LUA_FUNCTION.sub("", lib))
        if outside.strip():
            pieces.append((None, lib))  # top-level code besides functions: kept whole
        else:
            pieces.extend((m.group(1), m.group(0)) for m in _LUA_FUNCTION.finditer(lib))
    wanted: set[str | None] = {None}
    while True:
        used = _LUA_COMMENT_LINE.sub(
            "", "\n".join([script, *(text for name, text in pieces if name in wanted)])
        )
        more = {
            name
            for name, _ in pieces
            if name not in wanted and re.search(rf"(?<![\w.:]){name}(?!\w)", used)
        }
        if not more:
            return "\n".join([*(text for name, text in pieces if name in wanted), script])
        wanted |= more
