"""The blocking Inbox's group commit on the backends that take a batch in one round trip
(PostgreSQL, SQLite, Redis): claims and completions that other threads make while one round
trip is under way go together in the next, and each thread still gets exactly the answer a
claim of its own would give.

Round trips are counted by wrapping the real backend's verbs (the calls still go to the real
server). To make the batches deterministic, the first round trip of a test is held (after
the server answered it) until the other threads wait behind it."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence import BackendError, ClaimState
from tests.conformance.specs import INBOX, Spec, inbox_table, new_namespace, spec_params
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL, REDIS_URL

BATCHING = spec_params(INBOX, lambda s: s.id in ("postgres", "sqlite", "redis"))
WAIT = 30.0  # bound on every wait (a hang fails the test instead of the run)
THREADS = 8


class Counted:
    """The backend's claim/complete verbs, counted: round trips, and the keys of each batch
    (which must be distinct). ``hold(family)``: the next round trip of that family, once
    answered by the server, waits until :meth:`let_go`."""

    def __init__(self, inbox: jobfence.Inbox) -> None:
        self.calls: dict[str, list[list[str]]] = {"claim": [], "complete": []}
        self._mutex = threading.Lock()
        self._held: dict[str, threading.Event] = {}
        self.holding = threading.Event()  # a held round trip was answered and waits
        backend = inbox.backend
        for verb, many in (("claim", "claim_many"), ("complete", "complete_many")):
            self._wrap(backend, verb, verb, lambda args: [args[0]])
            self._wrap(backend, many, verb, lambda args: [item[0] for item in args[0]])

    def _wrap(self, backend: Any, name: str, family: str, keys_of: Any) -> None:
        real = getattr(backend, name)

        def counted(*args: Any) -> Any:
            keys = keys_of(args)
            assert len(set(keys)) == len(keys), f"a batch with one key twice: {keys}"
            with self._mutex:
                self.calls[family].append(keys)
                gate = self._held.pop(family, None)
            answer = real(*args)
            if gate is not None:
                self.holding.set()
                assert gate.wait(WAIT), "the held round trip was never let go"
            return answer

        setattr(backend, name, counted)

    def hold(self, family: str) -> threading.Event:
        gate = threading.Event()
        self._held[family] = gate
        return gate

    def trips(self, family: str) -> int:
        return len(self.calls[family])

    def items(self, family: str) -> int:
        return sum(len(keys) for keys in self.calls[family])


def waiting(gc: Any, n: int) -> None:
    """Until ``n`` items wait in the group commit ``gc`` (their threads blocked in it)."""
    pause = threading.Event()
    for _ in range(int(WAIT / 0.002)):
        with gc._mutex:
            if len(gc._pending) >= n:
                return
        pause.wait(0.002)
    raise AssertionError(f"{n} items never waited behind the round trip under way")


def at_once(
    pool: ThreadPoolExecutor, family: str, counted: Counted, gc: Any, calls: list[Any]
) -> list[Any]:
    """Run ``calls`` (no-argument callables) in threads: the first one's round trip is held
    until all the others wait behind it, so that they go together in the next one."""
    gate = counted.hold(family)
    first = pool.submit(calls[0])
    assert counted.holding.wait(WAIT)
    counted.holding.clear()
    rest = [pool.submit(call) for call in calls[1:]]
    waiting(gc, len(rest))
    gate.set()
    return [future.result(WAIT) for future in (first, *rest)]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(THREADS * 2, thread_name_prefix="caller") as executor:
        yield executor


@pytest.fixture(params=BATCHING)
def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    spec: Spec = request.param
    url = spec.make_url(tmp_path)
    namespace = new_namespace()
    box = jobfence.Inbox(url, table=inbox_table(namespace))
    assert box.backend.batches
    box.install()
    try:
        yield box
    finally:
        box.drop()
        box.close()
        spec.cleanup(url, namespace)


def test_threads_claiming_and_completing_at_once_share_round_trips(
    inbox: Any, pool: ThreadPoolExecutor
) -> None:
    counted = Counted(inbox)
    keys = [f"gc:{i}" for i in range(THREADS)]
    claims = at_once(
        pool, "claim", counted, inbox._claims, [lambda k=k: inbox.claim(k, ttl=30) for k in keys]
    )
    assert [c.key for c in claims] == keys
    assert [c.state for c in claims] == [ClaimState.NEW] * THREADS
    assert len({c.owner for c in claims}) == THREADS
    # the first alone, the seven others together
    assert counted.items("claim") == THREADS and counted.trips("claim") == 2, counted.calls
    at_once(
        pool,
        "complete",
        counted,
        inbox._completions,
        [lambda c=c, i=i: c.complete({"i": i}) for i, c in enumerate(claims)],
    )
    assert counted.items("complete") == THREADS and counted.trips("complete") == 2
    for i, key in enumerate(keys):  # each key kept its own result
        replay = inbox.claim(key)
        assert replay.state is ClaimState.COMPLETED and replay.result == {"i": i}


def test_one_key_claimed_by_many_threads_at_once_has_exactly_one_winner(
    inbox: Any, pool: ThreadPoolExecutor
) -> None:
    counted = Counted(inbox)
    keys = ["first", *["dup"] * 5, *["other"] * 3]
    claims = at_once(
        pool, "claim", counted, inbox._claims, [lambda k=k: inbox.claim(k, ttl=30) for k in keys]
    )
    for key in ("dup", "other"):
        mine = [c for c in claims if c.key == key]
        winners = [c for c in mine if c.state is ClaimState.NEW]
        assert len(winners) == 1, [c.state for c in mine]
        for loser in mine:
            if loser is not winners[0]:
                assert loser.state is ClaimState.IN_PROGRESS
                assert loser.owner == winners[0].owner
    assert counted.items("claim") == len(keys)  # Counted checked no batch held a key twice
    assert counted.trips("claim") < len(keys)


def test_guarded_def_calls_from_many_threads_run_each_key_once(
    inbox: Any, pool: ThreadPoolExecutor
) -> None:
    runs: list[int] = []
    lock = threading.Lock()

    @jobfence.guarded(inbox=inbox, key="order:{n}")
    def charge(n: int) -> dict[str, int]:
        with lock:
            runs.append(n)
        return {"charged": n}

    numbers = [*range(10), *range(10)]
    futures = [pool.submit(charge, n) for n in numbers]
    for n, future in zip(numbers, futures, strict=True):
        exc = future.exception(WAIT)
        # a duplicate that came while the first ran is told so; one after it replays
        assert exc is None or isinstance(exc, jobfence.ClaimInProgress), exc
        if exc is None:
            assert future.result() == {"charged": n}
    assert sorted(runs) == list(range(10))
    assert [charge(n) for n in range(10)] == [{"charged": n} for n in range(10)]
    assert sorted(runs) == list(range(10))
    # every claim and completion went through the group commits
    assert (inbox._claims.items, inbox._completions.items) == (30, 10)


# -- a batch that fails ------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["redis", "postgres"])
def test_a_batch_whose_link_breaks_fails_every_thread_in_it_and_the_next_call_works(
    server: str, pool: ThreadPoolExecutor
) -> None:
    """The round trip of a batch of three threads' claims is cut off (the connection is
    reset under it): each of the three threads raises, nothing is left waiting, and the
    next claim through the same inbox works."""
    url = {"redis": REDIS_URL, "postgres": POSTGRES_URL}[server]
    port = urlsplit(url).port or {"redis": 6379, "postgres": 5432}[server]
    table = inbox_table(new_namespace())
    direct = jobfence.Inbox(url, table=table)
    direct.install()
    with FaultProxy(port) as proxy:
        options: dict[str, Any] = {"timeout": 5} if server == "redis" else {}
        inbox = jobfence.Inbox(proxy.url_for(url, port), table=table, **options)
        try:
            assert inbox.claim("warm-up").state is ClaimState.NEW
            counted = Counted(inbox)
            gate = counted.hold("claim")
            first = pool.submit(inbox.claim, "first", ttl=300)
            assert counted.holding.wait(WAIT)  # answered, held before returning
            calls = [pool.submit(inbox.claim, f"cut:{i}", ttl=300) for i in range(3)]
            waiting(inbox._claims, 3)
            proxy.stall()
            gate.set()
            assert first.result(WAIT).state is ClaimState.NEW
            # the three go in one batch, which the stalled link holds
            pause = threading.Event()
            for _ in range(int(WAIT / 0.005)):
                if counted.trips("claim") >= 2:
                    break
                pause.wait(0.005)
            assert sorted(counted.calls["claim"][1]) == [f"cut:{i}" for i in range(3)]
            proxy.refuse(True)
            proxy.reset()
            for call in calls:
                assert isinstance(call.exception(WAIT), BackendError)
            assert not inbox._claims._pending and not inbox._claims._sending
            proxy.refuse(False)
            proxy.resume()
            again = inbox.claim("after")
            assert again.state is ClaimState.NEW
            for i in range(3):  # nothing reached the server, or it was given back
                assert direct.claim(f"cut:{i}").state is ClaimState.NEW
        finally:
            proxy.refuse(False)
            proxy.resume()
            inbox.close()
            direct.drop()
            direct.close()


def test_a_batch_the_server_refuses_fails_every_thread_in_it_and_the_next_call_works(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """SQLite: another connection holds the file's write lock while a batch of three
    threads' claims is sent; the batch fails (``database is locked``) in each of the three
    threads, and the next claim, once the lock is gone, works."""
    path = tmp_path / "locked.db"
    inbox = jobfence.Inbox(
        f"sqlite:///{path}", table=inbox_table(new_namespace()), busy_timeout=0.2
    )
    inbox.install()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        counted = Counted(inbox)
        gate = counted.hold("claim")
        first = pool.submit(inbox.claim, "first", ttl=300)
        assert counted.holding.wait(WAIT)
        calls = [pool.submit(inbox.claim, f"locked:{i}", ttl=300) for i in range(3)]
        waiting(inbox._claims, 3)
        blocker.execute("BEGIN EXCLUSIVE")
        gate.set()
        assert first.result(WAIT).state is ClaimState.NEW
        for call in calls:
            assert isinstance(call.exception(WAIT), BackendError)
        assert sorted(counted.calls["claim"][1]) == [f"locked:{i}" for i in range(3)]
        blocker.execute("COMMIT")
        assert not inbox._claims._pending and not inbox._claims._sending
        for i in range(3):  # the batch's transaction rolled back: every key is free
            assert inbox.claim(f"locked:{i}").state is ClaimState.NEW
    finally:
        blocker.close()
        inbox.drop()
        inbox.close()


# -- fork --------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_a_thread_sends_a_batch_batches_on_its_own(
    inbox: Any, pool: ThreadPoolExecutor
) -> None:
    """A parent thread is in the middle of a batch (the group's turn to send taken, its lock in use)
    when the process forks: the child's inbox has group commits of its own, so its claims
    neither wait for that batch (whose thread does not exist in the child) nor join it."""
    counted = Counted(inbox)
    gate = counted.hold("claim")
    parent_claim: Future[Any] = pool.submit(inbox.claim, "parent", ttl=30)
    assert counted.holding.wait(WAIT)  # a parent thread leads a batch now
    assert inbox._claims._sending
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 if its claims work, batched on its own
        code = 1
        try:
            signal.alarm(20)  # a hang kills the child, and fails the test
            claims = inbox._claims
            assert not claims._sending and not claims._pending
            with ThreadPoolExecutor(4) as child_pool:
                got = list(child_pool.map(lambda k: inbox.claim(k, ttl=30), ["c1", "c2", "c3"]))
            done = inbox.claim("c4")
            done.complete("ok")
            if [c.state for c in got] == [ClaimState.NEW] * 3 and claims.items == 4:
                code = 0
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        gate.set()
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_claim.result(WAIT).state is ClaimState.NEW
    assert inbox.claim("c4").state is ClaimState.COMPLETED  # the child's, stored
