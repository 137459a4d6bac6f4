"""``jobfence.testing.scenarios``: each ready scenario finds its race in a naive version of the
user's function (the check that failed, its message, and a tape that replays to the same
failure) and passes jobfence's version; bad arguments name themselves."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import faults, scenarios
from jobfence.testing.scenarios import (
    LimitContext,
    MessageContext,
    OrderContext,
    PodContext,
    TableContext,
)

# -- lost update ------------------------------------------------------------------------------


async def add_naive(ctx: TableContext) -> None:
    row = await ctx.table.read(ctx.key)
    await ctx.table.write(ctx.key, value=row["value"] + 1)  # computed from a stale read


async def add_versioned(ctx: TableContext) -> None:
    @jobfence.retry_unit(attempts=10)
    async def unit() -> None:
        row = await ctx.table.read(ctx.key)
        new = {"value": row["value"] + 1}
        await jobfence.versioned_update_async(
            ctx.table, ctx.table.name, {"id": ctx.key}, row["version"], new
        )

    await unit()


# -- duplicate delivery, lost ack -------------------------------------------------------------


async def charge_naive(message: Any, ctx: MessageContext) -> None:
    await ctx.effect("charge", message.id)


async def charge_guarded(message: Any, ctx: MessageContext) -> None:
    @jobfence.guarded(inbox=ctx.inbox, key=lambda m: m.id)
    async def charge(m: Any) -> None:
        await ctx.effect("charge", m.id)

    await charge(message)


async def charge_in_transaction(message: Any, ctx: MessageContext) -> None:
    async with ctx.table.transaction() as tx:
        if await ctx.inbox.claim_in(tx, message.id):
            await ctx.effect("charge", message.id, tx=tx)


# -- paused holder ----------------------------------------------------------------------------


async def report_naive(ctx: TableContext) -> None:
    lease = await ctx.locks.acquire(ctx.key, ttl=30)
    try:
        await ctx.point("render")
        await ctx.table.write(ctx.key, content=f"by {ctx.worker}")
    finally:
        await lease.release()


async def report_fenced(ctx: TableContext) -> None:
    lease = await ctx.locks.acquire(ctx.key, ttl=30)
    try:
        await ctx.point("render")
        async with ctx.table.transaction() as tx:
            await jobfence.fence_async(tx, ctx.key, lease.token)  # StaleToken if taken over
            await tx.write(ctx.key, content=f"by {ctx.worker}")
    finally:
        await lease.release()


# -- commit outcome unknown -------------------------------------------------------------------


async def order_naive(ctx: OrderContext) -> None:
    async with ctx.table.transaction() as tx:
        row = await tx.read(ctx.key)
        await tx.write(ctx.key, balance=row["balance"] - 10)
        await ctx.effect("charge", ctx.order, tx=tx)


async def order_claimed(ctx: OrderContext) -> None:
    @jobfence.retry_unit(attempts=5)
    async def unit() -> None:
        async with ctx.table.transaction() as tx:
            if not await ctx.inbox.claim_in(tx, ctx.order):
                return  # applied already: only its commit's answer was lost
            row = await tx.read(ctx.key)
            new = {"balance": row["balance"] - 10}
            await jobfence.versioned_update_async(
                tx, ctx.table.name, {"id": ctx.key}, row["version"], new
            )
            await ctx.effect("charge", ctx.order, tx=tx)

    await unit()


# -- check then act ---------------------------------------------------------------------------


async def welcome_naive(ctx: TableContext) -> None:
    if await ctx.table.read(ctx.key) is None:
        await ctx.effect("welcome", ctx.key)
        await ctx.table.write(ctx.key, welcomed=True)


async def welcome_claimed(ctx: TableContext) -> None:
    claim = await ctx.inbox.claim(f"welcome:{ctx.key}")
    if claim.state is jobfence.ClaimState.NEW:
        await ctx.effect("welcome", ctx.key)
        await claim.complete()


# -- slot fired twice -------------------------------------------------------------------------


async def tick_locked(slot: str, ctx: PodContext) -> None:
    lease = await ctx.locks.try_acquire(f"cron:{ctx.schedule}", ttl=10, renew=False)
    if lease is None:
        return  # another pod runs it now
    async with lease:
        await ctx.fire(slot)
        await ctx.sleep(1)


async def tick_claimed(slot: str, ctx: PodContext) -> None:
    claim = await ctx.inbox.claim(f"schedule:{ctx.schedule}@{slot}", ttl=30)
    if claim.state is jobfence.ClaimState.NEW:
        await ctx.fire(slot)
        await ctx.sleep(1)
        await claim.complete("fired")


# -- over the limit ---------------------------------------------------------------------------


async def call_counted(ctx: LimitContext) -> None:
    row = await ctx.table.read(ctx.name)
    if row["used"] >= ctx.limit:
        return
    await ctx.table.write(ctx.name, used=row["used"] + 1)
    try:
        async with ctx.using():
            await ctx.point("call")
    finally:
        row = await ctx.table.read(ctx.name)
        await ctx.table.write(ctx.name, used=row["used"] - 1)


async def call_permitted(ctx: LimitContext) -> None:
    lease = await ctx.locks.try_acquire(ctx.name, limit=ctx.limit, ttl=30)
    if lease is None:
        return
    async with lease, ctx.using(lease):
        await ctx.point("call")


# -- dual write -------------------------------------------------------------------------------


async def commit_then_publish(ctx: OrderContext) -> None:
    async with ctx.table.transaction() as tx:
        await tx.write(ctx.order, total=42)
    await ctx.queue.publish({"order": ctx.order}, id=ctx.order)


async def publish_then_commit(ctx: OrderContext) -> None:
    await ctx.queue.publish({"order": ctx.order}, id=ctx.order)
    async with ctx.table.transaction() as tx:
        await tx.write(ctx.order, total=42)


async def with_outbox(ctx: OrderContext) -> None:
    async with ctx.table.transaction() as tx:
        await tx.write(ctx.order, total=42)
        await ctx.outbox.add(tx, queue="orders", body={"order": ctx.order}, id=ctx.order)


# -- every scenario: the naive version fails, jobfence's passes --------------------------------

Run = Callable[..., testing.Report]

CASES: list[tuple[str, Run, Any, Any, str, str]] = [
    (
        "lost_update",
        scenarios.lost_update,
        add_naive,
        add_versioned,
        "no_lost_update",
        "that change is lost",
    ),
    (
        "duplicate_delivery",
        scenarios.duplicate_delivery,
        charge_naive,
        charge_in_transaction,
        "exactly_once",
        "charge applied more than once for 'order-1'",
    ),
    (
        "lost_ack",
        scenarios.lost_ack,
        charge_naive,
        charge_guarded,
        "exactly_once",
        "charge applied more than once for 'order-1'",
    ),
    (
        "paused_holder",
        scenarios.paused_holder,
        report_naive,
        report_fenced,
        "stale_write",
        "the write of a holder whose lease had expired was accepted",
    ),
    (
        "commit_unknown",
        scenarios.commit_unknown,
        order_naive,
        order_claimed,
        "exactly_once",
        "charge applied more than once for 'order-",
    ),
    (
        "check_then_act",
        scenarios.check_then_act,
        welcome_naive,
        welcome_claimed,
        "exactly_once",
        "welcome applied more than once for 'user-1'",
    ),
    (
        "slot_fired_twice",
        scenarios.slot_fired_twice,
        tick_locked,
        tick_claimed,
        "once_per_slot",
        "schedule 'report' fired slot '2026-01-01T00:01:00Z' 2 times",
    ),
    (
        "over_limit",
        scenarios.over_limit,
        call_counted,
        call_permitted,
        "at_most_holders",
        "holders, more than 2",
    ),
    (
        "dual_write",
        scenarios.dual_write,
        commit_then_publish,
        with_outbox,
        "published_once",
        "saved, never published (lost)",
    ),
]
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("name", "run", "naive", "fixed", "check", "message"), CASES, ids=IDS)
def test_the_naive_version_fails_and_its_tape_replays(
    name: str, run: Run, naive: Any, fixed: Any, check: str, message: str
) -> None:
    report = run(naive)  # stops at the first failure
    assert not report.ok, name
    failure = report.failures[0]
    assert failure.check == check
    assert message in failure.message
    again = failure.replay().failures[0]
    assert (again.check, again.message) == (failure.check, failure.message)
    assert again.tape == failure.tape


@pytest.mark.parametrize(("name", "run", "naive", "fixed", "check", "message"), CASES, ids=IDS)
def test_the_jobfence_version_passes(
    name: str, run: Run, naive: Any, fixed: Any, check: str, message: str
) -> None:
    report = run(fixed, schedules=100)
    report.assert_ok()
    assert report.schedules == 100


def test_a_guarded_handler_with_an_external_effect_loses_to_a_pause_before_complete() -> None:
    # the window the inbox leaves: the effect done, the result not stored, the claim expired
    failure = scenarios.duplicate_delivery(charge_guarded).failures[0]
    assert failure.check == "exactly_once"
    assert [(f.kind, f.point) for f in failure.tape.faults] == [
        ("pause_past_ttl", "inbox.complete")
    ]


def test_publish_then_commit_announces_an_order_never_saved() -> None:
    failure = scenarios.dual_write(publish_then_commit).failures[0]
    assert failure.check == "published_once"
    assert failure.message.endswith("published, its order never saved")


def test_without_skew_the_lock_deduplicated_tick_fires_each_slot_once() -> None:
    scenarios.slot_fired_twice(tick_locked, skew=0, schedules=50).assert_ok()


def test_the_options_reach_explore() -> None:
    report = scenarios.check_then_act(welcome_claimed, schedules=7, seed=3, strategy="pct")
    assert (report.schedules, report.seed, report.strategy, report.faults) == (7, 3, "pct", "none")
    report = scenarios.lost_update(add_versioned, schedules=5, faults=None)
    assert report.faults == "none"
    # a check of the user's own, on top of the scenario's
    report = scenarios.check_then_act(welcome_claimed, schedules=5, checks=[AlwaysWrong()])
    assert report.failures[0].check == "always_wrong"


class AlwaysWrong(testing.Checker):
    name = "always_wrong"

    def end(self, sim: Any) -> str | None:
        return "wrong"


# -- the context ------------------------------------------------------------------------------


def test_an_effect_in_a_transaction_counts_only_when_it_commits() -> None:
    async def rolled_back_then_committed(ctx: TableContext) -> None:
        try:
            async with ctx.table.transaction() as tx:
                await ctx.effect("welcome", ctx.key, tx=tx)
                raise jobfence.ConflictError("rolled back")
        except jobfence.ConflictError:
            pass
        async with ctx.table.transaction() as tx:
            await ctx.effect("welcome", ctx.key, tx=tx)

    scenarios.check_then_act(rolled_back_then_committed, workers=1, schedules=3).assert_ok()
    report = scenarios.check_then_act(rolled_back_then_committed, workers=2, schedules=3)
    assert report.failures[0].message == "welcome applied more than once for 'user-1'"


def test_the_context_names_the_worker_and_refuses_a_bad_tx() -> None:
    seen: list[str] = []

    async def look(ctx: TableContext) -> None:
        seen.append(ctx.worker)
        assert ctx.sim.current().name == ctx.worker  # type: ignore[union-attr]
        try:
            await ctx.effect("welcome", ctx.key, tx="not a transaction")
        except jobfence.ConfigurationError as exc:
            seen.append(str(exc.argument))

    scenarios.check_then_act(look, workers=3, schedules=1).assert_ok()
    assert seen == ["w1", "tx", "w2", "tx", "w3", "tx"]


def test_a_bug_in_the_function_fails_the_schedule_in_every_scenario() -> None:
    async def buggy(*args: Any) -> None:
        raise TypeError("a bug")

    for case in CASES:
        report = case[1](buggy, schedules=2)
        assert report.failures[0].check == "exception", case[0]
        assert isinstance(report.failures[0].error, TypeError), case[0]


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "run"), [(c[0], c[1]) for c in CASES], ids=IDS)
def test_bad_arguments_name_themselves(name: str, run: Run) -> None:
    fixed = next(case[3] for case in CASES if case[0] == name)
    for fn in (None, "handle", 3):
        with pytest.raises(jobfence.ConfigurationError) as exc:
            run(fn)
        assert exc.value.argument == "fn"
    bad: list[tuple[str, Any]] = [
        ("schedules", 0),
        ("seed", -1),
        ("strategy", "clever"),
        ("faults", "all"),
        ("checks", ["no checker"]),
    ]
    count = {"slot_fired_twice": "pods", "over_limit": "limit"}.get(name, "workers")
    bad += [(count, 0), (count, True), (count, 1.5)]
    if name in ("lost_update", "commit_unknown"):
        bad += [("rows", {}), ("rows", {"a": 1}), ("rows", [])]
    if name == "commit_unknown":
        bad += [("deliveries", 0)]
    if name == "slot_fired_twice":
        bad += [("skew", float("nan")), ("skew", "2"), ("slots", 0)]
    for argument, value in bad:
        with pytest.raises(jobfence.ConfigurationError) as exc:
            run(fixed, **{argument: value})
        assert exc.value.argument == argument, (argument, value)


def test_the_module_is_exported() -> None:
    assert "scenarios" in testing.__all__
    assert testing.scenarios is scenarios
    for name in IDS:
        assert name in scenarios.__all__


def test_a_fault_list_replaces_the_default() -> None:
    report = scenarios.lost_ack(charge_naive, faults=[], schedules=20)
    assert report.ok  # no ack lost, nothing delivered twice
    report = scenarios.lost_ack(charge_naive, faults=[faults.lost_ack()], schedules=20)
    assert report.failures[0].tape.faults == (faults.lost_ack(),)


def test_every_scenario_explains_each_of_its_parameters() -> None:
    for name in IDS:
        run = getattr(scenarios, name)
        doc = inspect.getdoc(run) or ""
        params = inspect.signature(run).parameters
        missing = [p for p in params if not re.search(rf"``{p}\b", doc)]
        assert not missing, f"{name}: {missing}"


def test_an_effect_key_need_not_be_hashable() -> None:
    async def twice(ctx: TableContext) -> None:
        await ctx.effect("sent", ["a", 1])
        async with ctx.table.transaction() as tx:
            await ctx.effect("sent", ["a", 1], tx=tx)

    report = scenarios.check_then_act(twice, workers=1, schedules=1)
    assert report.failures[0].message == "sent applied more than once for \"['a', 1]\""


def test_a_function_taking_the_wrong_arguments_is_refused_before_any_schedule() -> None:
    async def handle(ctx: Any) -> None:
        pass

    with pytest.raises(jobfence.ConfigurationError) as exc:
        scenarios.duplicate_delivery(handle)
    assert exc.value.argument == "fn"
    assert "fn is called as fn(message, ctx)" in str(exc.value)
    with pytest.raises(jobfence.ConfigurationError) as exc:
        scenarios.lost_update(charge_naive)
    assert "fn is called as fn(ctx)" in str(exc.value)
    with pytest.raises(jobfence.ConfigurationError) as exc:
        scenarios.slot_fired_twice(add_naive)
    assert "fn is called as fn(slot, ctx)" in str(exc.value)
    # keywords with defaults, *args, a partial and an object with an async __call__ are fine

    async def flexible(*args: Any, retries: int = 3) -> None:
        pass

    class Handler:
        async def __call__(self, message: Any, ctx: Any) -> None:
            await ctx.effect("charge", message.id)

    scenarios.check_then_act(flexible, schedules=2).assert_ok()
    scenarios.lost_ack(functools.partial(flexible, retries=1), schedules=2).assert_ok()
    assert scenarios.lost_ack(Handler()).failures[0].check == "exactly_once"


def test_an_order_announced_both_ways_is_published_twice() -> None:
    async def both(ctx: OrderContext) -> None:
        await with_outbox(ctx)
        await ctx.queue.publish({"order": ctx.order}, id=ctx.order)  # and the relay sends it

    failure = scenarios.dual_write(both, faults=None, schedules=5).failures[0]
    assert failure.check == "published_once"
    assert failure.message.startswith("message 'order-1'")
    assert failure.message.endswith("published to queue 'orders' more than once")
