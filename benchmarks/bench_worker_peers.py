#!/usr/bin/env python3
"""Workers side by side: how fast each system's own worker drains a queue of no-op tasks.

The same harness for every system, on the same servers, in interleaved rounds:

* ``--tasks`` tasks are published first (not timed), then the system's worker is started as
  its own process, with its command line (``celery worker``, ``dramatiq``, ``rq worker``,
  ``arq``, ``procrastinate worker``, ``jobfence worker``);
* every task runs the same body (``peers/peer_common.py``): ``INCR`` of a counter on Redis,
  the first and the last stamping the time. The rate is ``(tasks - 1) / (last - first)``:
  the worker's start-up is not counted, the drain is;
* the worker's CPU time per task is read from ``/proc`` for its whole process tree (Celery's
  prefork children included), from the first task seen to the last;
* every system runs at its documented default concurrency (Celery prefork: one process per
  core; Dramatiq: 1 process x 8 threads here, its default per process; arq: 10 jobs; RQ: one
  job at a time; procrastinate: 1), plus Celery with 8 threads (its best here), RQ's
  ``SimpleWorker`` (no fork per job) and jobfence's ``def`` and ``async def`` handlers at the
  worker's default (8).

Each row: median rate (min-max over the rounds), CPU per task, and the ratio to jobfence's
``def`` worker on the same broker.

Usage: ``python benchmarks/bench_worker_peers.py [--tasks 2000] [--rounds 3]
[--only redis,rabbitmq,postgres] [--systems celery,dramatiq,...]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = os.path.join(HERE, "peers")
sys.path.insert(0, ROOT)
sys.path.insert(0, PEERS)

from tests.servers import POSTGRES_URL, RABBITMQ_URL, REDIS_URL  # noqa: E402

BIN = os.path.dirname(sys.executable)
TICKS = os.sysconf("SC_CLK_TCK")
#: how long a worker may take to drain before the row is reported as failed
DRAIN_LIMIT = 300.0


@dataclass
class Case:
    """One worker set-up: how to publish ``n`` tasks and the command that drains them."""

    system: str
    broker: str  # redis, rabbitmq, postgres
    label: str
    publish: Callable[[dict[str, str], int], None]
    command: Callable[[dict[str, str]], list[str]]
    setup: Callable[[dict[str, str]], None] | None = None
    cleanup: Callable[[dict[str, str]], None] | None = None
    #: slow workers drain fewer tasks (their rate does not depend on the count)
    max_tasks: int | None = None


@dataclass
class Row:
    case: Case
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    error: str | None = None


# -- process-tree CPU ---------------------------------------------------------------------------


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every live descendant, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry)
        parents[pid] = int(fields[1])
        # utime, stime, and the children it has reaped (cutime, cstime)
        times[pid] = sum(int(x) for x in fields[11:15]) / TICKS
    total = 0.0
    for pid, cpu in times.items():
        p = pid
        while p > 1:
            if p == root:
                total += cpu
                break
            p = parents.get(p, 0)
    return total


# -- the cases ----------------------------------------------------------------------------------


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def _celery_publish(env: dict[str, str], n: int) -> None:
    code = f"import peer_celery\nfor _ in range({n}): peer_celery.tick.apply_async()\n"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=PEERS)


def _celery_cleanup(env: dict[str, str]) -> None:
    code = "import peer_celery\npeer_celery.app.control.purge()\n"
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, cwd=PEERS, capture_output=True
    )


def celery(broker: str, pool: str, conc: int | None) -> Case:
    def command(env: dict[str, str]) -> list[str]:
        cmd = [
            f"{BIN}/celery",
            "-A",
            "peer_celery",
            "worker",
            "-Q",
            env["PEER_QUEUE"],
            "-P",
            pool,
            "-l",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        return cmd + (["-c", str(conc)] if conc else [])

    label = f"Celery {pool}" + (f" x{conc}" if conc else " (default)")
    return Case("celery", broker, label, _celery_publish, command, cleanup=_celery_cleanup)


def _dramatiq_publish(env: dict[str, str], n: int) -> None:
    code = f"import peer_dramatiq\nfor _ in range({n}): peer_dramatiq.tick.send()\n"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=PEERS)


def _dramatiq_cleanup(env: dict[str, str]) -> None:
    code = "import peer_dramatiq\npeer_dramatiq.broker.flush_all()\n"
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, cwd=PEERS, capture_output=True
    )


def dramatiq(broker: str) -> Case:
    def command(env: dict[str, str]) -> list[str]:
        return [f"{BIN}/dramatiq", "peer_dramatiq", "-p", "1", "-t", "8", "-Q", env["PEER_QUEUE"]]

    return Case(
        "dramatiq",
        broker,
        "Dramatiq 1 process x 8 threads",
        _dramatiq_publish,
        command,
        cleanup=_dramatiq_cleanup,
    )


def _rq_publish(env: dict[str, str], n: int) -> None:
    import peer_rq
    import redis
    from rq import Queue

    queue = Queue(env["PEER_QUEUE"], connection=redis.Redis.from_url(REDIS_URL))
    with queue.connection.pipeline() as pipe:
        for _ in range(n):
            queue.enqueue(peer_rq.tick, result_ttl=0, pipeline=pipe)
        pipe.execute()


def _rq_cleanup(env: dict[str, str]) -> None:
    import redis
    from rq import Queue

    Queue(env["PEER_QUEUE"], connection=redis.Redis.from_url(REDIS_URL)).empty()


def rq(simple: bool) -> Case:
    def command(env: dict[str, str]) -> list[str]:
        cmd = [f"{BIN}/rq", "worker", "--url", REDIS_URL, "--burst", "-q"]
        if simple:
            cmd += ["--worker-class", "rq.worker.SimpleWorker"]
        return [*cmd, env["PEER_QUEUE"]]

    label = "RQ SimpleWorker" if simple else "RQ Worker (fork per job, default)"
    return Case("rq", "redis", label, _rq_publish, command, cleanup=_rq_cleanup, max_tasks=200)


def _arq_publish(env: dict[str, str], n: int) -> None:
    from arq import create_pool
    from arq.connections import RedisSettings

    async def main() -> None:
        pool = await create_pool(
            RedisSettings.from_dsn(REDIS_URL), default_queue_name=env["PEER_QUEUE"]
        )
        for _ in range(n):
            await pool.enqueue_job("tick")
        await pool.aclose()

    asyncio.run(main())


def arq() -> Case:
    def command(env: dict[str, str]) -> list[str]:
        return [f"{BIN}/arq", "peer_arq.WorkerSettings"]

    return Case("arq", "redis", "arq (10 jobs at once, default)", _arq_publish, command)


def _pq_setup(env: dict[str, str]) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{env["PEER_SCHEMA"]}"')
    subprocess.run(
        [f"{BIN}/procrastinate", "--app=peer_procrastinate.app", "schema", "--apply"],
        env=env,
        check=True,
        cwd=PEERS,
        capture_output=True,
    )


def _pq_publish(env: dict[str, str], n: int) -> None:
    code = (
        "import asyncio, peer_procrastinate as p\n"
        "async def main():\n"
        "    async with p.app.open_async():\n"
        f"        for _ in range({n}): await p.tick.defer_async()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=PEERS)


def _pq_cleanup(env: dict[str, str]) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{env["PEER_SCHEMA"]}" CASCADE')


def procrastinate(conc: int | None) -> Case:
    def command(env: dict[str, str]) -> list[str]:
        cmd = [
            f"{BIN}/procrastinate",
            "--app=peer_procrastinate.app",
            "worker",
            "-q",
            env["PEER_QUEUE"],
            "--delete-jobs",
            "successful",
        ]
        return cmd + (["-c", str(conc)] if conc else [])

    label = f"procrastinate (concurrency {conc})" if conc else "procrastinate (1, default)"
    return Case(
        "procrastinate",
        "postgres",
        label,
        _pq_publish,
        command,
        setup=_pq_setup,
        cleanup=_pq_cleanup,
        max_tasks=1000 if conc else 500,
    )


_URLS = {"redis": REDIS_URL, "rabbitmq": RABBITMQ_URL, "postgres": POSTGRES_URL}


def _jf_publish(env: dict[str, str], n: int) -> None:
    import jobfence

    with jobfence.Queue(env["PEER_BROKER"], env["PEER_QUEUE"]) as queue:
        for start in range(0, n, 500):
            queue.publish_many([{"i": i} for i in range(start, min(n, start + 500))])


def _jf_cleanup(env: dict[str, str]) -> None:
    import jobfence

    with jobfence.Queue(env["PEER_BROKER"], env["PEER_QUEUE"]) as queue:
        queue.drop()


def jobfence_worker(broker: str, handler: str) -> Case:
    def command(env: dict[str, str]) -> list[str]:
        return [
            f"{BIN}/jobfence",
            "worker",
            f"peer_jobfence:{handler}",
            "--queue",
            env["PEER_BROKER"],
            "--name",
            env["PEER_QUEUE"],
            "--no-live",
            "--log-level",
            "warning",
        ]

    kind = "def" if handler == "tick" else "async def"
    return Case(
        "jobfence",
        broker,
        f"jobfence worker, `{kind}` (8, default)",
        _jf_publish,
        command,
        cleanup=_jf_cleanup,
    )


def cases(brokers: set[str], systems: set[str] | None) -> list[Case]:
    every: list[Case] = []
    for broker in ("redis", "rabbitmq", "postgres"):
        if broker not in brokers:
            continue
        every += [jobfence_worker(broker, "tick"), jobfence_worker(broker, "atick")]
        if broker in ("redis", "rabbitmq"):
            every += [
                celery(broker, "prefork", None),
                celery(broker, "threads", 8),
                dramatiq(broker),
            ]
        if broker == "redis":
            every += [rq(simple=False), rq(simple=True), arq()]
        if broker == "postgres":
            every += [procrastinate(None), procrastinate(8)]
    return [c for c in every if systems is None or c.system in systems]


# -- one measurement --------------------------------------------------------------------------


def _env(case: Case, n: int) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    env = dict(os.environ)
    env.update(
        PEER_REDIS_URL=REDIS_URL,
        PEER_KEY=f"peer:{tag}",
        PEER_N=str(n),
        PEER_QUEUE=f"peer-{case.system}-{tag}",
        PEER_SCHEMA=f"peer_{tag}",
        PEER_BROKER=_URLS[case.broker]
        if case.system != "celery" or case.broker == "redis"
        else "pyamqp://guest:guest@127.0.0.1:5672//",
        PYTHONPATH=os.pathsep.join(
            [PEERS, os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    return env


def run_once(case: Case, n: int) -> tuple[float, float]:
    """One drain: (tasks per second, worker CPU microseconds per task)."""
    n = min(n, case.max_tasks or n)
    env = _env(case, n)
    key = env["PEER_KEY"]
    client = _redis()
    proc: subprocess.Popen[bytes] | None = None
    # the worker's log goes to a file: a pipe nobody reads fills up (64 KB, a few hundred
    # lines of arq's or procrastinate's per-job log) and the worker blocks writing to it
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    try:
        if case.setup:
            case.setup(env)
        case.publish(env, n)
        proc = subprocess.Popen(
            case.command(env),
            env=env,
            cwd=PEERS,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        deadline = time.monotonic() + DRAIN_LIMIT
        cpu0 = None
        seen0 = 0
        while True:
            done = int(client.get(key) or 0)
            if cpu0 is None and done:
                cpu0, seen0 = _tree_cpu(proc.pid), done
            if done >= n and client.get(key + ":t1"):
                cpu1 = _tree_cpu(proc.pid)
                break
            if proc.poll() is not None and done < n:
                log.seek(0)
                err = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{case.label}: worker exited after {done} of {n}: {err}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case.label}: {done} of {n} after {DRAIN_LIMIT} s")
            time.sleep(0.005)
        t0 = float(client.get(key + ":t0"))
        t1 = float(client.get(key + ":t1"))
        rate = (n - 1) / (t1 - t0)
        cpu_us = (cpu1 - (cpu0 or 0.0)) / max(1, n - seen0) * 1e6
        return rate, cpu_us
    finally:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if case.cleanup:
            case.cleanup(env)
        client.delete(key, key + ":t0", key + ":t1")
        client.close()
        log.close()


def measure(brokers: set[str], n: int, rounds: int, systems: set[str] | None = None) -> list[Row]:
    """Interleaved rounds: every case once per round, in the same order."""
    rows = [Row(c) for c in cases(brokers, systems)]
    for _ in range(rounds):
        for row in rows:
            if row.error:
                continue
            try:
                rate, cpu = run_once(row.case, n)
            except Exception as exc:  # a peer that cannot run is reported, not hidden
                row.error = str(exc)[:300]
                continue
            row.rates.append(rate)
            row.cpu_us.append(cpu)
    return rows


def table(rows: list[Row]) -> list[str]:
    """Markdown rows: broker and worker, rate median, min-max, CPU per task, ratio to
    jobfence's ``def`` worker on the same broker."""
    out = [
        "| case | tasks/s median | tasks/s min-max | CPU µs/task | vs jobfence `def` |",
        "|:--|--:|--:|--:|--:|",
    ]
    base: dict[str, float] = {}
    for row in rows:
        if row.case.system == "jobfence" and "`def`" in row.case.label and row.rates:
            base[row.case.broker] = statistics.median(row.rates)
    for row in rows:
        name = f"{row.case.broker}: {row.case.label}"
        if row.error:
            out.append(f"| {name} | failed: {row.error} | | | |")
            continue
        med = statistics.median(row.rates)
        spread = f"{min(row.rates):,.0f}-{max(row.rates):,.0f}"
        ratio = f"{med / base[row.case.broker]:.2f}x" if row.case.broker in base else "-"
        cpu = statistics.median(row.cpu_us)
        out.append(f"| {name} | {med:,.0f} | {spread} | {cpu:,.0f} | {ratio} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="redis,rabbitmq,postgres")
    parser.add_argument("--systems", default=None)
    args = parser.parse_args()
    systems = set(args.systems.split(",")) if args.systems else None
    rows = measure(set(args.only.split(",")), args.tasks, args.rounds, systems)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
