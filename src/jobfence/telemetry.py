"""OpenTelemetry metrics and spans for jobfence.

jobfence reports what its locks, inbox, retries, fencing and workers do through the
OpenTelemetry *API* only (the optional ``otel`` extra: ``pip install jobfence[otel]``). Without
``opentelemetry-api`` installed every call here is a no-op; with it installed but no SDK
configured, the API's own no-op (proxy) instruments are used, so the cost on the hot lock path
is one attribute check and one function call per event. Once an application installs an SDK
``MeterProvider`` / ``TracerProvider`` (globally, or for jobfence only with :func:`configure`),
the instruments below report to it.

Metrics (the lock name is never a metric attribute: it would make one series per name; a
schedule's name is, as schedules are few and declared in code):

======================================  ===========  ======  ==============================
name                                    type         unit    attributes
======================================  ===========  ======  ==============================
``jobfence.lock.wait``                  histogram    s       backend, outcome (acquired/timeout)
``jobfence.lock.hold``                  histogram    s       backend
``jobfence.lock.renewals``              counter      1       backend, outcome (ok/failed)
``jobfence.lock.lost``                  counter      1       backend
``jobfence.inbox.claims``               counter      1       backend, outcome (new/duplicate/
                                                             in_progress/mismatch)
``jobfence.inbox.renewals``             counter      1       backend, outcome (ok/failed)
``jobfence.inbox.lost``                 counter      1       backend
``jobfence.queue.renewals``             counter      1       backend, outcome (ok/failed)
``jobfence.queue.lost``                 counter      1       backend
``jobfence.retries``                    counter      1       cause (conflict/transient/
                                                             commit_unknown)
``jobfence.fence.rejections``           counter      1       backend
``jobfence.worker.messages``            counter      1       backend, outcome (processed/
                                                             duplicate/retried/deferred/
                                                             dead_lettered)
``jobfence.schedule.fires``             counter      1       schedule
``jobfence.schedule.misses``            counter      1       schedule
``jobfence.schedule.skips``             counter      1       schedule
``jobfence.schedule.lag``               histogram    s       schedule
``jobfence.outbox.added``               counter      1       backend, queue
``jobfence.http.idempotency``           counter      1       outcome (new/replayed/conflict/
                                                             mismatch/invalid)
``jobfence.outbox.published``           counter      1       backend, queue
``jobfence.outbox.failed``              counter      1       backend, queue
``jobfence.outbox.dead``                counter      1       backend, queue
``jobfence.outbox.lag``                 histogram    s       backend, queue
======================================  ===========  ======  ==============================

Spans: ``jobfence.guarded`` around every call of a :func:`jobfence.guarded` function, with
``jobfence.function``, ``jobfence.lock.name``, ``jobfence.lock.token`` and ``jobfence.key`` as
they become known; an exception sets the span's status to error and is recorded on it.

The log records jobfence emits for these events (a lost lease, a failed renewal, a retry)
carry the same fields as ``extra`` attributes (``jobfence.lock.name``, ``jobfence.lock.token``,
``jobfence.backend``, ``jobfence.cause``), so a structured log handler sees them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ._core.clock import get_clock

__all__ = ["INSTRUMENTATION_NAME", "METRICS", "configure", "enabled"]

#: the instrumentation scope name of jobfence's meter and tracer
INSTRUMENTATION_NAME = "jobfence"

#: what a renewer renews: the families of the ``jobfence.<family>.renewals`` / ``.lost`` metrics
FAMILIES = ("lock", "inbox", "queue")

#: every metric jobfence reports: name -> (instrument type, unit, description)
METRICS: dict[str, tuple[str, str, str]] = {
    "jobfence.lock.wait": (
        "histogram",
        "s",
        "Time an acquire took, from the call to the grant or the timeout",
    ),
    "jobfence.lock.hold": (
        "histogram",
        "s",
        "Time a lease was held, from its grant to its release",
    ),
    "jobfence.lock.renewals": ("counter", "1", "Lease renewals by the renewer, by outcome"),
    "jobfence.lock.lost": ("counter", "1", "Leases found lost while held"),
    "jobfence.inbox.claims": ("counter", "1", "Inbox claims, by outcome"),
    "jobfence.inbox.renewals": ("counter", "1", "Claim renewals by the renewer, by outcome"),
    "jobfence.inbox.lost": ("counter", "1", "Claims found lost while held"),
    "jobfence.queue.renewals": (
        "counter",
        "1",
        "Renewals of received messages' visibility, by outcome",
    ),
    "jobfence.queue.lost": ("counter", "1", "Received messages found lost while handled"),
    "jobfence.retries": ("counter", "1", "Whole-unit retries by retry_unit, by cause"),
    "jobfence.fence.rejections": ("counter", "1", "Writes refused for a stale fencing token"),
    "jobfence.worker.messages": ("counter", "1", "Messages a Worker finished, by outcome"),
    "jobfence.schedule.fires": ("counter", "1", "Schedule slots whose target was started"),
    "jobfence.schedule.misses": ("counter", "1", "Schedule slots recorded missed (misfires)"),
    "jobfence.schedule.skips": (
        "counter",
        "1",
        "Schedule slots recorded skipped (paused, or overlap='skip')",
    ),
    "jobfence.schedule.lag": (
        "histogram",
        "s",
        "Time from a schedule slot's due time to the start of its target",
    ),
    "jobfence.outbox.added": (
        "counter",
        "1",
        "Rows added to an outbox in the caller's transaction (counted when the statement ran)",
    ),
    "jobfence.http.idempotency": (
        "counter",
        "1",
        "HTTP requests carrying an Idempotency-Key (or missing a required one), by outcome",
    ),
    "jobfence.outbox.published": ("counter", "1", "Outbox rows a relay published"),
    "jobfence.outbox.failed": (
        "counter",
        "1",
        "Failed publishes of outbox rows that were left for a retry",
    ),
    "jobfence.outbox.dead": ("counter", "1", "Outbox rows given up after max_attempts"),
    "jobfence.outbox.lag": (
        "histogram",
        "s",
        "Time from an outbox row's created_at to its publish",
    ),
}


class _NoSpan:
    """Stands in for a span when ``opentelemetry-api`` is not installed."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


class _Instruments:
    """The meter's instruments and the tracer, or nothing (``on`` false) without the API."""

    def __init__(self, meter_provider: Any = None, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError:
            self.on = False
            return
        self.on = True
        if meter_provider is None:
            meter = metrics.get_meter(INSTRUMENTATION_NAME)
        else:
            meter = meter_provider.get_meter(INSTRUMENTATION_NAME)
        #: the API's no-op tracer type: with no SDK set, a span is skipped altogether
        self.noop_tracer: type = trace.NoOpTracer
        if tracer_provider is None:
            self.tracer = trace.get_tracer(INSTRUMENTATION_NAME)
        else:
            self.tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME)
        made: dict[str, Any] = {}
        for name, (kind, unit, description) in METRICS.items():
            create = meter.create_histogram if kind == "histogram" else meter.create_counter
            made[name] = create(name, unit=unit, description=description)
        self.lock_wait = made["jobfence.lock.wait"]
        self.lock_hold = made["jobfence.lock.hold"]
        #: by family (lock, inbox, queue)
        self.renewals = {f: made[f"jobfence.{f}.renewals"] for f in FAMILIES}
        self.lost = {f: made[f"jobfence.{f}.lost"] for f in FAMILIES}
        self.inbox_claims = made["jobfence.inbox.claims"]
        self.retries = made["jobfence.retries"]
        self.fence_rejections = made["jobfence.fence.rejections"]
        self.worker_messages = made["jobfence.worker.messages"]
        self.schedule_fires = made["jobfence.schedule.fires"]
        self.schedule_misses = made["jobfence.schedule.misses"]
        self.schedule_skips = made["jobfence.schedule.skips"]
        self.schedule_lag = made["jobfence.schedule.lag"]
        self.outbox_added = made["jobfence.outbox.added"]
        self.http_idempotency = made["jobfence.http.idempotency"]
        self.outbox_published = made["jobfence.outbox.published"]
        self.outbox_failed = made["jobfence.outbox.failed"]
        self.outbox_dead = made["jobfence.outbox.dead"]
        self.outbox_lag = made["jobfence.outbox.lag"]
        #: With the global providers and no SDK installed yet, the API hands out proxy
        #: instruments that drop every measurement until an SDK is set (then they forward to
        #: it). The lock cycle checks this one's backing instrument to skip even reading the
        #: clock while nothing would be recorded; a real instrument has no such attribute.
        self.probe = self.lock_wait

    def live(self) -> bool:
        """Whether a measurement would be recorded now."""
        return self.on and getattr(self.probe, "_real_instrument", self) is not None


_mutex = threading.Lock()
_inst: _Instruments | None = None


def _load() -> _Instruments:
    global _inst
    with _mutex:
        if _inst is None:
            _inst = _Instruments()
        return _inst


def configure(*, meter_provider: Any = None, tracer_provider: Any = None) -> None:
    """Report jobfence's metrics to ``meter_provider`` and its spans to ``tracer_provider``.

    ``None`` (the default) means OpenTelemetry's global providers, which is what an
    application that installs its SDK globally wants: it need not call this at all. Passing a
    provider lets jobfence report to one of its own without replacing the global one (tests,
    or a process that keeps jobfence's telemetry apart); ``configure()`` goes back to the
    global providers. Instruments are created anew on the next event.
    Raises :class:`~jobfence.ConfigurationError` if a provider lacks ``get_meter`` /
    ``get_tracer``.
    """
    from .errors import ConfigurationError

    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise ConfigurationError(
            f"meter_provider must be an OpenTelemetry MeterProvider or None, got "
            f"{meter_provider!r}",
            argument="meter_provider",
        )
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise ConfigurationError(
            f"tracer_provider must be an OpenTelemetry TracerProvider or None, got "
            f"{tracer_provider!r}",
            argument="tracer_provider",
        )
    global _inst
    with _mutex:
        if meter_provider is None and tracer_provider is None:
            _inst = None  # created from the global providers on the next event
        else:
            _inst = _Instruments(meter_provider, tracer_provider)


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is installed (else jobfence reports nothing)."""
    return (_inst or _load()).on


# -- the calls at jobfence's seams (internal) --------------------------------------------------


def lock_wait(backend: str, began: float, acquired: bool, *, limit: int | None = None) -> None:
    """An acquire called at ``began`` (``get_clock().monotonic()``) got its answer now;
    ``limit``: an acquire under a concurrency limit of that many (an attribute ``limit``)."""
    i = _inst or _load()
    if i.live():
        outcome = "acquired" if acquired else "timeout"
        seconds = get_clock().monotonic() - began
        attributes: dict[str, Any] = {"backend": backend, "outcome": outcome}
        if limit is not None:
            attributes["limit"] = limit
        i.lock_wait.record(seconds, attributes)


def lock_hold(backend: str, granted: float) -> None:
    """A lease granted at ``granted`` (``get_clock().monotonic()``) was released now."""
    i = _inst or _load()
    if i.live():
        i.lock_hold.record(get_clock().monotonic() - granted, {"backend": backend})


def renewals(family: str, backend: str, ok: int, failed: int) -> None:
    """A renewer's batch for ``family`` (lock, inbox, queue) renewed ``ok`` items and failed
    ``failed``."""
    i = _inst or _load()
    if i.on:
        counter = i.renewals[family]
        if ok:
            counter.add(ok, {"backend": backend, "outcome": "ok"})
        if failed:
            counter.add(failed, {"backend": backend, "outcome": "failed"})


def lost(family: str, backend: str) -> None:
    """A lease, claim or received message (``family``) was found lost while held."""
    i = _inst or _load()
    if i.on:
        i.lost[family].add(1, {"backend": backend})


def inbox_claim(backend: str, outcome: str) -> None:
    i = _inst or _load()
    if i.on:
        i.inbox_claims.add(1, {"backend": backend, "outcome": outcome})


def outbox_added(backend: str, queue: str, n: int) -> None:
    """``n`` rows for ``queue`` were added to an outbox (in a transaction that may still roll
    back)."""
    i = _inst or _load()
    if i.on and n:
        i.outbox_added.add(n, {"backend": backend, "queue": queue})


def http_idempotency(outcome: str) -> None:
    """A request with an Idempotency-Key was answered: ``outcome`` is ``new`` (the view ran),
    ``replayed``, ``conflict`` (in flight: 409), ``mismatch`` (key reuse: 422) or ``invalid``
    (a bad, missing or duplicated key, or a body over ``max_body``)."""
    i = _inst or _load()
    if i.on:
        i.http_idempotency.add(1, {"outcome": outcome})


def retry(cause: str) -> None:
    i = _inst or _load()
    if i.on:
        i.retries.add(1, {"cause": cause})


def fence_rejection(backend: str) -> None:
    i = _inst or _load()
    if i.on:
        i.fence_rejections.add(1, {"backend": backend})


def worker_message(backend: str, outcome: str) -> None:
    i = _inst or _load()
    if i.on:
        i.worker_messages.add(1, {"backend": backend, "outcome": outcome})


def schedule_fire(schedule: str, lag: float) -> None:
    """A slot of ``schedule`` fired (its target started) ``lag`` seconds after it was due."""
    i = _inst or _load()
    if i.on:
        attributes = {"schedule": schedule}
        i.schedule_fires.add(1, attributes)
        i.schedule_lag.record(lag, attributes)


def schedule_miss(schedule: str) -> None:
    """A slot of ``schedule`` was recorded missed (a misfire its policy did not fire)."""
    i = _inst or _load()
    if i.on:
        i.schedule_misses.add(1, {"schedule": schedule})


def schedule_skip(schedule: str) -> None:
    """A slot of ``schedule`` was recorded skipped (paused, or its previous fire ran on)."""
    i = _inst or _load()
    if i.on:
        i.schedule_skips.add(1, {"schedule": schedule})


def outbox_published(backend: str, queue: str, lags: list[float]) -> None:
    """A relay published ``len(lags)`` rows of ``queue`` from an outbox on ``backend``;
    ``lags``: each row's seconds from its ``created_at`` to the publish."""
    i = _inst or _load()
    if i.on and lags:
        attributes = {"backend": backend, "queue": queue}
        i.outbox_published.add(len(lags), attributes)
        for lag in lags:
            i.outbox_lag.record(lag, attributes)


def outbox_failed(backend: str, queue: str) -> None:
    """A publish of a row of ``queue`` failed; the row is retried later."""
    i = _inst or _load()
    if i.on:
        i.outbox_failed.add(1, {"backend": backend, "queue": queue})


def outbox_dead(backend: str, queue: str) -> None:
    """A row of ``queue`` failed ``max_attempts`` times: it is dead."""
    i = _inst or _load()
    if i.on:
        i.outbox_dead.add(1, {"backend": backend, "queue": queue})


#: what :func:`span` yields when no span is made (its ``set_attribute`` does nothing)
NO_SPAN: Any = _NO_SPAN


def spans() -> bool:
    """Whether :func:`span` would make a span now (an SDK's tracer is set). A caller on a hot
    path runs its block with :data:`NO_SPAN` when it would not, without the context manager."""
    i = _inst or _load()
    if not i.on:
        return False
    return not isinstance(getattr(i.tracer, "_tracer", i.tracer), i.noop_tracer)


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span around a block (current while it runs); error status on an exception."""
    i = _inst or _load()
    if not i.on:
        yield _NO_SPAN
        return
    # the global proxy tracer resolves to the SDK's once one is set, else to the no-op one,
    # whose span costs a context switch and two context managers for nothing
    tracer = getattr(i.tracer, "_tracer", i.tracer)
    if isinstance(tracer, i.noop_tracer):
        yield _NO_SPAN
        return
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current
