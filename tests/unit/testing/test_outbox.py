"""The outbox in jobfence.testing: the dual-write races, found, replayed, and closed.

A simulated transaction keeps the outbox rows ``AsyncOutbox.add`` gives it until it commits
(none after a rollback, a failed commit or a crash before the commit); ``sim.outbox()`` keeps
them in the schedule's memory, where ``jobfence.AsyncRelay`` claims, publishes and settles
them at hook points, on virtual time. With that:

* "commit, then publish" loses the order's message when the process dies (or the broker
  fails, or the commit's answer is lost) between the two: explore finds it, and its seed and
  tape replay it exactly;
* "publish, then commit" publishes a message for an order a failed commit never saved;
* the outbox (the message added in the order's transaction, two relays publishing) keeps the
  saved orders and the published messages equal under the same faults, and every fault
  ``faults="auto"`` tries, a relay crashed or stopped with rows in hand included;
* two live relays never publish a row twice, where a naive relay loop without the claim
  does; a relay stopped past its lease, or one whose "published" mark failed, does send a row
  again (the documented at-least-once: the consumer's inbox dedupes on the id).
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import Simulation, faults

#: the module (``jobfence.testing.explore`` is also the function's name)
EXPLORE = importlib.import_module("jobfence.testing.explore")

Job = Callable[[testing.SimTable, Any, Any, int], Awaitable[None]]
Scenario = Callable[[Simulation], Awaitable[None]]


# -- the shop: one order, saved and announced on the queue "orders" ------------------------
async def commit_then_publish(db: testing.SimTable, queue: Any, outbox: Any, order: int) -> None:
    async with db.transaction() as tx:
        await tx.write(order, total=42)
    await queue.publish({"order": order}, id=f"order-{order}")


async def publish_then_commit(db: testing.SimTable, queue: Any, outbox: Any, order: int) -> None:
    await queue.publish({"order": order}, id=f"order-{order}")
    async with db.transaction() as tx:
        await tx.write(order, total=42)


async def with_outbox(db: testing.SimTable, queue: Any, outbox: Any, order: int) -> None:
    async with db.transaction() as tx:
        await tx.write(order, total=42)
        await outbox.add(tx, queue="orders", body={"order": order}, id=f"order-{order}")


def shop(place_order: Job, crashed: list[str] | None = None) -> Scenario:
    """The order job beside two relays that run until the job is done and every lease a
    dead relay left has run out; then a relay restarted after the faults publishes what is
    left. Fails unless the saved orders are the published ones. ``crashed`` collects the
    names of the tasks that died, schedule after schedule."""

    async def scenario(sim: Simulation) -> None:
        db, queue, outbox = sim.table("orders"), sim.queue("orders"), sim.outbox()
        relays = [jobfence.AsyncRelay(outbox, queue, lease=5) for _ in range(2)]
        job = sim.spawn(place_order, db, queue, outbox, 7, name="shop")
        for i, relay in enumerate(relays):
            sim.spawn(relay.run, name=f"relay-{i}")
        await sim.join(job)
        await sim.sleep(10)  # past the 5 s lease of the rows a dead relay held
        for relay in relays:
            relay.stop()
        await sim.join()
        await jobfence.AsyncRelay(outbox, queue).run_once()
        if crashed is not None:
            crashed.extend(t.name for t in sim.tasks if t.process.crashed)
        saved = sorted(f"order-{order}" for order in db.rows())
        sent = sorted(set(sim.published("orders")))
        sim.check(saved == sent, f"orders saved {saved}, published {sent}")

    return scenario


CRASH_BETWEEN = [faults.crash("queue.publish")]  # the first publish: right after the commit


def test_commit_then_publish_loses_the_order_and_its_seed_replays_it_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenario = shop(commit_then_publish)
    report = testing.explore(scenario, faults=CRASH_BETWEEN)
    (failure,) = report.failures
    assert (failure.index, failure.check) == (0, "check")
    assert failure.message == "orders saved ['order-7'], published []"
    assert failure.tape.faults == tuple(CRASH_BETWEEN)
    for again in (failure.replay(), testing.replay(scenario, str(failure.tape))):
        (same,) = again.failures
        assert (same.message, same.tape) == (failure.message, failure.tape)

    # without being told where: faults="auto" finds a failure between the two writes
    found = testing.explore(scenario, schedules=100, faults="auto")
    (auto,) = found.failures
    assert auto.message == "orders saved ['order-7'], published []" and auto.index > 0
    assert auto.tape.faults[0].point in ("db.commit", "queue.publish")
    # pytest --jobfence-seed=N: that schedule alone (after schedule 0), the same failure
    monkeypatch.setattr(EXPLORE, "_REPLAY_SEED", auto.seed)
    rerun = testing.explore(scenario, schedules=100, faults="auto")
    (same,) = rerun.failures
    assert rerun.schedules == 2
    assert (same.seed, same.message, same.tape) == (auto.seed, auto.message, auto.tape)


def test_publish_then_commit_publishes_an_order_a_failed_commit_never_saved() -> None:
    report = testing.explore(shop(publish_then_commit), schedules=100, faults="auto")
    (failure,) = report.failures
    assert failure.message == "orders saved [], published ['order-7']"
    assert failure.tape.faults[0].point in ("db.write", "db.commit")
    (same,) = failure.replay().failures
    assert (same.message, same.tape) == (failure.message, failure.tape)


def test_the_outbox_saves_and_publishes_together_under_the_same_faults() -> None:
    """The crash between commit and publish hits a relay here, with the row in hand: the
    other relay publishes it once its lease runs out. faults="auto" tries every single and
    double fault at every point, relays crashed and paused after their claims included."""
    crashed: list[str] = []
    testing.explore(shop(with_outbox, crashed), schedules=150, faults=CRASH_BETWEEN).assert_ok()
    assert {"relay-0", "relay-1"} <= set(crashed)
    crashed.clear()
    report = testing.explore(shop(with_outbox, crashed), schedules=200, faults="auto")
    report.assert_ok()
    assert report.schedules == 200
    assert any(name.startswith("relay-") for name in crashed)  # auto crashed a relay too


# -- two relays, one row ------------------------------------------------------------------
async def naive_relay(sim: Simulation, db: testing.SimTable, queue: Any, outbox: Any) -> None:
    """Every 20 s: read the row, publish it unless it is marked, mark it (no claim)."""
    for _ in range(3):
        row = await db.read("order-7")
        assert row is not None
        if not row["published"]:
            await queue.publish(row["body"], id="order-7")
            await db.write("order-7", published=True)
        await sim.sleep(20)


async def jobfence_relay(sim: Simulation, db: testing.SimTable, queue: Any, outbox: Any) -> None:
    """Every 20 s: publish what is committed (``run_once``)."""
    relay = jobfence.AsyncRelay(outbox, queue)
    for _ in range(3):
        await relay.run_once()
        await sim.sleep(20)


def two_relays(relay: Callable[..., Awaitable[None]]) -> Scenario:
    async def scenario(sim: Simulation) -> None:
        db, queue, outbox = sim.table("outbox"), sim.queue("orders"), sim.outbox()
        async with db.transaction() as tx:  # the order's transaction fills both outboxes
            await tx.write("order-7", body={"order": 7}, published=False)
            await outbox.add(tx, queue="orders", body={"order": 7}, id="order-7")
        sim.spawn(relay, sim, db, queue, outbox)
        sim.spawn(relay, sim, db, queue, outbox)

    return scenario


ONCE = [testing.published_once("orders", expected=["order-7"])]
TWICE = "message 'order-7' published to queue 'orders' more than once"


def test_two_live_relays_never_publish_a_row_twice_where_a_naive_loop_does() -> None:
    naive = testing.explore(two_relays(naive_relay), schedules=50, checks=ONCE)
    (failure,) = naive.failures
    assert failure.check == "published_once" and failure.message == TWICE
    assert failure.deviations == 1  # one switch between a read and its mark
    (same,) = failure.replay().failures
    assert (same.message, same.tape) == (failure.message, failure.tape)
    for strategy in ("random", "pct"):
        report = testing.explore(
            two_relays(jobfence_relay), schedules=300, strategy=strategy, checks=ONCE
        )
        report.assert_ok()
        assert report.schedules == 300


@pytest.mark.parametrize(
    "fault",
    # outbox.settle #1 and #2 are the purges the relays start with; #3 marks the row published
    [faults.pause_past_ttl("outbox.publish"), faults.transient("outbox.settle", nth=3)],
    ids=["paused-past-its-lease", "published-mark-failed"],
)
def test_a_relay_that_lost_its_hold_sends_the_row_again(fault: faults.Fault) -> None:
    """The one way out of at-most-once: the rows of a relay that stopped past its lease, or
    whose mark failed, come back to the next claim; whatever the first relay does next, the
    row goes out twice (consumers dedupe on the id: the message id is the row's)."""
    report = testing.explore(two_relays(jobfence_relay), schedules=20, faults=[fault], checks=ONCE)
    (failure,) = report.failures
    assert failure.message == TWICE and failure.tape.faults == (fault,)


# -- the simulated transaction's side --------------------------------------------------------
def _one_order(
    fault: faults.Fault | None, body: Callable[[Any], Awaitable[None]] | None = None
) -> Callable[[], tuple[list[str], list[int], list[str]]]:
    """Run one order job (under ``fault``) that adds its message in its transaction and
    checks nothing of it is claimable before the commit; (ids a relay can claim afterwards,
    orders saved, the job's error type names)."""
    seen: dict[str, Any] = {"errors": []}

    async def job(db: testing.SimTable, outbox: Any) -> None:
        try:
            async with db.transaction() as tx:
                await tx.write(7, total=42)
                await outbox.add(tx, queue="orders", body={"order": 7}, id="order-7")
                await testing.point("added")
                seen["before"] = await outbox.backend.entries(None, None, 10)
                if body is not None:
                    await body(tx)
        except Exception as exc:
            seen["errors"].append(type(exc).__name__)

    async def scenario(sim: Simulation) -> None:
        db, outbox = sim.table("orders"), sim.outbox()
        sim.spawn(job, db, outbox)
        await sim.join()
        rows = await outbox.backend.claim("relay", 10, 30.0)
        seen["ids"] = [row.id for row in rows]
        seen["orders"] = list(db.rows())
        before = seen.get("before", [])
        sim.check(before == [], f"claimable before the commit: {before}")

    def run() -> tuple[list[str], list[int], list[str]]:
        testing.replay(scenario, testing.Tape((), (fault,) if fault else ())).assert_ok()
        return seen["ids"], seen["orders"], seen["errors"]

    return run


async def _fail(tx: Any) -> None:
    raise RuntimeError("the job fails before its commit")


@pytest.mark.parametrize(
    ("fault", "body", "expected"),
    [
        (None, None, (["order-7"], [7], [])),
        (None, _fail, ([], [], ["RuntimeError"])),
        (faults.transient("db.commit"), None, ([], [], ["InjectedFault"])),
        (faults.commit_unknown("db.commit"), None, (["order-7"], [7], ["InjectedFault"])),
        (faults.crash("db.commit"), None, ([], [], [])),
        (faults.crash("added"), None, ([], [], [])),
        (faults.transient("outbox.add"), None, ([], [], ["BackendError"])),
    ],
    ids=[
        "commit",
        "rollback",
        "commit-lost",
        "commit-unknown",
        "crash-at-commit",
        "crash-in-transaction",
        "add-failed",
    ],
)
def test_outbox_rows_are_claimable_once_their_transaction_commits_and_never_otherwise(
    fault: faults.Fault | None, body: Any, expected: tuple[list[str], list[int], list[str]]
) -> None:
    assert _one_order(fault, body)() == expected


def test_the_first_of_two_conflicting_transactions_to_commit_keeps_its_rows() -> None:
    """A commit that fails (a key another transaction applied first) drops its rows too."""
    seen: dict[str, Any] = {}

    async def job(sim: Simulation, db: testing.SimTable, inbox: Any, outbox: Any, n: int) -> None:
        async with db.transaction() as tx:
            assert await inbox.claim_in(tx, "order:7")
            await outbox.add(tx, queue="orders", body={"n": n}, id=f"m{n}")
            await sim.sleep(1)  # the other one claims the key too before this one commits

    async def scenario(sim: Simulation) -> None:
        db, inbox, outbox = sim.table("orders"), sim.inbox(), sim.outbox()
        first = sim.spawn(job, sim, db, inbox, outbox, 1)
        second = sim.spawn(job, sim, db, inbox, outbox, 2)
        await sim.join()
        seen["ids"] = [e.id for e in await outbox.backend.entries(None, None, 10)]
        seen["errors"] = [type(t.error).__name__ if t.error else None for t in (first, second)]

    testing.replay(scenario, "").assert_ok()
    assert seen == {"ids": ["m1"], "errors": [None, "ConflictError"]}


def test_a_simulated_table_adds_at_once_and_a_real_one_refuses() -> None:
    seen: dict[str, Any] = {}

    async def scenario(sim: Simulation) -> None:
        db, outbox = sim.table("orders"), sim.outbox(table="shop_outbox")
        msg_id = await outbox.add(db, queue="orders", body={"order": 7})
        seen["id"] = msg_id
        seen["ids"] = [e.id for e in await outbox.backend.entries(None, None, 10)]
        seen["table"] = outbox.table

    testing.replay(scenario, "").assert_ok()
    assert seen["ids"] == [seen["id"]] and len(seen["id"]) == 32
    assert seen["table"] == "shop_outbox"


def test_a_real_database_table_keeps_no_outbox(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"

    async def scenario(sim: Simulation) -> None:
        db, outbox = sim.table("orders", url=url), sim.outbox()
        async with db.transaction() as tx:
            await outbox.add(tx, queue="orders", body={})

    report = testing.replay(scenario, "")
    (failure,) = report.failures
    assert isinstance(failure.error, jobfence.ConfigurationError)
    assert failure.error.argument == "conn" and "in-memory" in str(failure.error)


def test_each_schedule_starts_with_an_empty_outbox_and_queue() -> None:
    counts: list[tuple[int, int]] = []

    async def scenario(sim: Simulation) -> None:
        db, outbox, queue = sim.table("orders"), sim.outbox(), sim.queue("orders")
        stats = await outbox.backend.stats()
        counts.append((stats.pending + stats.published, len(sim.published("orders"))))
        await outbox.add(db, queue="orders", body={}, id="same-id-every-time")
        await queue.publish({}, id="same-id-every-time")

    testing.explore(scenario, schedules=3, strategy="fifo").assert_ok()
    assert counts == [(0, 0)] * 3


# -- sim.published and published_once --------------------------------------------------------
def test_published_lists_every_publish_to_the_queue_acked_or_not_repeats_included() -> None:
    seen: dict[str, Any] = {}

    async def scenario(sim: Simulation) -> None:
        queue = sim.queue("orders")
        other = jobfence.AsyncQueue(f"memory://{sim.namespace}", "orders")
        await queue.publish({}, id="a")
        await other.publish_many([{}, {}], ids=["b", "a"])
        await sim.queue("mail").publish({}, id="c")
        for message in await queue.receive(max_messages=10):
            await message.ack()
        seen["orders"], seen["mail"] = sim.published("orders"), sim.published("mail")
        seen["none"] = sim.published("nothing-here")
        await other.close()

    testing.replay(scenario, "").assert_ok()
    assert seen == {"orders": ["a", "b", "a"], "mail": ["c"], "none": []}


def test_published_once_names_the_message_sent_twice_or_never() -> None:
    async def twice(sim: Simulation) -> None:
        queue = sim.queue()
        sim.spawn(queue.publish, {}, id="a")
        sim.spawn(queue.publish, {}, id="a")

    async def never(sim: Simulation) -> None:
        await sim.queue().publish({}, id="a")

    (dup,) = testing.explore(twice, schedules=10, checks=[testing.published_once()]).failures
    assert dup.message == "message 'a' published to queue 'jobs' more than once"
    (missing,) = testing.explore(
        never, schedules=10, checks=[testing.published_once("jobs", expected=["a", "b"])]
    ).failures
    assert missing.message == "no message 'b' in queue 'jobs'"
    testing.explore(
        never, schedules=10, checks=[testing.published_once(expected=["a"])]
    ).assert_ok()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"queue": ""}, "queue"),
        ({"queue": 3}, "queue"),
        ({"expected": "a"}, "expected"),
        ({"expected": 5}, "expected"),
    ],
)
def test_published_once_refuses_bad_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        testing.published_once(**kwargs)
    assert info.value.argument == argument


def test_published_refuses_a_bad_queue_name() -> None:
    async def scenario(sim: Simulation) -> None:
        sim.published("bad name!")

    (failure,) = testing.replay(scenario, "").failures
    assert isinstance(failure.error, jobfence.ConfigurationError)
    assert failure.error.argument == "queue"


def test_the_outbox_of_a_schedule_is_its_own() -> None:
    """Each schedule starts from an empty outbox: the row the schedule before added is gone
    (the schedules of one explore share the store name, never the stores)."""
    seen: list[int] = []

    async def scenario(sim: Simulation) -> None:
        outbox = sim.outbox()
        await outbox.add(sim.table("t"), queue="orders", body={}, id=uuid.uuid4().hex)
        stats = await outbox.backend.stats()
        seen.append(stats.pending)
        sim.check(stats.pending == 1, f"{stats}")

    testing.explore(scenario, schedules=3, strategy="fifo").assert_ok()
    assert seen == [1, 1, 1]


def test_two_relays_publish_the_rows_of_a_key_in_the_order_they_were_added() -> None:
    """Three orders of one customer, one row per claim, two relays racing for them: the
    messages go out in the orders' order, under every interleaving tried and when a relay
    dies with a row in hand (the others wait behind it until its lease runs out)."""

    async def shop(db: testing.SimTable, outbox: Any) -> None:
        for n in (1, 2, 3):
            async with db.transaction() as tx:
                await tx.write(n, customer="c1")
                await outbox.add(tx, queue="orders", body={"n": n}, id=f"o{n}", key="c1")

    async def scenario(sim: Simulation) -> None:
        db, queue, outbox = sim.table("orders"), sim.queue("orders"), sim.outbox()
        relays = [jobfence.AsyncRelay(outbox, queue, lease=5, batch=1) for _ in range(2)]
        job = sim.spawn(shop, db, outbox, name="shop")
        for relay in relays:
            sim.spawn(relay.run)
        await sim.join(job)
        await sim.sleep(10)
        for relay in relays:
            relay.stop()
        await sim.join()
        await jobfence.AsyncRelay(outbox, queue).run_once()
        first_sends = list(dict.fromkeys(sim.published("orders")))
        sim.check(first_sends == ["o1", "o2", "o3"], f"published in the order {first_sends}")

    testing.explore(scenario, schedules=150).assert_ok()
    for nth in (1, 2, 3):
        crash = [faults.crash("queue.publish", nth=nth)]
        testing.explore(scenario, schedules=30, faults=crash).assert_ok()
