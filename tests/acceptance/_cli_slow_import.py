"""A handler module whose import takes as long as the test wants: it writes ``importing`` to
``$JF_OUT``, then waits until ``$JF_GO`` exists (as a user's module that sets up a framework
at import can take seconds)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

Path(os.environ["JF_OUT"]).write_text("importing\n")
_deadline = time.monotonic() + 60
while not Path(os.environ["JF_GO"]).exists() and time.monotonic() < _deadline:
    time.sleep(0.05)


def handle(message: Any) -> None:
    with Path(os.environ["JF_OUT"]).open("a") as out:
        out.write(f"handled {message.id}\n")
