"""The scheduler against faults of the link and hostile input, on real servers.

A connection reset while a fired slot's record is being stored must not leave the slot held
and undecided (its claim renewed as long as the process lives, then given back, and so fired
again, when its inbox closes): the record is stored once the backend answers again, and no
other process fires the slot.
"""

from __future__ import annotations

import asyncio
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
