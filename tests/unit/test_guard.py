"""``@jobfence.guarded``: lock -> claim -> run -> complete -> release, on the memory backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence._guard_run import COMPLETE_ATTEMPTS
from jobfence.guard import current_lease, guarded


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def locks() -> Iterator[jobfence.Locks]:
    client = jobfence.Locks(_url())
    yield client
    client.close()


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    client = jobfence.Inbox(_url())
    yield client
    client.close()


def test_duplicates_return_the_stored_result_without_running(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    runs: list[Any] = []

    @guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}", key="order:{order_id}")
    def process(order_id: int, product_id: int, qty: int) -> dict[str, int]:
        lease = current_lease()
        assert lease is not None and lease.name == f"inventory:{product_id}" and lease.held
        runs.append(lease.token)
        return {"order": order_id, "left": 10 - qty}

    assert process(1, 7, 3) == {"order": 1, "left": 7}
    assert process(1, 7, 3) == {"order": 1, "left": 7}  # redelivery: replayed
    assert process(order_id=1, product_id=7, qty=3) == {"order": 1, "left": 7}
    assert len(runs) == 1
    assert process(2, 7, 5) == {"order": 2, "left": 5}
    assert len(runs) == 2 and runs[1] > runs[0]
    assert current_lease() is None
    # the lease was released after each call
    again = locks.try_acquire("inventory:7", ttl=1)
    assert again is not None
    again.release()


def test_a_claim_in_progress_elsewhere_raises(inbox: jobfence.Inbox) -> None:
    other = inbox.claim("order:9", ttl=60)
    assert other.state is jobfence.ClaimState.NEW

    @guarded(inbox=inbox, key="order:{order_id}")
    def process(order_id: int) -> int:
        pytest.fail("must not run while another worker owns the claim")

    with pytest.raises(jobfence.ClaimInProgress) as info:
        process(9)
    assert info.value.key == "order:9"


def test_an_exception_releases_the_claim_so_a_redelivery_runs_again(
    inbox: jobfence.Inbox,
) -> None:
    attempts: list[int] = []

    @guarded(inbox=inbox, key="order:{order_id}")
    def process(order_id: int) -> str:
        attempts.append(order_id)
        if len(attempts) == 1:
            raise RuntimeError("payment provider down")
        return "charged"

    with pytest.raises(RuntimeError):
        process(5)
    assert process(5) == "charged"
    assert process(5) == "charged"
    assert attempts == [5, 5]


def test_a_lost_lease_releases_the_claim_and_never_completes_it(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="inventory:{product_id}", key="order:{order_id}")
    def process(order_id: int, product_id: int) -> str:
        runs.append(order_id)
        if len(runs) == 1:
            assert locks.backend.force_release(f"inventory:{product_id}")  # lease taken away
            lease = current_lease()
            assert lease is not None
            with pytest.raises(jobfence.LockLost):
                lease.extend()
        return "done"

    with pytest.raises(jobfence.LockLost):
        process(3, 1)
    claim = inbox.claim("order:3", ttl=60)
    assert claim.state is jobfence.ClaimState.NEW  # released, not completed
    claim.release()
    assert process(3, 1) == "done"
    assert runs == [3, 3]


def test_a_result_that_cannot_be_stored_releases_the_claim(inbox: jobfence.Inbox) -> None:
    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}")
    def job(n: int) -> object:
        runs.append(n)
        return object() if len(runs) == 1 else "ok"  # not JSON-serialisable the first time

    with pytest.raises(Exception) as info:
        job(1)
    assert not isinstance(info.value, jobfence.ClaimInProgress)
    assert job(1) == "ok"  # the claim was released: the redelivery runs (not ClaimInProgress)
    assert runs == [1, 1]


def test_only_a_lock(locks: jobfence.Locks) -> None:
    @guarded(locks=locks, lock="report:{day}", timeout=0)
    def report(day: str) -> str:
        return f"report {day}"

    assert report("mon") == "report mon"
    held = locks.try_acquire("report:tue", ttl=5)
    assert held is not None
    with pytest.raises(jobfence.LockTimeout):
        report("tue")
    held.release()


def test_if_locked_skip_returns_the_skipped_result(locks: jobfence.Locks) -> None:
    ran: list[str] = []

    @guarded(
        locks=locks, lock="sync:{tenant}", timeout=0, if_locked="skip", skipped_result="skipped"
    )
    def sync(tenant: str) -> str:
        ran.append(tenant)
        return "ran"

    held = locks.try_acquire("sync:acme", ttl=5)
    assert held is not None
    assert sync("acme") == "skipped" and ran == []
    held.release()
    assert sync("acme") == "ran"


def test_callable_names_and_fingerprints(inbox: jobfence.Inbox) -> None:
    @guarded(inbox=inbox, key=lambda order_id, amount: f"order:{order_id}", fingerprint=True)
    def charge(order_id: int, amount: int) -> int:
        return amount

    assert charge(1, 100) == 100
    assert charge(1, 100) == 100
    with pytest.raises(jobfence.FingerprintMismatch):
        charge(1, 999)  # same key, other payload: never a silent replay


def test_attempts_rerun_the_whole_function_on_transient_errors(inbox: jobfence.Inbox) -> None:
    calls: list[int] = []

    import redis

    @guarded(inbox=inbox, key="job2:{n}", attempts=3)
    def job2(n: int) -> int:
        calls.append(n)
        if len(calls) < 3:
            raise redis.ConnectionError("connection reset")
        return n * 2

    assert job2(4) == 8 and calls == [4, 4, 4]


def test_a_retry_policy_gives_full_control(inbox: jobfence.Inbox) -> None:
    import redis

    seen: list[tuple[int, float]] = []
    policy = jobfence.RetryPolicy(
        attempts=4, backoff=0, on_retry=lambda n, exc, d: seen.append((n, d))
    )
    calls: list[int] = []

    @guarded(inbox=inbox, key="job:{n}", retry=policy)
    def job(n: int) -> int:
        calls.append(n)
        if len(calls) < 4:
            raise redis.TimeoutError("slow")
        return n

    assert job(1) == 1 and len(calls) == 4
    assert [n for n, _ in seen] == [1, 2, 3]
    with pytest.raises(jobfence.ConfigurationError) as info:
        guarded(inbox=inbox, key="k", retry=policy, attempts=3)
    assert info.value.argument == "retry"
    with pytest.raises(jobfence.ConfigurationError) as info:
        guarded(inbox=inbox, key="k", retry=3)
    assert info.value.argument == "retry"


def test_bad_configuration_is_reported_at_decoration(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:

        @guarded(locks=locks, lock="inventory:{product}")
        def f(product_id: int) -> None: ...

    assert info.value.argument == "lock" and "product_id" in str(info.value)
    with pytest.raises(jobfence.ConfigurationError) as info:
        guarded(locks=locks)
        guarded(locks=locks)(lambda: None)
    assert info.value.argument == "lock"
    with pytest.raises(jobfence.ConfigurationError) as info:
        guarded()(lambda: None)
    with pytest.raises(jobfence.ConfigurationError) as info:

        @guarded(locks=locks, lock="x")
        async def g() -> None: ...

    assert info.value.argument == "locks" and "AsyncLocks" in str(info.value)
    with pytest.raises(jobfence.ConfigurationError) as info:
        guarded(inbox=inbox, key="k", attempts=0)
    assert info.value.argument == "attempts"


async def test_async_guarded_and_the_body_is_cancelled_when_the_lease_is_lost() -> None:
    locks = jobfence.AsyncLocks(_url())
    inbox = jobfence.AsyncInbox(_url())
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="inv:{pid}", key="order:{oid}", ttl=0.6)
    async def process(oid: int, pid: int) -> int:
        runs.append(oid)
        lease = current_lease()
        assert lease is not None and lease.held
        if len(runs) == 1:
            await locks.backend.force_release(f"inv:{pid}")
            await asyncio.sleep(30)  # cancelled when the renewer finds the lease gone
        return oid

    try:
        with pytest.raises(jobfence.LockLost):
            await asyncio.wait_for(process(1, 2), 10)
        assert await process(1, 2) == 1  # the claim was released, so the redelivery runs
        assert await process(1, 2) == 1  # and now it is completed: replayed
        assert runs == [1, 1]
    finally:
        await inbox.close()
        await locks.close()


# -- the lease is lost behind the guard's back (found in review) ---------------------------
def test_no_retry_starts_once_the_lease_is_lost(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    runs: list[bool] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", attempts=3)
    def job(n: int) -> str:
        lease = current_lease()
        runs.append(lease.lost)
        locks.force_release("res")  # an administrator (or expiry) takes the lease away
        with pytest.raises(jobfence.LockLost):
            lease.extend()  # ... and this worker notices: the lease is lost locally
        assert locks.try_acquire("res", ttl=30, renew=False) is not None  # someone else
        raise ConnectionResetError("transient: would be retried")

    with pytest.raises(jobfence.LockLost):
        job(1)
    assert runs == [False]  # attempt 2 never ran without the lock
    assert inbox.claim("job:1").state is jobfence.ClaimState.NEW  # released, not completed


def test_a_lease_gone_on_the_server_is_never_completed(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    """The body ends before the renewer noticed the loss: the guard must still not store the
    result (it confirms the lease on the backend before completing the claim)."""
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            locks.force_release("res")
            other = locks.try_acquire("res", ttl=30, renew=False)
            assert other is not None and not current_lease().lost  # not noticed yet
            other.release()
        return f"result-{len(runs)}"

    with pytest.raises(jobfence.LockLost):
        job(1)
    claim = inbox.claim("job:1")
    assert claim.state is jobfence.ClaimState.NEW and claim.attempt == 2  # released
    claim.release()
    assert job(1) == "result-2"  # the redelivery runs and its result is the one stored
    assert job(1) == "result-2"


async def test_async_a_lease_gone_on_the_server_is_never_completed() -> None:
    locks = jobfence.AsyncLocks(_url())
    inbox = jobfence.AsyncInbox(_url())
    runs: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30, attempts=3)
    async def job(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            await locks.force_release("res")
            other = await locks.try_acquire("res", ttl=30, renew=False)
            assert other is not None
            await other.release()
        return f"result-{len(runs)}"

    try:
        with pytest.raises(jobfence.LockLost):
            await job(1)
        claim = await inbox.claim("job:1")
        assert claim.state is jobfence.ClaimState.NEW and claim.attempt == 2
        await claim.release()
        assert await job(1) == "result-2"
    finally:
        await inbox.close()
        await locks.close()


# -- fingerprint=True is the same for the same payload in every process (found in review) --
_FINGERPRINT_SCRIPT = """
import datetime, decimal, uuid
import jobfence
inbox = jobfence.Inbox("memory://fp")
@jobfence.guarded(inbox=inbox, key="job", fingerprint=True)
def job(tags, when, amount, ref, raw):
    return None
job({"b", "a", "c", "x1", "y2"}, datetime.date(2026, 11, 29), decimal.Decimal("12.50"),
    uuid.UUID(int=7), b"\\x00\\xff")
print(inbox.claim("job").fingerprint)
"""


def test_fingerprint_true_is_stable_across_processes() -> None:
    import os
    import subprocess
    import sys

    digests = set()
    for seed in ("1", "2", "3", "4"):
        out = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT_SCRIPT],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == 64


def test_fingerprint_true_refuses_an_argument_without_a_stable_form(
    inbox: jobfence.Inbox,
) -> None:
    runs: list[object] = []

    @guarded(inbox=inbox, key="job:{n}", fingerprint=True)
    def job(n: int, client: object) -> None:
        runs.append(client)

    with pytest.raises(jobfence.ConfigurationError) as info:
        job(1, object())
    assert info.value.argument == "fingerprint" and "object" in str(info.value)
    assert runs == []
    assert inbox.claim("job:1").state is jobfence.ClaimState.NEW  # nothing was claimed


def test_a_transient_error_confirming_the_lease_still_completes_the_claim(
    locks: jobfence.Locks, inbox: jobfence.Inbox
) -> None:
    """The lock backend not answering the confirming extend is not a lost lease: the work is
    done and stored, so a redelivery replays it instead of repeating it (found in review)."""
    from jobfence.testing import set_hook

    effects: list[int] = []

    @guarded(locks=locks, inbox=inbox, lock="res", key="job:{n}", ttl=30)
    def job(n: int) -> str:
        effects.append(n)
        return "done"

    def flaky(point: str, **info: Any) -> None:
        if point == "lock.extend":
            raise ConnectionError("injected: the lock backend did not answer")

    old = set_hook(flaky)
    try:
        assert job(1) == "done"
    finally:
        set_hook(old)
    assert job(1) == "done"  # replayed
    assert effects == [1]


# -- once the function has returned, a failure to store its result never lets it run again --
def _failing_complete(times: int) -> Any:
    """A hook that makes the first ``times`` stores of a result (inbox.complete) fail as a
    dropped connection would; ``calls`` counts them."""
    calls: list[str] = []

    def hook(point: str, **info: Any) -> None:
        if point == "inbox.complete":
            calls.append(info["key"])
            if len(calls) <= times:
                raise ConnectionResetError("injected: the inbox did not answer")

    hook.calls = calls  # type: ignore[attr-defined]
    return hook


def test_a_complete_that_fails_once_is_retried_and_the_claim_ends_completed(
    inbox: jobfence.Inbox,
) -> None:
    from jobfence.testing import hooked

    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}")
    def job(n: int) -> str:
        runs.append(n)
        return f"done {n}"

    hook = _failing_complete(1)
    with hooked(hook):
        assert job(1) == "done 1"
    assert hook.calls == ["job:1", "job:1"]  # the failed try, then the one that stored it
    claim = inbox.claim("job:1")
    assert claim.state is jobfence.ClaimState.COMPLETED and claim.result == "done 1"
    assert job(1) == "done 1"  # a duplicate: replayed, not run
    assert runs == [1]


def test_a_complete_that_always_fails_keeps_the_claim_so_the_function_never_runs_twice(
    inbox: jobfence.Inbox,
) -> None:
    from jobfence.testing import hooked

    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}", claim_ttl=60)
    def job(n: int) -> str:
        runs.append(n)
        return f"done {n}"

    hook = _failing_complete(1_000)
    with hooked(hook), pytest.raises(jobfence.BackendError):
        job(1)
    assert len(hook.calls) == COMPLETE_ATTEMPTS  # every try failed
    with pytest.raises(jobfence.ClaimInProgress):
        job(1)  # the claim was kept, not released: the redelivery does not run it
    assert runs == [1]
    assert inbox.claim("job:1").state is jobfence.ClaimState.IN_PROGRESS


async def test_async_a_complete_that_fails_once_is_retried_and_the_claim_ends_completed() -> None:
    from jobfence.testing import hooked

    inbox = jobfence.AsyncInbox(_url())
    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}")
    async def job(n: int) -> str:
        runs.append(n)
        return f"done {n}"

    try:
        hook = _failing_complete(1)
        with hooked(hook):
            assert await job(1) == "done 1"
        assert hook.calls == ["job:1", "job:1"]
        claim = await inbox.claim("job:1")
        assert claim.state is jobfence.ClaimState.COMPLETED and claim.result == "done 1"
        assert await job(1) == "done 1"
        assert runs == [1]
    finally:
        await inbox.close()


async def test_async_a_complete_that_always_fails_keeps_the_claim() -> None:
    from jobfence.testing import hooked

    inbox = jobfence.AsyncInbox(_url())
    runs: list[int] = []

    @guarded(inbox=inbox, key="job:{n}", claim_ttl=60)
    async def job(n: int) -> str:
        runs.append(n)
        return f"done {n}"

    try:
        hook = _failing_complete(1_000)
        with hooked(hook), pytest.raises(jobfence.BackendError):
            await job(1)
        assert len(hook.calls) == COMPLETE_ATTEMPTS
        with pytest.raises(jobfence.ClaimInProgress):
            await job(1)
        assert runs == [1]
        assert (await inbox.claim("job:1")).state is jobfence.ClaimState.IN_PROGRESS
    finally:
        await inbox.close()
