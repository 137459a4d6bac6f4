"""The benchmark scripts run: ``--quick`` prints every row and the bugs they hunt are found.

A smoke test: no figure is asserted (speeds depend on the machine), only that the script
runs to the end, prints the rows it promises, and that the races it times are really found.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_TESTING = ROOT / "benchmarks" / "bench_testing.py"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # the checkout's own sources, whatever jobfence the interpreter has installed
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )


def table_rows(out: str) -> dict[tuple[str, str], list[str]]:
    """Every markdown table row, by its first two cells, as its list of cells."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells
    return rows


def test_bench_testing_quick_prints_every_row_and_finds_both_bugs() -> None:
    result = run_script(BENCH_TESTING, "--quick")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    rows = table_rows(out)
    # 1. throughput: 2 and 3 tasks x 5, 10, 20 points under each strategy, and the locks row
    for tasks in (2, 3):
        for points in (5, 10, 20):
            for strategy in ("random", "pct", "fifo"):
                row = rows[(f"{tasks} tasks x {points} points", strategy)]
                assert row[2] == str(tasks * points), row  # the points each schedule hit
    locks = [cells for (name, _), cells in rows.items() if "sim.locks()" in name]
    assert len(locks) == 1, out
    assert int(locks[0][2]) > 0, locks  # the lock row's schedules did hit points
    # 2. both races are found, by the checker that describes them
    lost = rows[("(a) lost update", "yes")]
    assert lost[2] == "no_lost_update", lost
    duplicate = rows[("(b) duplicate processing", "yes")]
    assert duplicate[2] == "exactly_once", duplicate
    assert "no_lost_update: t1 wrote inventory['stock']" in out
    assert "exactly_once: charge applied more than once for 'order-1'" in out
    # 3. the profile section
    assert "## 3. Where the time goes" in out
    assert "testing/_sim.py" in out  # the simulator's functions are in the profile's top


RUN = ROOT / "benchmarks" / "run.py"

UNGUARDED = "(a) unguarded"
JOBFENCE = "(b) jobfence guard"
POWERTOOLS = "(d) Powertools idempotent_function (Redis)"

# every row run.py promises, by section heading: (first cell, anchor cell)
SECTION_ROWS = {
    "## 1. Redis: uncontended acquire+release": [
        "(a) hand-written SET NX PX + EVALSHA delete",
        "(f) hand-written on redis.asyncio",
        "(b) redis-py Lock",
        "(h) redis.asyncio Lock",
        "(i) python-redis-lock Lock",
        "(j) pottery Redlock, one master",
        "(c) jobfence Locks, renew=True (default)",
        "(e) jobfence AsyncLocks, renew=True",
    ],
    "## 2. PostgreSQL, MariaDB, SQLite: uncontended acquire+release": [
        "(a) hand-written INSERT ON CONFLICT + DELETE",
        "(c) jobfence Locks lease, renew=True (default)",
        "(f) jobfence AsyncLocks lease, renew=True",
        "(a) hand-written INSERT IGNORE + DELETE",
        "(a) hand-written INSERT OR IGNORE + DELETE",
        "(b) jobfence Locks, renew=True (default)",
        "(d) jobfence AsyncLocks, renew=True",
    ],
    "## 3. Contended hand-off": [
        "jobfence Redis `Locks.acquire` (FIFO hand-off)",
        "hand-written FIFO hand-off on Redis (Lua + BLPOP)",
        "redis-py `Lock(blocking=True)`, sleep=0.1 (default)",
        "jobfence PostgreSQL lease mode (LISTEN/NOTIFY)",
        "plain `pg_advisory_lock` (server queue)",
    ],
    "## 4. Inbox claims": [
        "hand-written INSERT ON CONFLICT DO NOTHING",
        "hand-written INSERT IGNORE",
        "hand-written INSERT OR IGNORE",
        "hand-written SET NX PX",
        "Inbox.claim (NEW)",
        "Inbox.claim (duplicate, IN_PROGRESS)",
        "hand-written insert in a transaction",
        "Inbox.claim_in in a transaction",
        "Inbox.claim + complete (NEW)",
        "Powertools idempotent_function (NEW)",
        "Powertools idempotent_function (duplicate, COMPLETED)",
    ],
    "## 5. A guarded job end to end": [
        f"{backend}: {case}"
        for backend in ("Redis", "PostgreSQL", "MariaDB", "SQLite")
        for case in (
            "hand-written lease + mark + result + release",
            "jobfence guarded (lock + claim + complete)",
        )
    ],
    "## 6. Worker: messages per second": [
        *(
            f"{queue}: {case}"
            for queue in ("redis", "postgres", "sqlite", "rabbitmq")
            for case in (
                "hand-written loop",
                "jobfence AsyncWorker, no-op",
                "jobfence Worker, def no-op (defaults)",
                "jobfence AsyncWorker, def no-op (defaults)",
                "jobfence Worker, guarded def (defaults)",
                "hand-written loop + idempotency mark",
                "jobfence AsyncWorker, guarded",
            )
        ),
        *(f"{queue}: Dramatiq worker, 8 threads (its default)" for queue in ("redis", "rabbitmq")),
    ],
    "## 7. 500 live leases on one client": ["Redis", "PostgreSQL (lease mode)", "SQLite"],
    "## 9. etcd beside Redis and PostgreSQL": [
        f"{backend}: {case}"
        for case in ("lock cycle", "inbox claim+complete")
        for backend in ("Redis", "PostgreSQL", "etcd")
    ],
    "## 10. Concurrency limits: acquire+release under limit=3": [
        "Redis: floor (ZSET script + ZREM)",
        "Redis: jobfence limit=3",
        "Redis: jobfence plain lock",
        "Redis: the backend's verbs on slot 0",
        "PostgreSQL: floor (slot rows, SKIP LOCKED)",
        "PostgreSQL: jobfence limit=3",
        "PostgreSQL: jobfence plain lock",
    ],
    "## 12. Idempotency-Key: a FastAPI POST per request": [
        "(a) FastAPI POST, no middleware",
        "(b) hand-written Redis SET NX middleware",
        "(c) jobfence IdempotencyKeyMiddleware, Redis",
        "(d) jobfence IdempotencyKeyMiddleware, PostgreSQL",
        "(b) hand-written, replay of a stored response",
        "(c) jobfence Redis, replay of a stored response",
    ],
    "## 14. A guarded task on its framework's worker": [
        f"{framework}: {case}"
        for framework, cases in (
            ("Celery", (UNGUARDED, JOBFENCE, "(c) celery-once QueueOnce", POWERTOOLS)),
            ("RQ", (UNGUARDED, JOBFENCE, POWERTOOLS)),
            ("Dramatiq", (UNGUARDED, JOBFENCE, POWERTOOLS)),
            ("arq", (UNGUARDED, JOBFENCE, POWERTOOLS)),
        )
        for case in cases
    ],
    "## 13. Transactional outbox": [
        *(
            f"{db}: {case}"
            for db, cases in (
                (
                    "PostgreSQL (psycopg)",
                    (
                        "hand-written INSERT in the transaction",
                        "Outbox.add in the transaction",
                        "async: hand-written INSERT in the transaction",
                        "async: AsyncOutbox.add in the transaction",
                    ),
                ),
                (
                    "MariaDB (PyMySQL)",
                    ("hand-written INSERT in the transaction", "Outbox.add in the transaction"),
                ),
                (
                    "SQLite (sqlite3, WAL)",
                    ("hand-written INSERT in the transaction", "Outbox.add in the transaction"),
                ),
            )
            for case in cases
        ),
        *(
            f"{db} → Redis Streams: {case}"
            for db in ("PostgreSQL (psycopg)", "MariaDB (PyMySQL)", "SQLite (sqlite3, WAL)")
            for case in ("hand-written relay loop", "jobfence Relay (defaults)")
        ),
    ],
    "## 15. Workers side by side": [
        "redis: jobfence worker, `def` (8, default)",
        "redis: jobfence worker, `async def` (8, default)",
        "redis: Dramatiq 1 process x 8 threads",
    ],
    "## 16. Publishing: messages per second": [
        f"{broker}: {case}"
        for broker in ("redis", "rabbitmq", "postgres", "sqlite")
        for case in (
            "Queue.publish",
            "Queue.publish_many(100)",
            "AsyncQueue.publish",
            "AsyncQueue.publish_many(100)",
        )
    ],
}

# one verdict line per target, by the words that start it (2 processes in --quick), by section
TARGETS: dict[str, list[str]] = {
    "frameworks": [
        *(
            f"{framework}: jobfence guard ≤ 1.15x the unguarded task"
            for framework in ("Celery", "RQ", "Dramatiq", "arq")
        ),
        "Celery: jobfence guard faster than celery-once QueueOnce",
        *(
            f"{framework}: jobfence guard faster than Powertools"
            for framework in ("Celery", "RQ", "Dramatiq", "arq")
        ),
    ],
    "limits": [
        "a limit of 3 on Redis ≤ 1.2x its floor",
        "a limit of 3 on PostgreSQL ≤ 1.2x its floor",
    ],
    "redis": [
        "jobfence `Locks` ≤ 1.15x the sync floor",
        "jobfence `AsyncLocks` ≤ 1.15x the async floor",
        "jobfence `Locks` faster than redis-py `Lock`",
        "jobfence `AsyncLocks` faster than `redis.asyncio` `Lock`",
    ],
    "sql": [
        f"{db}: jobfence `{cls}` ≤ 1.15x its {floor}"
        for db in ("PostgreSQL", "MariaDB", "SQLite")
        for cls, floor in (("Locks", "floor"), ("AsyncLocks", "async floor"))
    ],
    "contended": [
        "2 processes: jobfence Redis fair",
        "2 processes: jobfence PostgreSQL fair",
        "2 processes: jobfence Redis ≥ 95% of the hand-written FIFO rate",
        "2 processes: jobfence Redis ahead of redis-py `Lock`",
        "2 processes: jobfence PostgreSQL ≥ 85% of `pg_advisory_lock`",
    ],
    "inbox": [
        *(
            f"{db}: `claim` (NEW) ≤ 1.1x the hand-written insert"
            for db in (
                "PostgreSQL (psycopg, sync)",
                "MariaDB (PyMySQL)",
                "SQLite (sqlite3, WAL)",
                "Redis (redis-py, sync)",
            )
        ),
        *(
            f"{db}: `claim_in` ≤ 1.1x the hand-written insert in a transaction"
            for db in ("PostgreSQL (psycopg, sync)", "MariaDB (PyMySQL)", "SQLite (sqlite3, WAL)")
        ),
        "Redis (redis-py, sync): claim + complete faster than Powertools",
    ],
    "worker": [
        *(
            f"{queue}: {target}"
            for queue in ("redis", "postgres", "sqlite", "rabbitmq")
            for target in (
                "jobfence AsyncWorker, no-op ≥ 0.70x hand-written loop",
                "jobfence AsyncWorker, guarded ≥ 0.70x hand-written loop + idempotency mark",
                "≤ 5 backend round trips per guarded message",
                "jobfence Worker, def no-op (defaults) ≥ 0.50x hand-written loop",
                "jobfence Worker, def no-op (defaults) CPU per message ≤ 2x",
                "jobfence AsyncWorker, def no-op (defaults) ≥ 0.50x hand-written loop",
                "jobfence AsyncWorker, def no-op (defaults) CPU per message ≤ 2x",
                "jobfence Worker, guarded def (defaults) ≥ 0.70x jobfence Worker, def no-op",
            )
        ),
        *(
            f"{queue}: {case} ≥ Dramatiq worker, 8 threads"
            for queue in ("redis", "rabbitmq")
            for case in (
                "jobfence Worker, def no-op (defaults)",
                "jobfence AsyncWorker, def no-op (defaults)",
                "jobfence AsyncWorker, no-op",
            )
        ),
    ],
    "outbox": [
        *(
            f"{db}: `{cls}` ≤ 1.1x the hand-written INSERT in the same transaction"
            for db, cls in (
                ("PostgreSQL (psycopg)", "Outbox.add"),
                ("PostgreSQL (psycopg) async", "AsyncOutbox.add"),
                ("MariaDB (PyMySQL)", "Outbox.add"),
                ("SQLite (sqlite3, WAL)", "Outbox.add"),
            )
        ),
        *(
            f"{db} → Redis Streams: jobfence `Relay` {what}"
            for db in ("PostgreSQL (psycopg)", "MariaDB (PyMySQL)", "SQLite (sqlite3, WAL)")
            for what in (
                "rate ≥ 0.8x the hand-written relay",
                "p50 commit→publish latency ≤ 2x the hand-written relay's",
            )
        ),
    ],
    "peers": ["redis: jobfence `def` worker ≥ Dramatiq 1 process x 8 threads"],
    "publish": [
        *(
            f"{broker}: {case} ≥ 0.50x the hand-written, {n} per call"
            for broker in ("redis", "rabbitmq", "postgres", "sqlite")
            for case, n in (
                ("Queue.publish", 1),
                ("AsyncQueue.publish", 1),
                ("Queue.publish_many(100)", 100),
                ("AsyncQueue.publish_many(100)", 100),
            )
        ),
        *(
            f"{broker}: {case} ≥ Celery apply_async"
            for broker in ("redis", "rabbitmq", "postgres", "sqlite")
            for case in (
                "Queue.publish",
                "AsyncQueue.publish",
                "Queue.publish_many(100)",
                "AsyncQueue.publish_many(100)",
            )
        ),
        *(
            f"rabbitmq: {case} ≥ Celery with confirm_publish"
            for case in (
                "Queue.publish",
                "AsyncQueue.publish",
                "Queue.publish_many(100)",
                "AsyncQueue.publish_many(100)",
            )
        ),
    ],
    "leases": [
        f"{db}: {what}"
        for db in ("Redis", "PostgreSQL (lease mode)", "SQLite")
        for what in ("≤ 2 KB of client memory per lease", "one round trip per renewal tick")
    ],
}

# the section each numbered heading of run.py belongs to
HEADING_SECTION = {
    1: "redis",
    2: "sql",
    3: "contended",
    4: "inbox",
    5: "guarded",
    6: "worker",
    7: "leases",
    8: "replicas",
    9: "etcd",
    10: "limits",
    11: "scheduler",
    12: "idempotency",
    13: "outbox",
    14: "frameworks",
    15: "peers",
    16: "publish",
}

# run.py's sections in two halves of about the same time, run side by side (each is one
# process; together they are every section)
HALVES = {
    "locks-inbox-worker": ("redis", "sql", "contended", "inbox", "guarded", "worker"),
    "leases-schedules-edges": (
        "leases",
        "replicas",
        "etcd",
        "limits",
        "scheduler",
        "idempotency",
        "outbox",
    ),
    "frameworks-peers-publish": ("frameworks", "peers", "publish"),
}


def test_the_halves_are_every_section_once() -> None:
    """Every section of run.py is in exactly one half, and every section with rows or
    targets here is one of run.py's."""
    halves = [name for half in HALVES.values() for name in half]
    text = RUN.read_text(encoding="utf-8")
    declared = text.split("SECTIONS = (", 1)[1].split(")", 1)[0]
    sections = [part.strip().strip('",') for part in declared.split() if part.strip('",')]
    assert sorted(halves) == sorted(sections)
    assert set(HEADING_SECTION.values()) == set(sections)
    assert set(TARGETS) <= set(sections)


def _is_number(cell: str) -> bool:
    """A figure, or a ratio such as ``1.19x`` or ``1.19x (1.08-1.31)`` (its per-round range)."""
    try:
        float(cell.split(" (", 1)[0].rstrip("x").replace(",", ""))
    except ValueError:
        return False
    return True


# the run itself may take run_script's 240 s (half the sections, on a shared machine)
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("half", sorted(HALVES))
def test_run_quick_writes_every_section_row_and_target(half: str, tmp_path: Path) -> None:
    names = HALVES[half]
    out = tmp_path / "B.md"
    result = run_script(RUN, "--quick", "--only", ",".join(names), "--output", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = out.read_text(encoding="utf-8")
    # the header: machine, versions of every library and server, how it was measured
    assert "**Machine:**" in doc and "cores" in doc and "Python" in doc
    for name in ("jobfence", "redis-py", "psycopg", "PyMySQL", "pottery", "python-redis-lock"):
        assert f"{name} " in doc, name
    assert "aws-lambda-powertools (anchor)" in doc
    for server in ("Redis", "PostgreSQL", "MariaDB", "SQLite", "RabbitMQ"):
        assert f"{server} " in doc.split("**Servers**", 1)[1].split("\n", 1)[0], server
    assert "interleaved rounds" in doc and "median and p99" in doc
    # every section, and in it every promised row with numeric figures
    sections = doc.split("\n## ")
    for heading, labels in SECTION_ROWS.items():
        if HEADING_SECTION[int(heading[3:].split(".", 1)[0])] not in names:
            continue
        body = next((s for s in sections if s.startswith(heading[3:])), None)
        assert body is not None, heading
        rows = [
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in body.splitlines()
            if line.startswith("| ") and not line.startswith("| case") and "backend |" not in line
        ]
        by_label = {row[0]: row for row in rows}
        for label in labels:
            assert label in by_label, (heading, label, sorted(by_label))
            row = by_label[label]
            numeric = [c for c in row[1:] if _is_number(c)]
            assert len(numeric) >= 3, row  # figures, p99 or slowest round, ratio
    # one MET / NOT MET line per target
    marks = ("- **MET**", "- **NOT MET**")
    verdicts = [line for line in doc.splitlines() if line.startswith(marks)]
    targets = [target for name in names for target in TARGETS.get(name, [])]
    for target in targets:
        matching = [v for v in verdicts if v.split("**: ", 1)[1].startswith(target)]
        assert len(matching) == 1, (target, verdicts)
        assert any(ch.isdigit() for ch in matching[0].split(target, 1)[1]), matching[0]
    assert len(verdicts) == len(targets)
    # a target not met says why, with where the profile is
    for verdict in verdicts:
        if verdict.startswith("- **NOT MET**"):
            assert ". Why: " in verdict and "docs/reference/performance.md" in verdict, verdict
    # the quick run has two interleaved rounds: ratios and ratio targets show their spread
    assert re.search(r"\| \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\) \|", doc), doc
    if "redis" in names:
        redis_floor = next(v for v in verdicts if "`Locks` ≤ 1.15x the sync floor" in v)
        assert re.search(
            r"per round \d+\.\d\dx-\d+\.\d\dx, within 1\.15x in [0-2] of 2 rounds",
            redis_floor,
        ), redis_floor
        faster = next(v for v in verdicts if "faster than redis-py" in v)
        assert re.search(r"faster in [0-2] of 2 rounds", faster), faster
    assert "targets met; total wall time" in doc
