"""``jobfence.testing.scenarios`` with plain functions: each runs as thread tasks with the
blocking clients and the tables' blocking views; the naive version fails with the scenario's
check and a tape that replays, jobfence's version passes, as with async functions."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import scenarios
from jobfence.testing.scenarios import (
    LimitContext,
    MessageContext,
    OrderContext,
    PodContext,
    TableContext,
)


def add_naive(ctx: TableContext) -> None:
    row = ctx.table.read(ctx.key)
    ctx.table.write(ctx.key, value=row["value"] + 1)


def add_versioned(ctx: TableContext) -> None:
    @jobfence.retry_unit(attempts=10)
    def unit() -> None:
        row = ctx.table.read(ctx.key)
        jobfence.versioned_update(
            ctx.table, "counters", {"id": ctx.key}, row["version"], {"value": row["value"] + 1}
        )

    unit()


def charge_naive(message: Any, ctx: MessageContext) -> None:
    ctx.effect("charge", message.id)


def charge_guarded(message: Any, ctx: MessageContext) -> None:
    @jobfence.guarded(inbox=ctx.inbox, key=lambda m: m.id)
    def charge(m: Any) -> None:
        ctx.effect("charge", m.id)

    charge(message)


def charge_in_transaction(message: Any, ctx: MessageContext) -> None:
    with ctx.table.transaction() as tx:
        if ctx.inbox.claim_in(tx, message.id):
            ctx.effect("charge", message.id, tx=tx)


def report_naive(ctx: TableContext) -> None:
    lease = ctx.locks.acquire(ctx.key, ttl=30)
    try:
        ctx.point("render")
        ctx.table.write(ctx.key, content=f"by {ctx.worker}")
    finally:
        lease.release()


def report_fenced(ctx: TableContext) -> None:
    lease = ctx.locks.acquire(ctx.key, ttl=30)
    try:
        ctx.point("render")
        with ctx.table.transaction() as tx:
            jobfence.fence(tx, ctx.key, lease.token)
            tx.write(ctx.key, content=f"by {ctx.worker}")
    finally:
        lease.release()


def order_naive(ctx: OrderContext) -> None:
    with ctx.table.transaction() as tx:
        row = tx.read(ctx.key)
        tx.write(ctx.key, balance=row["balance"] - 10)
        ctx.effect("charge", ctx.order, tx=tx)


def order_claimed(ctx: OrderContext) -> None:
    @jobfence.retry_unit(attempts=5)
    def unit() -> None:
        with ctx.table.transaction() as tx:
            if not ctx.inbox.claim_in(tx, ctx.order):
                return
            row = tx.read(ctx.key)
            jobfence.versioned_update(
                tx, "accounts", {"id": ctx.key}, row["version"], {"balance": row["balance"] - 10}
            )
            ctx.effect("charge", ctx.order, tx=tx)

    unit()


def welcome_naive(ctx: TableContext) -> None:
    if ctx.table.read(ctx.key) is None:
        ctx.effect("welcome", ctx.key)
        ctx.table.write(ctx.key, welcomed=True)


def welcome_claimed(ctx: TableContext) -> None:
    claim = ctx.inbox.claim(f"welcome:{ctx.key}")
    if claim.state is jobfence.ClaimState.NEW:
        ctx.effect("welcome", ctx.key)
        claim.complete()


def tick_locked(slot: str, ctx: PodContext) -> None:
    lease = ctx.locks.try_acquire(f"cron:{ctx.schedule}", ttl=10, renew=False)
    if lease is None:
        return
    with lease:
        ctx.fire(slot)
        ctx.sleep(1)


def tick_claimed(slot: str, ctx: PodContext) -> None:
    claim = ctx.inbox.claim(f"schedule:{ctx.schedule}@{slot}", ttl=30)
    if claim.state is jobfence.ClaimState.NEW:
        ctx.fire(slot)
        ctx.sleep(1)
        claim.complete("fired")


def call_counted(ctx: LimitContext) -> None:
    row = ctx.table.read(ctx.name)
    if row["used"] >= ctx.limit:
        return
    ctx.table.write(ctx.name, used=row["used"] + 1)
    try:
        with ctx.using():
            ctx.point("call")
    finally:
        row = ctx.table.read(ctx.name)
        ctx.table.write(ctx.name, used=row["used"] - 1)


def call_permitted(ctx: LimitContext) -> None:
    lease = ctx.locks.try_acquire(ctx.name, limit=ctx.limit, ttl=30)
    if lease is None:
        return
    with lease, ctx.using(lease):
        ctx.point("call")


def commit_then_publish(ctx: OrderContext) -> None:
    with ctx.table.transaction() as tx:
        tx.write(ctx.order, total=42)
    ctx.queue.publish({"order": ctx.order}, id=ctx.order)


def with_outbox(ctx: OrderContext) -> None:
    with ctx.table.transaction() as tx:
        tx.write(ctx.order, total=42)
        ctx.outbox.add(tx, queue="orders", body={"order": ctx.order}, id=ctx.order)


SYNC_CASES = [
    ("lost_update", scenarios.lost_update, add_naive, add_versioned),
    ("duplicate_delivery", scenarios.duplicate_delivery, charge_naive, charge_in_transaction),
    ("lost_ack", scenarios.lost_ack, charge_naive, charge_guarded),
    ("paused_holder", scenarios.paused_holder, report_naive, report_fenced),
    ("commit_unknown", scenarios.commit_unknown, order_naive, order_claimed),
    ("check_then_act", scenarios.check_then_act, welcome_naive, welcome_claimed),
    ("slot_fired_twice", scenarios.slot_fired_twice, tick_locked, tick_claimed),
    ("over_limit", scenarios.over_limit, call_counted, call_permitted),
    ("dual_write", scenarios.dual_write, commit_then_publish, with_outbox),
]


Run = Callable[..., testing.Report]
IDS = [case[0] for case in SYNC_CASES]


@pytest.mark.parametrize(("name", "run", "naive", "fixed"), SYNC_CASES, ids=IDS)
def test_a_plain_naive_function_fails_and_its_tape_replays(
    name: str, run: Run, naive: Any, fixed: Any
) -> None:
    report = run(naive, schedules=300)
    failure = report.failures[0]
    assert failure.check == CHECKS[name]
    again = failure.replay().failures[0]
    assert (again.check, again.message, again.tape) == (
        failure.check,
        failure.message,
        failure.tape,
    )


@pytest.mark.parametrize(("name", "run", "naive", "fixed"), SYNC_CASES, ids=IDS)
def test_a_plain_jobfence_function_passes(name: str, run: Run, naive: Any, fixed: Any) -> None:
    report = run(fixed, schedules=100)
    report.assert_ok()
    assert report.schedules == 100


CHECKS = {
    "lost_update": "no_lost_update",
    "duplicate_delivery": "exactly_once",
    "lost_ack": "exactly_once",
    "paused_holder": "stale_write",
    "commit_unknown": "exactly_once",
    "check_then_act": "exactly_once",
    "slot_fired_twice": "once_per_slot",
    "over_limit": "at_most_holders",
    "dual_write": "published_once",
}


def test_a_plain_function_runs_in_a_thread_task_and_its_verbs_need_no_await() -> None:
    seen: list[tuple[str, bool, Any]] = []

    def look(ctx: TableContext) -> None:
        task = ctx.sim.current()
        assert task is not None
        done = ctx.effect("welcome", ctx.worker)  # already done: nothing to await
        seen.append((ctx.worker, task.thread, ctx.sim.effects["welcome"][-1]))
        for verb in (done, ctx.point("step"), ctx.sleep(1)):  # awaitables, never coroutines
            assert not inspect.iscoroutine(verb) and inspect.isawaitable(verb)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "never awaited" warning
        scenarios.check_then_act(look, workers=2, schedules=1).assert_ok()
    assert sorted(seen) == [("w1", True, "w1"), ("w2", True, "w2")]


def test_a_plain_function_returning_a_coroutine_is_a_bug_of_the_test() -> None:
    async def job(ctx: TableContext) -> None:
        pass

    report = scenarios.check_then_act(lambda ctx: job(ctx), workers=1, schedules=1)
    failure = report.failures[0]
    assert failure.check == "exception"
    assert isinstance(failure.error, jobfence.ConfigurationError)
    assert failure.error.argument == "fn"


def test_using_with_and_async_with_are_each_for_their_kind_of_task() -> None:
    errors: list[str | None] = []

    async def async_with_plain_with(ctx: LimitContext) -> None:
        try:
            with ctx.using():
                pass
        except jobfence.ConfigurationError as exc:
            errors.append(exc.argument)

    scenarios.over_limit(async_with_plain_with, workers=1, schedules=1).assert_ok()
    assert errors == ["lease"]


def test_a_plain_function_taking_the_wrong_arguments_is_refused() -> None:
    def handle(ctx: Any) -> None:
        pass

    with pytest.raises(jobfence.ConfigurationError) as exc:
        scenarios.lost_ack(handle)
    assert exc.value.argument == "fn"
    assert "fn is called as fn(message, ctx)" in str(exc.value)
