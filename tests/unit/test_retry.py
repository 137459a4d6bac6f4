"""retry_unit: whole-unit retries, backoff, caps, protection, and the open-transaction rule.

Time is virtual (a ManualClock whose sleeps advance it): nothing here really sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import (
    CommitOutcomeUnknown,
    ConfigurationError,
    RetryPolicy,
    StaleVersion,
    UnprotectedRetryWarning,
    retry_unit,
)
from jobfence.retry import mark_protected
from jobfence.testing import ManualClock


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    """Virtual time from 1000.0 that moves only when something sleeps (or a test advances
    it), installed for the test."""
    with ManualClock(1000.0, auto_advance=True) as virtual:
        yield virtual


class MaxRng:
    """Returns the top of every jitter range, and records the ranges asked for."""

    def __init__(self) -> None:
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return b


class Store:
    """A versioned row in memory, with a hook to let a rival write between read and write."""

    def __init__(self, stock: int) -> None:
        self.stock = stock
        self.version = 1
        self.reads: list[int] = []

    def read(self) -> tuple[int, int]:
        self.reads.append(self.stock)
        return self.stock, self.version

    def write(self, stock: int, expected_version: int) -> None:
        if self.version != expected_version:
            raise StaleVersion("version moved", expected=expected_version)
        self.stock, self.version = stock, self.version + 1


# ------------------------------------------------------------------- whole-unit re-run


def test_sync_retry_reruns_the_whole_function_with_fresh_reads(clock: ManualClock) -> None:
    store = Store(10)
    rival_done = False

    @retry_unit(attempts=5)
    def deduct(qty: int) -> int:
        nonlocal rival_done
        stock, version = store.read()
        if not rival_done:  # another job deducts 3 between our read and our write
            rival_done = True
            store.write(store.stock - 3, store.version)
        store.write(stock - qty, version)
        return stock - qty

    assert deduct(5) == 2
    assert store.stock == 2  # not 5: the retry recomputed from the fresh read
    assert store.reads == [10, 7]
    assert len(clock.sleeps) == 1


async def test_async_retry_reruns_the_whole_function_with_fresh_reads(
    clock: ManualClock,
) -> None:
    store = Store(10)
    rival_done = False

    @retry_unit(attempts=5)
    async def deduct(qty: int) -> int:
        nonlocal rival_done
        stock, version = store.read()
        await asyncio.sleep(0)
        if not rival_done:
            rival_done = True
            store.write(store.stock - 3, store.version)
        store.write(stock - qty, version)
        return stock - qty

    assert inspect.iscoroutinefunction(deduct)
    assert await deduct(5) == 2
    assert store.stock == 2
    assert store.reads == [10, 7]
    assert len(clock.sleeps) == 1


# ------------------------------------------------------------------ caps and backoff


def test_attempt_cap_reraises_the_last_original_exception(clock: ManualClock) -> None:
    raised: list[StaleVersion] = []

    @retry_unit(attempts=3)
    def always_conflicts() -> None:
        exc = StaleVersion(f"conflict {len(raised)}")
        raised.append(exc)
        raise exc

    with pytest.raises(StaleVersion) as info:
        always_conflicts()
    assert len(raised) == 3
    assert info.value is raised[-1]  # the original object, not a tenacity RetryError
    assert len(clock.sleeps) == 2


async def test_async_attempt_cap(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(attempts=4)
    async def always_conflicts() -> None:
        nonlocal calls
        calls += 1
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        await always_conflicts()
    assert calls == 4


def test_deadline_stops_before_a_sleep_that_would_pass_it(clock: ManualClock) -> None:
    calls: list[float] = []

    @retry_unit(attempts=100, deadline=1.0, backoff=0.4, max_backoff=0.4, rng=MaxRng())
    def slow_conflict() -> None:
        calls.append(clock.monotonic() - 1000.0)
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        slow_conflict()
    # attempts at t=0, 0.4, 0.8; the next sleep would end at 1.2 > 1.0
    assert calls == pytest.approx([0.0, 0.4, 0.8])
    assert clock.sleeps == pytest.approx([0.4, 0.4])


def test_deadline_counts_time_spent_inside_attempts(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(attempts=100, deadline=5.0, backoff=0.0, max_backoff=0.0)
    def takes_two_seconds() -> None:
        nonlocal calls
        calls += 1
        clock.advance(2.0)
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        takes_two_seconds()
    assert calls == 3  # after 3 attempts 6 s have passed


def test_full_jitter_backoff_is_bounded_and_exponential(clock: ManualClock) -> None:
    rng = MaxRng()

    @retry_unit(attempts=7, backoff=0.1, max_backoff=1.0, rng=rng)
    def conflict() -> None:
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        conflict()
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert [b for _, b in rng.ranges] == pytest.approx(ceilings)
    assert all(a == 0.0 for a, _ in rng.ranges)  # FULL jitter: from zero
    assert clock.sleeps == pytest.approx(ceilings)


def test_seeded_random_delays_stay_within_their_ceilings(clock: ManualClock) -> None:
    policy = RetryPolicy(attempts=9, backoff=0.05, max_backoff=0.5, rng=random.Random(7))

    @retry_unit(policy=policy)
    def conflict() -> None:
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        conflict()
    assert len(clock.sleeps) == 8
    for n, delay in enumerate(clock.sleeps):
        assert 0.0 <= delay <= min(0.5, 0.05 * 2**n)
    assert len(set(clock.sleeps)) > 1  # jittered, not constant
    # the same seed replays the same delays
    assert [RetryPolicy(rng=random.Random(7), max_backoff=0.5).delay(n) for n in range(3)] == [
        RetryPolicy(rng=random.Random(7), max_backoff=0.5).delay(n) for n in range(3)
    ]


# ------------------------------------------------------------ what is (not) retried


def test_non_retryable_error_is_raised_at_once_unchanged(clock: ManualClock) -> None:
    hook_calls: list[Any] = []
    error = ValueError("bad input")
    calls = 0

    @retry_unit(on_retry=lambda *a: hook_calls.append(a))
    def broken() -> None:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(ValueError) as info:
        broken()
    assert info.value is error
    assert calls == 1
    assert clock.sleeps == [] and hook_calls == []


async def test_cancellation_is_never_retried_even_with_a_conflict_as_context(
    clock: ManualClock,
) -> None:
    calls = 0

    @retry_unit
    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        try:
            raise StaleVersion("x")
        except StaleVersion:
            raise asyncio.CancelledError() from None

    with pytest.raises(asyncio.CancelledError):
        await cancelled()
    assert calls == 1


def test_lease_lost_and_stale_token_are_not_retried(clock: ManualClock) -> None:
    for exc in (jobfence.LockLost("gone", name="n"), jobfence.StaleToken("r", 3, 4)):
        calls = 0

        @retry_unit
        def fenced_out(e: Exception = exc) -> None:
            nonlocal calls
            calls += 1
            raise e

        with pytest.raises(type(exc)):
            fenced_out()
        assert calls == 1


def test_retry_on_adds_exception_types_and_predicates(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(attempts=3, retry_on=(KeyError,))
    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise KeyError("x")
        return "ok"

    assert flaky() == "ok" and calls == 3

    calls = 0

    @retry_unit(attempts=2, retry_on=lambda e: "retry me" in str(e))
    def flaky2() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("please retry me")

    with pytest.raises(RuntimeError):
        flaky2()
    assert calls == 2


@pytest.mark.parametrize(
    "exc",
    [
        jobfence.LockLost("gone", name="n"),
        jobfence.StaleToken(resource="r", token=1, newest=2),
        jobfence.ConfigurationError("bad", argument="x"),
        jobfence.FingerprintMismatch("other payload", key="k"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_retry_on_never_overrides_a_never_retry_error(clock: ManualClock, exc: Exception) -> None:
    calls = 0

    @retry_unit(attempts=4, retry_on=Exception)
    def unit() -> None:
        nonlocal calls
        calls += 1
        raise exc

    with pytest.raises(type(exc)):
        unit()
    assert calls == 1
    assert RetryPolicy(retry_on=Exception).is_retryable(ValueError("plain")) is True


def test_classify_override_replaces_the_builtin_table(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(classify=lambda e: None)  # retry nothing
    def conflict() -> None:
        nonlocal calls
        calls += 1
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        conflict()
    assert calls == 1

    calls = 0

    @retry_unit(attempts=2, classify=lambda e: "transient" if isinstance(e, OSError) else None)
    def oserror() -> None:
        nonlocal calls
        calls += 1
        raise OSError("disk hiccup")

    with pytest.raises(OSError):
        oserror()
    assert calls == 2


# ------------------------------------------------------------------ hook and logging


def test_on_retry_hook_gets_attempt_exception_and_delay(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[int, BaseException, float]] = []
    errors = [StaleVersion("first"), StaleVersion("second")]

    @retry_unit(attempts=5, on_retry=lambda n, e, d: seen.append((n, e, d)), rng=MaxRng())
    def twice() -> str:
        if errors:
            raise errors.pop(0)
        return "done"

    first, second = errors
    with caplog.at_level(logging.WARNING, logger="jobfence.retry"):
        assert twice() == "done"
    assert [(n, e) for n, e, _ in seen] == [(1, first), (2, second)]
    assert [d for _, _, d in seen] == clock.sleeps == pytest.approx([0.05, 0.1])
    records = [r for r in caplog.records if r.name == "jobfence.retry"]
    assert len(records) == 2 and all(r.levelno == logging.WARNING for r in records)
    assert "twice" in records[0].getMessage() and "StaleVersion" in records[0].getMessage()


async def test_async_on_retry_hook_may_be_a_coroutine(clock: ManualClock) -> None:
    seen: list[int] = []

    async def hook(n: int, e: BaseException, d: float) -> None:
        await asyncio.sleep(0)
        seen.append(n)

    calls = 0

    @retry_unit(attempts=3, on_retry=hook)
    async def unit() -> None:
        nonlocal calls
        calls += 1
        raise StaleVersion("x")

    with pytest.raises(StaleVersion):
        await unit()
    assert seen == [1, 2] and calls == 3


# --------------------------------------------------------------- commit outcome unknown


def test_commit_outcome_unknown_is_not_retried_for_an_unprotected_unit(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0
    error = CommitOutcomeUnknown("connection lost during COMMIT")

    @retry_unit
    def unprotected() -> None:
        nonlocal calls
        calls += 1
        raise error

    with (
        pytest.warns(UnprotectedRetryWarning, match="commit outcome"),
        caplog.at_level(logging.WARNING, logger="jobfence.retry"),
        pytest.raises(CommitOutcomeUnknown) as info,
    ):
        unprotected()
    assert info.value is error and calls == 1
    assert any("protected" in r.getMessage() for r in caplog.records)


def test_commit_outcome_unknown_is_retried_for_a_protected_unit(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(protected=True)
    def protected() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise CommitOutcomeUnknown("lost")
        return "ok"

    assert protected() == "ok" and calls == 2


def test_mark_protected_protects_only_the_attempt_that_called_it(clock: ManualClock) -> None:
    calls = 0

    @retry_unit(attempts=5)
    def unit() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            mark_protected()  # what inbox.claim_in does
        raise CommitOutcomeUnknown(f"lost {calls}")

    with pytest.warns(UnprotectedRetryWarning), pytest.raises(CommitOutcomeUnknown) as info:
        unit()
    # attempt 1 was protected and retried; attempt 2 did not mark itself: not retried
    assert calls == 2 and str(info.value) == "lost 2"


async def test_mark_protected_in_async_unit_and_nested_calls(clock: ManualClock) -> None:
    calls = 0

    async def claim_in() -> None:  # stands for jobfence's own claim_in
        await asyncio.sleep(0)
        mark_protected()

    @retry_unit(attempts=3)
    async def unit() -> str:
        nonlocal calls
        calls += 1
        await claim_in()
        if calls < 3:
            raise CommitOutcomeUnknown("lost")
        return "ok"

    assert await unit() == "ok" and calls == 3


def test_mark_protected_outside_a_unit_is_a_no_op() -> None:
    mark_protected()


# ------------------------------------------------------------------ decorator forms


def test_decorator_with_and_without_arguments_keeps_metadata(clock: ManualClock) -> None:
    @retry_unit
    def plain(a: int, b: str = "x") -> str:
        """Plain doc."""
        return f"{a}{b}"

    @retry_unit(attempts=3)
    def configured(a: int, *, b: str = "x") -> str:
        """Configured doc."""
        return f"{a}{b}"

    assert plain(1) == "1x" and configured(2, b="y") == "2y"
    assert plain.__name__ == "plain" and plain.__doc__ == "Plain doc."
    assert configured.__name__ == "configured" and configured.__doc__ == "Configured doc."
    assert str(inspect.signature(plain)) == "(a: 'int', b: 'str' = 'x') -> 'str'"
    assert str(inspect.signature(configured)) == "(a: 'int', *, b: 'str' = 'x') -> 'str'"
    assert configured.retry_policy.attempts == 3  # type: ignore[attr-defined]
    assert plain.retry_policy == RetryPolicy()  # type: ignore[attr-defined]


def test_bad_options_raise_configuration_error_naming_the_argument() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"deadline": -1}, "deadline"),
        ({"backoff": -0.1}, "backoff"),
        ({"retry_on": "KeyError"}, "retry_on"),
        ({"on_retry": 3}, "on_retry"),
        ({"rng": object()}, "rng"),
        ({"atempts": 3}, "atempts"),
    ]
    for options, argument in cases:
        with pytest.raises(ConfigurationError) as info:
            retry_unit(**options)
        assert info.value.argument == argument


def test_paramspec_typing_is_preserved(tmp_path: Path) -> None:
    mypy_api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            import jobfence

            @jobfence.retry_unit
            def plain(a: int, b: str = "x") -> float:
                return 1.0

            @jobfence.retry_unit(attempts=3)
            async def configured(a: int) -> list[str]:
                return []

            async def main() -> None:
                ok: float = plain(1, b="y")
                items: list[str] = await configured(1)
                plain("no")
                await configured(a="no")
            """
        )
    )
    stdout, _, status = mypy_api.run(
        [
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            "--cache-dir=/dev/null",
            str(snippet),
        ]
    )
    assert status == 1, stdout
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, stdout
    assert 'Argument 1 to "plain" has incompatible type "str"; expected "int"' in stdout
    assert 'Argument "a" to "configured" has incompatible type "str"; expected "int"' in stdout


# ------------------------------------------------------------------------- loop form


def test_retrying_loop_form(clock: ManualClock) -> None:
    store = Store(10)
    attempts: list[int] = []
    for attempt in jobfence.retrying(attempts=3):
        with attempt:
            attempts.append(attempt.number)
            stock, version = store.read()
            if attempt.number == 1:
                store.write(7, store.version)  # a rival write
            store.write(stock - 5, version)
    assert attempts == [1, 2] and store.stock == 2


async def test_async_retrying_loop_form_reraises_the_original(clock: ManualClock) -> None:
    error = StaleVersion("always")
    numbers: list[int] = []
    with pytest.raises(StaleVersion) as info:
        async for attempt in jobfence.retrying(attempts=2):
            with attempt:
                numbers.append(attempt.number)
                raise error
    assert info.value is error and numbers == [1, 2]


# ------------------------------------------------- never retry inside an open transaction


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE stock (id INTEGER PRIMARY KEY, qty INTEGER)")
    conn.execute("INSERT INTO stock VALUES (1, 10)")
    try:
        yield conn
    finally:
        conn.close()


def test_refuses_to_retry_inside_the_callers_open_transaction(
    clock: ManualClock, db: sqlite3.Connection
) -> None:
    calls = 0

    @retry_unit
    def deduct(conn: sqlite3.Connection, qty: int) -> None:
        nonlocal calls
        calls += 1
        conn.execute("UPDATE stock SET qty = qty - ? WHERE id = 1", (qty,))
        raise StaleVersion("conflict")  # as if the conditional write found another version

    db.execute("BEGIN")  # the caller's transaction: retrying deduct inside it is wrong
    with pytest.raises(ConfigurationError, match="inside a transaction") as info:
        deduct(db, 3)
    assert calls == 1
    assert info.value.argument == "argument 'conn'"
    assert isinstance(info.value.__cause__, StaleVersion)
    db.execute("ROLLBACK")


def test_retries_a_unit_that_owns_its_transaction_on_the_same_connection(
    clock: ManualClock, db: sqlite3.Connection
) -> None:
    calls = 0

    @retry_unit
    def deduct(conn: sqlite3.Connection, qty: int) -> None:
        nonlocal calls
        calls += 1
        conn.execute("BEGIN")
        try:
            conn.execute("UPDATE stock SET qty = qty - ? WHERE id = 1", (qty,))
            if calls == 1:
                raise StaleVersion("conflict")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    deduct(db, 3)
    assert calls == 2
    assert db.execute("SELECT qty FROM stock").fetchone() == (7,)


def test_refuses_when_the_unit_leaves_its_failed_transaction_open(
    clock: ManualClock, db: sqlite3.Connection
) -> None:
    calls = 0

    @retry_unit
    def sloppy(conn: sqlite3.Connection) -> None:
        nonlocal calls
        calls += 1
        conn.execute("BEGIN")
        conn.execute("UPDATE stock SET qty = 0 WHERE id = 1")
        raise StaleVersion("conflict")  # no rollback: the next attempt would run inside it

    with pytest.raises(ConfigurationError, match="still inside a transaction"):
        sloppy(conn=db)
    assert calls == 1
    db.execute("ROLLBACK")


def test_nested_unit_defers_to_the_enclosing_unit(
    clock: ManualClock, db: sqlite3.Connection
) -> None:
    inner_calls = outer_calls = 0

    @retry_unit
    def inner(conn: sqlite3.Connection) -> None:
        nonlocal inner_calls
        inner_calls += 1
        conn.execute("UPDATE stock SET qty = qty - 1 WHERE id = 1")
        if outer_calls == 1:
            raise StaleVersion("conflict")

    @retry_unit
    def outer() -> None:
        nonlocal outer_calls
        outer_calls += 1
        db.execute("BEGIN")
        try:
            inner(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    outer()
    # the inner unit did not retry inside the outer transaction; the outer re-ran everything
    assert (outer_calls, inner_calls) == (2, 2)
    assert db.execute("SELECT qty FROM stock").fetchone() == (9,)


async def test_retry_on_still_retries_an_asyncio_timeout(clock: ManualClock) -> None:
    """asyncio's TimeoutError is raised from a CancelledError: that cause must not make it a
    never-retry error (found in review)."""
    calls = 0

    @retry_unit(attempts=3, retry_on=TimeoutError)
    async def slow() -> None:
        nonlocal calls
        calls += 1
        await asyncio.wait_for(asyncio.Event().wait(), 0.001)

    with pytest.raises(TimeoutError):
        await slow()
    assert calls == 3
