"""The sync modules are generated from the async ones; they must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_twins_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_converter_rewrites_the_async_spellings() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import async_to_sync
    finally:
        sys.path.pop(0)
    src = (
        "import asyncio  # async-only\n"
        "from redis import asyncio as aioredis\n"
        "from .base_async import AsyncThing\n\n\n"
        "class AsyncWidget(AsyncThing):\n"
        "    async def go(self) -> None:\n"
        "        async with self.x:\n"
        "            await self.y(aioredis)\n"
        "        # begin-async-only\n"
        "        await asyncio.sleep(0)\n"
        "        # end-async-only\n"
        "        # begin-sync-only\n"
        "        # print('sync')\n"
        "        # end-sync-only\n"
    )
    out = async_to_sync.convert(src, "x_async.py")
    assert "class Widget(Thing):" in out
    assert "    def go(self) -> None:" in out and "with self.x:" in out
    assert "self.y(aioredis)" in out and "await" not in out and "asyncio" not in out
    assert "from .base import Thing" in out and "import redis as aioredis" in out
    assert "print('sync')" in out or 'print("sync")' in out
