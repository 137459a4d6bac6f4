"""Relay targets for ``test_cli_outbox.py``, imported by ``jobfence relay --target`` in a
subprocess: callables ``send(rows)`` taking a list of outbox rows."""

from __future__ import annotations

import json
import os
from typing import Any


def record(rows: list[Any]) -> None:
    """Append ``[id, queue, body]`` of each row to $JF_OUT; a row whose body has
    ``"fail": true`` is refused (the whole call raises, so the relay tries the rows one by
    one and only that one fails)."""
    if any(row.value().get("fail") for row in rows):
        raise ValueError("refused by the target: this row always fails")
    with open(os.environ["JF_OUT"], "a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps([row.id, row.queue, row.value()]) + "\n")


not_a_target = 42
