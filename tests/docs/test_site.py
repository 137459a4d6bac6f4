"""The documentation site builds in strict mode, and no file cites a page that is not there."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import test_reference as reference
from .blocks import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site built in strict mode, and the build's output."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return out, output


def test_the_site_builds_strict_without_warnings(site: tuple[Path, str]) -> None:
    tmp_path, output = site
    assert "WARNING" not in output, output
    # the API and CLI references were generated, not left as directives
    api = (tmp_path / "reference" / "api" / "locks" / "index.html").read_text(encoding="utf-8")
    assert 'id="jobfence.locks.Locks"' in api
    assert ":func:`" not in api and ":::" not in api
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "jobfence worker" in cli and "--concurrency" in cli


def _api_pages(site_dir: Path) -> dict[str, str]:
    return {
        path.relative_to(site_dir).as_posix(): path.read_text(encoding="utf-8")
        for path in (site_dir / "reference" / "api").rglob("index.html")
    }


def _entry_ids(module: str, name: str, obj: object) -> set[str]:
    """The ids an entry for ``module.name`` may have: where it is exported, where it is
    defined (a module's own name for a module)."""
    ids = {f"{module}.{name}"}
    if inspect.ismodule(obj):
        ids.add(obj.__name__)
    elif inspect.isclass(obj) or inspect.isfunction(obj):
        ids.add(f"{obj.__module__}.{obj.__qualname__}")
    return ids


def _reexported(obj: object, ids: set[str]) -> bool:
    """Whether one of ``ids`` is ``obj`` under a module that re-exports it (``Lease`` is
    defined in ``jobfence.lease`` and documented as ``jobfence.locks.Lease``)."""
    for entry in ids:
        module, _, name = entry.rpartition(".")
        if module in sys.modules and getattr(sys.modules[module], name, None) is obj:
            return True
    return False


def test_every_public_name_has_an_entry_in_the_api_reference(site: tuple[Path, str]) -> None:
    ids: set[str] = set()
    for text in _api_pages(site[0]).values():
        ids |= set(re.findall(r'id="(jobfence[\w.]*)"', text))
    missing = [
        f"{module.__name__}.{name}"
        for module in reference.modules()
        for name, obj in reference.public(module)
        if not _entry_ids(module.__name__, name, obj) & ids and not _reexported(obj, ids)
    ]
    assert not missing, f"public names with no entry in docs/reference/api: {missing}"


def test_api_reference_renders_code_and_parameters(site: tuple[Path, str]) -> None:
    pages = _api_pages(site[0])
    # reST directives have no Markdown rendering: they would show as text
    raw = [page for page, text in pages.items() if "code-block::" in text]
    assert not raw, f"literal reST code-block directives on {raw}"
    guard = pages["reference/api/guard/index.html"]
    entry = guard[guard.index('id="jobfence.guard.guarded"') :]
    next_entry = entry.find('class="doc doc-heading"', 100)
    entry = entry if next_entry == -1 else entry[:next_entry]
    # the signature one parameter per line, and a parameters table explaining each
    signature = entry[entry.index('class="doc-signature') :]
    signature = signature[: signature.index("</code>")]
    assert signature.count("\n") >= 10, signature
    table = entry[entry.index("Parameters:") :]
    for name in ("locks", "inbox", "lock", "key", "ttl", "timeout", "claim_ttl", "retry"):
        assert f"<code>{name}</code>" in table, name


#: a Markdown link or image with a relative target: [text](target) / ![alt](target)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#", 1)[0] for t in LINK.findall(text) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


#: a docs page cited by path in code, comments, docstrings, SQL files or docs
CITED = re.compile(r"(?<![\w/.-])docs/[\w/.-]+\.md\b")


def test_every_cited_docs_page_exists() -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    missing = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".sql", ".toml", ".yml", ".sh", ".txt"}:
            continue
        if not path.is_file():
            continue
        for cited in CITED.findall(path.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / cited).is_file():
                missing.append(f"{name}: {cited}")
    assert not missing, "files cite docs pages that do not exist:\n" + "\n".join(missing)
