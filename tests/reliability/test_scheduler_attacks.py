"""The scheduler against faults of the link and hostile input, on real servers.

A connection reset while a fired slot's record is being stored must not leave the slot held
and undecided (its claim renewed as long as the process lives, then given back, and so fired
again, when its inbox closes): the record is stored once the backend answers again, and no
other process fires the slot.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence._core import slots as slotmath
from jobfence.testing import hooked
from tests.conformance.specs import _postgres_cleanup, _redis_cleanup, new_namespace
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(90)

BACKENDS = {"redis": (REDIS_URL, 6379), "postgres": (POSTGRES_URL, 5432)}
PERIOD = 5


@pytest.fixture(params=sorted(BACKENDS))
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, FaultProxy, str]]:
    """``(direct url, proxied url, proxy, namespace)`` of a backend, cleaned up afterwards."""
    base, port = BACKENDS[request.param]
    namespace = new_namespace()
    try:
        with FaultProxy(port) as proxy:
            yield base, proxy.url_for(base, port), proxy, namespace
    finally:
        (_redis_cleanup if request.param == "redis" else _postgres_cleanup)(base, namespace)


def _reset_on_first_record(proxy: FaultProxy) -> Any:
    """A hook that, at the first store of a slot's record, resets every connection through
    the proxy and refuses new ones for 0.5 s: the store fails on a dead link."""
    done = threading.Event()

    def hook(point: str, **info: Any) -> None:
        key = str(info.get("key") or "")
        if point == "inbox.complete" and key.startswith("schedule:") and not done.is_set():
            done.set()
            proxy.refuse(True)
            proxy.reset()
            threading.Timer(0.5, proxy.refuse, args=(False,)).start()

    hook.done = done  # type: ignore[attr-defined]
    return hook


def _check_decided_once(base: str, namespace: str, at: int, pod: str, runs: list[str]) -> None:
    """The slot is recorded fired by ``pod``; another process, after ``pod`` closed, fires
    nothing."""
    key = slotmath.slot_key("job", at)
    with jobfence.Scheduler(base, namespace=namespace, lease=2) as other:
        other.every(PERIOD, name="job")(lambda: runs.append("other"))
        assert [(f.outcome, f.pod) for f in other.history("job")] == [("fired", pod)]
        assert other.tick(at + 1) == []
    assert runs == [key]


def test_record_stored_after_a_reset_mid_complete(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    base, url, proxy, namespace = proxied
    runs: list[str] = []
    at = int(time.time()) // PERIOD * PERIOD
    hook = _reset_on_first_record(proxy)
    with jobfence.Scheduler(url, namespace=namespace, lease=2) as scheduler:
        scheduler.every(PERIOD, name="job")(lambda slot: runs.append(slot.key))
        with hooked(hook):
            fires = scheduler.tick(at + 0.5)
        assert hook.done.is_set()
        assert [(f.key, f.outcome) for f in fires] == [(slotmath.slot_key("job", at), "fired")]
        pod = scheduler.pod
    _check_decided_once(base, namespace, at, pod, runs)


def test_record_stored_after_a_reset_mid_complete_async(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    base, url, proxy, namespace = proxied
    runs: list[str] = []
    at = int(time.time()) // PERIOD * PERIOD
    hook = _reset_on_first_record(proxy)

    async def main() -> str:
        async with jobfence.AsyncScheduler(url, namespace=namespace, lease=2) as scheduler:

            @scheduler.every(PERIOD, name="job")
            async def job(slot: jobfence.Slot) -> None:
                runs.append(slot.key)

            with hooked(hook):
                fires = await scheduler.tick(at + 0.5)
            assert [f.outcome for f in fires] == ["fired"]
            return scheduler.pod

    pod = asyncio.run(main())
    assert hook.done.is_set()
    _check_decided_once(base, namespace, at, pod, runs)


def test_forked_child_of_a_running_async_scheduler() -> None:
    """An AsyncScheduler runs in an event loop of a thread, its target running, while the
    main thread forks: the child, with the inherited scheduler and a loop of its own, finds
    the parent's slot in progress (fires nothing), and closes the scheduler without waiting
    for the parent's tasks (another loop's) or giving back the parent's claim."""
    namespace = new_namespace()
    started: list[str] = []
    running, release = threading.Event(), threading.Event()
    scheduler = jobfence.AsyncScheduler(REDIS_URL, namespace=namespace, lease=2)

    @scheduler.every(1, name="job", overlap="skip")
    async def job(slot: jobfence.Slot) -> None:
        started.append(slot.key)
        running.set()
        await asyncio.to_thread(release.wait, 10)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(scheduler.run(),))
    thread.start()
    try:
        assert running.wait(10)
        key = started[0]
        at = int(slotmath.parse_iso(key.rpartition("@")[2]).timestamp())
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, and never return into pytest
            answer = "error"
            try:

                async def child() -> str:
                    fires = await asyncio.wait_for(scheduler.tick(at + 0.5), 10)
                    await asyncio.wait_for(scheduler.close(), 10)
                    return f"fires={len(fires)}"

                answer = asyncio.run(child())
            except BaseException as exc:
                answer = repr(exc)
            finally:
                os.write(write, answer.encode())
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            assert pipe.read() == "fires=0"
        assert os.waitstatus_to_exitcode(status) == 0
        with jobfence.Inbox(REDIS_URL, table=namespace) as inbox:  # still the parent's
            info = inbox.claim_info(key)
            assert info is not None and info.state is jobfence.ClaimState.IN_PROGRESS
    finally:
        release.set()
        scheduler.stop()
        thread.join(15)
        loop.run_until_complete(scheduler.close())
        loop.close()
    try:
        assert started.count(key) == 1
        with jobfence.Scheduler(REDIS_URL, namespace=namespace) as reader:
            reader.every(1, name="job")(lambda: None)
            fired = {f.key: (f.outcome, f.pod) for f in reader.history("job", limit=None)}
        assert fired[key] == ("fired", scheduler.pod)
    finally:
        _redis_cleanup(REDIS_URL, namespace)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"name": "n" * 979, "every": 5}, "name"),
        ({"name": "n", "every": 10**12}, "seconds"),  # a next slot past the year 9999
        ({"name": "n", "every": 5, "catch_up": 400 * 86400.0}, "catch_up"),  # > 1 year kept
    ],
)
def test_input_no_pass_could_use_is_refused_when_added(
    options: dict[str, Any], argument: str
) -> None:
    """Each was accepted, then every pass failed (a slot key longer than an inbox key, a
    retention longer than an inbox keeps records) or ``info`` crashed (a year out of range)."""
    scheduler = jobfence.Scheduler("memory://")
    name = options.pop("name")
    with pytest.raises(jobfence.ConfigurationError) as caught:
        scheduler.add(name, target=lambda: None, **options)
    assert caught.value.argument == argument
    with pytest.raises(jobfence.ConfigurationError) as caught:
        jobfence.Scheduler("memory://", lease=2 * 366 * 86400.0)
    assert caught.value.argument == "lease"
    # a catch_up over half a year: the records are kept one year (not 2 * catch_up, which no
    # inbox keeps), and a pass works
    scheduler.add("half", every=5, catch_up=200 * 86400.0, target=lambda: None)
    assert scheduler.retention == 366 * 86400
    scheduler.tick()


def test_longest_name_fires_and_triggers(proxied: tuple[str, str, FaultProxy, str]) -> None:
    """A name of the largest size accepted makes keys every backend stores (a manual slot's
    key is the longest)."""
    base, _, _, namespace = proxied
    name = "é" * 489  # 978 bytes in UTF-8
    runs: list[str] = []
    at = int(time.time()) // PERIOD * PERIOD
    with jobfence.Scheduler(base, namespace=namespace) as scheduler:
        scheduler.add(name, every=PERIOD, target=lambda slot: runs.append(slot.key))
        assert [f.outcome for f in scheduler.tick(at + 0.5)] == ["fired"]
        assert scheduler.trigger(name).outcome == "fired"
        scheduler.pause(name)
        assert scheduler.info(name).paused
    assert len(runs) == 2 and len(runs[1].encode()) == 1024


def test_two_schedulers_run_on_through_a_redis_restart_that_lost_everything() -> None:
    """Two ``run()`` loops on a disposable Redis that is killed and restarted empty: the
    passes that fail are logged, the loops go on, and every slot due after the restart is
    fired exactly once. (Slots in progress at the kill may fire again: their claims were
    lost with the data, as documented.)"""
    from tests.reliability._redis_server import RedisServer

    runs: list[tuple[str, float]] = []
    mutex = threading.Lock()
    with RedisServer() as server:
        schedulers = [
            jobfence.Scheduler(server.url, namespace="restart", lease=2) for _ in range(2)
        ]
        for scheduler in schedulers:

            @scheduler.every(1, name="job")
            def job(slot: jobfence.Slot) -> None:
                with mutex:
                    runs.append((slot.key, slot.at.timestamp()))

        threads = [threading.Thread(target=s.run) for s in schedulers]
        for thread in threads:
            thread.start()
        try:
            time.sleep(2)  # a few slots fire before the kill
            server.kill()
            time.sleep(1.5)  # passes fail meanwhile
            server.start()
            back = time.time()
            time.sleep(4)
            assert all(thread.is_alive() for thread in threads)
        finally:
            for scheduler in schedulers:
                scheduler.stop()
            for thread in threads:
                thread.join(20)
            for scheduler in schedulers:
                scheduler.close()
    after = [key for key, at in runs if at >= back + 1]
    assert len(after) >= 2
    assert len(after) == len(set(after))


def test_an_interrupted_tick_gives_back_the_slots_it_claimed(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    """A tick claims 3 due slots; the first target is interrupted (KeyboardInterrupt): no
    slot stays claimed (and renewed) by nobody. The 2 not started are decided by this
    process's next pass; the interrupted one is taken over at once by another process."""
    base, _, _, namespace = proxied
    runs: list[str] = []
    at = int(time.time()) // PERIOD * PERIOD - 4 * PERIOD

    def job(slot: jobfence.Slot) -> None:
        runs.append(slot.key)
        if len(runs) == 2:
            raise KeyboardInterrupt

    keys = [slotmath.slot_key("job", at + k * PERIOD) for k in range(4)]
    with (
        jobfence.Scheduler(base, namespace=namespace, lease=2) as scheduler,
        jobfence.Scheduler(base, namespace=namespace, lease=2) as other,
    ):
        for s in (scheduler, other):
            s.every(PERIOD, name="job", misfire="all", catch_up=60)(job)
        assert [f.key for f in scheduler.tick(at + 0.5)] == keys[:1]
        with pytest.raises(KeyboardInterrupt):
            scheduler.tick(at + 3 * PERIOD + 0.5)
        assert runs == keys[:2]
        assert [f.key for f in scheduler.tick(at + 3 * PERIOD + 0.6)] == keys[2:]
        assert [f.key for f in other.tick(at + 3 * PERIOD + 0.7)] == keys[1:2]
        records = {f.key: f.outcome for f in other.history("job")}
    assert records == dict.fromkeys(keys, "fired")
    assert runs == [keys[0], keys[1], keys[2], keys[3], keys[1]]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("jobfence_no_such_module_x:scheduler", "cannot import 'jobfence_no_such_module_x'"),
        ("os.path:join", "is a function, not a jobfence Scheduler or AsyncScheduler"),
        ("os.path:no_such_name", "'os.path' has no 'no_such_name'"),
        ("os.path", "is not module:object"),
    ],
)
def test_the_schedule_cli_refuses_what_is_not_a_scheduler(spec: str, says: str) -> None:
    from click.testing import CliRunner

    from jobfence.cli.app import cli

    result = CliRunner().invoke(cli, ["schedule", "list", spec])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_a_slot_whose_claim_stalled_past_the_lease_still_fires_once(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    """The link stalls for 3 s (lease 2 s) while a pass claims a slot: the claim comes back
    lost, so its target does not start; with no other process to take the slot over, this
    one must claim it again and fire it (it was forgotten: never fired, never recorded)."""
    _, url, proxy, namespace = proxied
    runs: list[str] = []
    at = int(time.time()) // PERIOD * PERIOD
    key = slotmath.slot_key("job", at)
    stalled = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point == "inbox.claim" and info.get("key") == key and not stalled.is_set():
            stalled.set()
            proxy.stall()
            threading.Timer(3.0, proxy.resume).start()

    with jobfence.Scheduler(url, namespace=namespace, lease=2) as scheduler:
        scheduler.every(PERIOD, name="job")(lambda slot: runs.append(slot.key))
        with hooked(hook):
            assert scheduler.tick(at + 0.5) == []
        assert stalled.is_set() and runs == []
        deadline = time.monotonic() + 10
        while key not in runs and time.monotonic() < deadline:
            scheduler.tick(at + 0.5 + (time.monotonic() - deadline + 10))
            time.sleep(0.2)  # the pace of the passes, as run() would make them
        assert runs.count(key) == 1
        records = {f.key: f.outcome for f in scheduler.history("job")}
    assert records[key] == "fired"
