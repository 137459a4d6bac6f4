"""The core every framework integration builds on: the job id as the default key, and
jobfence's retryable outcomes raised as the framework's retry."""

from __future__ import annotations

import uuid

import pytest

import jobfence
from jobfence.errors import ClaimInProgress, ConfigurationError, FingerprintMismatch
from jobfence.integrations._task import guard_task, wants_retry


class FrameworkRetry(Exception):
    def __init__(self, cause: BaseException, delay: float) -> None:
        super().__init__(f"retry in {delay}")
        self.cause = cause
        self.delay = delay


class FinalFailure(Exception):
    pass


@pytest.fixture
def inbox():
    box = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
    yield box
    box.close()


def test_job_id_is_the_default_key_so_a_redelivery_is_a_duplicate(inbox):
    runs: list[int] = []
    job = {"id": "m-1"}

    def work(x: int) -> int:
        runs.append(x)
        return x * 2

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: job["id"],
        retry=FrameworkRetry,
        retry_delay=1.5,
        inbox=inbox,
    )
    assert task(21) == 42
    assert task(21) == 42  # the same message again: the stored result, not a second run
    assert runs == [21]
    again = inbox.claim("fw:m-1")  # the key the task used is the framework's job id
    assert (again.state.value, again.result) == ("completed", 42)
    job["id"] = "m-2"
    assert task(4) == 8
    assert runs == [21, 4]


def test_claim_in_progress_becomes_the_framework_retry_with_its_delay(inbox):
    held = inbox.claim("order:7", ttl=60)
    assert held.state.value == "new"

    def work(order_id: int) -> None:
        raise AssertionError("must not run while another worker holds the claim")

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: "m",
        retry=FrameworkRetry,
        retry_delay=2.5,
        inbox=inbox,
        key="order:{order_id}",
    )
    with pytest.raises(FrameworkRetry) as info:
        task(7)
    assert isinstance(info.value.cause, ClaimInProgress)
    assert info.value.delay == 2.5


def test_fingerprint_mismatch_is_final_never_retried(inbox):
    def work(order_id: int, qty: int) -> int:
        return qty

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: None,
        retry=FrameworkRetry,
        retry_delay=1,
        final=FinalFailure,
        inbox=inbox,
        key="order:{order_id}",
        fingerprint=True,
    )
    assert task(1, 5) == 5
    with pytest.raises(FinalFailure) as info:
        task(1, 6)
    assert isinstance(info.value.__cause__, FingerprintMismatch)
    assert not wants_retry(info.value.__cause__)


async def test_async_task_uses_the_job_id_too():
    inbox = jobfence.AsyncInbox(f"memory://{uuid.uuid4().hex}")
    runs = []

    async def work() -> str:
        runs.append(1)
        return "done"

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: "a-1",
        retry=FrameworkRetry,
        retry_delay=0,
        inbox=inbox,
    )
    assert await task() == "done"
    assert await task() == "done"
    assert runs == [1]
    await inbox.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True])
def test_bad_retry_delay_names_the_argument(bad):
    with pytest.raises(ConfigurationError) as info:
        guard_task(
            lambda: None,
            framework="fw",
            job_id=lambda a, k: None,
            retry=FrameworkRetry,
            retry_delay=bad,
            inbox=object(),
        )
    assert info.value.argument == "retry_delay"


def test_without_a_job_id_or_key_the_error_says_what_to_pass(inbox):
    task = guard_task(
        lambda: 1,
        framework="fw",
        job_id=lambda a, k: None,
        retry=FrameworkRetry,
        retry_delay=0,
        inbox=inbox,
    )
    with pytest.raises(ConfigurationError) as info:
        task()
    assert info.value.argument == "key"


def test_a_nested_guarded_call_without_key_is_refused_not_retried_forever(inbox):
    # A plain guarded helper without key= inside a framework task would take the task's own
    # key, which the task's claim holds: ClaimInProgress, sent to the framework's retry on
    # every run. It must fail for good with an error that says what to pass.
    runs: list[int] = []

    @jobfence.guarded(inbox=inbox)
    def helper(x: int) -> int:
        runs.append(x)
        return x + 1

    def work(x: int) -> int:
        return helper(x)

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: "m-9",
        retry=FrameworkRetry,
        retry_delay=1,
        inbox=inbox,
    )
    with pytest.raises(ConfigurationError) as info:
        task(1)
    assert info.value.argument == "key"
    assert "fw:m-9" in str(info.value)
    assert runs == []
    assert inbox.claim("fw:m-9").state.value == "new"  # the task's claim was given back


def test_a_nested_guarded_call_with_the_outer_key_is_refused(inbox):
    @jobfence.guarded(inbox=inbox, key="order:{order_id}")
    def inner(order_id: int) -> int:
        raise AssertionError("must not run")

    @jobfence.guarded(inbox=inbox, key="order:{order_id}")
    def outer(order_id: int) -> int:
        return inner(order_id)

    with pytest.raises(ConfigurationError) as info:
        outer(3)
    assert info.value.argument == "key"
    assert inbox.claim("order:3").state.value == "new"


def test_a_nested_guarded_call_with_its_own_key_runs(inbox):
    def work(x: int) -> int:
        return jobfence.guarded(inbox=inbox, key="step:{x}")(lambda x: x * 10)(x)

    task = guard_task(
        work,
        framework="fw",
        job_id=lambda a, k: "m-10",
        retry=FrameworkRetry,
        retry_delay=1,
        inbox=inbox,
    )
    assert task(2) == 20
    assert inbox.claim("step:2").result == 20
