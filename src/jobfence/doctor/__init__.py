"""A health check of a jobfence backend: what ``jobfence doctor`` prints.

:func:`diagnose` connects to the server of a backend URL and reports its version, the round
trip time, the offset between this host's clock and the server's, the server settings that
break locks, fencing or queues (each a :class:`Finding` with advice), the state of jobfence's
tables or keys, and the result of a probe lease (take, extend, release). The server-specific
part is in each backend's package (``jobfence.backends.<name>.doctor``, found through the
registry: :meth:`~jobfence.backends.BackendInfo.doctor_checks`); ``tables.py`` reads
jobfence's tables the same way on every SQL server.

Nothing is created on the server except what the probe lease creates (the lock tables of the
namespace on SQL backends, and its keys, deleted by its release, on Redis).
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .._core.clock import get_clock
from .._core.url import BackendURL, mask_url
from ..backends import BackendInfo, parse_backend_url, registered
from ..errors import ConfigurationError

__all__ = [
    "CLOCK_OFFSET_WARNING_MS",
    "RTT_WARNING_MS",
    "Finding",
    "Level",
    "Probe",
    "Report",
    "TableStatus",
    "diagnose",
    "unusable",
]

Level = Literal["ok", "warning", "error"]
_RANK = {"ok": 0, "warning": 1, "error": 2}

#: a median round trip above this many milliseconds is a warning (every lock verb pays it)
RTT_WARNING_MS = 50.0
#: a client/server clock offset above this many milliseconds is a warning
CLOCK_OFFSET_WARNING_MS = 1000.0
#: round trips timed for the median
DEFAULT_PINGS = 5


@dataclass(frozen=True)
class Finding:
    """One result of a check: ``level`` (``ok``, ``warning`` or ``error``), a stable ``code``
    (e.g. ``redis-eviction``), what was found (``message``) and what to do (``advice``)."""

    level: Level
    code: str
    message: str
    advice: str = ""


@dataclass
class Probe:
    """The probe lease: taken, extended and released under a random name. ``ok`` when all
    three worked; ``token`` is the fencing token it got; ``elapsed_ms`` the three calls'
    time; ``capabilities`` the lock backend's true capabilities; ``error`` why it failed."""

    ok: bool
    token: int | None = None
    elapsed_ms: float | None = None
    capabilities: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class TableStatus:
    """A table of one jobfence component (``locks``, ``inbox``, ``fences``, ``queue``): whether
    it exists, its schema version where one is recorded, and row counts by state."""

    component: str
    table: str
    installed: bool
    schema_version: int | None = None
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class Report:
    """What :func:`diagnose` found for one URL.

    ``url`` is masked; ``backend`` the URL's scheme family (``redis``, ``postgres``, ...);
    ``rtt_ms`` the median of a few round trips; ``clock_offset_ms`` the server's clock minus
    this host's at the midpoint of the request (``None``: unknown, see ``clock_note``);
    ``keys`` (Redis) the keys under the namespace by kind, ``keys_capped`` when the count
    stopped at its cap. ``max_skew`` is the bound in seconds the offset was held to
    (``None``: none was given, an offset over the warning threshold is a warning),
    ``clock_verdict`` the clock check's level (``ok``, ``warning``, ``error``; ``None`` when
    the offset is unknown and no bound was given).
    """

    url: str
    backend: str
    namespace: str
    server_version: str | None = None
    rtt_ms: float | None = None
    clock_offset_ms: float | None = None
    clock_note: str = ""
    max_skew: float | None = None
    clock_verdict: Level | None = None
    probe: Probe | None = None
    findings: list[Finding] = field(default_factory=list)
    tables: list[TableStatus] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)
    keys_capped: bool = False

    @property
    def level(self) -> Level:
        """The worst level among the findings (``ok`` when there are none)."""
        worst: Level = "ok"
        for finding in self.findings:
            if _RANK[finding.level] > _RANK[worst]:
                worst = finding.level
        return worst

    def add(self, level: Level, code: str, message: str, advice: str = "") -> Finding:
        finding = Finding(level, code, message, advice)
        self.findings.append(finding)
        return finding

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the report, with its ``level``."""
        out = asdict(self)
        out["level"] = self.level
        return out


class Timer:
    """Round trips of one check: :meth:`ping` times ``call`` a few times; :meth:`clock`
    estimates the server's clock offset from ``now`` (the server's time in seconds since the
    epoch), taking the fastest round trip (its midpoint is the tightest estimate)."""

    def __init__(self, pings: int) -> None:
        self.pings = pings

    def ping(self, call: Callable[[], object]) -> float:
        """The median round trip of ``call()`` in milliseconds."""
        times = []
        for _ in range(self.pings):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(times), 3)

    def clock(self, now: Callable[[], float]) -> float:
        """Server clock minus this host's clock (jobfence's clock, ``get_clock().time()``), in
        milliseconds."""
        clock = get_clock()
        best: tuple[float, float] | None = None
        for _ in range(self.pings):
            before = clock.time()
            server = now()
            after = clock.time()
            sample = (after - before, server - (before + after) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        return round(best[1] * 1000, 3)


def _backend(url: BackendURL) -> BackendInfo | None:
    """The registered backend serving the URL's scheme (None: no backend does)."""
    return registered().get(url.scheme)


def _error_text(url: BackendURL, exc: BaseException) -> str:
    return url.redact(f"{type(exc).__name__}: {exc}")


def unusable(url: str, namespace: str, exc: ConfigurationError) -> Report:
    """The report of a ``url`` that :func:`diagnose` refused (it cannot be parsed, or names no
    backend): one ``error`` finding, ``invalid-url``, with the reason (the URL masked)."""
    masked = mask_url(url)
    text = str(exc).replace(url, masked) if url else str(exc)
    report = Report(url=masked, backend="?", namespace=namespace)
    report.add("error", "invalid-url", text, "fix the URL: see the reason")
    return report


def _probe(raw: str, namespace: str) -> Probe:
    """Take, extend and release a lease under a random name (the lock tables of the namespace
    are created by it where they do not exist yet)."""
    from ..errors import JobfenceError
    from ..locks import Locks

    name = f"jobfence-doctor:{uuid.uuid4().hex}"
    try:
        with Locks(raw, namespace=namespace) as locks:
            started = time.perf_counter()
            lease = locks.try_acquire(name, ttl=5, renew=False)
            if lease is None:
                return Probe(ok=False, error=f"probe lock {name!r} unexpectedly held")
            lease.extend()
            released = lease.release()
            elapsed = (time.perf_counter() - started) * 1000
            caps = [k for k, v in vars(locks.capabilities).items() if v is True]
    except JobfenceError as exc:
        return Probe(ok=False, error=str(exc))
    return Probe(
        ok=released,
        token=lease.token,
        elapsed_ms=round(elapsed, 3),
        capabilities=caps,
        error=None if released else "the release of the probe lease failed",
    )


def _clock_check(report: Report, warning_ms: float, reachable: bool) -> None:
    """The clock-offset finding: against ``report.max_skew`` when one is given (over it: an
    error), else against the warning threshold ``warning_ms``."""
    offset = report.clock_offset_ms
    bound = report.max_skew
    if offset is None:
        if bound is not None and reachable:
            report.clock_verdict = "warning"
            report.add(
                "warning",
                "clock-unknown",
                f"the server's clock could not be read: the offset bound of {bound:g} s "
                "was not checked",
                "check the clocks of the hosts another way (chronyc tracking, timedatectl)",
            )
        return
    if bound is not None:
        if abs(offset) > bound * 1000:
            report.clock_verdict = "error"
            report.add(
                "error",
                "clock-offset",
                f"the server's clock is {offset / 1000:+.3f} s from this host's, over the "
                f"bound of {bound:g} s (--max-skew)",
                "what assumes clocks agree within the bound (a scheduler's slots, times your "
                "code compares with the server's) can misbehave: run NTP (chrony, "
                "systemd-timesyncd) on both hosts, or raise the bound",
            )
        else:
            report.clock_verdict = "ok"
            report.add(
                "ok",
                "clock-offset",
                f"clock offset {offset:+.1f} ms, within the bound of {bound:g} s",
            )
        return
    if abs(offset) > warning_ms:
        report.clock_verdict = "warning"
        report.add(
            "warning",
            "clock-offset",
            f"the server's clock is {offset / 1000:+.3f} s from this host's",
            "jobfence times leases by the server's clock, so locks stay correct; but "
            "published_at and dead_at times, logs and any time your code compares with the "
            "server's disagree: run NTP (chrony, systemd-timesyncd) on both hosts",
        )
    else:
        report.clock_verdict = "ok"
        report.add("ok", "clock-offset", f"clock offset {offset:+.1f} ms")


def diagnose(
    url: str,
    *,
    namespace: str = "jobfence",
    pings: int = DEFAULT_PINGS,
    probe: bool = True,
    rtt_warning_ms: float = RTT_WARNING_MS,
    clock_warning_ms: float = CLOCK_OFFSET_WARNING_MS,
    max_skew: float | None = None,
) -> Report:
    """Check the backend at ``url``: server version, round trip, clock offset, dangerous
    settings, jobfence's tables or keys (those of ``namespace``), and (``probe=True``) a probe
    lease. Never raises for a server that is down or refuses a check: that is an ``error`` or
    ``warning`` finding of the report. A URL that cannot be parsed raises
    :class:`~jobfence.errors.ConfigurationError`.

    ``max_skew``: the largest offset in seconds allowed between this host's clock and the
    server's (e.g. the ``max_skew`` a scheduler documents); a larger one is an ``error``
    finding (``clock-offset``), an offset that cannot be measured a ``warning``
    (``clock-unknown``). ``None`` (the default): an offset over ``clock_warning_ms`` is a
    warning. The offset is measured against jobfence's clock (``get_clock().time()``)."""
    parsed = parse_backend_url(url)
    if isinstance(pings, bool) or not isinstance(pings, int) or not 1 <= pings <= 100:
        raise ConfigurationError(
            f"pings must be an int from 1 to 100, got {pings!r}", argument="pings"
        )
    if max_skew is not None and (
        isinstance(max_skew, bool)
        or not isinstance(max_skew, (int, float))
        or not math.isfinite(max_skew)
        or max_skew < 0
    ):
        raise ConfigurationError(
            f"max_skew must be None or a number of seconds >= 0, got {max_skew!r}",
            argument="max_skew",
        )
    info = _backend(parsed)
    report = Report(
        url=parsed.masked,
        backend=info.name if info else parsed.scheme,
        namespace=namespace,
        max_skew=None if max_skew is None else float(max_skew),
    )
    timer = Timer(pings)
    reachable = True
    if info is not None:
        try:
            inspect = info.doctor_checks()
            if inspect is not None:
                inspect(report, parsed, timer)
        except Exception as exc:
            reachable = False
            report.add(
                "error",
                "unreachable",
                f"checking the server failed: {_error_text(parsed, exc)}",
                "check the URL, that the server runs and that this host may connect to it",
            )
    if report.rtt_ms is not None and report.rtt_ms > rtt_warning_ms:
        report.add(
            "warning",
            "high-rtt",
            f"round trip {report.rtt_ms:.1f} ms (over {rtt_warning_ms:.0f} ms)",
            "every lock, inbox and queue call pays at least one round trip: run the workers "
            "near the server, and give leases a ttl of many round trips",
        )
    elif report.rtt_ms is not None:
        report.add("ok", "rtt", f"round trip {report.rtt_ms:.2f} ms")
    _clock_check(report, clock_warning_ms, reachable)
    if probe and reachable and (info is None or "locks" in info.parts):
        report.probe = _probe(url, namespace)
        if report.probe.ok:
            report.add(
                "ok",
                "probe",
                f"probe lease taken, extended and released (token {report.probe.token})",
            )
        else:
            report.add(
                "error",
                "probe",
                f"probe lease failed: {parsed.redact(report.probe.error or '')}",
                "the lock backend does not work with this URL: see the error",
            )
    return report
