"""Handlers for ``test_cli_worker.py``, imported by ``jobfence worker`` in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any


def record(message: Any) -> None:
    """Append ``[id, delivery]`` to $JF_OUT; a body with ``"fail": true`` always raises."""
    with open(os.environ["JF_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps([message.id, message.delivery]) + "\n")
    if message.body.get("fail"):
        raise RuntimeError("this message always fails")


async def slow(message: Any) -> None:
    """Write ``started <id>`` to $JF_OUT, then take ``body["seconds"]`` seconds."""
    with open(os.environ["JF_OUT"], "a", encoding="utf-8") as out:
        out.write(f"started {message.id}\n")
    await asyncio.sleep(message.body["seconds"])
    with open(os.environ["JF_OUT"], "a", encoding="utf-8") as out:
        out.write(f"finished {message.id}\n")


not_callable = 42
