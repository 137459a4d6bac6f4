"""The Dramatiq integration with Dramatiq's own worker, in process, on its ``StubBroker``:
the middleware, the message id as the default key, jobfence outcomes through Dramatiq's
``Retries`` middleware, fingerprint mismatches never retried, ``async def`` actors on the
``AsyncIO`` event loop, and the mistakes it refuses."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import AsyncIO, Middleware
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend

import jobfence
from jobfence.errors import ClaimInProgress, ConfigurationError, FingerprintMismatch, LockTimeout
from jobfence.integrations.dramatiq import JobfenceMiddleware, guarded

#: milliseconds to wait for a queue to drain
JOIN = 30_000


class Recorder(Middleware):
    """Every outcome of every message processed: (message id, exception or None, retries)."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, BaseException | None, int]] = []
        self.changed = threading.Condition()

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        with self.changed:
            retries = message.options.get("retries", 0)
            self.outcomes.append((message.message_id, exception, retries))
            self.changed.notify_all()

    def wait_for(self, condition: Any, timeout: float = 10.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: condition(self.outcomes), timeout), self.outcomes


class Stub:
    def __init__(self) -> None:
        self.broker = StubBroker()
        self.broker.emit_after("process_boot")
        self.results = StubBackend()
        self.broker.add_middleware(Results(backend=self.results))
        self.broker.add_middleware(AsyncIO())
        self.recorder = Recorder()
        # added first, so its after_process_message runs after Retries' (it sees the count)
        self.broker.middleware.insert(0, self.recorder)
        self.queue = f"q_{uuid.uuid4().hex[:8]}"

    def actor(self, **options: Any) -> Any:
        return dramatiq.actor(broker=self.broker, queue_name=self.queue, **options)

    @contextmanager
    def worker(self) -> Iterator[dramatiq.Worker]:
        worker = dramatiq.Worker(self.broker, worker_timeout=20, worker_threads=2)
        worker.start()
        try:
            yield worker
        finally:
            worker.stop()

    def join(self) -> None:
        self.broker.join(self.queue, timeout=JOIN, fail_fast=False)


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    s.broker.add_middleware(JobfenceMiddleware())
    yield s
    s.broker.close()


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    box = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
    yield box
    box.close()


def test_the_message_id_is_the_default_key_so_a_redelivery_returns_the_stored_result(
    stub: Stub, inbox: jobfence.Inbox
) -> None:
    runs: list[str] = []

    @stub.actor(store_results=True)
    @guarded(inbox=inbox)
    def charge(order_id: str, cents: int) -> dict[str, Any]:
        runs.append(order_id)
        return {"order_id": order_id, "charged": cents, "run": len(runs)}

    with stub.worker():
        message = charge.send("o-1", 1250)
        stub.join()
        stub.broker.enqueue(message)  # the same message again: same id, a duplicate
        stub.broker.enqueue(message)
        stub.join()
        assert runs == ["o-1"]
        assert stub.results.get_result(message) == {"order_id": "o-1", "charged": 1250, "run": 1}
        stored = inbox.claim(f"dramatiq:{message.message_id}")
        assert stored.state is jobfence.ClaimState.COMPLETED and stored.result["run"] == 1
        other = charge.send("o-1", 1250)  # a new message of the same order: another key
        stub.join()
        assert runs == ["o-1", "o-1"]
        assert stub.results.get_result(other)["run"] == 2
    assert [exc for _, exc, _ in stub.recorder.outcomes] == [None] * 4


def test_an_async_actor_gets_its_message_id_on_the_event_loop() -> None:
    ainbox = jobfence.AsyncInbox(f"memory://{uuid.uuid4().hex}")
    stub = Stub()
    stub.broker.add_middleware(JobfenceMiddleware(clients=[ainbox]))  # after AsyncIO
    runs: list[str] = []

    @stub.actor(store_results=True)
    @guarded(inbox=ainbox)
    async def notify(user_id: int) -> str:
        claim = jobfence.current_claim()
        runs.append(claim.key)
        return f"sent to {user_id}"

    with stub.worker():
        message = notify.send(7)
        stub.broker.enqueue(message)
        stub.join()
        assert stub.results.get_result(message) == "sent to 7"
    assert runs == [f"dramatiq:{message.message_id}"]  # the redelivery did not run it
    # the worker's shutdown closed the async inbox on Dramatiq's event loop
    with pytest.raises(ConfigurationError, match="closed"):
        asyncio.run(ainbox.claim("x"))


def test_a_claim_in_progress_goes_back_to_dramatiq_uncounted_after_its_expiry(
    stub: Stub, inbox: jobfence.Inbox
) -> None:
    runs: list[int] = []

    @stub.actor(store_results=True, max_retries=1)
    @guarded(inbox=inbox, key="order:{order_id}", retry_delay=30)
    def ship(order_id: int) -> int:
        runs.append(order_id)
        return order_id

    # another worker is processing order 7: its claim (renewed) expires within 0.4 s
    held = inbox.claim("order:7", ttl=0.4, renew=True)
    assert held.state is jobfence.ClaimState.NEW
    with stub.worker():
        message = ship.send(7)
        stub.recorder.wait_for(lambda outcomes: len(outcomes) >= 3)  # refused more than
        assert runs == []  # max_retries (1) times
        for _id, exc, retries in stub.recorder.outcomes:
            assert isinstance(exc, dramatiq.Retry) and exc.delay <= 0.4 * 1100 + 500
            assert isinstance(exc.__cause__, ClaimInProgress)
            assert retries == 0  # not counted by Dramatiq's Retries middleware
        held.release()
        stub.join()
    assert runs == [7]
    assert stub.results.get_result(message) == 7


def test_a_lock_timeout_is_retried_and_the_lock_template_sees_the_arguments(
    stub: Stub, inbox: jobfence.Inbox
) -> None:
    locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    names: list[str] = []

    @stub.actor()
    @guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}", timeout=0, retry_delay=0)
    def reserve(order_id: int, product_id: int) -> None:
        names.append(jobfence.current_lease().name)

    lease = locks.try_acquire("inventory:42", ttl=0.4)  # renewed: held until released
    assert lease is not None
    with stub.worker():
        reserve.send(1, 42)
        stub.recorder.wait_for(lambda outcomes: len(outcomes) >= 3)
        causes = {type(exc.__cause__) for _, exc, _ in stub.recorder.outcomes}
        assert causes == {LockTimeout} and names == []
        assert {retries for _, _, retries in stub.recorder.outcomes} == {0}
        lease.release()
        stub.join()
    assert names == ["inventory:42"]
    locks.close()


def test_a_fingerprint_mismatch_is_never_retried(stub: Stub, inbox: jobfence.Inbox) -> None:
    @stub.actor(store_results=True, throws=KeyError)
    @guarded(inbox=inbox, key="refund:{refund_id}", fingerprint=True, retry_delay=0)
    def refund(refund_id: int, cents: int) -> int:
        return cents

    assert refund.options["throws"] == (KeyError, FingerprintMismatch, ConfigurationError)
    with stub.worker():
        refund.send(1, 500)
        stub.join()
        reused = refund.send(1, 900)  # the same key, another payload
        stub.join()
    failures = [(exc, retries) for _, exc, retries in stub.recorder.outcomes if exc is not None]
    assert len(failures) == 1  # tried once, not retried
    assert isinstance(failures[0][0], FingerprintMismatch)
    assert [m.message_id for m in stub.broker.dead_letters] == [reused.message_id]


def test_a_guarded_function_on_a_broker_without_the_middleware_is_refused(
    inbox: jobfence.Inbox,
) -> None:
    s = Stub()

    @s.actor()
    @guarded(inbox=inbox, key="job:{n}")
    def job(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:
        job(1)
    assert info.value.argument == "middleware"
    assert "throws" not in job.options
    s.broker.add_middleware(JobfenceMiddleware())  # after the actor: still applied to it
    assert job(1) == 1  # a direct call uses its key template
    assert job.options["throws"] == (FingerprintMismatch, ConfigurationError)


def test_a_direct_call_without_a_key_template_has_no_key(stub: Stub, inbox: jobfence.Inbox) -> None:
    @stub.actor()
    @guarded(inbox=inbox)
    def job(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:
        job(1)
    assert info.value.argument == "key"


def test_guarded_over_the_actor_is_refused(stub: Stub, inbox: jobfence.Inbox) -> None:
    with pytest.raises(ConfigurationError) as info:

        @guarded(inbox=inbox)
        @stub.actor()
        def job(n: int) -> int:
            return n

    assert info.value.argument == "fn"


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"retry_delay": -1}, "retry_delay"),
        ({"retry_delay": "5"}, "retry_delay"),
        ({"key": "order:{nope}"}, "key"),
        ({"attempts": 0}, "attempts"),
    ],
)
def test_bad_arguments_name_themselves(
    inbox: jobfence.Inbox, options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(ConfigurationError) as info:

        @guarded(inbox=inbox, **options)
        def job(order_id: int) -> None: ...

    assert info.value.argument == argument


def test_the_middleware_refuses_what_it_cannot_close() -> None:
    with pytest.raises(ConfigurationError) as info:
        JobfenceMiddleware(clients=["redis://localhost"])
    assert info.value.argument == "clients"


def test_retry_policy_runs_the_unit_again_in_process(stub: Stub, inbox: jobfence.Inbox) -> None:
    attempts: list[int] = []

    @stub.actor()
    @guarded(inbox=inbox, retry=jobfence.RetryPolicy(attempts=3, backoff=0))
    def flaky() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise jobfence.StaleVersion("changed meanwhile")

    with stub.worker():
        flaky.send()
        stub.join()
    assert len(attempts) == 3
    assert [exc for _, exc, _ in stub.recorder.outcomes] == [None]


def test_import_jobfence_does_not_import_dramatiq() -> None:
    code = "import sys, jobfence, jobfence.integrations; assert 'dramatiq' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
