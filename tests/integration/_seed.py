"""The seed article's lost-update scenario, as units of work on a real database.

Stock of product 1 is 10; job 1 orders 5, job 2 orders 3. The units below are the naive
version (a statement-level retry that re-sends the value computed from a stale read) and the
three fixes: (a) a versioned update + ``retry_unit``, (b) ``claim_in`` per order +
``retry_unit``, (c) ``guarded`` with a lock and an inbox. They are the same functions as in
docs/concepts/retries.md, plus three calls into the test harness:

* ``plan.at(point, ...)`` -- where a scripted test parks a job on ``threading.Event``s to force
  the article's interleaving (points: ``start``, ``read``, ``failed``, ``duplicate``,
  ``committed``);
* ``with faults.write(conn, plan):`` around the unit's writes -- when the plan says so, the
  statements inside fail with a *real* retryable driver error: PostgreSQL's backend is
  terminated (``pg_terminate_backend``: the driver raises ``AdminShutdown``), MariaDB's
  connection is killed (``KILL CONNECTION``: ``OperationalError(2013)``), SQLite's write lock
  is held by another connection while the job's busy timeout is 0 (``database is locked``);
* ``faults.commit(conn, plan)`` -- commits, then, when the plan says so, raises
  :class:`jobfence.CommitOutcomeUnknown`: the commit WAS applied but the job is told it
  failed (what the testing toolkit's "commit applied but reported failed" fault does).

Each unit runs one attempt on a fresh connection (so a fresh transaction and fresh reads);
the fixes wrap it in ``retry_unit``, the naive one retries its UPDATE statement.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jobfence
from jobfence._core.sqlconn import adapt
from tests.integration._sqldrivers import MYSQL_DB, MYSQL_KW, PG_DSN
from tests.servers import MYSQL_URL, POSTGRES_URL

WAIT = 20.0  # seconds: a scripted step that waits longer than this is a bug, not slowness
Job = Callable[[str, int, int], Any]


def retryable(exc: BaseException) -> bool:
    return jobfence.is_transient(exc) or jobfence.is_conflict(exc)


def run(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """``?``-placeholder SQL on any of the three connections (jobfence's caller adapter)."""
    return adapt(conn).execute(sql, params)


def close(conn: Any) -> None:
    """End an attempt: roll back whatever was not committed, close (a dead one too)."""
    with contextlib.suppress(Exception):
        conn.rollback()
    with contextlib.suppress(Exception):
        conn.close()


# -- the database --------------------------------------------------------------------------


@dataclass
class Db:
    """One dialect's database and this test's uniquely named objects in it (prefix ``ns``)."""

    dialect: str
    sqlite_path: Path
    ns: str

    @property
    def table(self) -> str:
        return f"{self.ns}_inventory"

    @property
    def inbox_table(self) -> str:
        return f"{self.ns}_inbox"

    @property
    def fence_table(self) -> str:
        return f"{self.ns}_fences"

    @property
    def url(self) -> str:
        """Where the locks and the inbox live: the same database as the inventory."""
        return {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}.get(
            self.dialect, f"sqlite:///{self.sqlite_path}"
        )

    def connect(self) -> Any:
        """An application connection: transactions begin implicitly, commit explicitly."""
        if self.dialect == "postgresql":
            import psycopg

            return psycopg.connect(PG_DSN)
        if self.dialect == "mysql":
            import pymysql

            return pymysql.connect(**MYSQL_KW, database=MYSQL_DB, ssl_disabled=True)
        return sqlite3.connect(self.sqlite_path, timeout=10, check_same_thread=False)

    def admin(self) -> Any:
        """An autocommit connection for setup, fault injection and checks."""
        if self.dialect == "postgresql":
            import psycopg

            return psycopg.connect(PG_DSN, autocommit=True)
        if self.dialect == "mysql":
            import pymysql

            return pymysql.connect(
                **MYSQL_KW, database=MYSQL_DB, autocommit=True, ssl_disabled=True
            )
        return sqlite3.connect(
            self.sqlite_path, timeout=10, isolation_level=None, check_same_thread=False
        )

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = self.admin()
        try:
            return list(run(conn, sql, params).rows)
        finally:
            conn.close()

    def create(self, stock: int) -> None:
        self.query(
            f"CREATE TABLE {self.table} (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, "
            "version INTEGER NOT NULL)"
        )
        self.query(f"INSERT INTO {self.table} (id, stock, version) VALUES (1, ?, 1)", (stock,))

    def stock(self) -> int:
        return int(self.query(f"SELECT stock FROM {self.table} WHERE id = 1")[0][0])

    def version(self) -> int:
        return int(self.query(f"SELECT version FROM {self.table} WHERE id = 1")[0][0])

    def applied_keys(self) -> set[str]:
        rows = self.query(f"SELECT k FROM {self.inbox_table} WHERE applied = ?", (True,))
        return {k.decode() if isinstance(k, (bytes, bytearray)) else str(k) for (k,) in rows}

    def drop_all(self) -> None:
        """Drop every table named with this test's prefix."""
        if self.dialect == "postgresql":
            sql = "SELECT tablename FROM pg_tables WHERE tablename LIKE ?"
        elif self.dialect == "mysql":
            sql = (
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE ?"
            )
        else:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ?"
        for (name,) in self.query(sql, (f"{self.ns}%",)):
            self.query(f"DROP TABLE IF EXISTS {name}")


# -- what happens to one order: orchestration and faults ----------------------------------------


class Stats:
    """Thread-safe counters of what really happened during a run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def on_retry(self, attempt: int, exc: BaseException, delay: float) -> None:
        """``retry_unit(on_retry=...)``: count the retries by the reason."""
        if isinstance(exc, jobfence.StaleVersion):
            self.add("retry:stale_version")
        elif jobfence.is_commit_outcome_unknown(exc):
            self.add("retry:commit_outcome_unknown")
        else:
            self.add("retry:" + ("conflict" if jobfence.is_conflict(exc) else "transient"))


class Plan:
    """Decides, for one order, where it waits and which faults hit it."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.reads: list[int] = []

    def at(self, point: str, **info: Any) -> None:
        self.seen[point] += 1
        if point == "read":
            self.reads.append(int(info["stock"]))
        self.step(point, self.seen[point])

    def step(self, point: str, occurrence: int) -> None:
        pass

    def fail_write(self) -> bool:
        return False

    def fail_after_commit(self) -> bool:
        return False


class Events:
    """Named ``threading.Event``s whose ``wait`` fails loudly instead of hanging."""

    def __init__(self, *names: str) -> None:
        self._events = {name: threading.Event() for name in names}

    def set(self, name: str) -> Callable[[], None]:
        return self._events[name].set

    def wait(self, name: str) -> Callable[[], None]:
        def wait() -> None:
            if not self._events[name].wait(WAIT):
                raise AssertionError(f"scripted interleaving stuck waiting for {name!r}")

        return wait

    def is_set(self, name: str) -> bool:
        return self._events[name].is_set()


class Scripted(Plan):
    """A fixed interleaving: ``steps[(point, n)]`` run when the job reaches ``point`` the n-th
    time; the n-th write fails if n is in ``fail_writes``; the n-th commit is reported failed
    (after it was applied) if n is in ``fail_commits``."""

    def __init__(
        self,
        steps: dict[tuple[str, int], list[Callable[[], None]]] | None = None,
        fail_writes: tuple[int, ...] = (),
        fail_commits: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.steps = steps or {}
        self.fail_writes = fail_writes
        self.fail_commits = fail_commits
        self.writes = 0
        self.commits = 0

    def step(self, point: str, occurrence: int) -> None:
        for action in self.steps.get((point, occurrence), []):
            action()

    def fail_write(self) -> bool:
        self.writes += 1
        return self.writes in self.fail_writes

    def fail_after_commit(self) -> bool:
        self.commits += 1
        return self.commits in self.fail_commits


class Randomised(Plan):
    """Faults drawn from the order's own seeded RNGs: with the same seed, an order's n-th write
    attempt and n-th commit meet the same fault, whatever the threads' interleaving."""

    def __init__(self, seed: str, p_before: float, p_after: float) -> None:
        super().__init__()
        self.writes = random.Random(f"{seed}:writes")  # the n-th write attempt's fate
        self.commits = random.Random(f"{seed}:commits")  # the n-th commit's fate
        self.p_before = p_before
        self.p_after = p_after

    def fail_write(self) -> bool:
        return self.writes.random() < self.p_before

    def fail_after_commit(self) -> bool:
        return self.commits.random() < self.p_after


class Faults:
    """Injects real failures into a job's connection (see the module docstring)."""

    def __init__(self, db: Db, stats: Stats) -> None:
        self.db = db
        self.stats = stats
        self._admin: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()

    def _break(self, conn: Any) -> Callable[[], None]:
        """Make ``conn``'s next statement fail for real; returns the cleanup."""
        if self.db.dialect == "sqlite":
            blocker = self.db.admin()
            blocker.execute("BEGIN IMMEDIATE")  # holds the write lock
            conn.execute("PRAGMA busy_timeout = 0")  # the job does not wait for it

            def cleanup() -> None:
                blocker.execute("ROLLBACK")
                blocker.close()
                with contextlib.suppress(Exception):
                    conn.execute("PRAGMA busy_timeout = 10000")

            return cleanup
        with self._lock:
            if self._admin is None:
                self._admin = self.db.admin()
            if self.db.dialect == "postgresql":
                pid = conn.info.backend_pid
                (done,) = run(self._admin, "SELECT pg_terminate_backend(?)", (pid,)).rows[0]
                assert done, "pg_terminate_backend did not signal the job's backend"
                # wait until the backend is gone (pg_terminate_backend's own timeout= polls
                # every 100 ms; this takes one or two round trips)
                deadline = time.monotonic() + WAIT
                while run(self._admin, "SELECT 1 FROM pg_stat_activity WHERE pid = ?", (pid,)).rows:
                    assert time.monotonic() < deadline, "the terminated backend did not exit"
            else:
                run(self._admin, f"KILL CONNECTION {int(conn.thread_id())}")
        return lambda: None

    @contextlib.contextmanager
    def write(self, conn: Any, plan: Plan) -> Iterator[None]:
        """Around the unit's writes: the statements inside fail if the plan says so."""
        if not plan.fail_write():
            yield
            return
        cleanup = self._break(conn)
        try:
            yield
        except Exception as exc:
            cleanup()
            if not retryable(exc):
                raise AssertionError(f"the injected failure surfaced as {exc!r}") from exc
            self.stats.add("injected:before_commit")
            close(conn)  # the failed transaction is over (rolled back / connection gone)
            plan.at("failed")
            raise
        cleanup()
        raise AssertionError("the injected write failure did not happen")

    def commit(self, conn: Any, plan: Plan) -> None:
        conn.commit()
        plan.at("committed")
        if plan.fail_after_commit():
            self.stats.add("injected:after_commit")
            raise jobfence.CommitOutcomeUnknown(
                "injected: the COMMIT was applied, but the job was told it failed"
            )


# -- the units of work ---------------------------------------------------------------------


@dataclass
class Env:
    """What the jobs share: the database, the injector, the plans of the orders."""

    db: Db
    faults: Faults
    stats: Stats
    plans: dict[str, Plan] = field(default_factory=dict)

    def plan(self, order_id: str) -> Plan:
        return self.plans.setdefault(order_id, Plan())


def naive_job(env: Env, statement_retries: int = 3) -> Job:
    """The article's code: read, compute, write; on a transient error, re-send the statement."""
    db, faults = env.db, env.faults

    def place_order(order_id: str, product_id: int, qty: int) -> None:
        plan = env.plan(order_id)
        plan.at("start")
        conn = db.connect()
        try:
            (stock,) = run(conn, f"SELECT stock FROM {db.table} WHERE id = ?", (product_id,)).rows[
                0
            ]
            plan.at("read", stock=stock)
            new_stock = stock - qty  # computed ONCE, from this read
            for attempt in range(1, statement_retries + 1):
                try:
                    with faults.write(conn, plan):
                        run(
                            conn,
                            f"UPDATE {db.table} SET stock = ? WHERE id = ?",
                            (new_stock, product_id),
                        )
                    faults.commit(conn, plan)
                    return
                except Exception as exc:
                    if attempt == statement_retries or not retryable(exc):
                        raise
                    env.stats.add("naive:statement_retry")
                    close(conn)
                    conn = db.connect()  # a new connection; the SAME statement is re-sent
        finally:
            close(conn)

    return place_order


def versioned_job(env: Env, policy: jobfence.RetryPolicy) -> Job:
    """Fix (a): the whole unit is retried; the write is conditional on the version read."""
    db, faults = env.db, env.faults

    @policy
    def place_order(order_id: str, product_id: int, qty: int) -> None:
        plan = env.plan(order_id)
        plan.at("start")
        conn = db.connect()  # a new transaction per attempt
        try:
            stock, version = run(
                conn, f"SELECT stock, version FROM {db.table} WHERE id = ?", (product_id,)
            ).rows[0]  # a fresh read per attempt
            plan.at("read", stock=stock)
            with faults.write(conn, plan):
                jobfence.versioned_update(
                    conn, db.table, {"id": product_id}, version, {"stock": stock - qty}
                )  # StaleVersion if someone wrote since our read: retry_unit re-runs the unit
            faults.commit(conn, plan)
        finally:
            close(conn)

    return place_order


def claimed_job(
    env: Env,
    policy: jobfence.RetryPolicy,
    inbox: jobfence.Inbox | None,
    write: str = "relative",
) -> Job:
    """Fix (b): the order's claim commits with its effect; a re-run of an applied order sees
    ``claim_in`` False. ``inbox=None`` is the same unit without the claim (to show what it
    prevents); ``write="absolute"`` writes the value computed from the read instead."""
    db, faults = env.db, env.faults

    @policy
    def place_order(order_id: str, product_id: int, qty: int) -> None:
        plan = env.plan(order_id)
        plan.at("start")
        conn = db.connect()
        try:
            (stock,) = run(conn, f"SELECT stock FROM {db.table} WHERE id = ?", (product_id,)).rows[
                0
            ]
            plan.at("read", stock=stock)
            with faults.write(conn, plan):
                if inbox is not None and not inbox.claim_in(conn, f"order:{order_id}"):
                    plan.at("duplicate")
                    env.stats.add("duplicate")
                    return  # this order's effect is already committed: nothing to do
                if write == "relative":
                    sql, value = f"UPDATE {db.table} SET stock = stock - ? WHERE id = ?", qty
                else:
                    sql, value = f"UPDATE {db.table} SET stock = ? WHERE id = ?", stock - qty
                run(conn, sql, (value, product_id))
            faults.commit(conn, plan)
            env.stats.add("applied")
        finally:
            close(conn)

    return place_order


def guarded_job(
    env: Env,
    locks: jobfence.Locks,
    inbox: jobfence.Inbox,
    attempts: int,
    claim_in: bool = True,
) -> Job:
    """Fix (c): one holder of ``inventory:{product_id}`` at a time, its writes fenced by the
    lease's token; the order's key claimed by ``guarded`` and applied with ``claim_in`` in the
    same transaction as the effect; the body re-run whole up to ``attempts`` times.
    ``claim_in=False``: the body relies on guarded's own (non-transactional) claim only."""
    db, faults = env.db, env.faults

    @jobfence.guarded(
        locks=locks,
        inbox=inbox,
        lock="inventory:{product_id}",
        key="order:{order_id}",
        attempts=attempts,
    )
    def place_order(order_id: str, product_id: int, qty: int) -> None:
        plan = env.plan(order_id)
        plan.at("start")
        lease = jobfence.current_lease()
        conn = db.connect()
        try:
            (stock,) = run(conn, f"SELECT stock FROM {db.table} WHERE id = ?", (product_id,)).rows[
                0
            ]  # no other holder can write between this read and our commit
            plan.at("read", stock=stock)
            with faults.write(conn, plan):
                jobfence.fence(conn, f"inventory:{product_id}", lease.token, table=db.fence_table)
                if claim_in and not inbox.claim_in(conn, f"order:{order_id}"):
                    plan.at("duplicate")
                    env.stats.add("duplicate")
                    return
                run(
                    conn,
                    f"UPDATE {db.table} SET stock = ? WHERE id = ?",
                    (stock - qty, product_id),
                )
            faults.commit(conn, plan)
            env.stats.add("applied")
        finally:
            close(conn)

    return place_order


def fenced_job(env: Env, policy: jobfence.RetryPolicy, locks: jobfence.Locks) -> Job:
    """A unit protected by a lease and a fence only (no claim): take the lease, then run
    read, fence, absolute write, commit under it (retried whole by ``policy``)."""
    db, faults = env.db, env.faults

    @policy
    def unit(order_id: str, product_id: int, qty: int, lease: jobfence.Lease) -> None:
        plan = env.plan(order_id)
        conn = db.connect()
        try:
            (stock,) = run(conn, f"SELECT stock FROM {db.table} WHERE id = ?", (product_id,)).rows[
                0
            ]
            plan.at("read", stock=stock)
            with faults.write(conn, plan):
                jobfence.fence(conn, f"inventory:{product_id}", lease.token, table=db.fence_table)
                run(
                    conn,
                    f"UPDATE {db.table} SET stock = ? WHERE id = ?",
                    (stock - qty, product_id),
                )
            faults.commit(conn, plan)
        finally:
            close(conn)

    def place_order(order_id: str, product_id: int, qty: int) -> None:
        with locks.acquire(f"inventory:{product_id}", ttl=30, timeout=WAIT) as lease:
            unit(order_id, product_id, qty, lease)

    return place_order


# -- running jobs in threads ---------------------------------------------------------------


def run_threads(targets: dict[str, Callable[[], Any]], timeout: float = 60.0) -> dict[str, Any]:
    """Run each target in its own named thread; return results, re-raise the first error."""
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def wrap(name: str, target: Callable[[], Any]) -> Callable[[], None]:
        def body() -> None:
            try:
                results[name] = target()
            except BaseException as exc:  # reported to the test below
                errors[name] = exc

        return body

    threads = [threading.Thread(target=wrap(n, t), name=n, daemon=True) for n, t in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"thread {t.name} did not finish within {timeout} s"
    if errors:
        name, exc = next(iter(errors.items()))
        raise AssertionError(f"{name} failed: {exc!r} (all: {errors!r})") from exc
    return results
