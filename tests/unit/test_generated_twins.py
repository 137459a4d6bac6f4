"""The sync modules are generated from the async ones by tools/async_to_sync.py; they must be
current, and the generator must refuse inputs it would get wrong."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "async_to_sync", ROOT / "tools" / "async_to_sync.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def convert(source: str, **kwargs: object) -> str:
    return gen.convert(textwrap.dedent(source), "x_async.py", **kwargs)


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


SOURCE = textwrap.dedent(
    '''\
    """Widgets."""

    from ._core.flavour import ASYNC

    __all__ = ["AsyncWidget"]


    async def aclose_all() -> None:
        pass
    '''
)


def run(package: Path, capsys: pytest.CaptureFixture[str], **kwargs: object) -> tuple[int, str]:
    options: dict[str, object] = {
        "package": package,
        "twins": {"widget_async.py": "widget.py"},
        "hand_written": (),
        "renames": {"aclose_all": "close_all"},
        "dotted": (),
    }
    options.update(kwargs)
    code = gen.run(**options)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# -- the repository --------------------------------------------------------------------------
def test_generated_sync_twins_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_async_source_is_listed() -> None:
    package = ROOT / "src" / "jobfence"
    assert gen.input_problems(package, gen.TWINS, gen.HAND_WRITTEN) == []
    assert len(gen.TWINS) == len(list(package.rglob("*_async.py")))


# -- rewriting -------------------------------------------------------------------------------
def test_converter_rewrites_the_async_spellings() -> None:
    out = convert(
        """\
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from collections.abc import Awaitable, Callable

        from ._core.flavour import ASYNC
        from .base_async import AsyncThing


        class AsyncWidget(AsyncThing):
            async def go(self, call: Callable[[], Awaitable[AsyncThing]]) -> None:
                async with self.x:
                    await self.y(Redis, Retry, open_backend(asynchronous=True))
                async for item in self.z:
                    await item.aclose()

            async def __aenter__(self) -> AsyncWidget:
                return self
        """
    )
    assert "class Widget(Thing):" in out
    assert "def go(self, call: Callable[[], Thing]) -> None:" in out
    assert "        with self.x:" in out and "        for item in self.z:" in out
    assert "self.y(Redis, Retry, open_backend(asynchronous=False))" in out
    assert "item.close()" in out and "def __enter__(self) -> Widget:" in out
    assert "from redis import Redis" in out and "from redis.retry import Retry" in out
    assert "from .base import Thing" in out
    body = out.split("\n", 2)[2]  # after the two header lines
    assert "await" not in body and "async " not in body and "ASYNC" not in body
    assert out.startswith("# Generated from x_async.py by tools/async_to_sync.py")


def test_sync_branch_is_kept_dedented_and_async_branch_dropped() -> None:
    out = convert(
        """\
        from ._core.flavour import ASYNC

        if ASYNC:
            import asyncio
        else:
            import threading


        def go() -> None:
            if ASYNC:
                asyncio.sleep(0)
                print("async")
            else:
                # sync: a thread
                for _ in range(2):
                    threading.Event().wait(0)
            print("both")
        """
    )
    assert "asyncio" not in out and '"async"' not in out
    assert "\nimport threading\n" in out
    kept = "    # sync: a thread\n    for _ in range(2):\n        threading.Event().wait(0)\n"
    assert kept in out
    assert '    print("both")' in out


def test_if_not_async_and_async_and_condition() -> None:
    out = convert(
        """\
        from ._core.flavour import ASYNC


        def go(x: int) -> int:
            if not ASYNC:
                x += 1  # sync only
            if ASYNC and x > 3:
                x = 0
            if ASYNC and x > 5:
                x = 1
            else:
                x += 2
            if ASYNC:
                x = 4
            return x


        def nothing_else() -> None:
            if ASYNC:
                print("only async")
            if ASYNC and True:
                print("only async")
        """
    )
    assert "    x += 1  # sync only\n" in out
    assert "x = 0" not in out and "x = 1\n" not in out and "x = 4" not in out
    assert "    x += 2\n    return x\n" in out
    assert "def nothing_else() -> None:\n    pass\n" in out


def test_docstrings_comments_and_strings_are_left_alone() -> None:
    out = convert(
        '''\
        """``AsyncLocks`` / ``Locks``: in ``async with`` the body is cancelled."""


        class AsyncLocks:
            """A client; ``await AsyncLocks().close()`` closes it (aclose)."""

            def name(self) -> str:
                # AsyncLocks, asyncio, aiosqlite
                return "an AsyncLocks client via aiosqlite"
        '''
    )
    assert '"""``AsyncLocks`` / ``Locks``: in ``async with`` the body is cancelled."""' in out
    assert '"""A client; ``await AsyncLocks().close()`` closes it (aclose)."""' in out
    assert "# AsyncLocks, asyncio, aiosqlite" in out
    assert '"an AsyncLocks client via aiosqlite"' in out
    assert "class Locks:" in out


def test_strings_that_are_one_name_are_renamed() -> None:
    out = convert(
        """\
        __all__ = ["DEFAULT", "AsyncLease", "AsyncLocks", "fence_async", 'aclose']
        DEFAULT = getattr(object, "AsyncLease", "Async lease")
        """,
        renames={"aclose": "close"},
    )
    assert '__all__ = ["DEFAULT", "Lease", "Locks", "fence", "close"]' in out
    assert 'getattr(object, "Lease", "Async lease")' in out


def test_refuses_what_it_would_get_wrong() -> None:
    with pytest.raises(gen.GeneratorError, match="comment marker"):
        convert("import asyncio  # async-only\n")
    with pytest.raises(gen.GeneratorError, match="inside an f-string"):
        convert('x = f"{AsyncLease.__name__}"\n')
    with pytest.raises(gen.GeneratorError, match="may only start the test"):
        convert("from ._core.flavour import ASYNC\n\nx = 1 if ASYNC else 2\n")
    with pytest.raises(gen.GeneratorError, match="no `elif`"):
        convert("if ASYNC:\n    x = 1\nelif y:\n    x = 2\n")
    with pytest.raises(gen.GeneratorError, match="inside another"):
        convert("if ASYNC:\n    if not ASYNC:\n        x = 1\n")
    with pytest.raises(gen.GeneratorError, match="line of its own"):
        convert("from ._core.flavour import ASYNC, other\n")


def test_a_name_left_with_an_async_spelling_is_refused() -> None:
    for source in ("import asyncio\n", "x = y.__aiter__()\n", "import aiofiles\n"):
        with pytest.raises(gen.GeneratorError, match="would stay in the sync twin"):
            convert(source)
    assert "asynchronous=False" in convert("f(asynchronous=False)\n")  # listed in KEEP


# -- inputs ----------------------------------------------------------------------------------
def test_listed_source_is_generated_and_check_fails_when_out_of_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, {"widget_async.py": SOURCE})
    assert run(tmp_path, capsys, check=True)[0] == 1  # not generated yet
    code, out = run(tmp_path, capsys)
    assert code == 0 and "wrote" in out
    twin = (tmp_path / "widget.py").read_text(encoding="utf-8")
    assert '__all__ = ["Widget"]' in twin and "def close_all() -> None:" in twin
    assert run(tmp_path, capsys, check=True) == (0, "")
    write(tmp_path, {"widget_async.py": SOURCE + "\n\nX = 1\n"})
    code, out = run(tmp_path, capsys, check=True)
    assert code == 1 and "out of date" in out and "widget.py" in out


def test_unused_rule_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, {"widget_async.py": SOURCE})
    code, out = run(tmp_path, capsys, renames={"aclose_all": "close_all", "aiter": "iter"})
    assert code == 1 and "rules no input uses" in out and "aiter" in out
    assert "aclose_all" not in out.split("uses")[1]
    code, out = run(tmp_path, capsys, dotted=("redis.asyncio",))
    assert code == 1 and "redis.asyncio" in out
    assert not (tmp_path / "widget.py").exists()  # nothing is written when a rule is dead


def test_unlisted_source_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, {"widget_async.py": SOURCE, "sub/extra_async.py": "X = 1\n"})
    code, out = run(tmp_path, capsys)
    assert code == 1 and "sub/extra_async.py: not listed in TWINS" in out
    assert run(tmp_path, capsys, hand_written=("sub/extra_async.py",))[0] == 0


def test_missing_listed_source_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, {"widget_async.py": SOURCE})
    twins = {"widget_async.py": "widget.py", "gone_async.py": "gone.py"}
    code, out = run(tmp_path, capsys, twins=twins)
    assert code == 1 and "gone_async.py: listed in TWINS but missing" in out


def test_stale_generated_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = gen.HEADER.format(src="old_async.py")
    write(tmp_path, {"widget_async.py": SOURCE, "old.py": header + "X = 1\n"})
    code, out = run(tmp_path, capsys)
    assert code == 1 and "old.py: a generated file that no TWINS entry produces" in out


def test_other_ruff_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen.installed_ruff() == gen.pinned_ruff()
    gen.require_pinned_ruff.cache_clear()
    monkeypatch.setattr(gen, "installed_ruff", lambda: "0.0.1")
    try:
        with pytest.raises(gen.GeneratorError) as info:
            convert("X = 1\n")
        assert f"pip install ruff=={gen.pinned_ruff()}" in str(info.value)
        assert "ruff 0.0.1" in str(info.value)
    finally:
        gen.require_pinned_ruff.cache_clear()


# -- a flavour branch in the package ---------------------------------------------------------
async def test_each_flavour_keeps_its_own_message() -> None:
    import sqlite3

    import aiosqlite

    from jobfence import SchemaMissing, fencing, fencing_async

    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(SchemaMissing, match=r"run jobfence\.fencing\.install\(conn\) once"):
            fencing.fence(conn, "r", 1)
    finally:
        conn.close()
    async with aiosqlite.connect(":memory:") as aconn:
        with pytest.raises(
            SchemaMissing, match=r"run await jobfence\.fencing_async\.install_async\(conn\) once"
        ):
            await fencing_async.fence_async(aconn, "r", 1)
