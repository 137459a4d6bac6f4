"""A relay process for the relay's kill, stop and signal tests.

``python -m tests.integration._relay_proc OUTBOX_URL DIR MODE LEASE BATCH`` runs
``jobfence.Relay(OUTBOX_URL, send, lease=LEASE, batch=BATCH, poll=0.05).run()`` in the main
thread (so SIGTERM/SIGINT stop it as they would a deployed relay). ``send(rows)`` appends the
rows' ids to ``DIR/sent`` (one per line, flushed) and then, by ``MODE``:

* ``slow`` -- sleeps 0.2 s after each batch (a relay busy mid-stream);
* ``hang`` -- blocks forever after its first batch (a relay that dies holding rows);
* ``stall`` -- sleeps 2 s after its first batch (a window for the test to SIGSTOP it).

``DIR/owner`` holds the relay's owner id once it starts; ``DIR/stats.json`` its stats once
``run()`` returns.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jobfence


def main() -> None:
    url, directory, mode, lease, batch = sys.argv[1:6]
    work = Path(directory)
    batches = [0]

    def send(rows: list[Any]) -> None:
        with open(work / "sent", "a") as out:
            out.write("".join(f"{row.id}\n" for row in rows))
            out.flush()
        batches[0] += 1
        if mode == "slow":
            time.sleep(0.2)
        elif mode == "hang":
            threading.Event().wait()
        elif mode == "stall" and batches[0] == 1:
            time.sleep(2.0)

    relay = jobfence.Relay(url, send, lease=float(lease), batch=int(batch), poll=0.05)
    (work / "owner").write_text(relay.owner)
    stats = relay.run()
    (work / "stats.json").write_text(json.dumps(dataclasses.asdict(stats)))


if __name__ == "__main__":
    main()
