# Generated from test_lock_conformance.py by tools/conformance_twins.py: do not edit.
# Edit the async specs and run: python tools/conformance_twins.py
"""The lock contract, run against every backend, with the sync and the async API.

The lease semantics that are the same on every backend, checked on every spec of
``specs_for("locks")`` (memory, SQLite, Redis, PostgreSQL in each mode, MySQL/MariaDB).

The specs are written once, in ``test_lock_conformance.py``, over ``AsyncLocks``;
``test_lock_conformance_sync.py`` is generated from it by ``tools/conformance_twins.py``
(``AsyncLocks`` -> ``Locks``, ``await x`` -> ``x``, ``flow_async`` -> ``flow``): the sync
specs call the sync API on the test's own thread, as users do. Code that differs between
the flavours sits in ``if ASYNC:`` / ``else:`` branches, and a spec only one flavour can run
in ``if ASYNC:``.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import uuid
from pathlib import Path

import pytest

import jobfence
from tests.conformance import _mutex_worker, flow
from tests.conformance.conftest import Env
from tests.conformance.specs import LOCKS, spec_params

pytestmark = pytest.mark.timeout(120)


#: the specs whose waiters join a FIFO wait queue with a call that returns: the queue's
#: contract is checked through the backend's verbs (a session-mode waiter waits in the server)
WAIT_QUEUE = spec_params(LOCKS, lambda s: s.fifo and not s.queue_follows_connection)
#: the specs whose leases run out after their ttl
TTL_EXPIRY = spec_params(LOCKS, lambda s: s.ttl_expiry)


def _name() -> str:
    return "job:" + uuid.uuid4().hex[:8]


def test_try_acquire_returns_none_while_held(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    lease = a.try_acquire(name, ttl=10)
    assert lease is not None and lease.token > 0
    assert b.try_acquire(name, ttl=10) is None
    assert a.try_acquire(name, ttl=10) is None  # not re-entrant: a new owner each call
    assert lease.release() is True
    assert lease.release() is False  # second release: no longer held


def test_same_name_can_be_held_again_right_after_release(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    tokens = []
    for client in (a, b, a, b):
        lease = client.try_acquire(name, ttl=10)
        assert lease is not None
        tokens.append(lease.token)
        assert lease.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == 4  # strictly increasing


def test_acquire_raises_lock_timeout_near_its_timeout(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    held = a.try_acquire(name, ttl=10)
    assert held is not None
    started = time.monotonic()
    with pytest.raises(jobfence.LockTimeout) as info:
        b.acquire(name, ttl=10, timeout=0.6)
    elapsed = time.monotonic() - started
    assert 0.55 <= elapsed < 3.0, elapsed
    assert info.value.name == name
    assert isinstance(info.value, jobfence.LockError)
    # the timed-out waiter left nothing behind: after release the name is free for others
    assert held.release()
    again = b.try_acquire(name, ttl=10)
    assert again is not None and again.token > held.token
    again.release()


def test_waiter_gets_the_lease_when_the_holder_releases(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    held = a.try_acquire(name, ttl=10)
    assert held is not None
    waiter = flow.spawn(lambda: b.acquire(name, ttl=10, timeout=30))
    flow.sleep(0.05)
    assert not waiter.done()  # still held: the waiter must wait
    assert held.release()
    got = flow.result(waiter, 30)
    assert got.token > held.token
    assert a.try_acquire(name, ttl=10) is None
    assert got.release()


def test_expired_holder_cannot_release_or_extend_the_new_holders_lease(
    env: Env,
) -> None:
    a, b = env.client(), env.client()
    name = _name()
    old = a.try_acquire(name, ttl=0.4, renew=False)
    assert old is not None
    if not env.client().capabilities.ttl_expiry:
        # a mode that does not honour ttl (declared by capability): the lease outlives its ttl
        flow.sleep(0.6)
        assert b.try_acquire(name, ttl=0.4) is None
        assert old.release()
        return
    new = b.acquire(name, ttl=10, timeout=10)  # expiry lets another client take over
    assert new.token > old.token
    assert old.lost
    with pytest.raises(jobfence.LockLost):
        old.check()
    with pytest.raises(jobfence.LockLost):
        old.extend()
    assert old.release() is False
    # nor through the backend's verbs; a retried grant of the new owner (its reply lost)
    # gets the same lease back
    assert a.backend.release(name, old.owner) is False
    assert a.backend.extend(name, old.owner, 10) is False
    assert a.backend.renew([(name, old.owner, 10)]) == [False]
    assert b.backend.acquire(name, new.owner, 10) == new.token
    # the new holder is untouched
    assert a.try_acquire(name, ttl=10) is None
    new.check()
    new.extend(10)
    assert new.release() is True


def test_renewal_keeps_a_lease_alive_past_several_ttls(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    # a renewal must answer within its share of the ttl: 1.2 s leaves slack for a loaded
    # machine running the suite in parallel (0.5 s did not, for SQLite)
    lease = a.try_acquire(name, ttl=1.2)
    assert lease is not None
    flow.sleep(3.8)  # > 3 ttls: only renewal can keep it
    assert not lease.lost
    lease.check()
    assert b.try_acquire(name, ttl=1.2) is None
    assert lease.release() is True


def test_deleted_lease_is_detected_as_lost_within_one_renewal_interval(
    env: Env,
) -> None:
    a, admin = env.client(), env.client()
    name = _name()
    ttl = 0.9
    lease = a.try_acquire(name, ttl=ttl)
    assert lease is not None
    lost = threading.Event()
    lease.on_lost(lambda _lease: lost.set())
    assert admin.force_release(name)
    # renewals run every ttl/3; allow one interval plus the round trip and scheduling slack
    assert flow.wait_event(lost, ttl / 3 + 1.0)
    assert lease.lost
    with pytest.raises(jobfence.LockLost):
        lease.check()
    assert lease.release() is False


def test_on_lost_registered_after_loss_runs_at_once(env: Env) -> None:
    a = env.client()
    name = _name()
    lease = a.try_acquire(name, ttl=0.3, renew=False)
    assert lease is not None
    flow.sleep(0.4)
    called = []
    lease.on_lost(called.append)
    assert called == [lease]


def test_block_exit_raises_lock_lost_when_the_lease_was_lost(
    env: Env,
) -> None:
    a, admin = env.client(), env.client()
    name = _name()
    with pytest.raises(jobfence.LockLost), a.acquire(name, ttl=0.6, timeout=5) as lease:
        admin.force_release(name)
        gone = threading.Event()  # the body goes on; the block's exit raises
        lease.on_lost(lambda _lease: gone.set())
        assert gone.wait(5)


def test_closing_a_client_gives_its_held_leases_back(env: Env) -> None:
    """Found in review: closing a client with held leases left them blocking the names for
    their whole ttl (SQL backends), and a later ``release()`` raised ConfigurationError."""
    a, b = env.client(), env.client()
    name = _name()
    lease = a.try_acquire(name, ttl=60)
    plain = a.try_acquire(name + ":plain", ttl=60, renew=False)
    assert lease is not None and plain is not None
    a.close()
    assert lease.lost and plain.lost  # their holders are told
    with pytest.raises(jobfence.LockLost):
        lease.check()
    assert lease.release() is False  # closing gave it back; no ConfigurationError
    taken = b.try_acquire(name, ttl=10)  # free at once, not after 60 s
    assert taken is not None and taken.token > lease.token
    assert b.try_acquire(name + ":plain", ttl=10) is not None


def test_closing_a_client_takes_its_waiters_out_of_the_queue(env: Env) -> None:
    """Found in review: a waiter left in a FIFO queue by a closed client was handed the next
    release's lease, and the name stalled for that waiter's ttl."""
    holder, closing, other = env.client(), env.client(), env.client()
    name = _name()
    held = holder.try_acquire(name, ttl=30)
    assert held is not None
    waiting = flow.spawn(lambda: closing.acquire(name, ttl=30, timeout=5))
    flow.sleep(0.3)  # the waiter joins the queue (no event to wait on across clients)
    assert not waiting.done()
    closing.close()
    assert held.release() is True
    taken = other.acquire(name, ttl=10, timeout=3)  # not stalled for 30 s
    assert taken.token > held.token
    assert taken.release()
    with pytest.raises(jobfence.ConfigurationError):  # the waiter ends: its client is
        flow.result(waiting, 10)  # closed (the same error on every backend)


def test_extend_resets_the_lifetime_and_fails_once_lost(env: Env) -> None:
    a, b = env.client(), env.client()
    name = _name()
    # a ttl the acquire and the extend fit in on a loaded machine (the client counts it
    # from before the acquire was sent; a slow etcd round trip took more than 0.5 s)
    lease = a.try_acquire(name, ttl=2, renew=False)
    assert lease is not None
    lease.extend(5)
    flow.sleep(2.2)  # past the original ttl: only the extension keeps it
    assert not lease.lost
    assert b.try_acquire(name, ttl=1) is None
    assert a.force_release(name)
    with pytest.raises(jobfence.LockLost):
        lease.extend()
    assert lease.lost


def test_mutual_exclusion_with_eight_concurrent_workers(env: Env, tmp_path: Path) -> None:
    """8 workers do read-sleep-write on a shared counter file: no increment may be lost."""
    workers, iterations = 8, 5
    name = _name()
    counter = tmp_path / "counter.txt"
    counter.write_text("0")
    cross_process = env.client().capabilities.cross_process
    # processes where the backend is shared between processes; threads for in-process ones
    ctx = multiprocessing.get_context("spawn")
    start, results, worker = (
        (ctx.Event(), ctx.Queue(), ctx.Process)
        if cross_process
        else (threading.Event(), queue.Queue(), threading.Thread)
    )
    procs = [
        worker(
            target=_mutex_worker.run,
            args=(
                env.url,
                env.namespace,
                name,
                str(counter),
                iterations,
                flow.FLAVOUR,
                start,
                results,
            ),
        )
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    start.set()
    holds = [h for _ in range(workers) for h in results.get(timeout=100)]
    for p in procs:
        p.join(30)
    assert int(counter.read_text()) == workers * iterations
    seen = sorted(v for v, _t in holds)
    assert seen == list(range(workers * iterations))  # every read saw the previous write
    tokens_in_hold_order = [t for _v, t in sorted(holds)]
    assert tokens_in_hold_order == sorted(set(tokens_in_hold_order))  # strictly increasing


def test_install_is_idempotent_and_force_release_frees_a_name(env: Env) -> None:
    admin, worker = env.client(), env.client()
    admin.install()
    admin.install()
    name = _name()
    lease = worker.try_acquire(name, ttl=10, renew=False)
    assert lease is not None
    assert admin.force_release(name) is True
    assert admin.force_release(name) is False  # nothing left to drop
    again = admin.try_acquire(name, ttl=10)
    assert again is not None and again.token > lease.token
    assert lease.release() is False
    assert again.release() is True


# -- the wait queue, renewal in batches, tokens per name ----------------------------------


@pytest.mark.parametrize("spec", WAIT_QUEUE)
def test_a_release_hands_the_lease_to_the_head_of_the_wait_queue(
    env: Env,
) -> None:
    """Waiters are served in arrival order: each release hands the lease to the head of the
    queue, whichever waiter looks first; neither the releaser nor a newcomer overtakes it."""
    backend = env.client().backend
    name = _name()
    first = backend.acquire(name, "holder", 30)
    assert first is not None
    for waiter in ("w1", "w2", "w3"):  # each joins the queue, in this order
        assert backend.acquire(name, waiter, 30, wait=30) is None
    assert backend.release(name, "holder") is True
    assert backend.acquire(name, "holder", 30) is None  # the releaser cannot take it back
    assert backend.acquire(name, "newcomer", 30) is None  # nor can a newcomer
    tokens = [first]
    for head, behind in (("w1", ("w3", "w2")), ("w2", ("w3",)), ("w3", ())):
        for later in behind:  # the waiters behind the head look first: not theirs yet
            assert backend.acquire(name, later, 30, wait=30) is None
        token = backend.acquire(name, head, 30, wait=30)  # the head's: handed over
        assert token is not None and token > tokens[-1], (head, token, tokens)
        tokens.append(token)
        assert backend.release(name, head) is True
    last = backend.acquire(name, "newcomer", 30)  # nobody waits any more
    assert last is not None and last > tokens[-1]
    assert backend.release(name, "newcomer") is True


@pytest.mark.parametrize("spec", WAIT_QUEUE)
def test_an_expired_lease_goes_to_the_head_of_the_wait_queue_not_a_newcomer(
    env: Env,
) -> None:
    backend = env.client().backend
    name = _name()
    first = backend.acquire(name, "holder", 0.3)  # a holder that crashes: no release
    assert first is not None
    assert backend.acquire(name, "w1", 30, wait=30) is None
    deadline = time.monotonic() + 10
    token = None
    while token is None:  # w1 looks again and again, as a waiting acquire does
        # a newcomer's try never takes the lease ahead of w1, also once the ttl ran out
        assert backend.acquire(name, "newcomer", 30) is None
        token = backend.acquire(name, "w1", 30, wait=30)
        assert time.monotonic() < deadline, "the expired lease never went to the waiter"
        if token is None:
            flow.sleep(0.02)
    assert token > first
    assert backend.acquire(name, "newcomer", 30) is None  # w1 holds it
    assert backend.release(name, "w1") is True


@pytest.mark.parametrize("spec", TTL_EXPIRY)
def test_renew_extends_many_leases_in_one_backend_call_with_one_answer_each(
    env: Env,
) -> None:
    """The renewer's batch: one ``renew`` call for many leases, one answer per item, in
    order; an item whose lease is gone, or held by another owner, changes nothing."""
    backend = env.client().backend
    names = [_name() for _ in range(4)]
    for i, name in enumerate(names):
        assert backend.acquire(name, f"o{i}", 1.0) is not None
    assert backend.force_release(names[2])
    items = [(name, f"o{i}", 30.0 + i) for i, name in enumerate(names)]  # ttls of their own
    items.append((names[0], "not-the-owner", 30.0))
    items.append((_name(), "o9", 30.0))  # never held
    assert backend.renew(items) == [True, True, False, True, False, False]
    assert backend.renew([]) == []
    flow.sleep(1.3)  # past the first ttl: only the renewal keeps them
    for i in (0, 1, 3):
        assert backend.acquire(names[i], "other", 30) is None, names[i]
    again = [(name, f"o{i}", 30.0) for i, name in enumerate(names)]
    assert backend.renew(again) == [True, True, False, True]
    assert backend.acquire(names[2], "other", 30) is not None  # released: free


def test_fencing_tokens_increase_per_name(env: Env) -> None:
    """Each name has its own token sequence: strictly increasing whoever takes it, and a
    name's holder never blocks another name."""
    a, b = env.client(), env.client()
    x, y = _name(), _name()
    seen: dict[str, list[int]] = {x: [], y: []}
    for client, name in ((a, x), (b, y), (b, x), (a, y), (a, x), (b, y)):
        lease = client.try_acquire(name, ttl=10)
        assert lease is not None, name
        other = (b if client is a else a).try_acquire(x if name == y else y, ttl=10)
        assert other is not None  # the other name is free meanwhile
        assert other.release()
        seen[name].append(lease.token)
        assert lease.release()
    for name, tokens in seen.items():
        assert tokens == sorted(set(tokens)), (name, tokens)
