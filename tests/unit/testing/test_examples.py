"""The three examples of docs/how-to/testing.md, as a user writes them: each scenario is a few lines
and the toolkit finds the bug by itself (or shows there is none in what it explored)."""

from __future__ import annotations

import uuid

import pytest

import jobfence
from jobfence import testing
from jobfence.testing import faults

# -- (a) the second article's lost update ---------------------------------------------------


async def with_retries(sim, statement):  # "retry transient errors": re-sends the same statement
    for _attempt in range(3):
        try:
            return await statement()
        except ConnectionError:
            await sim.sleep(0.1)


async def naive_job(sim, db, qty):
    row = await with_retries(sim, lambda: db.read("stock"))
    await with_retries(sim, lambda: db.write("stock", stock=row["stock"] - qty))  # stale value


async def fixed_job(sim, db, qty):
    @jobfence.retry_unit(attempts=10)  # re-runs the whole unit, from its read
    async def unit():
        row = await db.read("stock")
        new = {"stock": row["stock"] - qty}
        await jobfence.versioned_update_async(db, "inventory", {"id": "stock"}, row["version"], new)

    await unit()


def inventory(job):
    async def scenario(sim):
        db = sim.table("inventory", {"stock": {"stock": 10}})
        sim.spawn(job(sim, db, 5))
        sim.spawn(job(sim, db, 3))
        await sim.join()
        sim.check(db.get("stock")["stock"] == 2, f"stock {db.get('stock')['stock']}, not 2")

    return scenario


def test_a_naive_retry_loses_an_update_under_auto_faults() -> None:
    checks = [testing.no_lost_update()]
    report = testing.explore(inventory(naive_job), faults="auto", checks=checks)
    failure = report.failures[0]
    assert failure.check == "no_lost_update"
    (blip,) = failure.original.faults  # found with the article's network blip on a write...
    assert (blip.kind, blip.point) == ("transient", "db.write")
    assert failure.tape.faults == () and failure.deviations == 1  # ...shrunk: one preemption
    assert str(failure).startswith("schedule 3 (seed 3) failed: no_lost_update: t1 wrote")
    # the tape ends at its last deviation (the FIFO picks after it are left out)
    assert "tape:   t1 t2   (1 deviation(s)" in str(failure)
    assert report.schedules <= 50
    assert not failure.replay().ok  # the tape replays the same lost update


# 10,000 schedules take about 13 s on a quiet machine; a run beside a loaded suite took >120 s,
# the default per-test timeout, and the timeout surfaced as a failed schedule
@pytest.mark.timeout(600)
def test_a_retry_unit_and_versioned_update_pass_10000_schedules_and_exhaustive_search() -> None:
    checks = [testing.no_lost_update()]
    transient = faults.auto(kinds=["transient"])
    scenario = inventory(fixed_job)
    testing.explore(scenario, schedules=10_000, faults=transient, checks=checks).assert_ok()
    report = testing.explore(scenario, strategy="exhaustive", schedules=10_000, checks=checks)
    report.assert_ok()
    assert report.exhausted and report.schedules > 10


# -- (b) the first article's duplicate processing -------------------------------------------


async def plain_consumer(sim, queue, inbox):
    while batch := await queue.receive(visibility=30, wait=60):
        await sim.effect("charge", batch[0].id)
        await batch[0].ack()


async def guarded_consumer(sim, queue, inbox):
    @jobfence.guarded(inbox=inbox, key=lambda message: message.id)
    async def charge(message):
        await sim.effect("charge", message.id)

    while batch := await queue.receive(visibility=30, wait=60):
        await charge(batch[0])
        await batch[0].ack()


def orders(consumer):
    async def scenario(sim):
        queue, inbox = sim.queue(), sim.inbox()
        await queue.publish({"amount": 42}, id="order-1")
        sim.spawn(consumer(sim, queue, inbox))
        sim.spawn(consumer(sim, queue, inbox))

    return scenario


ONCE = [testing.exactly_once("charge", expected=["order-1"])]


def test_b_a_lost_ack_or_a_paused_worker_makes_a_plain_consumer_charge_twice() -> None:
    for fault in (faults.lost_ack(), faults.pause_past_ttl("queue.ack")):
        report = testing.explore(orders(plain_consumer), schedules=20, faults=[fault], checks=ONCE)
        assert "more than once" in report.failures[0].message
    assert not testing.explore(orders(plain_consumer), faults="auto", checks=ONCE).ok


def test_b_the_guarded_consumer_charges_once() -> None:
    for fault in (faults.lost_ack(), faults.pause_past_ttl("queue.ack")):
        scenario = orders(guarded_consumer)
        testing.explore(scenario, schedules=300, faults=[fault], checks=ONCE).assert_ok()


# -- (c) the first article's lock, released with a new GUID ---------------------------------


class ArticleLock:  # RedisDistributedLock of the article, on a simulated key-value table
    def __init__(self, kv, key):
        self.kv, self.key = kv, key

    async def try_acquire(self, ttl):
        row = await self.kv.read(self.key)
        if row and row["owner"] and row["until"] > testing.get_clock().monotonic():
            return False
        until = testing.get_clock().monotonic() + ttl
        await self.kv.write(self.key, owner=str(uuid.uuid4()), until=until)
        return True

    async def release(self):  # LockRelease(key, Guid.NewGuid()): nobody's token is checked
        await self.kv.write(self.key, owner=None, until=0)


async def article_worker(sim, kv, locks):
    lock = ArticleLock(kv, "job:123")
    try:
        if await lock.try_acquire(ttl=10):
            async with sim.critical("job:123"):
                await testing.point("process")
    finally:
        await lock.release()


async def jobfence_worker(sim, kv, locks):
    lease = await locks.try_acquire("job:123", ttl=10)
    if lease is not None:
        async with lease, sim.critical("job:123", lease=lease):
            await testing.point("process")


def workers(worker):
    async def scenario(sim):
        kv, locks = sim.table("locks"), sim.locks()
        for _ in range(3):
            sim.spawn(worker(sim, kv, locks))

    return scenario


def test_c_the_articles_lock_lets_two_workers_in() -> None:
    report = testing.explore(workers(article_worker), checks=[testing.single_holder()])
    assert report.failures[0].check == "single_holder"


def test_c_jobfence_locks_keep_one_holder() -> None:
    checks = [testing.single_holder()]
    testing.explore(workers(jobfence_worker), schedules=2000, checks=checks).assert_ok()
