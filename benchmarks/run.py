#!/usr/bin/env python3
"""Every benchmark in one run, written to ``BENCHMARKS.md``: the figures and their targets.

Runs the measuring functions of the ``bench_*.py`` scripts next to this file and writes one
markdown report: the machine, the versions of jobfence, the drivers, the servers and the
libraries compared against, how it was measured, then one table per section (median and p99
per operation, or a rate, and the ratio to the section's named anchor) and one MET / NOT MET
line per target.

Usage: ``python benchmarks/run.py [--quick] [--rounds N] [--only SECTION,...]
[--output BENCHMARKS.md]`` (sections: redis, sql, contended, inbox, guarded, worker, leases,
replicas, etcd, limits, scheduler, idempotency, outbox, frameworks, peers, publish;
``--quick``: tiny sizes, a smoke run of every row in about a minute, figures meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the scripts, also in workers

import _harness as h
import bench_etcd_locks
import bench_frameworks
import bench_guarded
import bench_idempotency
import bench_inbox
import bench_leases
import bench_mysql_locks
import bench_outbox
import bench_publish
import bench_redis_locks
import bench_redis_replicas
import bench_scheduler
import bench_semaphore
import bench_sql_locks
import bench_sqlite_locks
import bench_worker
import bench_worker_peers
from tests.servers import MYSQL_URL, POSTGRES_URL, RABBITMQ_URL, REDIS_URL

HERE = Path(__file__).resolve().parent
SECTIONS = (
    "redis",
    "sql",
    "contended",
    "inbox",
    "guarded",
    "worker",
    "leases",
    "replicas",
    "etcd",
    "limits",
    "scheduler",
    "idempotency",
    "outbox",
    "frameworks",
    "peers",
    "publish",
)


@dataclass
class Sizes:
    """How much each section measures."""

    rounds: int
    lock_ops: int
    inbox_ops: int
    guarded_ops: int
    seconds: float
    processes: tuple[int, ...]
    messages: int
    worker_rounds: int
    leases: int
    outbox_rows: int
    outbox_latency_rows: int
    relay_rounds: int
    framework_tasks: int
    peer_tasks: int
    publish_ops: int

    def ops_line(self) -> str:
        return (
            f"{self.rounds} interleaved rounds; per round {self.lock_ops} acquire+release pairs "
            f"per lock variant, {self.inbox_ops} claims per inbox case, {self.guarded_ops} "
            f"guarded calls per case; contended: {self.seconds:g} s per case with "
            f"{' and '.join(map(str, self.processes))} processes; worker: {self.messages} "
            f"messages per case, {self.worker_rounds} rounds; {self.leases} live leases; "
            f"outbox: {self.inbox_ops} transactions per add case, relays: "
            f"{self.relay_rounds} rounds of {self.outbox_latency_rows} rows for latency and "
            f"{self.outbox_rows} rows drained; frameworks: {self.framework_tasks} tasks drained "
            f"per variant and round; publish: {self.publish_ops} messages per case"
        )


FULL = Sizes(15, 300, 300, 200, 3.0, (4, 8), 1000, 3, 10_000, 10_000, 300, 7, 300, 2000, 1000)
QUICK = Sizes(2, 50, 50, 30, 1.0, (2,), 100, 1, 500, 200, 10, 1, 20, 100, 100)


@dataclass
class Report:
    """The markdown being written, and the targets' verdicts."""

    lines: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
        self.add("", "| " + " | ".join(header) + " |")
        left = ("case", "anchor", "backend")
        self.add("|" + "|".join(":--" if c in left else "--:" for c in header) + "|")
        for row in rows:
            self.add("| " + " | ".join(row) + " |")
        self.add("")

    def target(self, text: str, met: bool, figures: str) -> None:
        self.verdicts.append((text, met))
        line = f"- **{'MET' if met else 'NOT MET'}**: {text} ({figures})"
        if not met:
            line += f". Why: {why_not(text)}"
        self.add(line)


PERF = "docs/reference/performance.md"
#: why a target is not met, by a part of its text (the first that matches): what the profile
#: of that path showed; the figures behind each are in docs/reference/performance.md
WHY_NOT: tuple[tuple[str, str], ...] = (
    (
        "faster than redis-py",
        "redis-py's `Lock` sends the floor's two commands and nothing else; jobfence's "
        "acquire and release scripts run seven commands per cycle (fencing-token counter "
        "with its clock floor, waiters flag, idempotent-release marker) against the floor's "
        f"three ({PERF}#redis-locks)",
    ),
    (
        "faster than `redis.asyncio`",
        "as for redis-py's `Lock`: the floor's two commands against jobfence's two scripts "
        f"running seven commands per cycle ({PERF}#redis-locks)",
    ),
    (
        "the sync floor",
        "server time: seven commands of Lua per cycle against the floor's three (the token "
        "counter with its clock floor, the waiters flag and the release marker that fencing "
        "tokens, FIFO hand-off and an idempotent release need), plus the lease's client "
        f"bookkeeping ({PERF}#redis-locks)",
    ),
    (
        "the async floor",
        "server time as for `Locks` (seven commands of Lua per cycle against three), plus "
        f"the write deadline and lease bookkeeping on the event loop ({PERF}#redis-locks)",
    ),
    (
        "PostgreSQL: jobfence",
        "both sides are two autocommit statements that wait for the WAL flush; what is left "
        "is psycopg's work per statement, the request deadline, the pool and the lease, about "
        f"50-90 µs of client CPU per cycle ({PERF}#postgresql-locks)",
    ),
    (
        "MariaDB: jobfence",
        "the acquire is one `INSERT ... ON DUPLICATE KEY UPDATE` carrying the next-in-line "
        "rule and the token: the server spends 40-100 µs parsing it (SHOW PROFILE "
        "`Starting`) against about 20 µs for `INSERT IGNORE`, and more in `Update` "
        f"({PERF}#mariadb-locks)",
    ),
    (
        "SQLite: jobfence",
        "two commits like the floor's (4 statements); the grant also writes the token "
        "counter's page in the same commit, and the ratio moves by 0.1x "
        f"between runs on this machine ({PERF}#sqlite-locks)",
    ),
    (
        "of the hand-written FIFO rate",
        "a hand-off runs jobfence's release script (hand-off, token, wake list) and the "
        "waiter's bookkeeping; the gap is 40-80 µs longer than the hand-written Lua + "
        "`BLPOP` hand-off's, which has no token, no expiry and no renewal "
        f"({PERF}#contended-hand-off)",
    ),
    (
        "ahead of redis-py",
        "redis-py's `Lock` is unfair: with its default sleep the releasing process takes the "
        "lock again at once (min share 0.00-0.40), so its rate is one process looping; a fair "
        f"hand-off wakes another process every time ({PERF}#contended-hand-off)",
    ),
    (
        "of `pg_advisory_lock`",
        "a lease hand-off is a durable commit (the lease row and its token) and a `NOTIFY` to "
        "the next waiter's listener, about 1 ms; the advisory lock is handed over in the "
        f"server's memory, without token or expiry, in about 0.2 ms ({PERF}#contended-hand-off)",
    ),
    (
        "claim + complete faster than Powertools",
        "the claim script alone takes 25-28 µs of server time against 3-4 µs for a `SET`, "
        f"and the completion is a second script ({PERF}#inbox-claims)",
    ),
    (
        "guarded ≥ 0.70x",
        "a guarded message costs the client more CPU than the loop with its mark (on "
        "PostgreSQL about 255 µs against 145-175 µs: the worker's delivery, renewal and batched "
        "ack, and two inbox statements per batch), so this case loses most when other work "
        f"shares the machine; earlier runs gave 0.74x-0.86x on PostgreSQL ({PERF}#workers)",
    ),
    (
        "no-op ≥ 0.70x",
        "the worker's own work per message (task, delivery object, renewal, batched ack) "
        f"against the loop's ({PERF}#workers)",
    ),
    (
        "`claim",
        "the claim's statement alone (`claim_in` runs the same one on the caller's "
        "connection: an upsert that returns the record, on a row of nine columns) costs more "
        "than the two-column insert before any Python: PostgreSQL 1.11x-1.19x, MariaDB 1.15x "
        "(server time), SQLite 1.19x, Redis a 25-28 µs script against a 3-4 µs `SET` "
        f"({PERF}#inbox-claims)",
    ),
)


WHY_NOT = (
    *WHY_NOT,
    (
        "limit of 3 on Redis",
        "the limit costs what a plain jobfence lock costs (one grant request on slot 0, one "
        "release: the same two round trips); what is above the floor is the lock's own path: "
        "two scripts of about 15 µs of server time each (token counter, queue check, release "
        "marker) against the floor's 17 µs script and 2 µs `ZREM`, and the client's work per "
        f"call: 150 µs of client CPU against the floor's 104 ({PERF}#concurrency-limits)",
    ),
)


WHY_NOT = (
    *WHY_NOT,
    (
        "guarded def (defaults) ≥ 0.70x",
        "the claim and the completion run on the worker's loop, batched as `AsyncWorker`'s "
        "(0.25 round trips per message), and the guarded `def` drains at about the rate of "
        "`AsyncWorker` guarded; what remains is the inbox's own work per message (a claim "
        "and a completion written, on PostgreSQL and SQLite two more commits per batch): "
        "a hand-written consumer pays the same for its mark alone (its ratio is in the "
        f"figures) ({PERF}#workers)",
    ),
    (
        "add` ≤ 1.1x the hand-written INSERT",
        "`add` is one statement like the bare `INSERT`; what it adds: on PostgreSQL the "
        "`pg_notify` that wakes the relays, delivered by the commit (a bare `INSERT` + "
        "`NOTIFY` alone is 1.13x the bare `INSERT`); on MariaDB a single-row add is an "
        "`INSERT ... VALUES` now (the `JSON_TABLE` form sorted on the server, 308 µs, even for "
        "one row: 1.24x before, 1.16x after); and jobfence's Python around the "
        "statement (checks, the JSON rows parameter, the connection adapter, the hook): "
        "40-80 µs of client CPU per add (PostgreSQL 228 against 149 µs, SQLite 62 against "
        "20 µs). The rest of each transaction is the commit's flush, whose round-to-round "
        f"spread on a shared machine is wider than the target ({PERF}#transactional-outbox)",
    ),
    (
        "PostgreSQL (psycopg) → Redis Streams: jobfence `Relay` rate",
        "each row is written twice (held, then published: two commits per batch against "
        "one); the claim's update takes the picked rows as one array (`t.seq = "
        "ANY(ARRAY(...))`), which keeps the generic plan of the prepared claim on the key "
        "(a join there was a nested loop over every pending row: 340-560 ms per claim) "
        f"({PERF}#transactional-outbox)",
    ),
    (
        "MariaDB (PyMySQL) → Redis Streams: jobfence `Relay` rate",
        "the claim is `GET_LOCK`, a `SELECT`, an `UPDATE` of the 100 rows that writes the "
        "hold, and `RELEASE_LOCK` (about 5 ms per batch on an idle machine, 3 ms of it the "
        "`UPDATE` and its commit, against 2 ms for the "
        "hand-written `SELECT ... FOR UPDATE SKIP LOCKED`), and marking them published is a "
        "second `UPDATE`: each row is written twice where the hand-written loop writes it "
        f"once ({PERF}#transactional-outbox)",
    ),
    (
        "SQLite (sqlite3, WAL) → Redis Streams: jobfence `Relay` rate",
        "each row is written twice (the hold, then published), in two commits per batch "
        f"against the hand-written loop's one ({PERF}#transactional-outbox)",
    ),
    (
        "p50 commit→publish latency",
        "after a claim that was not full the relay waits for the server's wake-up "
        "(PostgreSQL `LISTEN`, SQLite's `data_version` read every 5 ms) or, polling "
        "(MariaDB), claims again at once and "
        "pauses only after an empty claim; what remains is the wake-up's own delay and the "
        f"claim's two writes per row ({PERF}#transactional-outbox)",
    ),
)


WHY_NOT_FRAMEWORKS = (
    "with the lock and the inbox on one Redis the guard is two round trips per task (lease + "
    "claim in one script, result + release in one), as many as the alternatives, which take "
    "no lease; the task's body is a no-op, so at one task at a time what remains is the "
    "server time of the lock and claim scripts and the guard's client work (the lease and the "
    f"claim with their renewals, the span) ({PERF}#guarded-tasks-on-their-frameworks)"
)


WHY_NOT = (
    *WHY_NOT,
    (
        "rabbitmq: Queue.publish ≥ Celery apply_async",
        "a single publish waits for its publisher confirm (a persistent message on a quorum "
        "queue: written by a majority), Celery's `apply_async` returns without one unless "
        "`confirm_publish` is set; the row with it shows the same round trip "
        f"({PERF}#publishing)",
    ),
    (
        "rabbitmq: AsyncQueue.publish ≥ Celery apply_async",
        "a single publish waits for its publisher confirm; Celery's `apply_async` does not "
        f"unless `confirm_publish` is set ({PERF}#publishing)",
    ),
    (
        "≥ 0.50x the hand-written",
        "the floor on the same driver does the same round trips with less work per call: "
        "Redis runs the idempotent publish script against one `XADD`, SQL builds rows with "
        "jobfence's columns, RabbitMQ sets jobfence's properties per message; on a machine "
        f"shared with other work the per-round spread is wider than the gap ({PERF}#publishing)",
    ),
)


def why_not(text: str) -> str:
    """The reason :data:`WHY_NOT` gives for the target ``text``."""
    for part, reason in WHY_NOT:
        if part in text:
            return reason
    if "jobfence guard" in text:
        return WHY_NOT_FRAMEWORKS
    return f"see {PERF}"


def _us(x: float) -> str:
    return f"{x:.1f}"


def _stats_rows(
    stats: dict[str, h.Stats], anchors: dict[str, str], names: dict[str, str] | None = None
) -> list[tuple[str, ...]]:
    """Rows ``case | median | p99 | anchor | ratio``; a case without an anchor is its own."""
    rows = []
    for label, st in stats.items():
        anchor = anchors.get(label, "")
        ratio = _ratio_cell(stats, label, anchor) if anchor else "1.00x"
        rows.append(
            (
                (names or {}).get(label, label),
                _us(st.median),
                _us(st.p99),
                (names or {}).get(anchor, anchor) or "(anchor)",
                ratio,
            )
        )
    return rows


US_HEADER = ("case", "median µs/op", "p99 µs/op", "anchor", "ratio to anchor (per round)")


def _ratio(stats: dict[str, h.Stats], case: str, anchor: str) -> float:
    return stats[case].median / stats[anchor].median


def _ratio_cell(stats: dict[str, h.Stats], case: str, anchor: str) -> str:
    """``1.19x (1.08-1.31)``: the ratio of the medians over all rounds, then the lowest and
    highest ratio of one round's medians (the cases ran interleaved, so each round compares
    like with like; the range is the spread a single short run could have shown)."""
    text = f"{_ratio(stats, case, anchor):.2f}x"
    per = h.round_ratios(stats[case], stats[anchor])
    if len(per) > 1:
        text += f" ({min(per):.2f}-{max(per):.2f})"
    return text


def _ratio_target(
    rep: Report, text: str, stats: dict[str, h.Stats], case: str, anchor: str, limit: float
) -> float:
    """A target ``case / anchor <= limit`` on the medians over all rounds; the figures also
    say in how many rounds on their own it held."""
    ratio = _ratio(stats, case, anchor)
    figures = f"{ratio:.2f}x"
    per = h.round_ratios(stats[case], stats[anchor])
    if len(per) > 1:
        within = sum(r <= limit for r in per)
        figures += (
            f"; per round {min(per):.2f}x-{max(per):.2f}x, within {limit:.2f}x in {within} of "
            f"{len(per)} rounds"
        )
    rep.target(text, ratio <= limit, figures)
    return ratio


def _faster_target(
    rep: Report, text: str, stats: dict[str, h.Stats], ours: str, theirs: str
) -> None:
    """A target ``ours`` faster than ``theirs`` (medians over all rounds), with the number of
    rounds in which it was."""
    a, b = stats[ours].median, stats[theirs].median
    figures = f"{_us(a)} µs vs {_us(b)} µs"
    per = h.round_ratios(stats[ours], stats[theirs])
    if len(per) > 1:
        figures += f"; faster in {sum(r < 1 for r in per)} of {len(per)} rounds"
    rep.target(text, a < b, figures)


# -- 1. Redis uncontended -----------------------------------------------------------------------
REDIS_FLOOR = "(a) hand-written SET NX PX + EVALSHA delete"
REDIS_FLOOR_ASYNC = "(f) hand-written on redis.asyncio"
REDIS_JF = "(c) jobfence Locks, renew=True (default)"
REDIS_JF_ASYNC = "(e) jobfence AsyncLocks, renew=True"
REDIS_PY = "(b) redis-py Lock"
REDIS_PY_ASYNC = "(h) redis.asyncio Lock"


def section_redis(rep: Report, sz: Sizes) -> None:
    rep.add("## 1. Redis: uncontended acquire+release", "")
    rep.add(
        "One name, one client, a fresh owner token per pair. Floors: `SET key token NX PX` "
        "+ `EVALSHA` compare-and-delete, on redis-py (sync) and on `redis.asyncio`."
    )
    stats = h.uncontended_stats(
        partial(bench_redis_locks.variants, REDIS_URL),
        partial(bench_redis_locks._cleanup, REDIS_URL),
        sz.rounds,
        sz.lock_ops,
        max(20, sz.lock_ops // 10),
    )
    async_labels = {REDIS_JF_ASYNC, REDIS_FLOOR_ASYNC, REDIS_PY_ASYNC}
    async_labels |= {label for label in stats if label.startswith("(g)")}
    anchors = {
        label: (REDIS_FLOOR_ASYNC if label in async_labels else REDIS_FLOOR) for label in stats
    }
    anchors[REDIS_FLOOR] = anchors[REDIS_FLOOR_ASYNC] = ""
    rep.table(US_HEADER, _stats_rows(stats, anchors))
    _ratio_target(
        rep, "jobfence `Locks` ≤ 1.15x the sync floor", stats, REDIS_JF, REDIS_FLOOR, 1.15
    )
    _ratio_target(
        rep,
        "jobfence `AsyncLocks` ≤ 1.15x the async floor",
        stats,
        REDIS_JF_ASYNC,
        REDIS_FLOOR_ASYNC,
        1.15,
    )
    _faster_target(rep, "jobfence `Locks` faster than redis-py `Lock`", stats, REDIS_JF, REDIS_PY)
    _faster_target(
        rep,
        "jobfence `AsyncLocks` faster than `redis.asyncio` `Lock`",
        stats,
        REDIS_JF_ASYNC,
        REDIS_PY_ASYNC,
    )


# -- 2. SQL uncontended ---------------------------------------------------------------------------
def section_sql(rep: Report, sz: Sizes) -> None:
    rep.add("## 2. PostgreSQL, MariaDB, SQLite: uncontended acquire+release", "")
    rep.add(
        "Floors (each a hand-written lease row, no expiry, no fencing token): PostgreSQL "
        "`INSERT ... ON CONFLICT DO NOTHING` + owner-checked `DELETE`, two autocommit "
        "statements on psycopg; MariaDB `INSERT IGNORE` + owner-checked `DELETE` on PyMySQL; "
        "SQLite `INSERT OR IGNORE` + owner-checked `DELETE` on `sqlite3`, WAL, "
        "`synchronous=FULL` (jobfence's default). The async rows are measured against the "
        "same statements on the async driver (psycopg async, aiomysql, aiosqlite). Session "
        "locks (`pg_try_advisory_lock`, `GET_LOCK`) write nothing and are lower bounds, not "
        "anchors."
    )
    tmp_url, tmp = bench_sqlite_locks.temporary_url()
    backends: list[
        tuple[str, Any, str, Callable[[str], None], tuple[str, str], tuple[str, str]]
    ] = [
        (
            "PostgreSQL",
            partial(bench_sql_locks.variants, POSTGRES_URL),
            POSTGRES_URL,
            partial(bench_sql_locks._cleanup, POSTGRES_URL),
            ("(a)", "(c)"),
            ("(g)", "(f)"),
        ),
        (
            "MariaDB",
            partial(bench_mysql_locks.variants, MYSQL_URL),
            MYSQL_URL,
            partial(bench_mysql_locks._cleanup, MYSQL_URL),
            ("(a)", "(c)"),
            ("(f)", "(e)"),
        ),
        (
            "SQLite",
            partial(bench_sqlite_locks.variants, tmp_url),
            tmp_url,
            partial(bench_sqlite_locks.cleanup, tmp_url),
            ("(a)", "(b)"),
            ("(e)", "(d)"),
        ),
    ]
    try:
        for name, variants, _url, cleanup, (floor, ours), (afloor, aours) in backends:
            stats = h.uncontended_stats(variants, cleanup, sz.rounds, sz.lock_ops, 20)
            by = {label.split(" ")[0]: label for label in stats}
            anchors = {
                label: (by[afloor] if label in (by[aours],) else by[floor]) for label in stats
            }
            anchors[by[floor]] = anchors[by[afloor]] = ""
            rep.add("", f"### {name}")
            rep.table(US_HEADER, _stats_rows(stats, anchors))
            _ratio_target(
                rep, f"{name}: jobfence `Locks` ≤ 1.15x its floor", stats, by[ours], by[floor], 1.15
            )
            _ratio_target(
                rep,
                f"{name}: jobfence `AsyncLocks` ≤ 1.15x its async floor",
                stats,
                by[aours],
                by[afloor],
                1.15,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- 3. contended -------------------------------------------------------------------------------
CONTENDED = [
    ("redis", "jobfence", "jobfence Redis `Locks.acquire` (FIFO hand-off)"),
    ("redis", "hand-fifo", "hand-written FIFO hand-off on Redis (Lua + BLPOP)"),
    ("redis", "redis-py", "redis-py `Lock(blocking=True)`, sleep=0.1 (default)"),
    ("redis", "redis-py-fast", "redis-py `Lock(blocking=True)`, sleep=0.001"),
    ("postgres", "jobfence-lease", "jobfence PostgreSQL lease mode (LISTEN/NOTIFY)"),
    ("postgres", "advisory", "plain `pg_advisory_lock` (server queue)"),
]


def section_contended(rep: Report, sz: Sizes) -> None:
    rep.add("## 3. Contended hand-off", "")
    per_sleep = h.sleep_cost()
    rep.add(
        f"N spawned processes loop on one name, each holding the lock for a 1 ms critical "
        f"section (`time.sleep(0.001)`, which takes {per_sleep * 1000:.3f} ms here: at most "
        f"{1 / per_sleep:.0f} acquisitions/s), {sz.seconds:g} s per case. Hand-off gap: from "
        f"the end of one holder's critical section (it starts releasing) to the next holder "
        f"having the lock. Share: each process's acquisitions over a fair share (1.00)."
    )
    workers = {
        "redis": (bench_redis_locks._worker, bench_redis_locks._cleanup, REDIS_URL),
        "postgres": (bench_sql_locks._worker, bench_sql_locks._cleanup, POSTGRES_URL),
    }
    for n in sz.processes:
        runs: dict[str, h.Contended] = {}
        rows = []
        for backend, kind, label in CONTENDED:
            worker, cleanup, url = workers[backend]
            run = h.contended_stats(worker, partial(cleanup, url), url, kind, n, sz.seconds)
            runs[kind] = run
            gap = run.gap
            anchor = "advisory" if backend == "postgres" else "hand-fifo"
            rows.append(
                (
                    label,
                    f"{run.rate:.0f}",
                    _us(gap.median),
                    _us(gap.p99),
                    f"{run.shares[-1]:.2f}",
                    f"{run.shares[0]:.2f}",
                    f"{run.rate / runs[anchor].rate:.2f}x" if anchor in runs else "1.00x",
                )
            )
        rep.add("", f"### {n} processes")
        rep.table(
            (
                "case",
                "acquisitions/s",
                "gap median µs",
                "gap p99 µs",
                "min share",
                "max share",
                "rate ratio to anchor",
            ),
            rows,
        )
        rep.add(
            "Anchors: the hand-written FIFO hand-off (Redis rows), `pg_advisory_lock` "
            "(PostgreSQL rows).",
            "",
        )
        jf, fifo = runs["jobfence"], runs["hand-fifo"]
        rep.target(
            f"{n} processes: jobfence Redis fair (min/max share ≥ 0.80)",
            jf.fairness >= 0.8,
            f"{jf.shares[-1]:.2f}/{jf.shares[0]:.2f} = {jf.fairness:.2f}",
        )
        pg = runs["jobfence-lease"]
        rep.target(
            f"{n} processes: jobfence PostgreSQL fair (min/max share ≥ 0.80)",
            pg.fairness >= 0.8,
            f"{pg.shares[-1]:.2f}/{pg.shares[0]:.2f} = {pg.fairness:.2f}",
        )
        rep.target(
            f"{n} processes: jobfence Redis ≥ 95% of the hand-written FIFO rate",
            jf.rate >= 0.95 * fifo.rate,
            f"{jf.rate:.0f}/s vs {fifo.rate:.0f}/s = {jf.rate / fifo.rate:.0%}",
        )
        best = max(runs["redis-py"].rate, runs["redis-py-fast"].rate)
        rep.target(
            f"{n} processes: jobfence Redis ahead of redis-py `Lock` (either sleep)",
            jf.rate > best,
            f"{jf.rate:.0f}/s vs {best:.0f}/s",
        )
        adv = runs["advisory"]
        rep.target(
            f"{n} processes: jobfence PostgreSQL ≥ 85% of `pg_advisory_lock`",
            pg.rate >= 0.85 * adv.rate,
            f"{pg.rate:.0f}/s vs {adv.rate:.0f}/s = {pg.rate / adv.rate:.0%}",
        )


# -- 4. inbox -------------------------------------------------------------------------------------
def section_inbox(rep: Report, sz: Sizes) -> None:
    rep.add("## 4. Inbox claims", "")
    rep.add(
        "A fresh key per call (NEW), or one held key (duplicate). Anchor: the hand-written "
        "idempotency insert on the same driver, autocommit (PostgreSQL `INSERT ... ON CONFLICT "
        "DO NOTHING`, MariaDB `INSERT IGNORE`, SQLite `INSERT OR IGNORE`, Redis `SET NX PX`); "
        "`claim_in` is measured against the same insert inside the same kind of transaction "
        "(statement + commit). On Redis, claim + complete is measured against AWS Lambda "
        "Powertools' `idempotent_function` on its Redis persistence layer "
        "(`RedisCachePersistenceLayer`, a fake Lambda context, outside Lambda), and a "
        "completed duplicate against Powertools' repeated call."
    )
    tx_anchor = "hand-written insert in a transaction"
    for backend in ("postgres", "mysql", "sqlite", "redis"):
        m = bench_inbox.MEASURES[backend](sz.inbox_ops, sz.rounds)
        anchors = {label: m.base for label in m.timings}
        anchors[m.base] = ""
        if tx_anchor in m.timings:
            anchors[tx_anchor] = ""
            anchors["Inbox.claim_in in a transaction"] = tx_anchor
        pt_new = "Powertools idempotent_function (NEW)"
        if pt_new in m.timings:
            anchors["Inbox.claim + complete (NEW)"] = pt_new
            anchors[pt_new] = ""
            pt_dup = "Powertools idempotent_function (duplicate, COMPLETED)"
            anchors["Inbox.claim (duplicate, COMPLETED)"] = pt_dup
            anchors[pt_dup] = ""
        rep.add("", f"### {m.backend}")
        rep.table(US_HEADER, _stats_rows(m.timings, anchors))
        trips = ", ".join(f"{k}: {v}" for k, v in m.trips.items())
        rep.add(f"Round trips: {trips}.", "")
        _ratio_target(
            rep,
            f"{m.backend}: `claim` (NEW) ≤ 1.1x the hand-written insert",
            m.timings,
            "Inbox.claim (NEW)",
            m.base,
            1.1,
        )
        if tx_anchor in m.timings:
            _ratio_target(
                rep,
                f"{m.backend}: `claim_in` ≤ 1.1x the hand-written insert in a transaction",
                m.timings,
                "Inbox.claim_in in a transaction",
                tx_anchor,
                1.1,
            )
        if pt_new in m.timings:
            _faster_target(
                rep,
                f"{m.backend}: claim + complete faster than Powertools",
                m.timings,
                "Inbox.claim + complete (NEW)",
                pt_new,
            )


# -- 5. guarded -----------------------------------------------------------------------------------
def section_guarded(rep: Report, sz: Sizes) -> None:
    rep.add("## 5. A guarded job end to end", "")
    rep.add(
        '`@jobfence.guarded(locks=..., inbox=..., lock="job", key="{key}")` around a '
        "no-op sync function, a fresh key per call: lease, claim, run, store the result, "
        "release. Anchor: the same four steps hand-written on the same driver (lease row/key, "
        "idempotency mark, result on the mark, owner-checked delete of the lease). No target."
    )
    rows = []
    for backend in bench_guarded.MEASURES:
        m = bench_guarded.MEASURES[backend](sz.guarded_ops, sz.rounds)
        names = {
            bench_guarded.ANCHOR: f"{m.backend}: {bench_guarded.ANCHOR}",
            bench_guarded.GUARDED: f"{m.backend}: {bench_guarded.GUARDED}",
        }
        anchors = {bench_guarded.GUARDED: bench_guarded.ANCHOR, bench_guarded.ANCHOR: ""}
        rows.extend(_stats_rows(m.timings, anchors, names))
    rep.table(US_HEADER, rows)


# -- 6. worker ------------------------------------------------------------------------------------
def section_worker(rep: Report, sz: Sizes) -> None:
    rep.add("## 6. Worker: messages per second", "")
    rep.add(
        f"{sz.messages} messages published, then consumed until the queue is empty (only the "
        f"consuming is timed), concurrency 8, {sz.worker_rounds} interleaved rounds; a rate "
        f"has no per-operation p99: the slowest round is given instead. Anchors: a "
        f"hand-written consumer loop on the same server and driver (receive a batch, ack each "
        f"message), and the same loop with a hand-written idempotency mark per message for "
        f"the guarded handler (RabbitMQ's inbox and mark are on Redis). Plain `def` handlers "
        f"run at the worker's defaults (`Worker` on a `Queue`, as `jobfence worker` runs them, "
        f"and `AsyncWorker` on an `AsyncQueue`), against the same loop and, on Redis and "
        f"RabbitMQ, Dramatiq's worker at its default 8 threads on the same broker, in the same "
        f"process and rounds. CPU: user + system time of the process (all its threads) while "
        f"consuming, per message."
    )
    rows = []
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("redis", "postgres", "sqlite", "rabbitmq"):
            m = asyncio.run(bench_worker.measure(backend, sz.messages, sz.worker_rounds, 8, tmp))
            measured.append(m)
            for case, values in m.rates.items():
                anchor = bench_worker.ANCHORS.get(case, "")
                med = m.median(case)
                rows.append(
                    (
                        f"{backend}: {case}",
                        f"{med:.0f}",
                        f"{min(values):.0f}",
                        f"{backend}: {anchor}" if anchor else "(anchor)",
                        f"{med / m.median(anchor):.2f}x" if anchor else "1.00x",
                        f"{m.cpu_us(case):.0f}",
                    )
                )
            rows.append(
                (
                    f"{backend}: inbox calls per guarded message (claim, complete)",
                    f"{m.extra_trips:.2f}",
                    f"{m.extra_trips:.2f}",
                    "(counted)",
                    "-",
                    "-",
                )
            )
            rows.append(
                (
                    f"{backend}: inbox round trips per guarded message (batched)",
                    f"{m.inbox_trips:.2f}",
                    f"{m.inbox_trips:.2f}",
                    "(counted)",
                    "-",
                    "-",
                )
            )
    rep.table(
        (
            "case",
            "msg/s median",
            "msg/s slowest round",
            "anchor",
            "ratio to anchor",
            "CPU µs per message",
        ),
        rows,
    )
    for m in measured:
        for case in (bench_worker.ASYNC_NOOP, bench_worker.ASYNC_GUARDED):
            anchor = bench_worker.ANCHORS[case]
            ratio = m.median(case) / m.median(anchor)
            rep.target(f"{m.backend}: {case} ≥ 0.70x {anchor}", ratio >= 0.70, f"{ratio:.2f}x")
        for text, met, figures in m.targets():
            rep.target(text, met, figures)
        rep.target(
            f"{m.backend}: ≤ 5 backend round trips per guarded message on top of receive and ack",
            m.extra_trips <= 5,
            f"{m.extra_trips:.2f} calls, {m.inbox_trips:.2f} round trips",
        )


# -- 7. leases ------------------------------------------------------------------------------------
def section_leases(rep: Report, sz: Sizes) -> None:
    rep.add(f"## 7. {sz.leases:,} live leases on one client", "")
    rep.add(
        f"One `AsyncLocks` client takes {sz.leases:,} leases (renew=True, taken 50 at a time) "
        f"and keeps them. Memory: the Python heap growth while taking them, by `tracemalloc` "
        f"(not RSS), per lease. Renewal: the client's clock is moved on a third of the ttl so "
        f"every lease is due at once, and the renewer's backend calls are counted with the I/O "
        f"hook of `jobfence.testing` (point `lock.renew`, one batched call each)."
    )
    rows = []
    results = []
    for backend in bench_leases.MEASURES:
        m = asyncio.run(bench_leases.MEASURES[backend](sz.leases))
        results.append(m)
        rows.append(
            (
                m.backend,
                f"{m.bytes_per_lease:.0f}",
                f"{m.trips_per_tick:.2f}",
                f"{m.renewed / m.round_trips:.0f}",
                f"{m.acquire_seconds:.1f}",
            )
        )
    rep.table(
        (
            "backend",
            "bytes per lease",
            "renewal round trips per tick",
            "leases per round trip",
            "seconds to take them",
        ),
        rows,
    )
    for m in results:
        rep.target(
            f"{m.backend}: ≤ 2 KB of client memory per lease",
            m.bytes_per_lease <= 2048,
            f"{m.bytes_per_lease:.0f} bytes",
        )
        rep.target(
            f"{m.backend}: one round trip per renewal tick",
            m.trips_per_tick <= 1.0,
            f"{m.round_trips} round trip(s) in {m.ticks} tick(s) for {m.renewed} leases",
        )


# -- 8. waiting for a Redis replica ---------------------------------------------------------------
def section_replicas(rep: Report, sz: Sizes) -> None:
    rep.add("## 8. Redis: waiting for a replica (`wait_replicas=1`)", "")
    rep.add(
        "A disposable primary with one replica, both on loopback (started for this section). "
        "Per fresh key: the lock cycle (`try_acquire` + `release`; the grant waits, the "
        "release does not) and the inbox's `claim` + `complete` (both wait), with "
        "`wait_replicas=0` (the default) and `wait_replicas=1` (the script and `WAIT 1` in "
        "one pipeline). The replica is on the same host: on a network, every waiting write "
        "also pays one round trip from the primary to the replica. No target: the figures "
        "are the price of the choice (docs/reference/durability.md)."
    )
    stats = bench_redis_replicas.measure(sz.rounds, sz.inbox_ops)
    rep.table(US_HEADER, _stats_rows(stats, bench_redis_replicas.ANCHORS))


# -- 9. etcd beside Redis and PostgreSQL ----------------------------------------------------------
def section_etcd(rep: Report, sz: Sizes) -> None:
    rep.add("## 9. etcd beside Redis and PostgreSQL", "")
    rep.add(
        "A disposable one-member etcd (data in memory where the host has /dev/shm), the local "
        "Redis and PostgreSQL. Per fresh key: the lock cycle (`try_acquire` + `release`, "
        "`renew=False`) and the inbox's `claim` + `complete`, each against the same operation "
        "on Redis. etcd pays more round trips and a Raft commit per write: the price of "
        "leases and records that survive a leader failover. No target: the figures are the "
        "price of the choice (docs/how-to/backends/etcd.md)."
    )
    stats = bench_etcd_locks.measure(sz.rounds, sz.inbox_ops)
    rep.table(US_HEADER, _stats_rows(stats, bench_etcd_locks.ANCHORS))


# -- 10. concurrency limits ------------------------------------------------------------------------
def section_limits(rep: Report, sz: Sizes) -> None:
    rep.add("## 10. Concurrency limits: acquire+release under limit=3", "")
    rep.add(
        "One name, one client, `try_acquire(name, limit=3, renew=False)` + `release` in a loop "
        "(slot 0 free each time), beside a plain jobfence lock, against hand-written floors: "
        "Redis, a sorted set of holders (one script: `ZREMRANGEBYSCORE` + `ZCARD` + `ZADD` + "
        "`PEXPIRE`; `ZREM` to release), the shape DistributedLock and Redisson use; "
        "PostgreSQL, a row per slot taken with `UPDATE ... (SELECT ... FOR UPDATE SKIP "
        "LOCKED)` and freed with an owner-checked `UPDATE`. The floors have no fencing token "
        "and no wait queue."
    )
    stats = bench_semaphore.measure(sz.rounds, sz.lock_ops)
    rep.table(US_HEADER, _stats_rows(stats, bench_semaphore.ANCHORS))
    _ratio_target(
        rep,
        "a limit of 3 on Redis ≤ 1.2x its floor",
        stats,
        bench_semaphore.REDIS_JF,
        bench_semaphore.REDIS_FLOOR,
        1.2,
    )
    _ratio_target(
        rep,
        "a limit of 3 on PostgreSQL ≤ 1.2x its floor",
        stats,
        bench_semaphore.PG_JF,
        bench_semaphore.PG_FLOOR,
        1.2,
    )


# -- 11. schedulers per fire ----------------------------------------------------------------------
def section_scheduler(rep: Report, sz: Sizes) -> None:
    quick = sz.rounds < FULL.rounds
    warmup = bench_scheduler.warmup_for(quick)
    rep.add("## 11. Schedulers: CPU and lag per fire", "")
    rep.add(
        f"{bench_scheduler.SCHEDULES} schedules every 1 s (a jobfence slot is a whole second: "
        "the fastest schedule the three run alike), each case in processes of its own for "
        f"a fixed time per round after a warm-up of {warmup:g} s (connections, "
        "tables, the first pass). CPU per fire: the scheduler processes' user + system CPU "
        "while their loop ran, over the fires (servers not counted). Lag: jobfence in the "
        "target (now minus the slot's time); celery beat + RedBeat when beat sends "
        "(`before_task_publish`), against the entry's previous send + 1 s; APScheduler 3 when "
        "it submits the job (`EVENT_JOB_SUBMITTED`), against its scheduled run time. In "
        "brackets: the lowest and highest figure of one round. No target: the figures are "
        "the price of exactly-once slots across processes "
        "(docs/reference/performance.md#scheduler)."
    )
    cases = bench_scheduler.measure(quick)
    rep.table(bench_scheduler.HEADER, bench_scheduler.rows(cases))


# -- 12. Idempotency-Key ----------------------------------------------------------------------
def section_idempotency(rep: Report, sz: Sizes) -> None:
    rep.add("## 12. Idempotency-Key: a FastAPI POST per request", "")
    rep.add(
        "A FastAPI `POST /orders` (a pydantic body, a JSON answer) called in-process through "
        "ASGI (no socket, no HTTP client: the middleware's cost is not drowned by the "
        "network), a fresh `Idempotency-Key` per request (the view runs), and the same key "
        "again (the stored response is replayed). Anchor: the app without middleware. (b) is "
        'the hand-written kind (`@app.middleware("http")`: `GET`, `SET NX EX`, the view, '
        "`SET`), which has no fingerprint, no caller scope, no release of a failed request "
        "and stores errors; (c) and (d) are jobfence's `IdempotencyKeyMiddleware` on an "
        "`AsyncInbox` (claim, run, store: two round trips; PostgreSQL commits each). No "
        "target: the figures are the price per request, and the ratio of (c) to (b) is "
        "below the table."
    )
    m = bench_idempotency.measure(sz.inbox_ops, sz.rounds)
    for case, seen in m.statuses.items():
        if seen != {201}:
            raise RuntimeError(f"{case}: answered {sorted(seen)}, not only 201")
    anchors = {case: bench_idempotency.ANCHORS.get(case, "") for case in m.timings}
    rep.table(US_HEADER, _stats_rows(m.timings, anchors))
    for ours, theirs in (
        (bench_idempotency.JF_REDIS, bench_idempotency.NAIVE),
        (bench_idempotency.JF_REDIS_REPLAY, bench_idempotency.NAIVE_REPLAY),
    ):
        rep.add(f"- {ours} / {theirs}: {_ratio_cell(m.timings, ours, theirs)}")
    rep.add("")


# -- 13. transactional outbox ---------------------------------------------------------------------
RELAY_HEADER = (
    "case",
    "rows/s median",
    "rows/s slowest round",
    "p50 ms",
    "p95 ms",
    "relay CPU µs/row",
    "first rows after (ms)",
    "anchor",
    "rate ratio (per round)",
    "p50 ratio (per round)",
)


def _spread_cell(overall: float, values: list[float]) -> str:
    """``1.19x (1.08-1.31)``: a ratio of the medians, then its lowest and highest per round."""
    text = f"{overall:.2f}x"
    if len(values) > 1:
        text += f" ({min(values):.2f}-{max(values):.2f})"
    return text


def section_outbox(rep: Report, sz: Sizes) -> None:
    rep.add("## 13. Transactional outbox", "")
    rep.add(
        "**add**: one caller transaction inserts an order row and adds one outbox row, then "
        "commits; `Outbox.add(conn, queue=..., body=...)` against the same transaction with "
        "a hand-written bare `INSERT` into an equivalent outbox table: the same columns, "
        f"{bench_outbox.BARE_INDEXES}; the user's side also makes the id (uuid4) and encodes "
        "the body as JSON. Same driver and connection for both (psycopg sync and async, "
        "PyMySQL, `sqlite3` in WAL with `synchronous=FULL`); µs per transaction."
    )
    rows: list[tuple[str, ...]] = []
    added = []
    for backend in bench_outbox.ADD_MEASURES:
        m = bench_outbox.ADD_MEASURES[backend](sz.inbox_ops, sz.rounds)
        added.append(m)
        names = {label: f"{m.backend}: {label}" for label in m.timings}
        anchors = {label: bench_outbox.ADD_ANCHORS[label] for label in m.timings}
        rows.extend(_stats_rows(m.timings, anchors, names))
    rep.table(US_HEADER, rows)
    rep.add(
        "Round trips of one `add` on the caller's connection (counted: libpq's trace, "
        "PyMySQL's commands, SQLite's statements): "
        + ", ".join(f"{m.backend} {m.trips:g}" for m in added)
        + ".",
        "",
    )
    for m in added:
        for case, anchor in m.pairs:
            what = "`AsyncOutbox.add`" if case == bench_outbox.ADD_JF_ASYNC else "`Outbox.add`"
            _ratio_target(
                rep,
                f"{m.backend}{' async' if 'async' in case else ''}: {what} ≤ 1.1x the "
                "hand-written INSERT in the same transaction",
                m.timings,
                case,
                anchor,
                1.1,
            )
    relay_rounds = min(sz.rounds, sz.relay_rounds)
    rep.add(
        "",
        "**relay**: rows committed in the database published to a Redis Streams queue, by "
        "`jobfence.Relay(outbox, Queue(redis_url, name))` with its defaults (one process), "
        "against a hand-written relay loop in a process of its own: `BEGIN; SELECT ... WHERE "
        "published_at IS NULL ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED` (SQLite: `BEGIN "
        "IMMEDIATE`, no `SKIP LOCKED`), one `XADD` per row in one redis-py pipeline, `UPDATE "
        "... SET published_at`, `COMMIT`, and a sleep of "
        f"{bench_outbox.HAND_SLEEP * 1000:g} ms after a claim that found nothing. Latency: a "
        f"producer commits one row every {bench_outbox.GAP * 1000:g} ms "
        f"({sz.outbox_latency_rows} rows per round) while the relay runs; a row's latency "
        "runs from right after its `COMMIT` returned to when a consumer thread blocked in "
        "`XREAD BLOCK` on the stream received it (one clock, the producer's process). "
        f"Throughput: {sz.outbox_rows} rows committed in one transaction while the relay "
        "waits; the rate runs from the first of them the consumer received to the last (the "
        "time the relay took to notice the commit is shown apart: first rows after); relay "
        "CPU is the relay process' user + system time per row from that commit to the last "
        f"row. {relay_rounds} interleaved "
        "round(s), one fresh relay process per case and round, warmed up with "
        f"{min(bench_outbox.WARMUP_ROWS, sz.outbox_latency_rows)} rows committed one by one; "
        "medians of the rounds.",
    )
    relayed = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("postgres", "mysql", "sqlite"):
            r = bench_outbox.measure_relay(
                backend, sz.outbox_rows, sz.outbox_latency_rows, relay_rounds, tmp
            )
            relayed.append(r)
            for case in (bench_outbox.RELAY_HAND, bench_outbox.RELAY_JF):
                jf = case == bench_outbox.RELAY_JF
                rows.append(
                    (
                        f"{r.backend}: {case}",
                        f"{r.median(case, 'rate'):.0f}",
                        f"{r.spread(case, 'rate')[0]:.0f}",
                        f"{r.median(case, 'p50_ms'):.2f}",
                        f"{r.median(case, 'p95_ms'):.2f}",
                        f"{r.median(case, 'cpu_us'):.0f}",
                        f"{r.median(case, 'pickup_ms'):.0f}",
                        f"{r.backend}: {bench_outbox.RELAY_HAND}" if jf else "(anchor)",
                        _spread_cell(r.ratio("rate"), r.ratios("rate")) if jf else "1.00x",
                        _spread_cell(r.ratio("p50_ms"), r.ratios("p50_ms")) if jf else "1.00x",
                    )
                )
    rep.table(RELAY_HEADER, rows)
    for r in relayed:
        rates, p50s = r.ratios("rate"), r.ratios("p50_ms")
        rate, p50 = r.ratio("rate"), r.ratio("p50_ms")
        rep.target(
            f"{r.backend}: jobfence `Relay` rate ≥ 0.8x the hand-written relay",
            rate >= 0.8,
            f"{rate:.2f}x; per round {min(rates):.2f}x-{max(rates):.2f}x, at least 0.80x in "
            f"{sum(x >= 0.8 for x in rates)} of {len(rates)} rounds",
        )
        rep.target(
            f"{r.backend}: jobfence `Relay` p50 commit→publish latency ≤ 2x the hand-written "
            "relay's",
            p50 <= 2.0,
            f"{p50:.2f}x; per round {min(p50s):.2f}x-{max(p50s):.2f}x, within 2x in "
            f"{sum(x <= 2.0 for x in p50s)} of {len(p50s)} rounds",
        )


# -- 14. guarded tasks on their frameworks ---------------------------------------------------------
def section_frameworks(rep: Report, sz: Sizes) -> None:
    rep.add("## 14. A guarded task on its framework's worker", "")
    rep.add(
        f"{sz.framework_tasks} no-op tasks enqueued on a fresh queue of the same Redis, then "
        "drained by the framework's own worker in this process (Celery `solo` pool, RQ "
        "`SimpleWorker`, one Dramatiq worker thread, arq `max_jobs=1`: concurrency 1 for "
        "every variant); µs per task from the first task's start to the last one's end. "
        "(b) is the framework integration as its how-to page sets it up (`locks` and `inbox` "
        'on Redis, `lock="item:{n}"`, the framework\'s job id as the key); (c) celery-once '
        "takes its lock when the task is enqueued (untimed) and deletes it after the run; (d) "
        "Powertools' `idempotent_function` on its Redis layer wraps the task's body. The table "
        "has no p99: a figure is one round's time per task, and the p99 column is the "
        "slowest round. Targets: the guard ≤ 1.15x the unguarded task, and ahead of each "
        "alternative."
    )
    rows: list[tuple[str, ...]] = []
    verdicts = []
    for name in bench_frameworks.MEASURES:
        m = bench_frameworks.MEASURES[name](sz.framework_tasks, sz.rounds)
        names = {case: f"{m.framework}: {case}" for case in m.timings}
        anchors = {case: bench_frameworks.UNGUARDED for case in m.timings}
        anchors[bench_frameworks.UNGUARDED] = ""
        rows.extend(_stats_rows(m.timings, anchors, names))
        verdicts.append(m)
    rep.table(US_HEADER, rows)
    for m in verdicts:
        _ratio_target(
            rep,
            f"{m.framework}: jobfence guard ≤ 1.15x the unguarded task",
            m.timings,
            bench_frameworks.JOBFENCE,
            bench_frameworks.UNGUARDED,
            1.15,
        )
        for alt in (bench_frameworks.CELERY_ONCE, bench_frameworks.POWERTOOLS):
            if alt in m.timings:
                _faster_target(
                    rep,
                    f"{m.framework}: jobfence guard faster than {alt[4:]}",
                    m.timings,
                    bench_frameworks.JOBFENCE,
                    alt,
                )


# -- 15. workers side by side ---------------------------------------------------------------------
def section_peers(rep: Report, sz: Sizes) -> None:
    rep.add("## 15. Workers side by side: each system's own worker", "")
    rep.add(
        f"Each system's worker process (its own command line) drains {sz.peer_tasks} tasks "
        "published before it starts; every task runs the same body (an `INCR` on Redis, the "
        "first and the last stamping the time), so the rate is from the first task to the last "
        "and the start-up is not counted. CPU per task is the worker's whole process tree's, "
        "from /proc. Default concurrency for each (Celery prefork: one process per core; "
        "Dramatiq: 8 threads; arq: 10 jobs; RQ and procrastinate: 1), plus Celery with 8 "
        f"threads, RQ's SimpleWorker and procrastinate with 8. {sz.worker_rounds} interleaved "
        "rounds; median (min-max)."
        + (
            " `--quick` runs the Redis rows of jobfence, Celery and Dramatiq only."
            if sz.peer_tasks < 500
            else ""
        )
    )
    quick = sz.peer_tasks < 500
    brokers = {"redis"} if quick else {"redis", "rabbitmq", "postgres"}
    systems = {"jobfence", "dramatiq"} if quick else None
    rows = bench_worker_peers.measure(brokers, sz.peer_tasks, sz.worker_rounds, systems)
    rep.add("", *bench_worker_peers.table(rows), "")
    by_name = {(r.case.broker, r.case.label): r for r in rows}
    for broker in ("redis", "rabbitmq", "postgres"):
        ours = by_name.get((broker, bench_worker_peers.jobfence_worker(broker, "tick").label))
        if ours is None:
            continue
        for peer in rows:
            if peer.case.broker != broker or peer.case.system not in ("celery", "dramatiq"):
                continue
            if not ours.rates or not peer.rates:
                rep.target(
                    f"{broker}: jobfence `def` worker ≥ {peer.case.label}",
                    False,
                    f"did not run: {ours.error or peer.error}",
                )
                continue
            med, theirs = statistics.median(ours.rates), statistics.median(peer.rates)
            rep.target(
                f"{broker}: jobfence `def` worker ≥ {peer.case.label}",
                med >= theirs,
                f"{med:,.0f} vs {theirs:,.0f} tasks/s, {med / theirs:.2f}x",
            )


# -- 16. publishing -------------------------------------------------------------------------------
def section_publish(rep: Report, sz: Sizes) -> None:
    rep.add("## 16. Publishing: messages per second", "")
    rep.add(
        f"{sz.publish_ops} messages per case per round, {sz.rounds} interleaved rounds (the "
        "order rotated each round); every case returns once the broker has each message "
        "(RabbitMQ: the publisher confirm of a persistent message on a quorum queue; "
        "PostgreSQL and SQLite: a committed row; Redis: the reply), except Celery and "
        "Dramatiq on RabbitMQ, which publish without confirms by default (the row "
        f"`{bench_publish.CELERY_CONFIRM}` waits for them: the same guarantee as jobfence's). "
        "Celery on PostgreSQL and SQLite is kombu's SQLAlchemy transport, Celery's broker on "
        "a database, with its defaults. Floors: the same on the driver "
        f"jobfence uses, hand-written, one message per call and {bench_publish.BATCH} per call "
        "(a Redis pipeline, pika with the batch's confirms awaited together, one transaction "
        "of `executemany` on PostgreSQL and SQLite). A rate has no per-operation p99: the "
        "slowest and fastest rounds are given instead; CPU is the publishing process's."
    )
    rows = []
    measured = []
    for broker in bench_publish.BROKERS:
        m = bench_publish.measure(broker, sz.publish_ops, sz.rounds)
        measured.append(m)
        rows.extend(bench_publish.table(m))
    rep.table(bench_publish.HEADER, rows)
    for m in measured:
        for text, met, figures in bench_publish.targets(m):
            rep.target(text, met, figures)


RUNNERS: dict[str, Callable[[Report, Sizes], None]] = {
    "redis": section_redis,
    "sql": section_sql,
    "contended": section_contended,
    "inbox": section_inbox,
    "guarded": section_guarded,
    "worker": section_worker,
    "leases": section_leases,
    "replicas": section_replicas,
    "etcd": section_etcd,
    "limits": section_limits,
    "scheduler": section_scheduler,
    "idempotency": section_idempotency,
    "outbox": section_outbox,
    "frameworks": section_frameworks,
    "peers": section_peers,
    "publish": section_publish,
}


# -- header ---------------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {ram} RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )


def server_versions() -> dict[str, str]:
    import pika
    import psycopg
    import pymysql
    import redis

    versions = {}
    r = redis.Redis.from_url(REDIS_URL)
    versions["Redis"] = str(r.info("server")["redis_version"])
    r.close()
    with psycopg.connect(POSTGRES_URL) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
        ).fetchone()
    assert row is not None
    versions["PostgreSQL"] = f"{row[0]} (synchronous_commit={row[1]})"
    conn2 = pymysql.connect(host="127.0.0.1", user="root", database="test")
    with conn2.cursor() as cur:
        cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
        version, flush = cur.fetchone()
    conn2.close()
    versions["MariaDB"] = f"{version} (innodb_flush_log_at_trx_commit={flush})"
    versions["SQLite"] = sqlite3.sqlite_version
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    props = connection._impl.server_properties
    connection.close()
    rv = props.get("version", b"?")
    versions["RabbitMQ"] = rv.decode() if isinstance(rv, bytes) else str(rv)
    return versions


LIBRARIES = (
    ("jobfence", "jobfence"),
    ("redis-py", "redis"),
    ("psycopg", "psycopg"),
    ("PyMySQL", "PyMySQL"),
    ("aiomysql", "aiomysql"),
    ("aiosqlite", "aiosqlite"),
    ("aio-pika", "aio-pika"),
    ("python-redis-lock (anchor)", "python-redis-lock"),
    ("pottery (anchor)", "pottery"),
    ("aws-lambda-powertools (anchor)", "aws-lambda-powertools"),
    ("celery (anchor)", "celery"),
    ("celery-once (anchor)", "celery-once"),
    ("RQ", "rq"),
    ("Dramatiq", "dramatiq"),
    ("arq", "arq"),
    ("celery-redbeat (anchor)", "celery-redbeat"),
    ("APScheduler (anchor)", "apscheduler"),
    ("FastAPI", "fastapi"),
    ("Starlette", "starlette"),
)


def header(rep: Report, sz: Sizes, quick: bool, sections: list[str]) -> None:
    rep.add("# Benchmarks", "")
    rep.add(
        "Generated by `python benchmarks/run.py"
        + (" --quick" if quick else "")
        + "` (`bash scripts/bench.sh` installs, starts the services and runs it). "
        "Figures depend on the machine and on what else runs on it: compare rows of one run, "
        "not runs of different machines. Where the time goes, and why a target is not met: "
        "docs/reference/performance.md."
        + (" **Quick run: tiny sizes, figures meaningless.**" if quick else ""),
        "",
    )
    rep.add(f"**Machine:** {machine_line()}", "")
    versions = [f"{name} {_version(dist)}" for name, dist in LIBRARIES]
    rep.add("**Libraries:** " + ", ".join(versions), "")
    rep.add(
        "**Servers** (loopback, on the same machine): "
        + ", ".join(f"{k} {v}" for k, v in server_versions().items()),
        "",
    )
    rep.add(
        "**How it was measured.** Each section runs its cases in interleaved rounds (every "
        "case once per round, the order rotated each round for the lock variants), after a "
        "warm-up run of each case (connections, scripts, tables). Every operation is timed on "
        "its own (`time.perf_counter`), and a case's median and p99 are over all its "
        "operations of all rounds. A ratio is that of the medians over all rounds; in "
        "brackets, the lowest and highest ratio of the two cases' medians within one round "
        "(the spread a single short run could have shown), and each target line says in how "
        "many rounds on their own it held. "
        f"Sizes: {sz.ops_line()}. Sections run: {', '.join(sections)}.",
        "",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help="sections, comma-separated: " + ",".join(SECTIONS),
    )
    parser.add_argument("--output", default=str(HERE.parent / "BENCHMARKS.md"))
    args = parser.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    sz = QUICK if args.quick else FULL
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        sz = Sizes(**{**sz.__dict__, "rounds": args.rounds})
    started = time.perf_counter()
    rep = Report()
    header(rep, sz, args.quick, sections)
    for section in sections:
        print(f"== {section}", flush=True)
        before = time.perf_counter()
        RUNNERS[section](rep, sz)
        rep.add("")
        print(f"   {time.perf_counter() - before:.0f} s", flush=True)
    met = sum(1 for _, ok in rep.verdicts if ok)
    rep.add(
        "## Summary",
        "",
        f"{met} of {len(rep.verdicts)} targets met; total wall time "
        f"{time.perf_counter() - started:.0f} s.",
    )
    Path(args.output).write_text("\n".join(rep.lines).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {args.output}: {met} of {len(rep.verdicts)} targets met")


if __name__ == "__main__":
    main()
