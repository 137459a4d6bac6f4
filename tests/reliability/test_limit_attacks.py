"""Concurrency limits under attack, on real servers: 32 threads of one client contend for a
limit of 2, a waiter's link is reset while it is queued on the slots, and a holder process
is frozen past its ttl."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.testing import hooked
from tests.conformance.specs import _postgres_cleanup, _redis_cleanup, new_namespace
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(90)

BACKENDS = {"redis": (REDIS_URL, 6379), "postgres": (POSTGRES_URL, 5432)}
LIMIT = 2
THREADS = 32
ROUNDS = 3
GATE = "\x1fgate"


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


def _nothing_left(locks: jobfence.Locks, name: str) -> None:
    """No lease of the limit is listed, its gate is free, and both slots are free at once."""
    assert locks.holders(name) == []
    assert locks._holder(name + GATE) is None
    leases = [locks.try_acquire(name, ttl=5, limit=LIMIT) for _ in range(LIMIT)]
    assert all(lease is not None for lease in leases)
    for lease in leases:
        assert lease is not None and lease.release()


def test_32_threads_of_one_client_never_exceed_a_limit_of_2(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    base, _, _, namespace = proxied
    name = "busy"
    mutex = threading.Lock()
    inside: set[int] = set()
    most = 0
    grants: list[tuple[int, int]] = []  # (slot, token) in the order the holders saw them
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    with jobfence.Locks(base, namespace=namespace) as locks:

        def worker() -> None:
            nonlocal most
            try:
                start.wait()
                for _ in range(ROUNDS):
                    with locks.acquire(name, ttl=10, timeout=60, limit=LIMIT) as lease:
                        assert lease.slot is not None and lease.token % 1000 == lease.slot
                        with mutex:
                            assert lease.slot not in inside  # one holder per slot
                            inside.add(lease.slot)
                            most = max(most, len(inside))
                            grants.append((lease.slot, lease.token))
                        time.sleep(0.01)  # the work
                        with mutex:
                            inside.discard(lease.slot)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors[:3]
        assert len(grants) == THREADS * ROUNDS
        assert most == LIMIT
        tokens = [token for _, token in grants]
        assert len(set(tokens)) == len(tokens)
        for slot in range(LIMIT):  # a slot's tokens increase in the order it was held
            mine = [token for s, token in grants if s == slot]
            assert mine == sorted(mine)
        _nothing_left(locks, name)


def test_a_waiter_reset_while_queued_gets_the_released_slot(
    proxied: tuple[str, str, FaultProxy, str],
) -> None:
    """Both slots are held; a waiter (through the proxy) queues on them; its connections are
    reset and refused for 0.5 s; one slot is released: the waiter gets it, nothing else is
    left held once everyone is done."""
    base, url, proxy, namespace = proxied
    name = "reset"
    queued = threading.Event()
    got: dict[str, Any] = {}

    def hook(point: str, **info: Any) -> None:
        if point == "lock.wait":
            queued.set()

    with (
        jobfence.Locks(base, namespace=namespace) as near,
        jobfence.Locks(url, namespace=namespace) as far,
    ):
        held = [near.acquire(name, ttl=10, timeout=5, limit=LIMIT) for _ in range(LIMIT)]

        def waiter() -> None:
            try:
                got["lease"] = far.acquire(name, ttl=10, timeout=10, limit=LIMIT)
            except BaseException as exc:
                got["error"] = exc

        with hooked(hook):
            thread = threading.Thread(target=waiter)
            thread.start()
            assert queued.wait(10)
            proxy.refuse(True)
            proxy.reset()
            time.sleep(0.5)  # the link stays down this long
            proxy.refuse(False)
            assert held[0].release()
            thread.join(15)
        lease = got.get("lease")
        assert lease is not None, got
        assert lease.slot == held[0].slot and lease.token > held[0].token
        assert {h.token for _, h in near.holders(name)} == {lease.token, held[1].token}
        assert lease.release() and held[1].release()
        _nothing_left(near, name)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_holder_stopped_past_its_ttl_cannot_free_the_slot_it_lost(backend: str) -> None:
    """A process holding a slot of a limit of 2 is frozen (SIGSTOP) past its ttl: its slot is
    granted again (larger token); resumed, it finds its lease lost and its release frees
    nothing: the two leases granted meanwhile stay held."""
    base, _ = BACKENDS[backend]
    namespace = new_namespace()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability._stopped_limit_holder", base, namespace],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])},
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        word, slot, token = proc.stdout.readline().split()
        assert word == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        with jobfence.Locks(base, namespace=namespace) as locks:
            mine = [locks.acquire("stopped", ttl=10, timeout=10, limit=LIMIT) for _ in range(2)]
            taken = next(lease for lease in mine if lease.slot == int(slot))
            assert taken.token > int(token)
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().split() == ["lost=True", "released=False"]
            assert proc.wait(10) == 0
            for lease in mine:
                lease.check()
            assert sorted(h.token for _, h in locks.holders("stopped")) == sorted(
                lease.token for lease in mine
            )
            for lease in mine:
                assert lease.release()
            _nothing_left(locks, "stopped")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)
        (_redis_cleanup if backend == "redis" else _postgres_cleanup)(base, namespace)
