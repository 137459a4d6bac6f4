"""Three ``jobfence scheduler`` processes fire a 1 s schedule: one is killed, one is frozen
past its lease, and every slot still has exactly one effect.

Every backend whose inbox is shared between processes (SQLite file, PostgreSQL,
MySQL/MariaDB, Redis, etcd): three processes run ``jobfence scheduler`` on the same schedule
(``every 1 s``, lease 2 s, misfire ``latest``, grace 60 s), whose target writes to a PostgreSQL
ledger (``_scheduler_app.py``): an ``attempts`` row per invocation, and an ``effects`` row in
the same transaction as the ledger inbox's ``claim_in(conn, slot.key)``.

The pods' wall clocks are skewed (+0.2 s, 0, -0.2 s, within ``max_skew`` = 1 s), so the
first pod wins the race for each slot while it lives, then the second: this makes the
failures land where they prove something, in the middle of a fire:

1. pod ``p0`` is SIGKILLed while its target runs (its attempt row is there, its effect not);
2. pod ``p1`` is SIGSTOPped while its target runs, and SIGCONTed only once another pod has
   taken that slot over (so it was frozen past its 2 s lease); it resumes inside the target
   it was running, whose ``claim_in`` then finds the slot applied;
3. the processes left are stopped with SIGTERM after ``JOBFENCE_PROOF_SECONDS`` (default 12),
   and at least ``TAIL`` (4) slots after the resumed pod fired again.

Asserted on the ledger: every slot from the first effect to the last slot before SIGTERM has
exactly one effect row; none is missing (a taken-over slot fires about ``lease`` + one pass
late, far within grace: misfire ``latest`` never applies, so no slot may be recorded missed,
and the scheduler's own records say ``fired`` for each); a slot has more than one attempt
only when an earlier attempt was the killed or frozen pod's, and the slots those pods were
running were fired by another pod. A live pod's attempt finds its slot applied only where the
killed or frozen pod made that slot's effect and was stopped before it recorded the fire (a pod
runs two targets at once when one starts late), within two slots of the kill or the freeze:
the live pod's fire is then recorded.
``JOBFENCE_PROOF_REPORT=<file>`` appends each run's figures to that file as a JSON line.

The naive control runs three plain per-process loops (sleep to the next second, write the
effect) against the same ledger: every second gets an effect from each of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from tests.conformance.specs import INBOX, new_namespace, spec_params
from tests.reliability._scheduler_app import SCHEDULE, create_ledger, ledger_inbox
from tests.servers import POSTGRES_URL

SECONDS = float(os.environ.get("JOBFENCE_PROOF_SECONDS", "12"))
#: slots the two pods left share after the frozen pod fired again, at least
TAIL = 4.0
LEASE = 2.0
#: each pod's wall-clock skew (seconds): p0 claims each slot first while it lives, then p1
SKEWS = {"p0": 0.2, "p1": 0.0, "p2": -0.2}
KILLED, STOPPED = "p0", "p1"
SPENT = (KILLED, STOPPED)
#: how long one awaited condition may take before the test fails (seconds)
WAIT = 30.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 4 * int(WAIT))]

ROOT = Path(__file__).resolve().parents[2]
SPECS = spec_params(INBOX, lambda s: s.cross_process)


@pytest.fixture
def ledger() -> Iterator[str]:
    """The ledger's table prefix in PostgreSQL: attempts, effects and the ledger inbox."""
    tables = new_namespace()
    with psycopg.connect(POSTGRES_URL) as conn:
        create_ledger(conn, tables)
    with ledger_inbox(tables) as inbox:
        inbox.install()
    try:
        yield tables
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for suffix in ("attempts", "effects", "ledger"):
                conn.execute(f"DROP TABLE IF EXISTS {tables}_{suffix}")
            conn.execute(
                "DELETE FROM jobfence_inbox_schema WHERE table_name = %s", (f"{tables}_ledger",)
            )


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _until(
    what: str, check: Callable[[], Any], procs: dict[str, Any], timeout: float = WAIT
) -> Any:
    """Poll ``check`` (a ledger query) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        for pod, proc in procs.items():
            code = proc.poll()
            assert code is None or code == -signal.SIGKILL, f"{pod} exited {code}"
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def _query(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _running(tables: str, pod: str, after: float) -> str | None:
    """The slot whose target ``pod`` is running now (its attempt has no outcome yet)."""
    rows = _query(
        f"SELECT slot FROM {tables}_attempts WHERE pod = %s AND applied IS NULL "
        "AND slot_at > %s ORDER BY slot_at DESC LIMIT 1",
        pod,
        after,
    )
    return rows[0][0] if rows else None


def _slot_at(tables: str, slot: str) -> float:
    return float(_query(f"SELECT slot_at FROM {tables}_attempts WHERE slot = %s", slot)[0][0])


def _terminate(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def _report(figures: dict[str, Any]) -> None:
    path = os.environ.get("JOBFENCE_PROOF_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(figures) + "\n")


@pytest.mark.parametrize("backend", SPECS, indirect=True)
def test_killed_and_frozen_pods_every_slot_has_one_effect(
    backend: tuple[str, str], ledger: str, tmp_path: Path
) -> None:
    url, namespace = backend
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {pod: tmp_path / f"{pod}.log" for pod in SKEWS}
    try:
        for pod, skew in SKEWS.items():
            env = {
                "PROOF_URL": url,
                "PROOF_NAMESPACE": namespace,
                "PROOF_TABLES": ledger,
                "PROOF_POD": pod,
                "PROOF_LEASE": str(LEASE),
                "PROOF_SKEW": str(skew),
            }
            args = ["-m", "jobfence.cli.app", "scheduler", "tests.reliability._scheduler_app:sched"]
            procs[pod] = _spawn(args, env, logs[pod])
        started = time.time()
        _until(
            "every pod runs its loop",
            lambda: all("running schedules" in logs[p].read_text() for p in procs),
            procs,
        )
        ready = time.time()

        # 1. SIGKILL p0 in the middle of a fire
        killed = _until("p0 runs a target", lambda: _running(ledger, KILLED, ready), procs)
        procs[KILLED].kill()
        procs[KILLED].wait()
        killed_at = _slot_at(ledger, killed)

        # 2. SIGSTOP p1 in the middle of a later fire, SIGCONT once another pod took it over
        stopped = _until("p1 runs a target", lambda: _running(ledger, STOPPED, killed_at), procs)
        os.kill(procs[STOPPED].pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            _until(
                "another pod fires the frozen pod's slot",
                lambda: _query(f"SELECT pod FROM {ledger}_effects WHERE slot = %s", stopped),
                procs,
            )
            frozen = time.monotonic() - frozen
        finally:
            os.kill(procs[STOPPED].pid, signal.SIGCONT)
        stopped_at = _slot_at(ledger, stopped)
        # p1 fires again once resumed (it claims the slots first again)
        _until(
            "the resumed pod fires again",
            lambda: _query(
                f"SELECT 1 FROM {ledger}_effects WHERE pod = %s AND slot_at > %s",
                STOPPED,
                stopped_at,
            ),
            procs,
        )
        resumed = time.time()
        # the rest of the run: the two pods left share the schedule (the run's length, not
        # a synchronisation)
        time.sleep(max(0.0, started + SECONDS - time.time(), resumed + TAIL - time.time()))
        ended = time.time()
        for pod in (STOPPED, "p2"):
            procs[pod].send_signal(signal.SIGTERM)
        for pod in (STOPPED, "p2"):
            assert procs[pod].wait(WAIT) == 0, logs[pod].read_text()[-3000:]
    finally:
        _terminate(procs)

    effects = _query(f"SELECT slot, slot_at, pod, lag FROM {ledger}_effects")
    attempts = _query(f"SELECT slot, slot_at, pod, applied FROM {ledger}_attempts")
    timed = _query(f"SELECT slot, slot_at, pod, started FROM {ledger}_attempts")
    first = min(at for _, at, _, _ in effects)
    last = float(int(ended) - 2)  # the slots before SIGTERM: each had its time to fire
    window = [first + i for i in range(int(last - first) + 1)]
    per_slot: dict[float, list[str]] = {at: [] for at in window}
    for _, at, pod, _ in effects:
        per_slot.setdefault(at, []).append(pod)
    doubled = {at: pods for at, pods in per_slot.items() if len(pods) > 1}
    missing = [at for at in window if not per_slot[at]]
    assert not doubled, f"slots with more than one effect: {doubled}"
    assert not missing, f"slots with no effect (nothing may be missed here): {missing}"
    # the killed and the frozen pod's slots were fired by another pod
    owner = {slot: pod for slot, _, pod, _ in effects}
    assert owner[killed] != KILLED, owner[killed]
    assert owner[stopped] != STOPPED, owner[stopped]
    # an attempt that made no effect is the killed or the frozen pod's, or a live pod's that
    # took over a slot one of those two had applied and not yet recorded as fired when it was
    # killed or frozen (it can run two targets at once, and the signal can land between one's
    # commit and its record): its claim expired, and the ledger inbox found the slot applied.
    # Only next to the kill or the freeze: a live pod re-running a slot at any other time is
    # a slot run twice, which the inbox hid from the effects but not from the attempts.
    wasted = [(slot, pod, applied) for slot, _, pod, applied in attempts if applied is not True]
    assert wasted, "the killed and frozen pods' attempts are in the ledger"
    slot_ats = {slot: at for slot, at, _, _ in attempts}
    applied_by = {(slot, pod) for slot, _, pod, applied in attempts if applied is True}
    moments = {KILLED: slot_ats[killed], STOPPED: slot_ats[stopped]}
    taken_over = [(slot, pod, applied) for slot, pod, applied in wasted if pod not in SPENT]
    bad = [
        (slot, pod, applied, owner.get(slot))
        for slot, pod, applied in taken_over
        if not (
            applied is False
            and owner.get(slot) in SPENT
            and (slot, owner[slot]) in applied_by
            and abs(slot_ats[slot] - moments[owner[slot]]) <= 2
        )
    ]
    assert not bad, (bad, moments)
    assert {slot for slot, _, _ in wasted} >= {killed, stopped}
    # the frozen pod finished the target it was running: claim_in found the slot applied
    assert (stopped, STOPPED, False) in wasted, wasted
    counts: dict[str, int] = {}
    for slot, *_ in attempts:
        counts[slot] = counts.get(slot, 0) + 1
    retried = sorted(slot for slot, n in counts.items() if n > 1)
    assert set(retried) <= {slot for slot, _, _ in wasted}, retried

    # the scheduler's own records: every slot of the window fired, none missed
    with jobfence.Scheduler(url, namespace=namespace, lease=LEASE) as sched:
        sched.add(SCHEDULE, every=1, target=lambda: None)
        fires = sched.history(SCHEDULE, limit=None)
    outcomes = {f.slot_at.timestamp(): f.outcome for f in fires if f.slot_at is not None}
    assert [o for o in outcomes.values() if o != "fired"] == []
    assert all(outcomes.get(at) == "fired" for at in window), outcomes
    recorded = {f.key: f.pod for f in fires}
    assert recorded[killed] not in (None, KILLED), recorded[killed]
    assert recorded[stopped] not in (None, STOPPED), recorded[stopped]
    # a slot applied by the killed or frozen pod and taken over: the taker's record says fired
    assert all(recorded[slot] == pod for slot, pod, _ in taken_over), (taken_over, recorded)

    lags = {slot: lag for slot, _, _, lag in effects}
    _report(
        {
            "backend": url.split(":", 1)[0],
            "seconds": round(ended - started, 1),
            "slots": len(window),
            "effects": sum(len(per_slot[at]) for at in window),
            "attempts": len(attempts),
            "retried_slots": len(retried),
            "wasted_attempts": len(wasted),
            "wasted": [
                [round(_slot_at(ledger, s) - first), p, a, round(lags[s], 3)] for s, p, a in wasted
            ],
            "missed": len(missing),
            "frozen_s": round(frozen, 2),
            "max_lag": round(max(lags.values()), 3),
            "min_lag": round(min(lags.values()), 3),
            "killed_slot_lag": round(lags[killed], 3),
            "frozen_slot_lag": round(lags[stopped], 3),
            "attempt_lag_by_pod": {
                p: [round(min(ls), 3), round(max(ls), 3)]
                for p in SKEWS
                if (ls := [t - at for _, at, pod, t in timed if pod == p])
            },
            "late_attempts": sorted(
                [round(at - first), pod, round(t - at, 3)]
                for _, at, pod, t in timed
                if t - at > 0.5
            ),
            "effects_by_pod": {p: sum(pod == p for *_, pod, _ in effects) for p in SKEWS},
        }
    )


def test_naive_loops_fire_every_slot_in_every_process(ledger: str, tmp_path: Path) -> None:
    """The control: three uncoordinated loops write one effect each for every second."""
    procs = {
        pod: _spawn(
            ["-m", "tests.reliability._scheduler_app", "naive"],
            {"PROOF_TABLES": ledger, "PROOF_POD": pod},
            tmp_path / f"{pod}.log",
        )
        for pod in ("n0", "n1", "n2")
    }
    try:
        # until five seconds have an effect from each loop
        _until(
            "five slots written by all three loops",
            lambda: (
                len(
                    _query(
                        f"SELECT slot FROM {ledger}_effects GROUP BY slot "
                        "HAVING count(DISTINCT pod) = 3"
                    )
                )
                >= 5
            ),
            procs,
        )
    finally:
        _terminate(procs)
    effects = _query(f"SELECT slot, count(*) FROM {ledger}_effects GROUP BY slot")
    tripled = [slot for slot, n in effects if n == 3]
    assert len(tripled) >= 5, effects
    _report(
        {
            "backend": "naive loops",
            "slots": len(effects),
            "effects": sum(n for _, n in effects),
            "slots_with_duplicates": sum(n > 1 for _, n in effects),
        }
    )
