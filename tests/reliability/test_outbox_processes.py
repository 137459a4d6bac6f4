"""The transactional outbox through crashes, with real processes and real servers.

An application process (``_outbox_app.py orders``) commits ``JOBFENCE_PROOF_ORDERS`` orders
(default 1,000), one transaction each: an ``orders`` row and ``outbox.add(conn, ...)`` with
id ``order:<n>`` and key ``customer:<n % 20>``; 10 % are rolled back instead (a seeded rule
the checker recomputes). Two ``jobfence relay`` processes publish the outbox to the queue;
one ``jobfence worker`` (concurrency 1) applies each order in ONE PostgreSQL transaction with
``inbox.claim_in`` and a ledger row, under ``guarded`` (an inbox claim per message id).

The run, in three thirds of the orders (the app waits at each third until the test lets it
go on):

1. both relays are slow to mark their batches published (each waits 0.3 s after sending a
   batch, its I/O hook at ``outbox.settle``, and says so with a file): the test SIGSTOPs a
   relay while it waits there and holds claimed rows (``outbox.entries(state="claimed")``
   shows rows claimed by its pid), then SIGKILLs it. Those rows were sent and not marked
   published; the other relay must take them over when their lease (2 s) runs out and send
   them again: the worker gets each of them twice. **takeover** = from the kill until every
   one of them is published, by the other relay;
2. the second third is committed, then the queue's broker goes down for 3 s while the last
   third is being committed (the rows committed meanwhile wait in the outbox): Redis (AOF,
   ``appendfsync always``) and PostgreSQL (a disposable server, ``pg_ctl -m immediate``) are
   killed and started again on their data; RabbitMQ cannot be restarted here (the machine's
   shared server), so its link is cut instead: every connection to it goes through a
   ``tests.netproxy.FaultProxy`` that resets the open connections and refuses new ones for
   3 s. SQLite has no server: that case has the killed relay only. **outage** = how long
   the broker was away; **catch-up** = from its return until every row committed before it
   is published (the relays back off while it is down: 0.1 s doubling up to 10 s);
3. the test waits until the outbox is empty, the ledger holds every committed order and the
   queue is drained, then stops the worker and the relay left with SIGTERM (both exit 0).

The checker, from the databases:

* the app committed exactly the orders the rule keeps (the ``orders`` table);
* the ledger holds each committed order exactly once and no rolled-back one: every committed
  order's job ran exactly once, whatever was re-sent (the killed relay's batch) or
  redelivered (the broker's outage) -- those duplicates reached the handler and were
  absorbed by the inbox (**duplicates** = deliveries - ledger rows);
* the outbox holds exactly the committed orders' ids, all published, none pending, claimed or
  dead; the queue has no dead letter and nothing ready or in flight;
* per-key order: within each key the ledger's rows in arrival order (the ledger's bigserial,
  one worker, one handler at a time) carry kseq 0, 1, 2, ... -- the order the orders were
  committed in. A queue may legitimately deliver a message late after a delivery was lost in
  the outage (a receive whose reply never arrived comes back after its visibility): such a
  late row is allowed only when it was applied on a redelivery (delivery > 1) and is counted
  and reported; a late row applied on its first delivery is a broken order and fails.

Cases (outbox database x queue): the suite runs every database and every queue once
(postgres x redis, mysql x postgres, sqlite x sqlite, postgres x rabbitmq);
``JOBFENCE_PROOF_MATRIX=full`` runs all twelve. ``JOBFENCE_PROOF_REPORT=<file>`` appends
each case's figures to that file as a JSON line.

The composition test runs the parts with their defaults (concurrency, max deliveries,
batch, relay lease): ``jobfence worker --relay`` (the relay in the worker's process), a
queue on Redis, the guarded handler. The worker is SIGKILLed while handlers of it work and
its relay holds claimed rows (found with SIGSTOP, as above), and a new one is started (its
relay takes the rows over after the default 30 s lease); then Redis is killed while the new
one works and started again on its files. Nothing is applied twice, every committed order is
applied, the killed relay's rows are published by the new one, and no message that never
reached a handler is dead-lettered. Only the visibility and the claim ttl are short (2 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobfence
from tests.netproxy import FaultProxy
from tests.reliability._outbox_app import committed_orders, create_ledger, create_orders
from tests.reliability._outbox_app import rolled_back as is_rolled_back
from tests.reliability._pg_server import PostgresServer
from tests.reliability.test_compose_schedules import DurableRedis
from tests.servers import MYSQL_URL, POSTGRES_URL, RABBITMQ_URL, mysql_params

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.reliability._outbox_app"
ORDERS = int(os.environ.get("JOBFENCE_PROOF_ORDERS", "1000"))
KEYS = 20
SEED = 20261204
#: the relays' lease (s): how long a killed relay's rows wait for the other one
LEASE = 2.0
#: how long a relay waits after sending each batch before marking it published (s)
SETTLE_HOLD = 0.3
#: the worker's visibility (s): how soon an unacked delivery comes back
VISIBILITY = 3.0
#: the broker's downtime (s)
OUTAGE = 3.0
#: how long one awaited condition may take before the test fails (s)
WAIT = 60.0 + ORDERS * 0.02

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(4 * WAIT + 120))]

DATABASES = ["postgres", "mysql", "sqlite"]
QUEUES = ["redis", "postgres", "sqlite", "rabbitmq"]
SUITE = [("postgres", "redis"), ("mysql", "postgres"), ("sqlite", "sqlite"),
         ("postgres", "rabbitmq")]  # fmt: skip
MATRIX = (
    [(d, q) for d in DATABASES for q in QUEUES]
    if os.environ.get("JOBFENCE_PROOF_MATRIX") == "full"
    else SUITE
)


def _wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT, procs: Any = ()) -> Any:
    """Poll ``check`` (a state in a database or another process: nothing to wait on) until
    it returns something truthy; fail naming ``what`` after ``timeout`` seconds, or as soon
    as one of ``procs`` exited."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[3:5]} exited {proc.returncode}"
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


# -- the queue's broker ---------------------------------------------------------------------


class Broker:
    """Where the queue lives, and how it goes away for a while (:meth:`down`, :meth:`up`)."""

    name = "?"
    outage = ""  # what down() does, for the report ("" : no outage)

    def __init__(self, tmp: Path, ns: str) -> None:
        self.queue = "orders"

    @property
    def url(self) -> str:  # what the relays and the worker use
        raise NotImplementedError

    def down(self) -> None:
        pass

    def up(self) -> None:
        pass

    def close(self) -> None:
        pass


class RedisBroker(Broker):
    name, outage = "redis", "redis-server SIGKILLed and started again on its AOF"

    def __init__(self, tmp: Path, ns: str) -> None:
        super().__init__(tmp, ns)
        self.server = DurableRedis()
        self.server.start()

    @property
    def url(self) -> str:
        return self.server.url

    def down(self) -> None:
        self.server.kill()

    def up(self) -> None:
        self.server.start()

    def close(self) -> None:
        self.server.stop()


class PostgresBroker(Broker):
    name, outage = "postgres", "postgres crashed (pg_ctl -m immediate) and started again"

    def __init__(self, tmp: Path, ns: str) -> None:
        super().__init__(tmp, ns)
        self.server = PostgresServer()
        self.server.__enter__()

    @property
    def url(self) -> str:
        return self.server.url

    def down(self) -> None:
        self.server.crash()

    def up(self) -> None:
        self.server.start_again()

    def close(self) -> None:
        self.server.stop()


class SqliteBroker(Broker):
    name = "sqlite"

    def __init__(self, tmp: Path, ns: str) -> None:
        super().__init__(tmp, ns)
        self.path = tmp / "queue.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"


class RabbitBroker(Broker):
    name, outage = "rabbitmq", "link cut: open connections reset, new ones refused"

    def __init__(self, tmp: Path, ns: str) -> None:
        super().__init__(tmp, ns)
        self.queue = f"orders.{ns}"  # the machine's shared server: a queue of the test's own
        port = int(RABBITMQ_URL.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        self.proxy = FaultProxy(port)
        self.direct = RABBITMQ_URL
        self._url = self.proxy.url_for(RABBITMQ_URL, port)

    @property
    def url(self) -> str:
        return self._url

    def down(self) -> None:
        self.proxy.refuse(True)
        self.proxy.reset()

    def up(self) -> None:
        self.proxy.refuse(False)

    def close(self) -> None:
        self.proxy.close()
        queue = jobfence.Queue(self.direct, self.queue)
        try:
            queue.drop()
        finally:
            queue.close()


BROKERS: dict[str, type[Broker]] = {
    "redis": RedisBroker,
    "postgres": PostgresBroker,
    "sqlite": SqliteBroker,
    "rabbitmq": RabbitBroker,
}


# -- the outbox's database ------------------------------------------------------------------


def outbox_url(database: str, tmp: Path) -> str:
    return {"postgres": POSTGRES_URL, "mysql": MYSQL_URL}.get(
        database, f"sqlite:///{tmp / 'shop.db'}"
    )


def drop_tables(database: str, ns: str) -> None:
    """Every table of the test (``<ns>_*``) in the machine's PostgreSQL or MariaDB, and its
    rows in jobfence's schema tables."""
    if database == "postgres":
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for (table,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename LIKE %s",
                (ns + "%",),
            ).fetchall():
                conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
            for schema in ("jobfence_inbox_schema", "jobfence_outbox_schema"):
                if conn.execute("SELECT to_regclass(%s)", (schema,)).fetchone() != (None,):
                    conn.execute(f"DELETE FROM {schema} WHERE table_name LIKE %s", (ns + "%",))
    elif database == "mysql":
        import pymysql

        conn = pymysql.connect(**mysql_params(), autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name LIKE %s",
                    (ns + "%",),
                )
                for (table,) in cur.fetchall():
                    cur.execute(f"DROP TABLE IF EXISTS `{table}`")
                cur.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name = 'jobfence_outbox_schema'"
                )
                if cur.fetchone():
                    cur.execute(
                        "DELETE FROM jobfence_outbox_schema WHERE table_name LIKE %s", (ns + "%",)
                    )
        finally:
            conn.close()


# -- one run's parts ------------------------------------------------------------------------


@dataclass
class Run:
    database: str
    broker: Broker
    ns: str
    url: str  # the outbox's database
    tmp: Path
    gates: Path = field(init=False)
    logs: Path = field(init=False)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gates = self.tmp / "gates"
        self.logs = self.tmp / "logs"
        self.gates.mkdir()
        self.logs.mkdir()

    @property
    def table(self) -> str:
        return f"{self.ns}_outbox"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
            "JF_NS": self.ns,
            "JF_OUTBOX_URL": self.url,
            "JF_OUTBOX_TABLE": self.table,
            "JF_QUEUE": self.broker.queue,
            "JF_ORDERS": str(ORDERS),
            "JF_KEYS": str(KEYS),
            "JF_SEED": str(SEED),
            "JF_GATE_DIR": str(self.gates),
            "JF_LEDGER_DSN": POSTGRES_URL,
            **extra,
        }

    def spawn(self, name: str, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        """Start ``python args...``; its output goes to ``logs/<name>.log``."""
        with (self.logs / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def relay(self, name: str, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        """A ``jobfence relay`` process (see ``_outbox_app.py relay``)."""
        return self.spawn(
            name,
            ["-m", APP, "relay", self.url, "--to", self.broker.url, "--table", self.table,
             "--log-level", "WARNING", *extra],
            **env,
        )  # fmt: skip

    def worker(self, name: str, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        return self.spawn(
            name,
            ["-m", "jobfence.cli.app", "worker", f"{APP}:handle", "--queue", self.broker.url,
             "--name", self.broker.queue, "--no-live", "--log-level", "WARNING", *extra],
            **env,
        )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def gate_reached(self, n: int) -> bool:
        return (self.gates / f"reached-{n}").exists()

    def open_gate(self, n: int) -> None:
        (self.gates / f"go-{n}").touch()


@pytest.fixture
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    database, queue = request.param
    ns = "t" + uuid.uuid4().hex[:12]
    create_ledger(POSTGRES_URL, ns)
    broker: Broker | None = None
    the_run: Run | None = None
    try:
        broker = BROKERS[queue](tmp_path, ns)
        url = outbox_url(database, tmp_path)
        create_orders(url, ns)
        with jobfence.Outbox(url, table=f"{ns}_outbox") as outbox:
            outbox.install()
        the_run = Run(database, broker, ns, url, tmp_path)
        yield the_run
    finally:
        if the_run is not None:
            for proc in the_run.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        if broker is not None:
            broker.close()
        drop_tables(database, ns)
        drop_tables("postgres", ns)


# -- reading the results ----------------------------------------------------------------------


def ledger(ns: str) -> list[tuple[int, str, int, int, int]]:
    """(order, key, kseq, delivery, pid) of every ledger row, in arrival order."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        return conn.execute(  # type: ignore[return-value]
            f"SELECT order_no, key, kseq, delivery, pid FROM {ns}_ledger ORDER BY n"
        ).fetchall()


def count(ns: str, table: str) -> int:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {ns}_{table}").fetchone()
        assert row is not None
        return int(row[0])


def deliveries(ns: str) -> list[tuple[int, int, int]]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        return conn.execute(  # type: ignore[return-value]
            f"SELECT order_no, delivery, pid FROM {ns}_deliveries ORDER BY n"
        ).fetchall()


def all_entries(outbox: jobfence.Outbox, state: str | None = None) -> list[Any]:
    """Every row of the outbox (in ``state``), page by page."""
    rows: list[Any] = []
    after: int | None = None
    while True:
        page = outbox.entries(state=state, limit=1000, after=after)
        rows.extend(page)
        if len(page) < 1000:
            return rows
        after = page[-1].seq


def owned_by(entry: Any, pid: int) -> bool:
    """Whether the relay that claimed (or published) ``entry`` is process ``pid`` (owner ids
    are ``host:pid:uuid``)."""
    return f":{pid}:" in (entry.claimed_by or "")


def order_check(rows: list[tuple[int, str, int, int, int]]) -> tuple[list[Any], list[Any]]:
    """Per key, the ledger rows that arrived after a row of a later kseq: (late rows applied
    on a redelivery, late rows applied on their first delivery)."""
    highest: dict[str, int] = {}
    redelivered, broken = [], []
    for row in rows:
        _order, key, kseq, delivery, _pid = row
        if kseq < highest.get(key, -1):
            (redelivered if delivery > 1 else broken).append(row)
        highest[key] = max(highest.get(key, -1), kseq)
    return redelivered, broken


def report(figures: dict[str, Any]) -> None:
    print(json.dumps(figures))
    path = os.environ.get("JOBFENCE_PROOF_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(figures) + "\n")


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """SIGTERM the processes still running and wait for them; their exit codes."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return [proc.returncode for proc in procs]


def _queue_drained(queue: jobfence.Queue) -> bool:
    try:
        stats = queue.stats()
    except jobfence.JobfenceError:
        return False
    return stats.ready in (0, None) and stats.in_flight in (0, None)


# -- the proof ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run", [pytest.param(case, id=f"{case[0]}-outbox-{case[1]}-queue") for case in MATRIX],
    indirect=True,
)  # fmt: skip
def test_every_committed_order_runs_once_in_key_order_through_a_killed_relay_and_an_outage(
    run: Run,
) -> None:
    started = time.monotonic()
    expected = [n for n in range(ORDERS) if not is_rolled_back(SEED, n)]
    first_gate, second_gate = ORDERS // 3, 2 * ORDERS // 3
    outbox = jobfence.Outbox(run.url, table=run.table)
    worker = run.worker("worker", "--concurrency", "1", "--visibility", str(VISIBILITY))
    relays = [
        run.relay(name, "--lease", str(LEASE), JF_SETTLE_HOLD=str(SETTLE_HOLD))
        for name in ("relay-1", "relay-2")
    ]
    app = run.spawn("app", ["-m", APP, "orders"], JF_GATES=f"{first_gate},{second_gate}")
    live = [worker, *relays]
    try:
        # 1. a relay holds claimed rows it has sent: kill it there
        _wait_for("the app's first third", lambda: run.gate_reached(first_gate), procs=live)
        held: list[Any] = []

        def holding() -> Any:
            """A relay, stopped, has sent a batch and holds its rows: kill it there."""
            for relay in relays:
                settling = run.gates / f"settling-{relay.pid}"
                if not settling.exists():
                    continue
                os.kill(relay.pid, signal.SIGSTOP)
                rows = [e for e in outbox.entries(state="claimed", limit=1000) if
                        owned_by(e, relay.pid)]  # fmt: skip
                if rows and settling.exists():
                    os.kill(relay.pid, signal.SIGKILL)
                    held.extend(rows)
                    return relay
                os.kill(relay.pid, signal.SIGCONT)
            return None

        killed = _wait_for("a relay holding rows it has sent", holding, procs=live)
        killed_at = time.monotonic()
        killed.wait(10)
        live.remove(killed)
        (survivor,) = [relay for relay in relays if relay is not killed]
        run.open_gate(first_gate)
        held_ids = {e.id for e in held}
        low, high = min(e.seq for e in held), max(e.seq for e in held)

        def taken_over() -> list[Any] | None:
            done = [
                e
                for e in outbox.entries(state="published", after=low - 1, limit=high - low + 1)
                if e.id in held_ids
            ]
            return done if len(done) == len(held_ids) else None

        republished = _wait_for("the other relay to publish those rows", taken_over, procs=live)
        takeover = time.monotonic() - killed_at
        assert all(owned_by(e, survivor.pid) for e in republished), republished

        # 2. the broker goes away while the last third is committed
        _wait_for("the app's second third", lambda: run.gate_reached(second_gate), procs=live)
        outage = catch_up = None
        if run.broker.outage:
            run.broker.down()
            down_at = time.monotonic()
            run.open_gate(second_gate)
            # rows committed while the broker is down wait in the outbox
            _wait_for("rows held back by the outage", lambda: outbox.stats().pending > 0,
                      procs=live)  # fmt: skip
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))  # the downtime itself
            held_back = all_entries(outbox, "pending") + all_entries(outbox, "claimed")
            run.broker.up()
            up_at = time.monotonic()
            outage = up_at - down_at
            last = max(e.seq for e in held_back)

            def caught_up() -> bool:
                """Every row committed before the broker came back is published."""
                waiting = outbox.entries("pending", limit=1) + outbox.entries("claimed", limit=1)
                return all(e.seq > last for e in waiting)

            _wait_for("the rows held back by the outage published", caught_up, procs=live)
            catch_up = time.monotonic() - up_at
        else:
            run.open_gate(second_gate)

        # 3. everything committed is applied, the queue drained
        _wait_for("the app to finish", lambda: app.poll() is not None, procs=live)
        assert app.returncode == 0, run.log("app")
        app_figures = json.loads(run.log("app").strip().splitlines()[-1])
        _wait_for("the outbox to empty", lambda: (lambda s: s.pending + s.claimed == 0)(
            outbox.stats()), procs=live)  # fmt: skip
        _wait_for(
            "every committed order applied",
            lambda: count(run.ns, "ledger") >= len(expected),
            timeout=WAIT + ORDERS * 0.05,
            procs=live,
        )
        queue = jobfence.Queue(run.broker.url, run.broker.queue)
        try:
            _wait_for("the queue to drain", lambda: _queue_drained(queue), procs=live)
            codes = _stop(live)
            stats = queue.stats()
            dead_letters = queue.dead_letters()
        finally:
            queue.close()
        wall = time.monotonic() - started
        stats_after = outbox.stats()
        entries = all_entries(outbox)
    finally:
        outbox.close()
    logs = {name: run.log(name) for name in ("worker", "relay-1", "relay-2", "app")}
    assert codes == [0, 0], logs

    # the app committed exactly what the rule keeps
    assert committed_orders(run.url, run.ns) == expected
    # every committed order's job ran exactly once, no rolled-back one ran
    rows = ledger(run.ns)
    applied = Counter(row[0] for row in rows)
    assert {n: c for n, c in applied.items() if c > 1} == {}, "applied twice"
    assert sorted(applied) == expected
    assert not [n for n in applied if is_rolled_back(SEED, n)]
    # the killed relay had sent the rows it held, the other one sent them again: the worker
    # got them twice and the inbox absorbed the second copies
    delivered = deliveries(run.ns)
    assert len(delivered) - len(rows) >= len(held), (len(delivered), len(rows), len(held))
    # the outbox: exactly the committed orders, all published, nothing dead or left
    assert sorted(e.id for e in entries) == sorted(f"order:{n}" for n in expected)
    assert {e.state for e in entries} == {"published"}, Counter(e.state for e in entries)
    assert (stats_after.pending, stats_after.claimed, stats_after.dead) == (0, 0, 0)
    assert stats_after.published == len(expected)
    # the queue: no dead letter, nothing ready or in flight
    assert dead_letters == [], dead_letters
    assert stats.dead in (0, None) and stats.ready in (0, None), stats
    # per-key order (see the module's docstring)
    redelivered, broken = order_check(rows)
    assert broken == [], broken[:10]
    for key in {row[1] for row in rows}:
        assert sorted(row[2] for row in rows if row[1] == key) == list(
            range(sum(1 for row in rows if row[1] == key))
        ), key
    by_relay = Counter("survivor" if owned_by(e, survivor.pid) else "killed" for e in entries)
    report(
        {
            "case": f"{run.database}-outbox x {run.broker.name}-queue",
            "orders": ORDERS,
            "committed": app_figures["committed"],
            "rolled_back": app_figures["rolled_back"],
            "app_retries": app_figures["retried"],
            "app_seconds": app_figures["seconds"],
            "jobs_run": len(rows),
            "deliveries": len(delivered),
            "duplicates_absorbed": len(delivered) - len(rows),
            "killed_relay_rows": len(held),
            "published_by": dict(by_relay),
            "takeover_s": round(takeover, 2),
            "broker_outage": run.broker.outage or "none (no server)",
            "outage_s": None if outage is None else round(outage, 2),
            "catch_up_s": None if catch_up is None else round(catch_up, 2),
            "late_on_redelivery": len(redelivered),
            "dead_rows": stats_after.dead,
            "dead_letters": len(dead_letters),
            "wall_s": round(wall, 1),
        }
    )


# -- the parts with their defaults ---------------------------------------------------------


COMPOSE_ORDERS = 300


def worker_has_relay() -> bool:
    """Whether ``jobfence worker`` runs a relay in its process (``--relay OUTBOX_URL``)."""
    from jobfence.cli.worker_cmd import worker

    return any(param.name == "relay_url" for param in worker.params)


@pytest.mark.parametrize("run", [pytest.param(("postgres", "redis"), id="postgres-redis")],
                         indirect=True)  # fmt: skip
def test_composition_worker_with_relay_through_a_killed_worker_and_a_restarted_server(
    run: Run,
) -> None:
    assert isinstance(run.broker, RedisBroker)
    expected = [n for n in range(COMPOSE_ORDERS) if not is_rolled_back(SEED, n)]
    short = {"JF_CLAIM_TTL": "2", "JF_WORK": "0.05"}
    worker_args = ["--visibility", "2"]
    if worker_has_relay():
        worker_args += ["--relay", run.url, "--outbox-table", run.table]
    else:  # a relay process beside the workers, with its defaults
        run.relay("relay")
    victim = run.worker("worker-1", *worker_args, **short)
    app = run.spawn("app", ["-m", APP, "orders"], JF_ORDERS=str(COMPOSE_ORDERS), JF_PACE="0.005")

    # the worker dies while handlers of it work (their deliveries recorded, no effect yet)
    # and, with the relay in its process, while that relay holds claimed rows
    outbox = jobfence.Outbox(run.url, table=run.table)
    relay_inside = worker_has_relay()
    held: list[Any] = []

    def in_the_middle() -> bool:
        os.kill(victim.pid, signal.SIGSTOP)
        applied = {row[0] for row in ledger(run.ns)}
        working = any(d[2] == victim.pid and d[0] not in applied for d in deliveries(run.ns))
        holding = [e for e in outbox.entries(state="claimed") if owned_by(e, victim.pid)]
        if working and (holding or not relay_inside):
            os.kill(victim.pid, signal.SIGKILL)
            held.extend(holding)
            return True
        os.kill(victim.pid, signal.SIGCONT)
        return False

    try:
        _wait_for("the first worker in the middle of its work", in_the_middle, procs=[victim])
    finally:
        outbox.close()
    killed_at = time.monotonic()
    victim.wait(10)
    if held:
        # a statement the killed relay sent before it was stopped (marking rows published)
        # is still carried out by the database: those rows were published once, by it
        with jobfence.Outbox(run.url, table=run.table) as outbox:
            still = {e.id for e in outbox.entries(state="claimed", limit=1000)}
        held[:] = [e for e in held if e.id in still]
    survivor = run.worker("worker-2", *worker_args, **short)
    # the queue's server dies while the new worker works, and comes back on its files
    _wait_for(
        "the new worker at work",
        lambda: any(d[2] == survivor.pid for d in deliveries(run.ns)),
        procs=[survivor],
    )
    run.broker.down()
    time.sleep(2.5)  # the downtime itself, longer than the visibility and the claim ttl
    run.broker.up()
    _wait_for("the app to finish", lambda: app.poll() is not None, procs=[survivor])
    assert app.returncode == 0, run.log("app")
    _wait_for(
        "every committed order applied",
        lambda: count(run.ns, "ledger") >= len(expected),
        timeout=150,
        procs=[survivor],
    )
    applied_at = time.monotonic()
    queue = jobfence.Queue(run.broker.url, run.broker.queue)
    try:
        _wait_for("the queue to drain", lambda: _queue_drained(queue), procs=[survivor])
        (code,) = _stop([survivor])
        dead_letters = queue.dead_letters(limit=1000)
    finally:
        queue.close()
    assert code == 0, run.log("worker-2")
    rows = ledger(run.ns)
    applied = Counter(row[0] for row in rows)
    assert {n: c for n, c in applied.items() if c > 1} == {}, "applied twice"
    assert sorted(applied) == expected
    ran = {d[0] for d in deliveries(run.ns)}
    never_ran = [d for d in dead_letters if int(d.id.split(":")[1]) not in ran]
    assert never_ran == [], never_ran
    with jobfence.Outbox(run.url, table=run.table) as outbox:
        stats = outbox.stats()
        republished = [e for e in all_entries(outbox, "published") if e.id in {h.id for h in held}]
    assert (stats.pending, stats.claimed, stats.dead) == (0, 0, 0), stats
    # the killed worker's relay's rows were published by the new worker's relay
    assert len(republished) == len(held)
    assert not [e for e in republished if owned_by(e, victim.pid)], republished
    delivered = deliveries(run.ns)
    report(
        {
            "case": "composition: worker --relay, postgres outbox, redis queue",
            "committed": len(expected),
            "jobs_run": len(rows),
            "deliveries": len(delivered),
            "duplicates_absorbed": len(delivered) - len(rows),
            "killed_worker_deliveries": sum(1 for d in delivered if d[2] == victim.pid),
            "killed_worker_relay_rows": len(held),
            "all_applied_s": round(applied_at - killed_at, 1),
            "dead_letters": len(dead_letters),
        }
    )


# -- a relay frozen inside its claim ---------------------------------------------------------


def claim_lock_held(database: str, table: str) -> bool:
    """Whether a session holds the claim lock of the outbox ``table`` (PostgreSQL: the
    advisory lock of its claim transaction; MySQL/MariaDB: its ``GET_LOCK``)."""
    from jobfence.backends._sql.outbox_rows import lock_key

    if database == "postgres":
        key = lock_key(table) & 0xFFFFFFFFFFFFFFFF
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = %s AND objid = %s AND objsubid = 1",
                (key >> 32, key & 0xFFFFFFFF),
            ).fetchone()
        return bool(row and row[0])
    import pymysql

    conn = pymysql.connect(**mysql_params(), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT IS_USED_LOCK(CONCAT('jobfence_outbox:', "
                f"SHA1(CONCAT(COALESCE(DATABASE(), ''), '.{table}'))))"
            )
            found = cur.fetchone()
        return bool(found and found[0] is not None)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "run",
    [pytest.param(("postgres", "redis"), id="postgres"),
     pytest.param(("mysql", "redis"), id="mysql")],
    indirect=True,
)  # fmt: skip
def test_a_relay_frozen_inside_its_claim_does_not_stop_the_other_relays(run: Run) -> None:
    """A relay process frozen (SIGSTOP: a paused VM, a stuck host) in the middle of its claim
    transaction holds the table's claim lock. Past its lease it must lose its hold like a
    relay frozen anywhere else: the other relay goes on publishing what is committed.
    (SQLite is not run: a process frozen inside any write transaction stops every writer of
    the file, the application's too.)"""
    outbox = jobfence.Outbox(run.url, table=run.table)
    frozen = run.relay("relay-a", "--lease", str(LEASE), "--batch", "1")
    app = run.spawn("app", ["-m", APP, "orders"], JF_ORDERS="100000", JF_PACE="0.002")
    other = None
    try:
        _wait_for("the first rows published", lambda: outbox.stats().published > 20,
                  procs=[frozen, app])  # fmt: skip

        def inside_its_claim() -> bool:
            os.kill(frozen.pid, signal.SIGSTOP)
            # held, and still held a moment later (not a release already on its way)
            if claim_lock_held(run.database, run.table):
                time.sleep(0.2)
                if claim_lock_held(run.database, run.table):
                    return True  # left frozen there
            os.kill(frozen.pid, signal.SIGCONT)
            return False

        _wait_for("relay A frozen inside its claim", inside_its_claim, procs=[app])
        frozen_at = time.monotonic()
        published = outbox.stats().published
        other = run.relay("relay-b", "--lease", str(LEASE))
        _wait_for(
            "relay B to publish rows committed after relay A froze",
            lambda: outbox.stats().published > published + 20,
            timeout=LEASE + 15,
            procs=[other, app],
        )
        report({"case": f"frozen claim, {run.database}",
                "resumed_s": round(time.monotonic() - frozen_at, 1)})  # fmt: skip
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        outbox.close()
