"""The sync conformance specs are generated from the async ones (tools/conformance_twins.py):
they must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_specs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "conformance_twins.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
