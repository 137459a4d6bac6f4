#!/usr/bin/env python3
"""Schedulers per fire: the scheduler's CPU time and the fire lag.

Cases, each in processes of its own, with ``SCHEDULES`` (5) schedules that fire every second:

* jobfence ``Scheduler`` on Redis and on PostgreSQL, one process and three processes (every
  slot fires once, in one of them). Lag: measured in the target, ``time.time()`` minus the
  slot's time.
* celery beat with RedBeat (``redbeat.RedBeatScheduler``, entries in Redis, sending to a Redis
  broker; one beat, as RedBeat's lock allows). Lag: measured when beat sends (Celery's
  ``before_task_publish`` signal in the beat process), minus when the entry was due: the
  previous send of the entry plus its 1 s interval (Celery's interval schedules count from
  the last run). No worker: the messages are deleted afterwards.
* APScheduler 3 ``BackgroundScheduler`` with a ``SQLAlchemyJobStore`` on PostgreSQL (one
  process; 3.x has no multi-process coordination). Lag: measured when it submits the job to
  its executor (``EVENT_JOB_SUBMITTED``), minus the job's scheduled run time.

Every 1 s because a jobfence slot is a whole second (``every`` takes whole seconds): it is the
fastest schedule all three run alike; five schedules make five fires a second. CPU per fire:
the user + system CPU time of the scheduler process(es) while their loop ran, after a
warm-up of ``WARMUP`` (3) s (imports, connections, tables and the first pass excluded; the
servers' CPU not counted), divided by the fires due after the warm-up. Rounds are
interleaved (every case once per round, the order rotated), each case runs ``seconds`` per
round.

Usage: ``python benchmarks/bench_scheduler.py [--rounds 3] [--seconds 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests

REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
SCHEDULES = 5
#: seconds of each scheduler's loop before the measurement starts
WARMUP = 3.0
#: the warm-up and the measured seconds of a quick run (``measure(quick=True)``, run.py
#: ``--quick``): a smoke run of every case, whose figures are not read; still a few fires per
#: process after the warm-up, so that the lag and CPU code runs on real fires
QUICK_WARMUP = 1.0
QUICK_SECONDS = 2.0
CASES = (
    "jobfence Scheduler, Redis, 1 process",
    "jobfence Scheduler, Redis, 3 processes",
    "jobfence Scheduler, PostgreSQL, 1 process",
    "jobfence Scheduler, PostgreSQL, 3 processes",
    "celery beat + RedBeat (Redis)",
    "APScheduler 3 BackgroundScheduler (PostgreSQL job store)",
)


# -- the scheduler processes ------------------------------------------------------------------
def _cpu() -> float:
    t = os.times()
    return t.user + t.system


class _Warmup:
    """The first ``seconds`` (``WARMUP``) of a scheduler's loop (connections, tables, the
    first pass) are not measured: ``cpu`` is the CPU time at their end, and only the fires due
    after them count."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = float("inf")
        self.cpu = 0.0

    def start(self) -> None:
        self.at = time.time() + self.seconds
        threading.Timer(self.seconds, self._end).start()

    def _end(self) -> None:
        self.cpu = _cpu()

    def counts(self, due: float) -> bool:
        return due >= self.at


def _child_jobfence(url: str, ns: str, seconds: float, warmup: float) -> dict[str, Any]:
    import jobfence

    lags: list[float] = []
    sched = jobfence.Scheduler(url, namespace=ns, lease=30.0)
    warm = _Warmup(warmup)

    def target(slot: jobfence.Slot) -> None:
        at = slot.at.timestamp()
        if warm.counts(at):
            lags.append(time.time() - at)

    for i in range(SCHEDULES):
        sched.add(f"bench.s{i}", every=1, target=target)
    warm.start()
    threading.Timer(warmup + seconds, sched.stop).start()
    sched.run()
    cpu = _cpu() - warm.cpu
    sched.close()
    return {"lags": lags, "cpu": cpu}


def _child_redbeat(url: str, ns: str, seconds: float, warmup: float) -> dict[str, Any]:
    from celery import Celery
    from celery.beat import Service
    from celery.signals import before_task_publish
    from redbeat import RedBeatScheduler

    app = Celery("bench_scheduler", broker=url)
    app.conf.update(
        redbeat_redis_url=url,
        redbeat_key_prefix=f"{ns}:redbeat:",
        task_default_queue=f"{ns}:queue",
        beat_schedule={f"s{i}": {"task": f"bench.s{i}", "schedule": 1.0} for i in range(SCHEDULES)},
    )
    sends: list[tuple[str, float]] = []

    def sent(sender: str | None = None, **_: Any) -> None:
        sends.append((str(sender), time.time()))

    before_task_publish.connect(sent, weak=False)
    service = Service(app, scheduler_cls=RedBeatScheduler)
    warm = _Warmup(warmup)
    warm.start()
    threading.Timer(warmup + seconds, service.stop).start()
    service.start(embedded_process=True)
    cpu = _cpu() - warm.cpu
    # due = the entry's previous send + its interval
    lags: list[float] = []
    last: dict[str, float] = {}
    for task, at in sends:
        if task in last and warm.counts(last[task] + 1.0):
            lags.append(at - (last[task] + 1.0))
        last[task] = at
    return {"lags": lags, "cpu": cpu}


def _noop() -> None:
    """The APScheduler jobs' function."""


def _child_apscheduler(url: str, ns: str, seconds: float, warmup: float) -> dict[str, Any]:
    from datetime import datetime, timezone

    from apscheduler.events import EVENT_JOB_SUBMITTED, JobSubmissionEvent
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    store = SQLAlchemyJobStore(
        url=url.replace("postgresql://", "postgresql+psycopg://"), tablename=f"{ns}_apjobs"
    )
    sched = BackgroundScheduler(jobstores={"default": store}, timezone="UTC")
    lags: list[float] = []

    warm = _Warmup(warmup)

    def submitted(event: JobSubmissionEvent) -> None:
        now = time.time()
        lags.extend(
            now - t.timestamp() for t in event.scheduled_run_times if warm.counts(t.timestamp())
        )

    sched.add_listener(submitted, EVENT_JOB_SUBMITTED)
    start = datetime.fromtimestamp(int(time.time()) + 1, timezone.utc)
    for i in range(SCHEDULES):
        sched.add_job(
            _noop, "interval", seconds=1, id=f"s{i}", start_date=start, misfire_grace_time=60
        )
    warm.start()
    sched.start()
    time.sleep(warmup + seconds)
    sched.shutdown(wait=True)
    cpu = _cpu() - warm.cpu
    store.engine.dispose()
    return {"lags": lags, "cpu": cpu}


CHILDREN = {
    "jobfence": _child_jobfence,
    "redbeat": _child_redbeat,
    "apscheduler": _child_apscheduler,
}


# -- the measuring process ----------------------------------------------------------------------
@dataclass
class Case:
    """One case's figures over all rounds."""

    lags: list[float] = field(default_factory=list)
    cpu: float = 0.0
    fires: int = 0
    #: per round: (fires, CPU ms per fire, lag p50 ms, lag p99 ms)
    rounds: list[tuple[int, float, float, float]] = field(default_factory=list)

    @property
    def cpu_per_fire_ms(self) -> float:
        return 1000 * self.cpu / max(1, self.fires)

    def lag_ms(self, q: float) -> float:
        return 1000 * _quantile(self.lags, q)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spawn(kind: str, url: str, ns: str, seconds: float, warmup: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, os.path.abspath(__file__), "--child", kind, url, ns),
            *(str(seconds), str(warmup)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def _run_case(case: str, seconds: float, warmup: float) -> tuple[list[float], float, int]:
    """Run one case once: (lags, CPU seconds, fires)."""
    ns = "b" + uuid.uuid4().hex[:12]
    url = POSTGRES if "PostgreSQL" in case else REDIS
    kind = "jobfence" if case.startswith("jobfence") else case.split()[0].lower()
    kind = {"celery": "redbeat"}.get(kind, kind)
    count = 3 if "3 processes" in case else 1
    procs = [_spawn(kind, url, ns, seconds, warmup) for _ in range(count)]
    try:
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=warmup + seconds + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"{case}: a scheduler process exited {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        _cleanup(url, ns)
    lags = [lag for r in results for lag in r["lags"]]
    fires = sum(len(r["lags"]) for r in results)
    return lags, sum(r["cpu"] for r in results), fires


def _cleanup(url: str, ns: str) -> None:
    if url.startswith("redis"):
        from tests.servers import delete_redis_keys

        delete_redis_keys(f"{ns}*", url)
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE %s",
            (ns + "%",),
        ).fetchall()
        for (table,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
        if conn.execute("SELECT to_regclass('jobfence_inbox_schema')").fetchone() != (None,):
            conn.execute("DELETE FROM jobfence_inbox_schema WHERE table_name LIKE %s", (ns + "%",))


def warmup_for(quick: bool) -> float:
    """The warm-up of each scheduler process, in seconds."""
    return QUICK_WARMUP if quick else WARMUP


def measure(
    quick: bool, rounds: int | None = None, seconds: float | None = None
) -> dict[str, Case]:
    """Every case, in interleaved rounds (the order rotated each round)."""
    # quick: one short round per case after a short warm-up, a smoke run of every case that
    # keeps run.py --quick within its time; the figures worth reading come from the full run
    rounds = rounds or (1 if quick else 3)
    seconds = seconds or (QUICK_SECONDS if quick else 30.0)
    warmup = warmup_for(quick)
    cases = {name: Case() for name in CASES}
    order = list(CASES)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            lags, cpu, fires = _run_case(name, seconds, warmup)
            c = cases[name]
            c.lags += lags
            c.cpu += cpu
            c.fires += fires
            c.rounds.append(
                (
                    fires,
                    1000 * cpu / max(1, fires),
                    1000 * _quantile(lags, 0.5),
                    1000 * _quantile(lags, 0.99),
                )
            )
    return cases


def spread(values: list[float]) -> str:
    """``min-max`` of per-round figures."""
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def rows(cases: dict[str, Case]) -> list[tuple[str, ...]]:
    """Table rows: case, fires, CPU ms/fire [round spread], lag p50 ms [spread], lag p99 ms."""
    out = []
    for name, c in cases.items():
        out.append(
            (
                name,
                str(c.fires),
                f"{c.cpu_per_fire_ms:.2f} [{spread([r[1] for r in c.rounds])}]",
                f"{c.lag_ms(0.5):.1f} [{spread([r[2] for r in c.rounds])}]",
                f"{c.lag_ms(0.99):.1f} [{spread([r[3] for r in c.rounds])}]",
                f"{1000 * max(c.lags, default=float('nan')):.1f}",
            )
        )
    return out


HEADER = (
    "case",
    "fires",
    "CPU ms / fire [per round]",
    "lag p50 ms [per round]",
    "lag p99 ms [per round]",
    "lag max ms",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--child", nargs=5, metavar=("KIND", "URL", "NS", "SECONDS", "WARMUP"))
    args = parser.parse_args()
    if args.child:
        kind, url, ns, secs, warmup = args.child
        print(json.dumps(CHILDREN[kind](url, ns, float(secs), float(warmup))), flush=True)
        return
    started = time.perf_counter()
    cases = measure(False, args.rounds, args.seconds)
    print(f"{args.rounds} interleaved rounds of {args.seconds:g} s per case, {SCHEDULES} schedules")
    print(" | ".join(HEADER))
    for row in rows(cases):
        print(" | ".join(row))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
