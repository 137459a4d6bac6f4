"""In-process checks of ``jobfence doctor``: ``memory://`` has no server (no round trip, and
this host's clock)."""

from __future__ import annotations

from ..._core.url import BackendURL
from ...doctor import Report, Timer


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    report.clock_offset_ms = 0.0
    report.clock_note = "in-process: this host's clock"
    report.add(
        "ok",
        "in-process",
        "memory:// keeps everything in this process",
        "only threads and tasks of one process share it: use a server for several processes",
    )
