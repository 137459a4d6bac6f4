"""The duplicate-effect scenario: an at-least-once queue, worker processes, a SIGKILL.

``messages`` messages are published to a :class:`jobfence.Queue`, every
:data:`DUPLICATE_EVERY`-th of them twice with the same id (a publisher's retry). ``workers``
``jobfence worker`` processes run a handler from this module on the queue; once
:data:`KILL_AT` of the messages have their effect, one worker is killed with SIGKILL while it
holds deliveries and a new one is started (its deliveries come back after their visibility).

A handler's effect is one row in an effects table. :func:`naive` writes it and returns (the
worker acks); :func:`guarded` is ``jobfence.guarded(inbox=...)`` keyed on the message id, and
writes the row in one transaction with ``Inbox.claim_in``'s marker, so a redelivery, a
duplicate publish or a worker killed between its commit and its ack cannot repeat it.

The handlers read their configuration from the environment: ``JOBFENCE_DEMO_DB`` (the
effects' and the inbox's database URL) and ``JOBFENCE_DEMO_NS`` (the table prefix).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

from .._core.sqlconn import adapt
from ..guard import guarded as _guarded
from ..inbox import Inbox
from ..queue import Queue
from ._db import connect, drop_tables, set_up_file

DUPLICATE_EVERY = 4
KILL_AT = 0.4
VISIBILITY = 2.0
CLAIM_TTL = 3.0
CONCURRENCY = 4


def tables(ns: str) -> dict[str, str]:
    return {"effects": f"{ns}_effects", "inbox": f"{ns}_msg_inbox"}


def setup(db: str, ns: str) -> None:
    """Create the effects table and the guarded handler's inbox table."""
    t = tables(ns)
    conn = connect(db)
    try:
        set_up_file(conn, db)
        adapt(conn).execute(
            f"CREATE TABLE {t['effects']} (mode varchar(16) NOT NULL, "
            "msg_id varchar(64) NOT NULL, delivery int NOT NULL, pid int NOT NULL)"
        )
        conn.commit()
    finally:
        conn.close()
    inbox = Inbox(db, table=t["inbox"])
    try:
        inbox.install()
    finally:
        inbox.close()


def drop(db: str, ns: str) -> None:
    """Drop the scenario's tables (used for server databases; SQLite files are deleted)."""
    t = tables(ns)
    drop_tables(db, [t["effects"], t["inbox"]], inbox=t["inbox"])


# -- the handlers, run by ``jobfence worker`` in the worker processes ------------------------

_local = threading.local()
_inbox_lock = threading.Lock()


def _config() -> tuple[str, str]:
    return os.environ["JOBFENCE_DEMO_DB"], os.environ["JOBFENCE_DEMO_NS"]


def _conn() -> Any:
    """One connection per handler thread."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = connect(_config()[0])
    return conn


def _effect(conn: Any, mode: str, message: Any) -> None:
    time.sleep(0.005)  # the handler's work
    adapt(conn).execute(
        f"INSERT INTO {tables(_config()[1])['effects']} (mode, msg_id, delivery, pid) "
        "VALUES (?, ?, ?, ?)",
        (mode, message.id, message.delivery, os.getpid()),
    )


def naive(message: Any) -> None:
    """The hand-written handler: write the effect, commit, return (the worker acks)."""
    conn = _conn()
    try:
        _effect(conn, "naive", message)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


_handlers: dict[str, Callable[[Any], None]] = {}


def guarded(message: Any) -> None:
    """The guarded handler: ``guarded`` claims the message id, and the effect commits in one
    transaction with ``claim_in``'s marker."""
    with _inbox_lock:
        handler = _handlers.get("guarded")
        if handler is None:
            handler = _handlers["guarded"] = _make_guarded()
    handler(message)


def _make_guarded() -> Callable[[Any], None]:
    db, ns = _config()
    inbox = Inbox(db, table=tables(ns)["inbox"])

    @_guarded(inbox=inbox, claim_ttl=CLAIM_TTL)
    def handle(message: Any) -> None:
        conn = _conn()
        try:
            if inbox.claim_in(conn):
                _effect(conn, "guarded", message)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    return handle


# -- the run ------------------------------------------------------------------------------


def counts(db: str, ns: str, mode: str) -> dict[str, int]:
    """``effects`` (rows) and ``distinct`` (messages with an effect) of ``mode``'s run."""
    conn = connect(db)
    try:
        effects, distinct = (
            adapt(conn)
            .execute(
                f"SELECT count(*), count(DISTINCT msg_id) FROM {tables(ns)['effects']} "
                "WHERE mode = ?",
                (mode,),
            )
            .rows[0]
        )
        conn.commit()
    finally:
        conn.close()
    return {"effects": int(effects), "distinct": int(distinct)}


def _drained(queue: Queue) -> bool:
    stats = queue.stats()
    return stats.ready == 0 and stats.delayed in (0, None) and stats.in_flight in (0, None)


class _Workers:
    """``jobfence worker`` processes running one of this module's handlers."""

    def __init__(self, db: str, ns: str, queue_url: str, name: str, mode: str, log: IO[bytes]):
        self.command = [
            sys.executable,
            "-m",
            "jobfence.cli.app",
            "worker",
            f"jobfence.demo.duplicates:{mode}",
            "--queue",
            queue_url,
            "--name",
            name,
            "--concurrency",
            str(CONCURRENCY),
            "--visibility",
            str(VISIBILITY),
            "--max-deliveries",
            "50",
            "--shutdown-timeout",
            "10",
            "--no-live",
            "--log-level",
            "ERROR",
        ]
        self.env = {**os.environ, "JOBFENCE_DEMO_DB": db, "JOBFENCE_DEMO_NS": ns}
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.procs.append(
            subprocess.Popen(self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=self.log)
        )

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a demo worker exited with status {proc.returncode}")

    def kill_one(self) -> None:
        """SIGKILL the oldest worker mid-run (it holds deliveries) and start a new one."""
        victim = self.procs.pop(0)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        self.start()

    def stop(self) -> None:
        """SIGTERM: the workers finish or give back what they hold, then exit."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs = []


def run(
    *,
    db: str,
    queue_url: str,
    ns: str,
    mode: str,
    messages: int,
    workers: int,
    log: IO[bytes],
    progress: Callable[[int], None] = lambda done: None,
    timeout: float = 300.0,
) -> dict[str, int]:
    """Publish, run ``workers`` worker processes with ``mode``'s handler until every message
    has its effect and the queue is drained, killing one worker on the way; count."""
    name = f"{ns}-{mode}-{uuid.uuid4().hex[:6]}"
    queue = Queue(queue_url, name)
    ids = [f"msg:{i}" for i in range(messages)]
    bodies = [{"n": i} for i in range(messages)]
    queue.publish_many(bodies, ids=ids)
    again = list(range(0, messages, DUPLICATE_EVERY))  # published twice on purpose
    queue.publish_many([bodies[i] for i in again], ids=[ids[i] for i in again])
    pool = _Workers(db, ns, queue_url, name, mode, log)
    kills = 0
    try:
        for _ in range(workers):
            pool.start()
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} workers did not finish in {timeout:.0f} s")
            distinct = counts(db, ns, mode)["distinct"]
            progress(distinct)
            if not kills and distinct >= KILL_AT * messages:
                pool.kill_one()
                kills += 1
            pool.check()
            if distinct >= messages and kills and _drained(queue):
                break
            time.sleep(0.05)
        # A queue that cannot count deliveries in flight (RabbitMQ) looks drained too early:
        # once the workers have stopped, whatever they held is ready again; drain it too.
        for _ in range(10):
            pool.stop()
            if _drained(queue):
                break
            pool.start()
            while not _drained(queue):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {mode} queue did not drain in {timeout:.0f} s")
                time.sleep(0.05)
    finally:
        pool.stop()
        queue.drop()
        queue.close()
    return {**counts(db, ns, mode), "kills": kills, "published": messages + len(again)}
