# Generated from test_limit_conformance.py by tools/conformance_twins.py: do not edit.
# Edit the async specs and run: python tools/conformance_twins.py
"""The concurrency-limit contract (``acquire(name, limit=N)``), run against every lock
backend, with the sync and the async API.

Written once over ``AsyncLocks``; ``test_limit_conformance_sync.py`` is generated from it by
``tools/conformance_twins.py``, as the lock specs' twin is.
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from typing import Any

import pytest

import jobfence
from jobfence.backends.postgres.locks import advisory_key
from jobfence.limits import TOKEN_STRIDE, gate_name, slot_name
from jobfence.testing import hooked
from tests.conformance import flow
from tests.conformance.conftest import Env
from tests.conformance.specs import LOCKS, spec_params

pytestmark = pytest.mark.timeout(120)

#: the specs whose waiters are served in arrival order
FIFO = spec_params(LOCKS, lambda s: s.fifo)
#: the specs whose leases run out after their ttl
TTL_EXPIRY = spec_params(LOCKS, lambda s: s.ttl_expiry)
#: the specs that can list their leases (a session-mode advisory lock has no name to list)
LISTING = spec_params(LOCKS, lambda s: not s.queue_follows_connection)


def _name() -> str:
    return "tenant:" + uuid.uuid4().hex[:8]


def _gate_taken(client: Any, name: str, timeout: float = 20) -> None:
    """Wait until a waiter of the limit on ``name`` holds its gate."""
    deadline = time.monotonic() + timeout
    while client.backend.holder(gate_name(name)) is None:
        assert time.monotonic() < deadline, "no waiter took the gate"
        flow.sleep(0.01)


#: which waiter of a spec (``"w1"``...) the running actor is, for :class:`_Queues`
_ACTOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("actor", default=None)


class _Queues:
    """The queues the waiters of a spec have joined, as the I/O hook sees them (a hook).

    A waiting acquire calls ``wait`` on a lock only after its ``acquire(..., wait=)`` put it
    in that lock's queue: so an actor's ``lock.wait`` on a lock means it is queued there.
    """

    def __init__(self) -> None:
        self._joined: set[tuple[str, str]] = set()
        self._mutex = threading.Lock()

    def __call__(self, point: str, **info: Any) -> None:
        actor = _ACTOR.get()
        if actor is not None and point == "lock.wait":
            with self._mutex:
                self._joined.add((actor, info["name"]))

    def joined(self, actor: str, key: str) -> bool:
        with self._mutex:
            return (actor, key) in self._joined


def _waiting_in_server(client: Any, key: str) -> int:
    """How many sessions wait in PostgreSQL for the advisory lock of ``key`` (session mode,
    whose waiters queue in the server, not through ``wait``)."""
    unsigned = advisory_key(client.backend.namespace, key) & 0xFFFFFFFFFFFFFFFF
    rows, _ = client.backend._run(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid = %(hi)s AND objid = %(lo)s AND objsubid = 1",
        {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF},
    )
    return int(rows[0][0])


def _joined(
    client: Any, queues: _Queues, actor: str, key: str, ahead: int, timeout: float = 20
) -> None:
    """Wait until ``actor`` is queued on the lock ``key``, behind ``ahead`` other waiters where
    the server holds the queue."""
    deadline = time.monotonic() + timeout
    in_server = client.backend.capabilities.queue_follows_connection
    while not (_waiting_in_server(client, key) > ahead if in_server else queues.joined(actor, key)):
        assert time.monotonic() < deadline, f"{actor} did not join the queue of {key!r}"
        flow.sleep(0.01)


def test_n_leases_are_granted_and_the_next_one_is_refused(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    held = [(a if i % 2 else b).try_acquire(name, ttl=10, limit=3) for i in range(3)]
    assert all(lease is not None for lease in held)
    leases = [lease for lease in held if lease is not None]
    assert sorted(lease.slot for lease in leases if lease.slot is not None) == [0, 1, 2]
    assert all(lease.name == name for lease in leases)
    assert len({lease.token for lease in leases}) == 3
    assert a.try_acquire(name, ttl=10, limit=3) is None
    assert b.try_acquire(name, ttl=10, limit=3) is None
    with pytest.raises(jobfence.LockTimeout) as info:
        b.acquire(name, ttl=10, timeout=0.3, limit=3)
    assert info.value.name == name
    assert leases[1].release() is True
    again = a.try_acquire(name, ttl=10, limit=3)
    assert again is not None and again.slot == leases[1].slot
    assert again.token > leases[1].token
    for lease in (leases[0], leases[2], again):
        assert lease.release() is True


def test_a_waiter_gets_a_lease_when_one_is_released(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    held = [a.try_acquire(name, ttl=10, limit=2) for _ in range(2)]
    assert held[0] is not None and held[1] is not None
    waiter = flow.spawn(lambda: b.acquire(name, ttl=10, timeout=30, limit=2))
    _gate_taken(a, name)
    assert not flow.done(waiter)
    assert held[1].release()
    got = flow.result(waiter, 30)
    assert got.slot == held[1].slot and got.token > held[1].token
    assert a.backend.holder(gate_name(name)) is None  # the waiter gave the gate back
    assert a.try_acquire(name, ttl=10, limit=2) is None
    assert got.release() and held[0].release()


@pytest.mark.parametrize("spec", FIFO)
def test_waiters_are_served_in_arrival_order(env: Env) -> None:
    """Each release goes to the oldest waiter; a newcomer's try never takes it first."""
    holder = env.client()
    name = _name()
    held = [holder.try_acquire(name, ttl=30, limit=2) for _ in range(2)]
    assert held[0] is not None and held[1] is not None
    order: list[str] = []
    waiters = {}
    queues = _Queues()
    in_server = holder.backend.capabilities.queue_follows_connection
    with hooked(queues):
        for ahead, label in enumerate(("w1", "w2", "w3")):
            client = env.client()

            def wait(client: Any = client, label: str = label) -> Any:
                _ACTOR.set(label)
                lease = client.acquire(name, ttl=30, timeout=60, limit=2)
                order.append(label)
                return lease

            waiters[label] = flow.spawn(wait)
            # the next waiter arrives only once this one is queued: w1 holds the gate and
            # waits on the slots (in the server: one slot at a time, so its gate is the
            # sign), w2 and w3 wait on the gate, w3 behind w2
            if label == "w1":
                _gate_taken(holder, name)
                if not in_server:
                    _joined(holder, queues, label, slot_name(name, 0), 0)
            else:
                _joined(holder, queues, label, gate_name(name), ahead - 1)
        assert order == []
        granted = []
        releasing = held
        for label in ("w1", "w2", "w3"):
            assert releasing[0].release()
            lease = flow.result(waiters[label], 30)
            granted.append(lease)
            assert order[-1] == label, order
            releasing = [*releasing[1:], lease]
    assert order == ["w1", "w2", "w3"]
    for lease in releasing:
        assert lease.release()


def test_tokens_are_unique_and_increase_per_slot(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    per_slot: dict[int, list[int]] = {}
    seen: list[int] = []
    for round_ in range(4):
        leases = [(a, b)[i % 2].try_acquire(name, ttl=10, limit=3) for i in range(3)]
        for lease in leases:
            assert lease is not None
            assert lease.slot is not None and lease.token % TOKEN_STRIDE == lease.slot
            per_slot.setdefault(lease.slot, []).append(lease.token)
            seen.append(lease.token)
        for lease in leases[round_ % 3 :] + leases[: round_ % 3]:
            assert lease is not None and lease.release()
    assert len(set(seen)) == len(seen)
    for tokens in per_slot.values():
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_slot_deleted_behind_the_holders_back_is_found_lost(env: Env) -> None:
    a = env.client()
    name = _name()
    lease = a.try_acquire(name, ttl=0.9, limit=3)
    assert lease is not None and lease.backend_name == slot_name(name, 0)
    lost = threading.Event()
    lease.on_lost(lambda _lease: lost.set())
    assert a.backend.force_release(lease.backend_name)
    assert flow.wait_event(lost, 5)
    assert lease.lost
    with pytest.raises(jobfence.LockLost):
        lease.check()
    assert lease.release() is False


@pytest.mark.parametrize("spec", TTL_EXPIRY)
def test_an_expired_slot_is_lost_and_taken_over(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    old = [a.try_acquire(name, ttl=0.4, renew=False, limit=2) for _ in range(2)]
    assert old[0] is not None and old[1] is not None
    new = b.acquire(name, ttl=10, timeout=10, limit=2)  # a slot's expiry lets it in
    former = old[new.slot or 0]
    assert former is not None and new.token > former.token
    assert former.lost
    with pytest.raises(jobfence.LockLost):
        former.extend()
    assert former.release() is False
    new.check()
    assert new.release()


@pytest.mark.parametrize("spec", LISTING)
def test_holders_lists_the_leases_of_a_limit_under_its_name(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    held = [a.try_acquire(name, ttl=10, limit=3) for _ in range(2)]
    waiter = flow.spawn(lambda: b.acquire(name, ttl=10, timeout=30, limit=2 + 1))
    third = flow.result(waiter, 30)  # a free slot: no gate
    listed = a.holders(name)
    leases = [lease for lease in (*held, third) if lease is not None]
    assert [n for n, _ in listed] == [name] * 3
    assert sorted((h.owner, h.token) for _, h in listed) == sorted(
        (lease.owner, lease.token) for lease in leases
    )
    first = b.holder(name, limit=3)
    assert first is not None and first.token in {lease.token for lease in leases}
    assert b.holder(name) is None  # the plain lock of that name is another lock
    for lease in leases:
        assert lease.release()
    assert a.holders(name) == []
    assert a.holder(name, limit=3) is None


def test_a_limit_of_one_is_the_plain_lock(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    lease = a.try_acquire(name, ttl=10, limit=1)
    assert lease is not None
    assert lease.backend_name == name and lease.slot is None
    assert b.try_acquire(name, ttl=10) is None
    found = b.holder(name)
    assert found is not None and found.token == lease.token
    assert lease.release()
    plain = b.try_acquire(name, ttl=10)
    assert plain is not None and plain.token > lease.token
    assert a.try_acquire(name, ttl=10, limit=1) is None
    assert plain.release()


def test_bad_limits_and_a_second_limit_for_a_name_are_refused(env: Env) -> None:
    a = env.client()
    name = _name()
    for bad in (0, -1, 1001, True, 2.0, "3", None):
        with pytest.raises(jobfence.ConfigurationError) as info:
            a.try_acquire(name, limit=bad)  # type: ignore[arg-type]
        assert info.value.argument == "limit"
    with pytest.raises(jobfence.ConfigurationError) as info:
        a.try_acquire("a\x1fb", limit=2)
    assert info.value.argument == "name"
    lease = a.try_acquire(name, ttl=10, limit=2)
    assert lease is not None
    with pytest.raises(jobfence.ConfigurationError) as info:
        a.try_acquire(name, ttl=10, limit=3)
    assert info.value.argument == "limit"
    with pytest.raises(jobfence.ConfigurationError):
        a.try_acquire(name, ttl=10)  # limit=1 is a second limit too
    assert lease.release()


def test_a_timed_out_waiter_leaves_nothing_behind(env: Env) -> None:
    """A waiter whose timeout passed left the gate and every slot's queue: a slot released
    afterwards goes to a newcomer, not to the waiter that gave up."""
    a, b, c = env.client(), env.client(), env.client()
    name = _name()
    held = [a.try_acquire(name, ttl=10, limit=2) for _ in range(2)]
    assert held[0] is not None and held[1] is not None
    with pytest.raises(jobfence.LockTimeout) as info:
        b.acquire(name, ttl=10, timeout=1.5, limit=2)
    assert info.value.name == name and info.value.token in {held[0].token, held[1].token}
    assert a.backend.holder(gate_name(name)) is None
    assert held[0].release()
    again = c.try_acquire(name, ttl=10, limit=2)
    assert again is not None and again.slot == held[0].slot
    assert again.release() and held[1].release()
