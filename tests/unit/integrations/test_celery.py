"""jobfence.integrations.celery with real Celery tasks, run by ``Task.apply()`` (Celery's own
tracer, request and retry machinery, without a broker): the task id as the default key,
jobfence's "not now" as Celery's retry after the holder's expiry, fingerprint mismatches final,
``bind=True`` tasks, and bad configuration."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import celery
import pytest
from celery.signals import task_retry

import jobfence
from jobfence.errors import (
    ClaimInProgress,
    ConfigurationError,
    FingerprintMismatch,
    LockTimeout,
)
from jobfence.integrations import celery as jfcelery
from tests.claims import held_elsewhere


@pytest.fixture
def app() -> Iterator[celery.Celery]:
    application = celery.Celery(f"jf-unit-{uuid.uuid4().hex[:8]}", broker="memory://")
    yield application
    application.close()


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    box = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
    yield box
    box.close()


@pytest.fixture
def locks() -> Iterator[jobfence.Locks]:
    client = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    yield client
    client.close()


@pytest.fixture
def retries() -> Iterator[list[Any]]:
    """The ``reason`` (a ``celery.exceptions.Retry``) of every retry Celery records."""
    seen: list[Any] = []

    def on_retry(sender: Any = None, reason: Any = None, **_: Any) -> None:
        seen.append(reason)

    task_retry.connect(on_retry, weak=False)
    yield seen
    task_retry.disconnect(on_retry)


def test_the_task_id_is_the_default_key_so_a_redelivery_returns_the_stored_result(app, inbox):
    runs: list[tuple[str | None, int, int]] = []

    @app.task(shared=False, acks_late=True)
    @jfcelery.guarded(inbox=inbox)
    def add(x: int, y: int) -> int:
        runs.append((jfcelery.job_key(), x, y))
        return x + y

    first = add.apply((2, 3), task_id="task-1")
    again = add.apply((2, 3), task_id="task-1")  # the same message delivered again
    assert (first.state, first.result) == ("SUCCESS", 5)
    assert (again.state, again.result) == ("SUCCESS", 5)
    assert runs == [("celery:task-1", 2, 3)]
    stored = inbox.claim("celery:task-1")
    assert (stored.state.value, stored.result) == ("completed", 5)
    assert add.apply((2, 3), task_id="task-2").result == 5  # another task: its own key
    assert runs == [("celery:task-1", 2, 3), ("celery:task-2", 2, 3)]
    assert jfcelery.job_key() is None  # outside a task


def test_a_key_template_and_a_lock_template_see_the_task_arguments(app, inbox, locks):
    seen: list[Any] = []

    @app.task(shared=False)
    @jfcelery.guarded(locks=locks, inbox=inbox, lock="product:{product_id}", key="order:{order_id}")
    def apply_order(order_id: int, product_id: int) -> str:
        seen.append((jobfence.current_lease().name, jobfence.guard.current_claim().key))
        return f"applied {order_id}"

    assert apply_order.apply((7, 3), task_id="a").result == "applied 7"
    assert apply_order.apply((7, 3), task_id="b").result == "applied 7"  # another task, same key
    assert seen == [("product:3", "order:7")]


def test_a_bound_task_keeps_self_out_of_templates_and_fingerprint(app, inbox):
    calls: list[Any] = []

    @app.task(shared=False, bind=True)
    @jfcelery.guarded(inbox=inbox, key="order:{order_id}", fingerprint=True)
    def apply_order(self: Any, order_id: int, qty: int) -> int:
        calls.append((self.name, self.request.id, order_id, qty))
        return qty

    assert apply_order.apply((1,), {"qty": 5}, task_id="t-1").result == 5
    assert calls == [(apply_order.name, "t-1", 1, 5)]
    mismatch = apply_order.apply((1, 6), task_id="t-2")  # same key, other arguments
    assert mismatch.state == "FAILURE"
    assert isinstance(mismatch.result, FingerprintMismatch)
    assert len(calls) == 1


def test_a_claim_in_progress_becomes_celerys_retry_after_the_claims_expiry(app, inbox, retries):
    """In eager mode (``apply``) Celery re-runs a retry inside the call, so there is no
    message to send uncounted: the refusal is an ordinary (counted) retry there, after the
    holder's expiry; a worker sends it again uncounted (tests/frameworks/test_celery.py)."""
    held = held_elsewhere(inbox.claim("celery:t-9", ttl=60))  # another worker holds the key
    runs: list[int] = []

    @app.task(max_retries=5, name=f"work-{uuid.uuid4().hex[:8]}", shared=False)
    @jfcelery.guarded(inbox=inbox, retry_delay=7.5)
    def work(n: int) -> int:
        runs.append(celery.current_task.request.retries)
        return n

    def free_after_two(sender: Any = None, reason: Any = None, **_: Any) -> None:
        if len(retries) == 2:
            held.release()  # the other worker gives the key back

    task_retry.connect(free_after_two, weak=False)
    try:
        result = work.apply((4,), task_id="t-9")
    finally:
        task_retry.disconnect(free_after_two)
    assert (result.state, result.result) == ("SUCCESS", 4)
    assert [type(r.exc) for r in retries] == [ClaimInProgress, ClaimInProgress]
    # Celery's countdown is the claim's expiry (60 s), plus jitter, not the retry_delay
    assert all(55 < r.when <= 60 * 1.1 + 0.5 for r in retries), [r.when for r in retries]
    assert runs == [2]  # ran once, on Celery's second retry of the same task id


def test_a_lock_timeout_is_retried_until_max_retries_then_fails(app, locks, retries):
    other = locks.acquire("report", ttl=60)

    @app.task(shared=False, max_retries=2)
    @jfcelery.guarded(locks=locks, lock="report", timeout=0, retry_delay=0.25)
    def report() -> str:
        raise AssertionError("must not run while another worker holds the lock")

    result = report.apply(task_id="r-1")
    other.release()
    assert result.state == "FAILURE"
    assert isinstance(result.result, LockTimeout)  # Celery re-raises the cause at the limit
    assert [type(r.exc) for r in retries] == [LockTimeout] * 2  # eager: counted
    assert all(55 < r.when <= 60 * 1.1 + 0.5 for r in retries)  # the lease's expiry


def test_a_fingerprint_mismatch_fails_at_once_never_retried(app, inbox, retries):
    @app.task(shared=False, max_retries=5)
    @jfcelery.guarded(inbox=inbox, key="charge:{charge_id}", fingerprint=True)
    def charge(charge_id: str, cents: int) -> int:
        return cents

    assert charge.apply(("c1", 100)).result == 100
    wrong = charge.apply(("c1", 999))
    assert wrong.state == "FAILURE"
    assert isinstance(wrong.result, FingerprintMismatch)
    assert retries == []


def test_with_autoretry_for_every_exception_not_retried_stays_final(app, inbox, retries):
    @app.task(
        shared=False,
        autoretry_for=(Exception,),
        dont_autoretry_for=jfcelery.NOT_RETRIED,
        max_retries=3,
    )
    @jfcelery.guarded(inbox=inbox, key="charge:{charge_id}", fingerprint=True)
    def charge(charge_id: str, cents: int) -> int:
        if cents < 0:
            raise ValueError("negative")
        return cents

    assert charge.apply(("c1", 100)).result == 100
    wrong = charge.apply(("c1", 999))
    assert wrong.state == "FAILURE" and isinstance(wrong.result, FingerprintMismatch)
    assert retries == []
    charge.apply(("c2", -1))  # the task's own error: autoretry_for retries it, 3 times
    assert [type(r.exc) for r in retries] == [ValueError] * 3


def test_the_task_exceptions_follow_celerys_rules_and_release_the_claim(app, inbox, retries):
    attempts: list[int] = []

    @app.task(shared=False)
    @jfcelery.guarded(inbox=inbox, retry=jobfence.RetryPolicy(attempts=3, backoff=0.001))
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("transient: re-run the whole unit in this process")
        if len(attempts) == 3:
            raise ValueError("the task's own error")
        return "ok"

    failed = flaky.apply(task_id="f-1")
    assert failed.state == "FAILURE" and isinstance(failed.result, ValueError)
    assert len(attempts) == 3 and retries == []  # RetryPolicy re-ran it; Celery did not retry
    assert flaky.apply(task_id="f-1").result == "ok"  # the claim was released: it runs again


def test_a_direct_call_has_no_task_id(app, inbox, locks):
    @app.task(shared=False)
    @jfcelery.guarded(inbox=inbox)
    def no_key() -> int:
        return 1

    @app.task(shared=False)
    @jfcelery.guarded(inbox=inbox, key="k:{n}")
    def keyed(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError) as info:
        no_key()
    assert info.value.argument == "key"
    assert keyed(3) == 3
    inbox.claim("k:4", ttl=60)
    with pytest.raises(ClaimInProgress):  # no worker to retry it: raised as it is
        keyed(4)


def test_bad_configuration_names_the_argument(app, inbox):
    async def coroutine() -> None:
        pass

    with pytest.raises(ConfigurationError) as info:
        jfcelery.guarded(inbox=inbox)(coroutine)
    assert info.value.argument == "fn" and "synchronously" in str(info.value)

    @app.task(shared=False)
    def plain() -> None:
        pass

    with pytest.raises(ConfigurationError) as info:
        jfcelery.guarded(inbox=inbox)(plain)
    assert info.value.argument == "fn" and "UNDER @app.task" in str(info.value)

    with pytest.raises(ConfigurationError) as info:
        jfcelery.guarded(inbox=inbox, retry_delay=-1)
    assert info.value.argument == "retry_delay"

    def bound(self: Any, order_id: int) -> None:
        pass

    with pytest.raises(ConfigurationError) as info:
        jfcelery.guarded(inbox=inbox, key="order:{self_id}")(bound)
    assert info.value.argument == "key" and "order_id" in str(info.value)

    guarded_bound = jfcelery.guarded(inbox=inbox, key="order:{order_id}")(bound)
    with pytest.raises(ConfigurationError) as info:
        guarded_bound(1)  # not registered with bind=True: no task as first argument
    assert info.value.argument == "fn" and "bind=True" in str(info.value)


def test_a_retry_that_cannot_be_sent_requeues_the_message_instead_of_dropping_it(inbox) -> None:
    """Celery's ``Task.retry`` rejects the message *without* requeueing it when the retry
    cannot be sent (the broker is unreachable): with ``acks_late`` that drops the message.
    jobfence's "not now" must keep it: the rejection asks the broker to requeue it."""
    from celery.exceptions import Reject

    app = celery.Celery(
        f"jf-unit-{uuid.uuid4().hex[:8]}",
        broker="amqp://guest:guest@127.0.0.1:1//",  # nothing listens there
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        broker_transport_options={"max_retries": 0},
    )
    held = inbox.claim("order:3", ttl=60)  # another worker holds the key: "not now"

    @app.task(shared=False, acks_late=True, reject_on_worker_lost=True, max_retries=None)
    @jfcelery.guarded(inbox=inbox, key="order:{order_id}", retry_delay=1)
    def reserve(order_id: int) -> None:
        raise AssertionError("must not run while the key is held")

    from celery._state import _task_stack

    # what a worker does around a task: the task on the stack, a request of a delivery
    _task_stack.push(reserve)
    reserve.push_request(id="task-3", called_directly=False, is_eager=False)
    try:
        with pytest.raises(Reject) as info:
            reserve.run(3)
    finally:
        reserve.pop_request()
        _task_stack.pop()
        held.release()
        app.close()
    assert info.value.requeue is True
    assert isinstance(info.value.__cause__, ClaimInProgress)


def test_a_worker_sends_a_refused_task_again_without_using_up_max_retries(inbox) -> None:
    """A real worker (in a thread, on the in-memory broker): a task refused more times than
    its max_retries (another worker holds its key) is sent again each time with its retries
    count unchanged, after the claim's expiry, and runs once the key is free."""
    from celery.contrib.testing.worker import start_worker

    app = celery.Celery(
        f"jf-unit-w-{uuid.uuid4().hex[:8]}", broker="memory://", backend="cache+memory://"
    )
    app.conf.task_default_queue = f"q-{uuid.uuid4().hex[:8]}"
    app.conf.worker_hijack_root_logger = False
    # held (renewed) until released; a ttl of a few renewal round trips even on a loaded machine
    held = inbox.claim("celery:t-held", ttl=2.0, renew=True)
    runs: list[int] = []
    refusals: list[Any] = []

    # a name of its own, not shared: Celery gives every app created later the tasks of the
    # earlier ones by name, and the first one registered wins (another test's `work`, bound
    # to that test's closed inbox)
    @app.task(max_retries=1, name=f"refused-{uuid.uuid4().hex[:8]}", shared=False)
    @jfcelery.guarded(inbox=inbox, retry_delay=30)
    def work(n: int) -> int:
        runs.append(celery.current_task.request.retries)
        return n

    def refused(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        refusals.append((request.retries, reason))
        if len(refusals) == 3:  # refused more often than max_retries allows
            held.release()

    task_retry.connect(refused, weak=False)
    # the embedded worker sets the root logger's level (to its loglevel, ERROR) for the whole
    # process: put it back, or later tests in this process see no WARNING records
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            result = work.apply_async((5,), task_id="t-held")
            assert result.get(timeout=30) == 5
    finally:
        task_retry.disconnect(refused)
        app.close()
        root.setLevel(level)
        root.handlers[:] = handlers
    assert [retries for retries, _ in refusals][:3] == [0, 0, 0]  # never counted
    assert all(isinstance(reason.exc, ClaimInProgress) for _, reason in refusals)
    assert all(reason.when <= 2.0 * 1.1 + 0.5 for _, reason in refusals)  # the claim's expiry
    assert runs == [0]
