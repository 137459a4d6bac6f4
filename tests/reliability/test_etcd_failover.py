"""etcd failover: a disposable three-member cluster on free loopback ports
(``tests/etcd_cluster.py``), its leader SIGKILLed while lock holders and inbox workers run
against all three endpoints; and a holder cut off from the quorum.

What must hold: no fencing token of a name ever goes backwards (every token granted is
collected per name, in grant order: each is appended while its lease is held); every inbox
record that was completed before, during or after the failover is still completed afterwards
(read linearizably through the surviving members); a holder whose cluster lost its quorum
learns that its lease is lost (``on_lost`` runs) within the lease's ttl.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest

import jobfence
from jobfence.backends.base import ClaimState
from jobfence.errors import JobfenceError
from tests.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NAMES = ("alpha", "beta", "gamma")
WORKERS = 4


def wait_until(check: object, timeout: float, what: str) -> None:
    """Poll ``check`` every 20 ms (a cluster's state has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    c = EtcdCluster(3).start()
    try:
        yield c
    finally:
        c.stop()


class Run:
    """Lock holders and inbox workers, until ``stop`` is set."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.namespace = "f" + uuid.uuid4().hex[:10]
        self.table = self.namespace + "_inbox"
        self.stop = threading.Event()
        self.guard = threading.Lock()
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.completed: dict[str, int] = {}
        self.grants = 0
        self.errors: list[str] = []
        self.progress = threading.Condition(self.guard)

    def worker(self, index: int) -> None:
        locks = jobfence.Locks(self.url, namespace=self.namespace)
        inbox = jobfence.Inbox(self.url, table=self.table)
        try:
            n = 0
            while not self.stop.is_set():
                n += 1
                name = NAMES[(index + n) % len(NAMES)]
                key = f"w{index}-{n}"
                try:
                    with locks.acquire(name, ttl=5, timeout=30) as lease, self.progress:
                        self.tokens[name].append(lease.token)
                        self.grants += 1
                        self.progress.notify_all()
                    claim = inbox.claim(key, ttl=30)
                    if claim.state is ClaimState.NEW:
                        claim.complete(n)
                        with self.guard:
                            self.completed[key] = n
                except JobfenceError as exc:  # a call that found no quorum in its timeout
                    with self.guard:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            locks.close()
            inbox.close()

    def wait_grants(self, count: int, timeout: float) -> None:
        with self.progress:
            assert self.progress.wait_for(lambda: self.grants >= count, timeout), (
                f"only {self.grants} grants of {count} within {timeout} s; errors: "
                f"{self.errors[-3:]}"
            )


def test_leader_sigkill_keeps_tokens_increasing_and_completed_records(
    cluster: EtcdCluster,
) -> None:
    run = Run(cluster.url + "?timeout=10")
    threads = [threading.Thread(target=run.worker, args=(i,), daemon=True) for i in range(WORKERS)]
    for t in threads:
        t.start()
    try:
        run.wait_grants(40, 60)
        leader = cluster.leader()
        assert leader is not None
        with run.guard:
            before_kill, completed_before = run.grants, len(run.completed)
        killed_at = time.monotonic()
        cluster.kill(leader)
        wait_until(lambda: cluster.leader() not in (None, leader), 30, "a new leader")
        elected = time.monotonic() - killed_at
        run.wait_grants(before_kill + 40, 60)
    finally:
        run.stop.set()
        for t in threads:
            t.join(60)
    checked = 0
    for name, tokens in run.tokens.items():
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), (name, tokens)
        checked += len(tokens)
    inbox = jobfence.Inbox(cluster.url, table=run.table)
    try:
        for key, value in run.completed.items():
            info = inbox.claim_info(key)  # a linearizable read through a surviving member
            assert info is not None and info.state is ClaimState.COMPLETED, (key, info)
            replay = inbox.claim(key)
            assert replay.state is ClaimState.COMPLETED and replay.result == value
    finally:
        inbox.close()
    print(
        f"\netcd failover: {checked} tokens checked ({before_kill} granted before the kill), "
        f"{len(run.completed)} completed records checked ({completed_before} before the "
        f"kill), new leader after {elected:.2f} s, {len(run.errors)} calls failed meanwhile"
    )
    assert checked >= 80 and len(run.completed) >= 40


def _granted_on_a_settled_cluster(
    cluster: EtcdCluster, locks: jobfence.Locks, name: str, ttl: float
) -> jobfence.Lease:
    """The lease on ``name``, on a cluster an earlier step may have just restarted or paused
    members of: every member answers, and the lease is granted (a grant that hits a member
    still catching up times out after the request timeout and is asked again; one that landed
    anyway holds the name until its etcd lease ends, so the name is asked for until then)."""
    cluster.wait_ready()
    deadline = time.monotonic() + 30
    while True:
        try:
            lease = locks.try_acquire(name, ttl=ttl)
        except JobfenceError:
            lease = None
        if lease is not None:
            return lease
        assert time.monotonic() < deadline, f"the lease on {name!r} was never granted"
        time.sleep(0.1)  # polling for the precondition, not synchronisation


def test_a_holder_cut_off_from_the_quorum_learns_it_lost_its_lease(cluster: EtcdCluster) -> None:
    ttl = 3.0
    # a short request timeout, so that renewals give up quickly once the quorum is gone
    locks = jobfence.Locks(cluster.url + "?timeout=1", namespace="q" + uuid.uuid4().hex[:10])
    try:
        lease = _granted_on_a_settled_cluster(cluster, locks, "cut-off", ttl)
        assert lease.renews
        lost = threading.Event()
        lease.on_lost(lambda _lease: lost.set())
        others = [m for m in cluster.members if m is not cluster.leader()]
        leader = cluster.leader()
        assert leader is not None
        cut_at = time.monotonic()
        cluster.pause(leader)  # two of three members stop: no quorum anywhere
        cluster.pause(others[0])
        try:
            assert lost.wait(ttl + 1.0), "the holder did not learn that its lease was lost"
            detected = time.monotonic() - cut_at
            assert lease.lost
        finally:
            cluster.resume(leader)
            cluster.resume(others[0])
        print(f"\netcd quorum loss: the holder learned its lease was lost after {detected:.2f} s")
        # the quorum is back: the name is free again once the server ended the lease (a
        # member still electing or catching up after the pause answers late: asked again)
        again = _granted_on_a_settled_cluster(cluster, locks, "cut-off", ttl)
        assert again.token > lease.token
        again.release()
    finally:
        locks.close()


def test_the_doctor_reports_a_dead_member_and_a_url_that_names_one_member(
    cluster: EtcdCluster,
) -> None:
    from jobfence.backends import parse_backend_url
    from jobfence.backends.etcd.doctor import inspect
    from jobfence.doctor import Report, Timer

    def findings(url: str) -> dict[str, str]:
        parsed = parse_backend_url(url)
        report = Report(url=parsed.masked, backend="etcd", namespace="jobfence")
        inspect(report, parsed, Timer(1))
        return {f.code: f.level for f in report.findings}

    healthy = findings(cluster.url)
    assert healthy["etcd-health"] == "ok" and healthy["etcd-member-count"] == "ok"
    assert "etcd-endpoints" not in healthy
    first = cluster.members[0]
    assert findings(f"etcd://127.0.0.1:{first.client_port}")["etcd-endpoints"] == "warning"
    cluster.kill(cluster.members[2])
    wait_until(lambda: cluster.leader() is not None, 30, "a leader among the two left")
    assert findings(cluster.url)["etcd-members"] == "warning"
