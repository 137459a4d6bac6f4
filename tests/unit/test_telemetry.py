"""OpenTelemetry metrics and spans (jobfence.telemetry): every metric is provoked for real
(memory:// and SQLite; one test on a real Redis) and read back through the SDK's in-memory
reader and span exporter. jobfence is pointed at test-local providers with
``telemetry.configure`` and pointed back afterwards: no global provider is ever installed."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import jobfence
from jobfence import CommitOutcomeUnknown, ConfigurationError, StaleVersion, retry_unit, telemetry
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)


class Otel:
    """Test-local providers with in-memory export, and readers of what they got."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """The data points of metric ``name`` by their attributes (cumulative)."""
        found: dict[frozenset[tuple[str, Any]], Any] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data is not None else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[frozenset(point.attributes.items())] = point
        return found

    def value(self, name: str, **attributes: str) -> float:
        """A counter's value (a histogram's count) for exactly these attributes; 0 if none."""
        point = self.points(name).get(frozenset(attributes.items()))
        if point is None:
            return 0
        return point.count if hasattr(point, "count") else point.value


@pytest.fixture
def otel() -> Iterator[Otel]:
    global_meters, global_tracers = metrics.get_meter_provider(), trace.get_tracer_provider()
    o = Otel()
    telemetry.configure(meter_provider=o.meters, tracer_provider=o.tracers)
    try:
        yield o
    finally:
        telemetry.configure()
        o.meters.shutdown()
        o.tracers.shutdown()
        # nothing was installed globally
        assert metrics.get_meter_provider() is global_meters
        assert trace.get_tracer_provider() is global_tracers


def _until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


# -- locks ----------------------------------------------------------------------------------


def test_lock_wait_and_hold_with_outcomes_and_no_lock_name(otel: Otel) -> None:
    with jobfence.Locks(_url()) as locks:
        lease = locks.acquire("orders:1", ttl=30, renew=False)
        with pytest.raises(jobfence.LockTimeout):
            locks.acquire("orders:1", ttl=30, timeout=0.05)
        assert locks.try_acquire("orders:1", ttl=30) is None
        lease.release()
        assert locks.try_acquire("orders:2", ttl=30, renew=False) is not None
    assert otel.value("jobfence.lock.wait", backend="memory", outcome="acquired") == 2
    assert otel.value("jobfence.lock.wait", backend="memory", outcome="timeout") == 2
    timeout = otel.points("jobfence.lock.wait")[
        frozenset({"backend": "memory", "outcome": "timeout"}.items())
    ]
    assert timeout.sum >= 0.05  # the timed-out acquire waited its timeout
    # one release (the lease on orders:2 was given back by close(), not released)
    assert otel.value("jobfence.lock.hold", backend="memory") == 1
    for name in ("jobfence.lock.wait", "jobfence.lock.hold"):
        for attributes in otel.points(name):
            assert {key for key, _ in attributes} <= {"backend", "outcome"}


async def test_async_lock_wait_and_hold(otel: Otel) -> None:
    async with jobfence.AsyncLocks(_url()) as locks, locks.acquire("a", ttl=30, renew=False):
        pass
    assert otel.value("jobfence.lock.wait", backend="memory", outcome="acquired") == 1
    assert otel.value("jobfence.lock.hold", backend="memory") == 1


def test_renewals_then_a_lost_lease_with_its_log_fields(
    otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    with jobfence.Locks(_url()) as locks, caplog.at_level(logging.WARNING, "jobfence"):
        lease = locks.acquire("report", ttl=0.6)
        _until(lambda: otel.value("jobfence.lock.renewals", backend="memory", outcome="ok") >= 1)
        assert otel.value("jobfence.lock.lost", backend="memory") == 0
        assert locks.force_release("report")  # taken away: the next renewal finds it gone
        _until(lambda: lease.lost)
        assert otel.value("jobfence.lock.renewals", backend="memory", outcome="failed") == 1
        assert otel.value("jobfence.lock.lost", backend="memory") == 1
        lease.release()
    record = next(r for r in caplog.records if "lost" in r.getMessage())
    assert getattr(record, "jobfence.lock.name") == "report"
    assert getattr(record, "jobfence.lock.token") == lease.token
    assert getattr(record, "jobfence.backend") == "memory"


def test_on_a_real_redis(otel: Otel) -> None:
    namespace = f"otel{uuid.uuid4().hex[:12]}"
    try:
        with (
            jobfence.Locks(REDIS_URL, namespace=namespace) as locks,
            locks.acquire("r", ttl=30, renew=False),
            pytest.raises(jobfence.LockTimeout),
        ):
            locks.acquire("r", ttl=30, timeout=0.05)
    finally:
        delete_redis_keys(f"{namespace}*")
    assert otel.value("jobfence.lock.wait", backend="redis", outcome="acquired") == 1
    assert otel.value("jobfence.lock.wait", backend="redis", outcome="timeout") == 1
    assert otel.value("jobfence.lock.hold", backend="redis") == 1


# -- inbox, fencing, retries ----------------------------------------------------------------


def test_claim_renewals_then_a_lost_claim_with_its_log_fields(
    otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    with jobfence.Inbox(_url()) as inbox, caplog.at_level(logging.WARNING, "jobfence"):
        claim = inbox.claim("order-7", ttl=0.6, renew=True)
        _until(lambda: otel.value("jobfence.inbox.renewals", backend="memory", outcome="ok") >= 1)
        assert otel.value("jobfence.inbox.lost", backend="memory") == 0
        # the claim is given back behind its holder's back: the next renewal finds it gone
        assert inbox.backend.release("order-7", claim.owner)
        _until(lambda: claim.lost)
        assert otel.value("jobfence.inbox.renewals", backend="memory", outcome="failed") == 1
        assert otel.value("jobfence.inbox.lost", backend="memory") == 1
    record = next(r for r in caplog.records if "claim on 'order-7'" in r.getMessage())
    assert getattr(record, "jobfence.key") == "order-7"
    assert getattr(record, "jobfence.backend") == "memory"
    # a lock's renewals are counted apart
    assert otel.value("jobfence.lock.renewals", backend="memory", outcome="ok") == 0


def test_message_renewals_then_a_lost_message(otel: Otel, caplog: pytest.LogCaptureFixture) -> None:
    with jobfence.Queue(_url(), "mail") as queue, caplog.at_level(logging.WARNING, "jobfence"):
        queue.publish({"to": "a@example.com"}, id="m1")
        (message,) = queue.receive(visibility=0.6, renew=True)
        _until(lambda: otel.value("jobfence.queue.renewals", backend="memory", outcome="ok") >= 1)
        assert otel.value("jobfence.queue.lost", backend="memory") == 0
        # another hand gives the delivery back: the next renewal finds it gone
        assert queue.backend.nack(message.receipt, queue.consumer, 0.0, None)
        _until(lambda: message.lost)
        assert otel.value("jobfence.queue.renewals", backend="memory", outcome="failed") == 1
        assert otel.value("jobfence.queue.lost", backend="memory") == 1
    record = next(r for r in caplog.records if "message 'm1'" in r.getMessage())
    assert getattr(record, "jobfence.message.id") == "m1"
    assert getattr(record, "jobfence.backend") == "memory"


def test_inbox_claim_outcomes_on_sqlite(otel: Otel, tmp_path: Path) -> None:
    with jobfence.Inbox(f"sqlite:///{tmp_path / 'inbox.db'}") as inbox:
        first = inbox.claim("k", fingerprint="a")
        assert inbox.claim("k", fingerprint="a").state is jobfence.ClaimState.IN_PROGRESS
        first.complete("done")
        assert inbox.claim("k", fingerprint="a").state is jobfence.ClaimState.COMPLETED
        with pytest.raises(jobfence.FingerprintMismatch):
            inbox.claim("k", fingerprint="b")
    for outcome in ("new", "in_progress", "duplicate", "mismatch"):
        assert otel.value("jobfence.inbox.claims", backend="sqlite", outcome=outcome) == 1


def test_claim_in_outcomes(otel: Otel, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    with jobfence.Inbox(f"sqlite:///{tmp_path / 'app.db'}") as inbox:
        inbox.install()
        for _ in range(2):
            conn.execute("BEGIN")
            inbox.claim_in(conn, "msg-1")
            conn.execute("COMMIT")
    conn.close()
    assert otel.value("jobfence.inbox.claims", backend="sqlite", outcome="new") == 1
    assert otel.value("jobfence.inbox.claims", backend="sqlite", outcome="duplicate") == 1


def test_fence_rejection(otel: Otel, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "fence.db")
    jobfence.fencing.install(conn)
    jobfence.fence(conn, "invoice", 5)
    jobfence.fence(conn, "invoice", 5)  # the same token passes
    with pytest.raises(jobfence.StaleToken):
        jobfence.fence(conn, "invoice", 4)
    conn.close()
    assert otel.value("jobfence.fence.rejections", backend="sqlite") == 1


def test_retries_by_cause(otel: Otel, caplog: pytest.LogCaptureFixture) -> None:
    def failing_once(error: Exception, **options: Any) -> None:
        calls = 0

        @retry_unit(backoff=0.001, **options)
        def unit() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise error

        unit()

    with caplog.at_level(logging.WARNING, "jobfence.retry"):
        failing_once(StaleVersion("row changed"))
        failing_once(StaleVersion("row changed"))
        failing_once(ConnectionResetError("peer went away"))
        failing_once(CommitOutcomeUnknown("lost during COMMIT"), protected=True)
    assert otel.value("jobfence.retries", cause="conflict") == 2
    assert otel.value("jobfence.retries", cause="transient") == 1
    assert otel.value("jobfence.retries", cause="commit_unknown") == 1
    causes = [getattr(r, "jobfence.cause") for r in caplog.records if "retrying" in r.getMessage()]
    assert causes == ["conflict", "conflict", "transient", "commit_unknown"]


# -- the worker ------------------------------------------------------------------------------


async def test_worker_message_outcomes(otel: Otel) -> None:
    url = _url()
    q = jobfence.AsyncQueue(url, "jobs", visibility=10)
    inbox = jobfence.AsyncInbox(url)
    await q.publish({"kind": "ok"}, id="ok")
    await q.publish({"kind": "flaky"}, id="flaky")
    await q.publish({"kind": "bad"}, id="bad")
    await q.publish({"kind": "ok"}, id="dup")
    await q.publish({"kind": "ok"}, id="dup")  # the inbox recognises it
    failures: dict[str, int] = {}

    @jobfence.guarded(inbox=inbox)
    async def handler(message: Any) -> None:
        kind = message.body["kind"]
        if kind == "bad" or (kind == "flaky" and not failures.get(message.id)):
            failures[message.id] = failures.get(message.id, 0) + 1
            raise ConnectionResetError(kind)

    worker = jobfence.AsyncWorker(q, handler, concurrency=1, max_deliveries=2, backoff=0)

    def count(outcome: str) -> float:
        return otel.value("jobfence.worker.messages", backend="memory", outcome=outcome)

    def done() -> bool:
        return count("processed") + count("duplicate") == 4 and count("dead_lettered") == 1

    async def watch() -> None:
        deadline = time.monotonic() + 20
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        worker.stop()

    watcher = asyncio.ensure_future(watch())
    await worker.run()
    await watcher
    await inbox.close()
    await q.close()
    assert count("processed") == 3  # ok, flaky (second delivery), the first dup
    assert count("duplicate") == 1
    assert count("retried") == 2  # flaky and bad, once each
    assert count("dead_lettered") == 1
    assert worker.stats.processed == 4 and worker.stats.duplicates == 1


# -- spans ------------------------------------------------------------------------------------


def test_guarded_span_attributes_and_error_status(otel: Otel) -> None:
    url = _url()
    with jobfence.Locks(url) as locks, jobfence.Inbox(url) as inbox:

        @jobfence.guarded(locks=locks, inbox=inbox, lock="order:{n}", key="charge:{n}")
        def charge(n: int) -> int:
            if n < 0:
                raise ValueError("negative")
            return n

        assert charge(7) == 7
        with pytest.raises(ValueError):
            charge(-1)
    spans = otel.spans.get_finished_spans()
    assert [s.name for s in spans] == ["jobfence.guarded", "jobfence.guarded"]
    ok, failed = spans
    assert ok.attributes is not None and failed.attributes is not None
    assert ok.attributes["jobfence.lock.name"] == "order:7"
    assert ok.attributes["jobfence.key"] == "charge:7"
    assert isinstance(ok.attributes["jobfence.lock.token"], int)
    assert str(ok.attributes["jobfence.function"]).endswith("charge")
    assert ok.status.status_code is not StatusCode.ERROR
    assert failed.attributes["jobfence.lock.name"] == "order:-1"
    assert failed.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in failed.events)


async def test_async_guarded_span_is_current_inside_the_function(otel: Otel) -> None:
    seen: list[Any] = []
    async with jobfence.AsyncLocks(_url()) as locks:

        @jobfence.guarded(locks=locks, lock="job")
        async def job() -> None:
            seen.append(trace.get_current_span())

        await job()
    (span,) = otel.spans.get_finished_spans()
    assert seen[0].get_span_context().span_id == span.context.span_id
    assert span.attributes is not None and span.attributes["jobfence.lock.name"] == "job"


# -- no SDK, no API, bad input ----------------------------------------------------------------


def test_without_an_sdk_nothing_is_recorded_and_nothing_fails() -> None:
    telemetry.configure()  # the global providers: none installed in the test run
    with jobfence.Locks(_url()) as locks, locks.acquire("x", ttl=30, renew=False):
        pass
    assert telemetry.enabled()


def test_bad_providers_are_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        telemetry.configure(meter_provider=object())
    assert info.value.argument == "meter_provider"
    with pytest.raises(ConfigurationError) as info:
        telemetry.configure(tracer_provider="x")
    assert info.value.argument == "tracer_provider"


def test_without_the_api_installed_jobfence_works_and_reports_nothing() -> None:
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
import jobfence
from jobfence import telemetry
assert not telemetry.enabled()
with jobfence.Locks("memory://") as locks:
    @jobfence.guarded(locks=locks, lock="x")
    def job():
        return 1
    assert job() == 1
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_jobfence_does_not_import_opentelemetry() -> None:
    script = "import sys, jobfence; print('opentelemetry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
