"""The documentation site builds in strict mode, and no file cites a page that is not there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .blocks import ROOT


def test_the_site_builds_strict_without_warnings(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    # the API and CLI references were generated, not left as directives
    api = (tmp_path / "reference" / "api" / "locks" / "index.html").read_text(encoding="utf-8")
    assert 'id="jobfence.locks.Locks"' in api
    assert ":func:`" not in api and ":::" not in api
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "jobfence worker" in cli and "--concurrency" in cli


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
