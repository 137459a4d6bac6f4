"""Faults aimed at a target: ``nth`` counts the hits of the point at that target only (the data
table's write, not the lock table's), ``kind(point[target]#nth)`` reads back, and
``faults="auto"`` plans its faults with their targets."""

from __future__ import annotations

from typing import Any

import pytest

from jobfence import ConfigurationError, testing
from jobfence._core.hooks import ahook
from jobfence.testing import Simulation, Tape, faults


@pytest.mark.parametrize(
    ("point", "info", "target"),
    [
        ("db.write", {"table": "orders", "key": 1}, "orders"),
        ("db.commit", {"table": None, "key": None}, None),
        ("versioned.update", {"table": "stock", "key": {"id": 1}, "version": 3}, "stock"),
        ("lock.acquire", {"name": "job:1", "backend": "memory"}, "job:1"),
        ("lock.renew", {"names": ["job:1"]}, "job:1"),
        ("lock.renew", {"names": ["job:1", "job:2"]}, None),
        ("inbox.claim", {"key": "msg-7", "backend": "memory"}, "msg-7"),
        ("inbox.renew", {"keys": ("msg-7",)}, "msg-7"),
        ("queue.ack", {"queue": "jobs", "id": "1", "delivery": 1}, "jobs"),
        ("fence.check", {"resource": "orders:1", "token": 5}, "orders:1"),
        ("outbox.claim", {"relay": "r1", "table": "jobfence_outbox"}, "jobfence_outbox"),
        ("outbox.publish", {"relay": "r1", "ids": [], "target": "amqp"}, "r1"),
        ("outbox.add", {"queue": "jobs", "ids": [], "backend": "sqlite"}, None),
        ("sleep", {"seconds": 1.0}, None),
        ("charge", {"target": "card-1"}, "card-1"),
        ("charge", {}, None),
        ("db.write", {"target": "mine"}, "mine"),  # a point of your own named like a table's
        ("inbox.claim", {"key": 42}, "42"),
    ],
)
def test_target_of(point: str, info: dict[str, Any], target: str | None) -> None:
    assert faults.target_of(point, info) == target


@pytest.mark.parametrize(
    "text",
    [
        "transient(db.write[orders]#1)",
        "pause_past_ttl(lock.renew[job:1]#2@t1+600s)",
        "crash(inbox.complete[msg #7, @x+1]#3@t2)",
        "commit_unknown(db.commit[orders]#1)",
        "lost_ack(queue.ack[jobs]#1)",
        "transient(db.write#1)",  # a tape written before targets: still read
    ],
)
def test_str_and_parse_round_trip(text: str) -> None:
    fault = faults.parse(text)
    assert str(fault) == text
    assert faults.parse(str(fault)) == fault


def test_constructors_take_a_target() -> None:
    made = [
        faults.transient("db.write", target="orders"),
        faults.commit_unknown(target="orders"),
        faults.lost_ack(target="jobs"),
        faults.pause_past_ttl("lock.renew", seconds=60, target="job:1"),
        faults.crash("inbox.complete", 2, task="t1", target="msg-1"),
    ]
    assert [f.target for f in made] == ["orders", "orders", "jobs", "job:1", "msg-1"]
    assert str(made[3]) == "pause_past_ttl(lock.renew[job:1]#1+60s)"
    assert str(made[4]) == "crash(inbox.complete[msg-1]#2@t1)"
    tape = Tape.parse("t1 t2 | " + ", ".join(map(str, made)))
    assert tape.faults == tuple(made)
    assert Tape.parse(str(tape)) == tape


@pytest.mark.parametrize("target", ["", "a]b", "x[1]", "f(x)", "a|b", 3])
def test_a_bad_target_is_refused_naming_it(target: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        faults.transient("db.write", target=target)
    assert raised.value.argument == "target"


def test_a_point_with_brackets_is_refused_and_a_bad_text_names_the_fault() -> None:
    with pytest.raises(ConfigurationError) as raised:
        faults.transient("db[write]")
    assert raised.value.argument == "point"
    with pytest.raises(ConfigurationError) as raised:
        faults.parse("transient(db.write[orders#1)")
    assert raised.value.argument == "fault"
    assert "kind(point[target]#nth)" in str(raised.value)


def _lock_then_data(seen: list[str]) -> Any:
    """The job takes a lock row in the table ``locks``, then writes the table ``orders``
    twice (the article's shape: every write of the job goes through db.write)."""

    async def job(sim: Simulation, locks: Any, orders: Any, n: int) -> None:
        try:
            await locks.write("job", owner=n)
        except testing.InjectedFault:
            seen.append(f"locks {n}")
        for step in (1, 2):
            try:
                await orders.write(f"{n}.{step}", done=True)
            except testing.InjectedFault:
                seen.append(f"orders {n}.{step}")

    async def scenario(sim: Simulation) -> None:
        locks, orders = sim.table("locks"), sim.table("orders")
        for n in (1, 2):
            sim.spawn(job, sim, locks, orders, n)
        await sim.join()

    return scenario


def test_nth_counts_only_the_hits_at_the_target() -> None:
    seen: list[str] = []
    fault = faults.transient("db.write", nth=1, target="orders")
    assert testing.explore(_lock_then_data(seen), schedules=1, faults=[fault]).ok
    assert seen == ["orders 1.1"]  # the first write of orders, not the first db.write (locks)
    seen.clear()
    fault = faults.transient("db.write", nth=3, target="orders")
    assert testing.explore(_lock_then_data(seen), schedules=1, faults=[fault]).ok
    assert seen == ["orders 2.1"]  # FIFO: t1 writes orders twice, then t2
    seen.clear()
    fault = faults.transient("db.write", nth=1)  # without a target: every table counts
    assert testing.explore(_lock_then_data(seen), schedules=1, faults=[fault]).ok
    assert seen == ["locks 1"]  # the lock table's write


def test_pause_past_ttl_at_the_data_table_not_the_lock_table() -> None:
    paused: list[float] = []

    async def job(sim: Simulation, locks: Any, orders: Any) -> None:
        await locks.write("job", owner=1)
        before = sim.now()
        await orders.write("o", done=True)
        paused.append(sim.now() - before)

    async def scenario(sim: Simulation) -> None:
        sim.spawn(job, sim, sim.table("locks"), sim.table("orders"))
        await sim.join()

    fault = faults.pause_past_ttl("db.write", seconds=50, target="orders")
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert paused == [50.0]


@pytest.mark.parametrize("announce", ["point", "hook"])
def test_a_point_of_your_own_is_aimed_at_by_its_target(announce: str) -> None:
    charged: list[str] = []

    async def job(sim: Simulation, card: str) -> None:
        try:
            if announce == "point":
                await testing.point("charge", target=card)
            else:  # what testing.point(name, target=) announces: info {"target": ...}
                await ahook("charge", target=card)
            charged.append(card)
        except testing.InjectedFault:
            pass

    async def scenario(sim: Simulation) -> None:
        for card in ("a", "b", "a"):
            sim.spawn(job, sim, card)
        await sim.join()

    fault = faults.transient("charge", nth=2, target="a")
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert charged == ["a", "b"]  # the second charge of card a failed, not the second charge


def test_auto_faults_are_planned_with_their_target() -> None:
    async def job(sim: Simulation, locks: Any, orders: Any) -> None:
        row = await orders.read("stock")
        await locks.write("job", owner=1)
        await orders.write("stock", n=row["n"] - 1)

    async def scenario(sim: Simulation) -> None:
        locks, orders = sim.table("locks"), sim.table("orders", {"stock": {"n": 2}})
        sim.spawn(job, sim, locks, orders)
        await sim.join()
        sim.check(orders.get("stock")["n"] == 1, "stock not decremented")

    report = testing.explore(scenario, schedules=50, faults="auto")
    failure = report.failures[0]
    assert [str(f) for f in failure.tape.faults] in (
        ["transient(db.read[orders]#1)"],
        ["transient(db.write[locks]#1)"],
        ["transient(db.write[orders]#1)"],
        ["commit_unknown(db.write[locks]#1)"],
    )
    assert "[" in str(failure.tape) and testing.replay(scenario, str(failure.tape)).failures


def test_a_thread_task_is_aimed_at_by_its_target() -> None:
    charged: list[str] = []

    def job(card: str) -> None:  # a plain function: a thread task, blocking at its points
        try:
            testing.point("charge", target=card)
            charged.append(card)
        except testing.InjectedFault:
            pass

    async def scenario(sim: Simulation) -> None:
        for card in ("a", "b", "a"):
            sim.spawn(job, card)
        await sim.join()

    fault = faults.transient("charge", nth=2, target="a")
    assert testing.explore(scenario, schedules=1, faults=[fault]).ok
    assert charged == ["a", "b"]
