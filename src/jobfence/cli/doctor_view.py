"""The Rich output of ``jobfence doctor``: a summary table of the backends, then each
backend's findings (level, check, what was found, what to do)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from ..doctor import Report
from ._common import console

_STYLE = {"ok": "green", "warning": "yellow", "error": "red"}


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} ms"


def _offset(report: Report) -> str:
    bound = "" if report.max_skew is None else f" (max {report.max_skew:g} s)"
    if report.clock_offset_ms is None:
        return "unknown" + bound
    return f"{report.clock_offset_ms:+.1f} ms{bound}"


def _probe(report: Report) -> Text:
    if report.probe is None:
        return Text("-")
    if report.probe.ok:
        return Text("ok", style="green")
    return Text("failed", style="red")


def render(reports: Sequence[Report]) -> None:
    out = console()
    summary = Table(title="jobfence doctor")
    for column in ("backend", "status", "version", "round trip", "clock offset", "probe", "token"):
        summary.add_column(column)
    for report in reports:
        summary.add_row(
            Text(report.url),
            Text(report.level, style=_STYLE[report.level]),
            Text(report.server_version or "?"),
            _ms(report.rtt_ms),
            _offset(report),
            _probe(report),
            "" if report.probe is None or report.probe.token is None else str(report.probe.token),
        )
    out.print(summary)
    for report in reports:
        table = Table(title=f"{report.url} ({report.backend})", show_lines=True)
        table.add_column("level")
        table.add_column("check")
        # long texts wrap (never cut) at a readable width
        table.add_column("found", max_width=100)
        table.add_column("advice", max_width=80)
        for finding in report.findings:
            table.add_row(
                Text(finding.level, style=_STYLE[finding.level]),
                Text(finding.code),
                Text(finding.message),
                Text(finding.advice),
            )
        if report.clock_note:
            table.caption = f"clock: {report.clock_note}"
        out.print(table)
