"""The dual-write scenario: an app commits orders and enqueues a job for each, and is killed.

Three app processes run side by side, one per mode, each committing ``orders`` orders (one
row each in an orders table) and putting one job on a :class:`jobfence.Queue` for each order,
with :data:`WORK` seconds of the app's own work between its two writes. About one order in
:data:`DECLINE_EVERY` is declined mid-way: its transaction rolls back. The runner SIGKILLs
every app :data:`KILLS` times, a random moment after it is ready, and starts it again (a new
process goes on with new orders, as a web server does after a crash: the request that died is
gone). Each app process is forked by a launcher process of its mode, so a restart costs a
``fork()``. The modes:

* ``commit_then_publish`` (naive) -- commit the order, then publish its job. Killed between
  the two: the order is committed and its job is never sent (a *lost* job).
* ``publish_then_commit`` (naive) -- publish the job, then commit the order. Killed between
  the two, or the order declined: the job runs for an order that does not exist (a
  *phantom* job).
* ``outbox`` -- ``Outbox.add`` writes the job into the order's own transaction; a
  :class:`jobfence.Relay` publishes what committed. Killed anywhere: the order and its job
  commit together or not at all. The relay's publishes are keyed by the row id, so a
  re-send (a relay that stalled past its lease) is deduplicated by the consumer's guard.

One ``jobfence worker`` process runs :func:`handle` on the queue for all three modes: guarded
by an inbox on the message id, it writes one row per job into a jobs table (the job's effect,
e.g. the order's confirmation email). Every count comes from those two tables: orders
committed, jobs run, *lost* (a committed order without its job) and *phantom* (a job whose
order never committed).

The worker's handler reads its configuration from the environment: ``JOBFENCE_DEMO_DB`` and
``JOBFENCE_DEMO_NS``, as the duplicates scenario's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import IO, Any

from .._core.sqlconn import adapt
from ..guard import guarded as _guarded
from ..inbox import Inbox
from ..outbox import Outbox
from ..queue import Queue
from ._db import connect, drop_tables, set_up_file

MODES = ("commit_then_publish", "publish_then_commit", "outbox")
NAIVE_MODES = MODES[:2]
#: about one order in this many is declined: its transaction rolls back
DECLINE_EVERY = 8
#: how many times each app process is killed with SIGKILL
KILLS = 8
#: an app lives this long (seconds, drawn uniformly) after it is ready before it is killed
KILL_AFTER = (0.02, 0.2)
#: the app's work between its two writes (building the order's confirmation, say)
WORK = 0.01
CONCURRENCY = 4
CLAIM_TTL = 3.0


def tables(ns: str) -> dict[str, str]:
    return {
        "orders": f"{ns}_orders",
        "jobs": f"{ns}_jobs",
        "inbox": f"{ns}_job_inbox",
        "outbox": f"{ns}_outbox",
    }


def _outbox(db: str, ns: str) -> Outbox:
    return Outbox(db, table=tables(ns)["outbox"])


def setup(db: str, ns: str) -> None:
    """Create the orders and jobs tables, the worker's inbox and the outbox."""
    t = tables(ns)
    conn = connect(db)
    try:
        set_up_file(conn, db)
        adapt(conn).execute(
            f"CREATE TABLE {t['orders']} (mode varchar(32) NOT NULL, "
            "order_id varchar(64) NOT NULL, PRIMARY KEY (mode, order_id))"
        )
        adapt(conn).execute(
            f"CREATE TABLE {t['jobs']} (mode varchar(32) NOT NULL, "
            "order_id varchar(64) NOT NULL, msg_id varchar(128) NOT NULL, pid int NOT NULL)"
        )
        conn.commit()
    finally:
        conn.close()
    inbox = Inbox(db, table=t["inbox"])
    try:
        inbox.install()
    finally:
        inbox.close()
    outbox = _outbox(db, ns)
    try:
        outbox.install()
    finally:
        outbox.close()


def drop(db: str, ns: str) -> None:
    """Drop the scenario's tables (used for server databases; SQLite files are deleted)."""
    t = tables(ns)
    outbox = _outbox(db, ns)
    try:
        outbox.drop()
    finally:
        outbox.close()
    drop_tables(db, [t["orders"], t["jobs"], t["inbox"]], inbox=t["inbox"])


# -- the app, one process per run of it -------------------------------------------------------


def declined(order_id: str) -> bool:
    """Whether order ``order_id`` is declined (its transaction rolls back): a fixed draw."""
    return random.Random(order_id).randrange(DECLINE_EVERY) == 0


def _committed(conn: Any, orders: str, mode: str) -> int:
    rows = adapt(conn).execute(f"SELECT count(*) FROM {orders} WHERE mode = ?", (mode,)).rows
    conn.commit()
    return int(rows[0][0])


def _app_main(config: dict[str, Any]) -> None:
    """Commit orders until ``orders`` of this mode are committed, a job for each."""
    db, ns, mode = config["db"], config["ns"], config["mode"]
    t = tables(ns)
    conn = connect(db)
    queue = Queue(config["queue_url"], config["queue_name"])
    outbox = _outbox(db, ns) if mode == "outbox" else None
    committed = _committed(conn, t["orders"], mode)
    print("ready", os.getpid(), flush=True)  # the runner's kill clock starts here (_App)
    insert = f"INSERT INTO {t['orders']} (mode, order_id) VALUES (?, ?)"
    n = 0
    while committed < config["orders"]:
        order_id = f"{config['incarnation']}.{n}"
        n += 1
        msg_id = f"{mode}:{order_id}"
        body = {"mode": mode, "order": order_id}
        no = declined(order_id)
        if mode == "commit_then_publish":
            adapt(conn).execute(insert, (mode, order_id))
            if no:
                conn.rollback()
                continue
            conn.commit()
            time.sleep(WORK)  # killed here: the order is committed, its job never sent
            queue.publish(body, id=msg_id)
        elif mode == "publish_then_commit":
            queue.publish(body, id=msg_id)
            time.sleep(WORK)  # killed here (or declined below): a job for no order
            adapt(conn).execute(insert, (mode, order_id))
            if no:
                conn.rollback()
                continue
            conn.commit()
        else:
            assert outbox is not None
            adapt(conn).execute(insert, (mode, order_id))
            outbox.add(conn, queue=config["queue_name"], body=body, id=msg_id)
            time.sleep(WORK)  # killed here: neither the order nor its job commits
            if no:
                conn.rollback()
                continue
            conn.commit()
        committed += 1


# -- the worker's handler -----------------------------------------------------------------------

_handler_lock = threading.Lock()
_handlers: dict[str, Callable[[Any], None]] = {}
_local = threading.local()


def _worker_conn(db: str) -> Any:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = connect(db)
    return conn


def handle(message: Any) -> None:
    """The job, run by ``jobfence worker``: guarded on the message id, it writes one jobs row
    in one transaction with ``claim_in``'s marker (once per message, however often it is
    delivered or published)."""
    with _handler_lock:
        handler = _handlers.get("handle")
        if handler is None:
            handler = _handlers["handle"] = _make_handler()
    handler(message)


def _make_handler() -> Callable[[Any], None]:
    db, ns = os.environ["JOBFENCE_DEMO_DB"], os.environ["JOBFENCE_DEMO_NS"]
    t = tables(ns)
    inbox = Inbox(db, table=t["inbox"])

    @_guarded(inbox=inbox, claim_ttl=CLAIM_TTL)
    def run(message: Any) -> None:
        body = message.body  # decoded: {"mode": ..., "order": ...}
        conn = _worker_conn(db)
        try:
            if inbox.claim_in(conn):
                adapt(conn).execute(
                    f"INSERT INTO {t['jobs']} (mode, order_id, msg_id, pid) VALUES (?, ?, ?, ?)",
                    (body["mode"], body["order"], message.id, os.getpid()),
                )
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    return run


# -- the run ------------------------------------------------------------------------------------


def counts(db: str, ns: str, mode: str) -> dict[str, int]:
    """What the database holds for ``mode``: ``orders`` committed, ``jobs`` run (distinct
    orders with a job row), ``lost`` (committed orders without a job), ``phantom`` (jobs
    whose order never committed), ``job_rows`` (jobs rows: one per message)."""
    t = tables(ns)
    conn = connect(db)
    try:
        sql = adapt(conn)
        orders = sql.execute(f"SELECT count(*) FROM {t['orders']} WHERE mode = ?", (mode,)).rows
        jobs = sql.execute(
            f"SELECT count(*), count(DISTINCT order_id) FROM {t['jobs']} WHERE mode = ?", (mode,)
        ).rows
        lost = sql.execute(
            f"SELECT count(*) FROM {t['orders']} o WHERE o.mode = ? AND NOT EXISTS "
            f"(SELECT 1 FROM {t['jobs']} j WHERE j.mode = o.mode AND j.order_id = o.order_id)",
            (mode,),
        ).rows
        phantom = sql.execute(
            f"SELECT count(DISTINCT j.order_id) FROM {t['jobs']} j WHERE j.mode = ? AND NOT "
            f"EXISTS (SELECT 1 FROM {t['orders']} o WHERE o.mode = j.mode "
            "AND o.order_id = j.order_id)",
            (mode,),
        ).rows
        conn.commit()
    finally:
        conn.close()
    return {
        "orders": int(orders[0][0]),
        "jobs": int(jobs[0][1]),
        "job_rows": int(jobs[0][0]),
        "lost": int(lost[0][0]),
        "phantom": int(phantom[0][0]),
    }


class _App:
    """One mode's app, killed :data:`KILLS` times at random moments and restarted, driven
    from a thread of the runner.

    The app processes are forked by a launcher process (``_launcher_main``) that has imported
    jobfence once, so that a restart costs a ``fork()``, not an interpreter start; each app
    opens its own connections after the fork. The runner SIGKILLs the app process itself
    (it reports its pid when it is ready), never the launcher."""

    def __init__(self, config: dict[str, Any], seed: int, log: IO[bytes]) -> None:
        self.config = config
        self.rng = random.Random(f"{seed}:{config['mode']}")
        self.log = log
        self.kills = 0
        self.error: BaseException | None = None
        self.launcher: subprocess.Popen[str] | None = None
        self.pid: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _line(self) -> tuple[str, int]:
        """The launcher's next report: ``("ready", app pid)`` or ``("exit", status)``."""
        assert self.launcher is not None and self.launcher.stdout is not None
        line = self.launcher.stdout.readline().split()
        if len(line) != 2 or line[0] not in ("ready", "exit"):
            raise RuntimeError(f"the {self.config['mode']} app launcher said {line!r}")
        return line[0], int(line[1])

    def start_launcher(self) -> None:
        """Start the launcher (it imports jobfence: best done early, while something else
        runs)."""
        if self.launcher is None:
            self.launcher = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys, json; from jobfence.demo.dualwrite import _launcher_main; "
                    "_launcher_main(json.loads(sys.argv[1]))",
                    json.dumps(self.config),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
            )

    def _run(self) -> None:
        try:
            self.start_launcher()
            launcher = self.launcher
            assert launcher is not None
            assert launcher.stdin is not None
            for incarnation in range(KILLS + 1):
                launcher.stdin.write(f"{incarnation}{uuid.uuid4().hex[:4]}\n")
                launcher.stdin.flush()
                kind, value = self._line()
                if kind == "ready":
                    self.pid = value
                    if incarnation < KILLS:
                        time.sleep(self.rng.uniform(*KILL_AFTER))
                        try:
                            os.kill(value, signal.SIGKILL)
                        except ProcessLookupError:  # pragma: no cover - it had just exited
                            pass
                    kind, value = self._line()
                self.pid = None
                if kind != "exit":
                    raise RuntimeError(f"the {self.config['mode']} app launcher said {kind}")
                code = value
                if code == -signal.SIGKILL:
                    self.kills += 1
                    continue
                if code != 0:
                    raise RuntimeError(f"a {self.config['mode']} app exited with status {code}")
                break  # all its orders are committed
            launcher.stdin.close()
            launcher.wait(30)
        except BaseException as exc:  # reported by the runner
            self.error = exc

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher = self.launcher
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
        if launcher is not None and launcher.stdout is not None:
            launcher.stdout.close()


class _Relay:
    """The outbox's relay, in a thread of the runner."""

    def __init__(self, db: str, ns: str, queue: Queue) -> None:
        from ..relay import Relay

        self.outbox = _outbox(db, ns)
        self.relay = Relay(self.outbox, queue, poll=0.2)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:
            self.error = exc

    def idle(self) -> bool:
        stats = self.outbox.stats()
        return stats.pending == 0 and stats.claimed == 0

    def stop(self) -> None:
        self.relay.stop()
        self.thread.join(30)
        self.outbox.close()


def _drained(queue: Queue) -> bool:
    stats = queue.stats()
    return stats.ready == 0 and stats.delayed in (0, None) and stats.in_flight in (0, None)


def _worker(db: str, ns: str, queue_url: str, name: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "jobfence.cli.app", "worker"),
            "jobfence.demo.dualwrite:handle",
            *("--queue", queue_url, "--name", name, "--concurrency", str(CONCURRENCY)),
            *("--visibility", "5", "--max-deliveries", "50", "--shutdown-timeout", "10"),
            *("--no-live", "--log-level", "ERROR"),
        ],
        env={**os.environ, "JOBFENCE_DEMO_DB": db, "JOBFENCE_DEMO_NS": ns},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


@dataclasses.dataclass
class Prepared:
    """The processes of :func:`run` started ahead: the apps' launchers and the worker (each
    imports jobfence: best done while something else runs)."""

    apps: list[_App]
    worker: subprocess.Popen[bytes]


def prepare(
    *, db: str, queue_url: str, ns: str, orders: int, seed: int, log: IO[bytes]
) -> Prepared:
    """Start the processes of :func:`run` now: the runner calls this before the other
    scenarios, so that their start costs none of this one's time. Give the result to
    :func:`run` (with the same arguments), or to :func:`discard`."""
    name = f"{ns}-orders"
    apps = [
        _App(
            {
                "db": db,
                "ns": ns,
                "mode": mode,
                "queue_url": queue_url,
                "queue_name": name,
                "orders": orders,
            },
            seed,
            log,
        )
        for mode in MODES
    ]
    for app in apps:
        app.start_launcher()
    return Prepared(apps, _worker(db, ns, queue_url, name, log))


def discard(prepared: Prepared) -> None:
    """Stop what :func:`prepare` started (if :func:`run` did not run)."""
    for app in prepared.apps:
        app.stop()
    _stop_worker(prepared.worker)


def _stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


def run(
    *,
    db: str,
    queue_url: str,
    ns: str,
    orders: int,
    seed: int,
    log: IO[bytes],
    progress: Callable[[int], None] = lambda done: None,
    timeout: float = 300.0,
    prepared: Prepared | None = None,
) -> dict[str, dict[str, int]]:
    """Run the three apps side by side (each killed :data:`KILLS` times), the relay and the
    worker until every committed job is run; return :func:`counts` of each mode, with the
    number of ``kills``. ``prepared``: from :func:`prepare` with the same arguments
    (default: prepared now)."""
    name = f"{ns}-orders"
    if prepared is None:
        prepared = prepare(db=db, queue_url=queue_url, ns=ns, orders=orders, seed=seed, log=log)
    apps, worker = prepared.apps, prepared.worker
    try:
        queue = Queue(queue_url, name)
        relay = _Relay(db, ns, queue)
    except BaseException:
        discard(prepared)
        raise
    deadline = time.monotonic() + timeout
    try:
        relay.thread.start()
        for app in apps:
            app.thread.start()
        while any(app.thread.is_alive() for app in apps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the dual-write apps did not finish in {timeout:.0f} s")
            progress(sum(counts(db, ns, mode)["orders"] for mode in MODES))
            time.sleep(0.1)
        for app in apps:
            if app.error is not None:
                raise app.error
        # every job that was published (or committed into the outbox) runs
        while not (relay.idle() and _drained(queue)):
            if relay.error is not None:
                raise relay.error
            if worker.poll() is not None:
                raise RuntimeError(f"the dual-write worker exited with status {worker.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the dual-write jobs did not run in {timeout:.0f} s")
            time.sleep(0.05)
        progress(len(MODES) * orders)
    finally:
        for app in apps:
            app.stop()
        relay.stop()
        _stop_worker(worker)
        queue.drop()
        queue.close()
    return {
        mode: {**counts(db, ns, mode), "kills": app.kills}
        for mode, app in zip(MODES, apps, strict=True)
    }


def _launcher_main(config: dict[str, Any]) -> None:
    """The app launcher: for each line on stdin (an incarnation name), fork an app process
    that commits orders (:func:`_app_main`); the app reports ``ready PID`` on stdout once it
    is connected, the launcher ``exit STATUS`` when it ended (``-9``: it was SIGKILLed)."""
    # import what the apps use (the backends are imported on first use) and close it again,
    # so that an app starts warm, with connections of its own
    Queue(config["queue_url"], config["queue_name"]).close()
    _outbox(config["db"], config["ns"]).close()
    connect(config["db"]).close()
    for line in sys.stdin:
        incarnation = line.strip()
        if not incarnation:
            continue
        pid = os.fork()
        if pid == 0:  # the app process
            code = 0
            try:
                _app_main({**config, "incarnation": incarnation})
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
