"""The one loader of the shipped SQL and Lua files (``jobfence._core.sqlfiles``): sections,
comment stripping, identifier filling and placeholder conversion for every driver style."""

from __future__ import annotations

import re
import sqlite3
from importlib.resources import files
from pathlib import Path

import pytest

from jobfence._core.sqlfiles import (
    convert,
    fill,
    load_lua,
    load_sections,
    load_sql,
    split_statements,
    strip_comments,
)
from jobfence.backends import sql_dialect
from jobfence.backends.mysql.common import held_statement, load_queries, renew_statement
from jobfence.backends.postgres.locks_async import load_queries as pg_load_queries
from jobfence.backends.sqlite.common import load_queries as sqlite_load_queries

SQL_FILES = [
    (f"jobfence.backends.{server}", name)
    for server in ("postgres", "mysql", "sqlite")
    for name in ("locks.sql", "inbox.sql", "fence.sql")
]


def _pg(name: str) -> str:
    return sql_dialect("postgresql").quote(name)


# -- sections and comments ------------------------------------------------------------------


@pytest.mark.parametrize(("package", "filename"), SQL_FILES)
def test_every_file_splits_into_named_sections_without_comments(
    package: str, filename: str
) -> None:
    source = files(package).joinpath(f"sql/{filename}").read_text(encoding="utf-8")
    names = re.findall(r"^-- name: (\w+)\s*$", source, re.MULTILINE)
    sections = load_sections(package, filename)
    assert list(sections) == names
    for name, sql in sections.items():
        assert sql, name
        assert not sql.rstrip().endswith(";"), name
        assert all(line.strip() for line in sql.splitlines()), name
        assert "-- " not in sql, name  # no shipped statement has "--" inside quotes


@pytest.mark.parametrize(("package", "filename"), SQL_FILES)
def test_every_file_uses_named_parameters_only(package: str, filename: str) -> None:
    for name, sql in load_sections(package, filename).items():
        code = re.sub(r"'(?:[^']|'')*'", "''", sql)
        assert "?" not in code, name
        assert "%(" not in code and "%s" not in code, name


def test_comments_inside_quotes_are_kept() -> None:
    sql = (
        "SELECT '-- not a comment', \"a--b\" -- a comment\n"
        "  /* block\n comment */ FROM t;  -- trailing\n\n"
    )
    assert strip_comments(sql) == "SELECT '-- not a comment', \"a--b\"\n   FROM t"


def test_do_blocks_are_one_statement_and_lose_their_comments() -> None:
    sql = strip_comments(
        "DO $jobfence$\nBEGIN\n  PERFORM 1; -- first\n  CREATE TABLE x (a int); -- second\n"
        "END\n$jobfence$;\nSELECT ';' FROM x;\nSELECT 2"
    )
    assert "--" not in sql
    statements = split_statements(sql)
    assert len(statements) == 3
    assert statements[0].startswith("DO $jobfence$") and statements[0].endswith("$jobfence$")
    assert "PERFORM 1;" in statements[0]
    assert statements[1] == "SELECT ';' FROM x"


def test_the_postgres_inbox_schema_is_one_do_block_and_the_locks_schema_one_script() -> None:
    inbox = sql_dialect("postgresql").inbox_queries("jobfence_inbox")
    (schema,) = inbox.statements("schema")
    assert schema.startswith("DO $jobfence$") and schema.endswith("$jobfence$")
    assert inbox.statements("drop")[0].startswith("DROP TABLE IF EXISTS")
    locks = pg_load_queries("jobfence")
    assert locks["schema"].startswith("SELECT pg_advisory_xact_lock(")
    assert locks["schema"].count("CREATE TABLE IF NOT EXISTS") == 4


# -- identifiers ----------------------------------------------------------------------------


def test_fill_quotes_whole_identifiers_and_writes_bare_names_inside_quotes() -> None:
    sql = (
        "SELECT * FROM {namespace}_locks JOIN {table} ON x WHERE c = '{table}' "
        "AND pg_notify('{namespace}_locks', 'k') AND \"{namespace}_q\".a = {key}"
    )
    out = fill(sql, {"namespace": "Ns", "table": "tab"}, _pg, values={"key": -5})
    assert out == (
        'SELECT * FROM "Ns_locks" JOIN "tab" ON x WHERE c = \'tab\' '
        "AND pg_notify('Ns_locks', 'k') AND \"Ns_q\".a = -5"
    )


def test_fill_leaves_slots_and_refuses_unknown_placeholders() -> None:
    sql = "UPDATE {namespace}_locks SET a = 1 WHERE h IN ({hashes})"
    out = fill(sql, {"namespace": "n"}, lambda s: f"`{s}`", slots=("hashes",))
    assert out == "UPDATE `n_locks` SET a = 1 WHERE h IN ({hashes})"
    with pytest.raises(KeyError):
        fill(sql, {"namespace": "n"}, lambda s: f"`{s}`")


@pytest.mark.parametrize(
    ("dialect", "locks"),
    [("postgresql", '"Ns_locks"'), ("mysql", "`Ns_locks`"), ("sqlite", '"Ns_locks"')],
)
def test_on_server_names_are_kept(dialect: str, locks: str) -> None:
    """The names the tables have always had: lock tables keep the namespace's case (they were
    quoted on PostgreSQL); the PostgreSQL inbox table was unquoted, so folded to lower case."""
    loaders = {"postgresql": pg_load_queries, "mysql": load_queries, "sqlite": sqlite_load_queries}
    assert locks in loaders[dialect]("Ns")["force_release"]
    inbox = sql_dialect(dialect).inbox_queries("MyInbox")
    table = {"postgresql": '"myinbox"', "mysql": "`MyInbox`", "sqlite": '"MyInbox"'}[dialect]
    assert f"FROM {table} WHERE k = :key" in inbox["peek"]
    assert "'MyInbox'" in inbox.statements("schema")[-1]  # the schema row keeps the given name
    fence = sql_dialect(dialect).fence_queries("app.Fences")
    quoted = sql_dialect(dialect).quote("app.Fences")
    assert f"FROM {quoted} WHERE" in fence["newest"]


def test_no_file_replaces_a_default_table_name_as_a_word() -> None:
    for package, filename in SQL_FILES:
        for name, sql in load_sections(package, filename).items():
            assert "jobfence_fences" not in sql and "jobfence_inbox " not in sql, name


# -- placeholders ---------------------------------------------------------------------------

SQL = (
    "SELECT :a, :b::float8, '50%', ':not_a_param', x::int, \"c:d\"\n"
    "FROM t WHERE k = :a AND t.x LIKE 'a%' AND e = :b_2"
)


def test_named_style_is_unchanged() -> None:
    assert convert(SQL, "named") == (SQL, ("a", "b", "b_2"))


def test_psycopg_style_sends_array_parameters_in_binary() -> None:
    sql = (
        "SELECT * FROM unnest(CAST(:keys AS text[]), CAST(:ttls AS double precision[]), "
        ":names::text[]) WHERE k = :key AND x = CAST(:n AS integer) AND '5%' <> :key"
    )
    out, names = convert(sql, "psycopg")
    assert out == (
        "SELECT * FROM unnest(CAST(%(keys)b AS text[]), CAST(%(ttls)b AS double precision[]), "
        "%(names)b::text[]) WHERE k = %(key)s AND x = CAST(%(n)s AS integer) AND '5%%' <> %(key)s"
    )
    assert names == ("keys", "ttls", "names", "key", "n")


def test_pyformat_style_doubles_percent_signs() -> None:
    out, names = convert(SQL, "pyformat")
    assert names == ("a", "b", "b_2")
    assert out == (
        "SELECT %(a)s, %(b)s::float8, '50%%', ':not_a_param', x::int, \"c:d\"\n"
        "FROM t WHERE k = %(a)s AND t.x LIKE 'a%%' AND e = %(b_2)s"
    )
    # a statement without parameters is sent without them: its "%" stays single
    assert convert("SELECT '50%' FROM t", "pyformat") == ("SELECT '50%' FROM t", ())


def test_numeric_style_numbers_each_name_once() -> None:
    out, names = convert(SQL, "numeric")
    assert names == ("a", "b", "b_2")
    assert out == (
        "SELECT $1, $2::float8, '50%', ':not_a_param', x::int, \"c:d\"\n"
        "FROM t WHERE k = $1 AND t.x LIKE 'a%' AND e = $3"
    )


def test_format_style_lists_a_name_per_placeholder() -> None:
    out, names = convert(SQL, "format")
    assert names == ("a", "b", "a", "b_2")  # one per %s, in order: "a" twice
    assert out == (
        "SELECT %s, %s::float8, '50%%', ':not_a_param', x::int, \"c:d\"\n"
        "FROM t WHERE k = %s AND t.x LIKE 'a%%' AND e = %s"
    )
    assert convert("SELECT '50%' FROM t", "format") == ("SELECT '50%' FROM t", ())


def test_sqlalchemy_style_escapes_colons_text_would_misread() -> None:
    out, names = convert(SQL, "sqlalchemy")
    assert names == ("a", "b", "b_2")
    assert out == (
        "SELECT :a, :b ::float8, '50%', '\\:not_a_param', x::int, \"c:d\"\n"
        "FROM t WHERE k = :a AND t.x LIKE 'a%' AND e = :b_2"
    )


def test_sqlalchemy_text_takes_exactly_our_parameters() -> None:
    sa = pytest.importorskip("sqlalchemy")
    out, _names = convert(SQL, "sqlalchemy")
    clause = sa.text(out)
    assert set(clause._bindparams) == {"a", "b", "b_2"}
    compiled = str(clause.compile(compile_kwargs={"render_postcompile": True}))
    assert "':not_a_param'" in compiled and ":b ::float8" in compiled


def test_every_style_runs_on_sqlite3() -> None:
    conn = sqlite3.connect(":memory:")
    sql = "SELECT :a || '%' || ':x', :b, :a"
    text, names = convert(sql, "named")
    assert conn.execute(text, {"a": "p", "b": 2}).fetchone() == ("p%:x", 2, "p")
    assert names == ("a", "b")


def test_unknown_style_is_refused() -> None:
    with pytest.raises(ValueError, match="pyformat"):
        convert("SELECT 1", "qmark")


def test_loaded_queries_are_converted_and_cached() -> None:
    d = sql_dialect("mysql")
    a = d.inbox_queries("t1", style="pyformat")
    assert a is d.inbox_queries("t1", style="pyformat")
    assert "%(key)s" in a["claim_in"] and ":key" not in a["claim_in"]
    b = d.inbox_queries("t1")
    assert ":key" in b["claim_in"]
    assert a is not b
    assert load_sql("jobfence.backends.sqlite", "inbox.sql", names={"table": "t1"}, quote=d.quote)[
        "peek"
    ].endswith("FROM `t1` WHERE k = :key")


def test_mysql_batched_renewal_uses_numbered_parameters() -> None:
    q = load_queries("ns")
    sql, args = renew_statement(q["renew"], [("aa", "o1", 1.0), ("bb", "o2", 1.0)])
    assert "{" not in sql
    assert "UNHEX(%(h0)s), UNHEX(%(h1)s)" in sql
    assert "(UNHEX(%(h0)s), %(o0)s), (UNHEX(%(h1)s), %(o1)s)" in sql
    assert "INTERVAL %(ttl_us)s MICROSECOND" in sql
    assert args == {"h0": "aa", "o0": "o1", "h1": "bb", "o1": "o2", "ttl_us": 1_000_000}
    sql, args = renew_statement(q["renew"], [("aa", "o1", 1.0), ("bb", "o2", 2.0)])
    assert "WHEN name_hash = UNHEX(%(h1)s) AND owner = %(o1)s THEN %(t1)s" in sql
    assert args["t0"] == 1_000_000 and args["t1"] == 2_000_000
    sql, args = held_statement(q["held"], ["aa", "bb", "cc"])
    assert "IN (UNHEX(%(h0)s), UNHEX(%(h1)s), UNHEX(%(h2)s))" in sql
    assert args == {"h0": "aa", "h1": "bb", "h2": "cc"}


# -- Lua ------------------------------------------------------------------------------------


def test_lua_scripts_load_with_their_library_first() -> None:
    package = "jobfence.backends.redis"
    lib = files(package).joinpath("lua/lock_lib.lua").read_text(encoding="utf-8")
    body = files(package).joinpath("lua/lock_acquire.lua").read_text(encoding="utf-8")
    assert load_lua(package, "lock_lib.lua", "lock_acquire.lua") == lib + "\n" + body
    assert load_lua(package, "inbox_claim.lua").startswith("--")


def _lua_functions(script: str) -> list[str]:
    return re.findall(r"^local function (\w+)\(", script, re.MULTILINE)


def test_a_lua_script_gets_only_the_library_functions_it_calls() -> None:
    """``needed_only``: the functions the script calls, and those they call, in the
    libraries' order (each is defined before its callers); none it never runs."""
    script = load_lua(
        "jobfence.backends.redis",
        "lock_lib.lua",
        "inbox_lib.lua",
        "guard_complete.lua",
        needed_only=True,
    )
    names = _lua_functions(script)
    assert {"release", "release_held", "hand_off", "split_lease", "store", "ms_of"} <= set(names)
    assert not {"acquire", "claim", "complete", "tidy", "held_by", "clock_ms"} & set(names)
    assert names.index("hand_off") < names.index("release_held") < names.index("release")
    claim = load_lua(
        "jobfence.backends.redis", "inbox_lib.lua", "inbox_claim.lua", needed_only=True
    )
    assert _lua_functions(claim) == ["clock_ms", "claim"]


def test_a_lua_library_with_top_level_code_is_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "jf_lua_fixture"
    (package / "lua").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    lib = "local LIMIT = 3\n\nlocal function a()\n  return LIMIT\nend\n\nlocal function b()\nend\n"
    (package / "lua" / "lib.lua").write_text(lib)
    (package / "lua" / "shaken.lua").write_text("-- b() is not called\nlocal function c()\nend\n")
    (package / "lua" / "main.lua").write_text("return a()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_lua("jf_lua_fixture", "lib.lua", "main.lua", needed_only=True) == (
        lib + "\nreturn a()\n"
    )
    # a library of functions only gives what is called; a comment is not a call
    assert (
        _lua_functions(load_lua("jf_lua_fixture", "shaken.lua", "main.lua", needed_only=True)) == []
    )


def test_the_postgres_batch_claim_takes_keys_by_the_single_claims_rules() -> None:
    """``claim_many`` repeats ``claim``'s upsert for many rows: their ON CONFLICT clauses
    (which keys are taken, and how a takeover counts attempts and keeps fingerprints) must
    not drift apart."""
    from jobfence.backends.postgres.dialect import DIALECT

    queries = DIALECT.inbox_queries("t", style="named")

    def on_conflict(section: str) -> str:
        sql = queries[section]
        clause = sql[sql.index("ON CONFLICT") : sql.index("RETURNING")]
        return " ".join(clause.split())

    assert on_conflict("claim_many") == on_conflict("claim")
