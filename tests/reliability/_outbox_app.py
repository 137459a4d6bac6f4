"""The processes of the outbox process proofs (``test_outbox_processes.py``).

* ``python -m tests.reliability._outbox_app orders`` -- the application: it commits orders
  0 .. ``JF_ORDERS``-1 one transaction each, on its own connection to the outbox's database
  (psycopg, PyMySQL or sqlite3, as an application would): an ``orders`` row and
  ``outbox.add(conn, queue=JF_QUEUE, body=..., id="order:<n>", key="customer:<n % K>")``;
  the orders :func:`rolled_back` names are rolled back instead of committed (10 %, a seeded
  rule the checker recomputes). The body is ``{"order": n, "key": key, "kseq": i}``: ``i``
  is how many orders of that key were committed before this one (so within a key the
  committed orders are numbered 0, 1, 2, ... in commit order). Before each order listed in
  ``JF_GATES`` it creates ``reached-<n>`` in ``JF_GATE_DIR`` and waits for ``go-<n>``
  there, so the test can act while the outbox holds a known amount of work. A transaction
  that fails before its commit (a deadlock, a lock wait timeout) is retried as a whole. At
  the end it prints one JSON line of its figures.
* ``python -m tests.reliability._outbox_app relay ARGS...`` -- ``jobfence relay ARGS...``
  (the command line, when this jobfence has it; else a ``jobfence.Relay`` run with the same
  few options), with the I/O hook pausing ``JF_SETTLE_HOLD`` seconds at every
  ``outbox.settle`` of the verb ``published`` (after a batch was sent, before it is marked
  published; meanwhile the file ``settling-<pid>`` exists in ``JF_GATE_DIR``): a relay
  that is killed while it holds its rows has sent them, so the next relay sends them again.
* ``handle`` -- the worker's handler (``jobfence worker tests.reliability._outbox_app:handle``):
  it records each delivery in ``<ns>_deliveries`` (committed at once), then, ``guarded`` by
  an inbox claim keyed on the message id, applies the order in ONE PostgreSQL transaction:
  ``inbox.claim_in(conn)`` and a ``<ns>_ledger`` row (order, key, kseq, delivery, pid).
  ``JF_WORK`` seconds of work come before the transaction (0 by default).

Configured by environment variables: ``JF_NS`` (the prefix of every table of the test),
``JF_OUTBOX_URL``, ``JF_OUTBOX_TABLE``, ``JF_QUEUE``, ``JF_ORDERS``, ``JF_KEYS``,
``JF_SEED``, ``JF_GATES`` (comma separated order numbers), ``JF_GATE_DIR``, ``JF_PACE``
(seconds between orders, 0 by default), ``JF_LEDGER_DSN`` (the ledger's PostgreSQL),
``JF_CLAIM_TTL`` (the handler's inbox claim ttl), ``JF_SETTLE_HOLD``.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg

import jobfence

#: the share of orders rolled back
ROLLBACK_SHARE = 0.1


def rolled_back(seed: int, n: int) -> bool:
    """Whether order ``n`` is rolled back (the app) -- and so must never run (the checker)."""
    return random.Random(f"{seed}:{n}").random() < ROLLBACK_SHARE


def key_of(n: int, keys: int) -> str:
    return f"customer:{n % keys}"


def connect(url: str) -> Any:
    """A DB-API connection (not autocommit) to the database of an outbox URL:
    ``postgresql://`` (psycopg), ``mysql://`` (PyMySQL), ``sqlite:///path`` (sqlite3)."""
    if url.startswith("postgresql"):
        return psycopg.connect(url.split("?", 1)[0])
    if url.startswith("mysql"):
        import pymysql

        u = urlsplit(url)
        return pymysql.connect(
            host=u.hostname or "127.0.0.1",
            port=u.port or 3306,
            user=unquote(u.username or "root"),
            password=unquote(u.password or ""),
            database=u.path.lstrip("/") or "test",
        )
    if url.startswith("sqlite:///"):
        return sqlite3.connect(url[len("sqlite:///") :].split("?", 1)[0], timeout=60)
    raise ValueError(f"not a database URL: {url!r}")


def param(url: str) -> str:
    """The driver's placeholder."""
    return "?" if url.startswith("sqlite") else "%s"


def create_orders(url: str, ns: str) -> None:
    conn = connect(url)
    try:
        cur = conn.cursor()
        cur.execute(
            f"CREATE TABLE {ns}_orders (n INTEGER PRIMARY KEY, customer VARCHAR(64) NOT NULL, "
            "amount INTEGER NOT NULL)"
        )
        cur.close()
        conn.commit()
    finally:
        conn.close()


def committed_orders(url: str, ns: str) -> list[int]:
    conn = connect(url)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT n FROM {ns}_orders ORDER BY n")
        rows = [int(r[0]) for r in cur.fetchall()]
        cur.close()
        conn.commit()
        return rows
    finally:
        conn.close()


# -- the application -------------------------------------------------------------------------


def _gate(gate_dir: Path, n: int) -> None:
    """Say the app reached order ``n``; wait (at most 5 minutes) until the test lets it go."""
    (gate_dir / f"reached-{n}").touch()
    deadline = time.monotonic() + 300
    while not (gate_dir / f"go-{n}").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"gate {n} was never opened")
        time.sleep(0.01)


def orders_main() -> None:
    env = os.environ
    ns, url = env["JF_NS"], env["JF_OUTBOX_URL"]
    queue, orders = env["JF_QUEUE"], int(env["JF_ORDERS"])
    keys, seed = int(env["JF_KEYS"]), int(env["JF_SEED"])
    gates = {int(g) for g in env.get("JF_GATES", "").split(",") if g}
    gate_dir = Path(env.get("JF_GATE_DIR", "."))
    pace = float(env.get("JF_PACE", "0"))
    p = param(url)
    outbox = jobfence.Outbox(url, table=env["JF_OUTBOX_TABLE"])
    conn = connect(url)
    kseq: dict[str, int] = {}
    figures = {"committed": 0, "rolled_back": 0, "retried": 0, "errors": []}
    started = time.monotonic()
    for n in range(orders):
        if n in gates:
            _gate(gate_dir, n)
        key = key_of(n, keys)
        back = rolled_back(seed, n)
        body = {"order": n, "key": key, "kseq": kseq.get(key, 0)}
        while True:
            try:
                cur = conn.cursor()
                cur.execute(
                    f"INSERT INTO {ns}_orders (n, customer, amount) VALUES ({p}, {p}, {p})",
                    (n, key, n % 97 + 1),
                )
                cur.close()
                outbox.add(conn, queue=queue, body=body, id=f"order:{n}", key=key)
            except Exception as exc:  # a deadlock or lock wait: nothing committed, retry
                figures["retried"] += 1  # type: ignore[operator]
                if len(figures["errors"]) < 5:  # type: ignore[arg-type]
                    figures["errors"].append(repr(exc))  # type: ignore[union-attr]
                conn.rollback()
                if figures["retried"] > 1000:  # type: ignore[operator]
                    raise
                continue
            break
        if back:
            conn.rollback()
            figures["rolled_back"] += 1  # type: ignore[operator]
        else:
            conn.commit()  # an error here is not retried: the outcome would be unknown
            kseq[key] = kseq.get(key, 0) + 1
            figures["committed"] += 1  # type: ignore[operator]
        if pace:
            time.sleep(pace)  # the app's own rate (load shaping, not synchronisation)
    figures["seconds"] = round(time.monotonic() - started, 3)
    conn.close()
    outbox.close()
    print(json.dumps(figures), flush=True)


# -- a relay ---------------------------------------------------------------------------------


def _hold_settles(seconds: float, flag: Path) -> None:
    """Install the I/O hook that makes this relay slow to mark its batches published: while
    it waits, the file ``flag`` exists (the test kills the relay there)."""
    from jobfence.testing import set_hook

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.settle" and info.get("verb") == "published":
            flag.touch()
            try:
                time.sleep(seconds)  # a slow relay: its batch sent, not yet marked published
            finally:
                flag.unlink(missing_ok=True)

    set_hook(hook)


def relay_main(args: list[str]) -> None:
    hold = float(os.environ.get("JF_SETTLE_HOLD", "0"))
    if hold:
        _hold_settles(hold, Path(os.environ["JF_GATE_DIR"]) / f"settling-{os.getpid()}")
    try:
        from jobfence.cli.outbox_cmd import relay_command
    except ImportError:  # no ``jobfence relay`` command: the Relay itself, same options
        _run_relay(args)
        return
    relay_command.main(args=args, prog_name="jobfence relay")


def _run_relay(args: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--to", required=True)
    parser.add_argument("--table", default="jobfence_outbox")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--log-level", default="WARNING")
    opts = parser.parse_args(args)
    import logging

    logging.basicConfig(level=opts.log_level.upper())
    with jobfence.Outbox(opts.url, table=opts.table) as outbox:
        relay = jobfence.Relay(outbox, opts.to, lease=opts.lease, batch=opts.batch)
        relay.run()
        print(f"relay stopped: {relay.stats}", flush=True)


# -- the worker's handler --------------------------------------------------------------------

_local = threading.local()
_build = threading.Lock()
_apply: Any = None


def _conn() -> psycopg.Connection[Any]:
    """One autocommit connection to the ledger per handler thread."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["JF_LEDGER_DSN"], autocommit=True)
    return conn


def ledger_inbox(dsn: str, ns: str) -> jobfence.Inbox:
    return jobfence.Inbox(dsn, table=f"{ns}_handled")


def _applier() -> Any:
    """The guarded apply step, built on first use (the module is also imported by the test,
    which has no ledger environment)."""
    global _apply
    with _build:
        if _apply is None:
            ns = os.environ["JF_NS"]
            inbox = ledger_inbox(os.environ["JF_LEDGER_DSN"], ns)
            claim_ttl = float(os.environ.get("JF_CLAIM_TTL", "30"))

            @jobfence.guarded(inbox=inbox, claim_ttl=claim_ttl)
            def apply(message: jobfence.Message) -> None:
                body = message.body
                conn = _conn()
                with conn.transaction():
                    if inbox.claim_in(conn):
                        conn.execute(
                            f"INSERT INTO {ns}_ledger (order_no, key, kseq, delivery, pid) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            (body["order"], body["key"], body["kseq"], message.delivery,
                             os.getpid()),
                        )  # fmt: skip

            _apply = apply
    return _apply


def handle(message: jobfence.Message) -> None:
    """Record the delivery, work, apply the order once (see the module's docstring)."""
    apply = _apply or _applier()
    _conn().execute(
        f"INSERT INTO {os.environ['JF_NS']}_deliveries (order_no, delivery, pid) "
        "VALUES (%s, %s, %s)",
        (message.body["order"], message.delivery, os.getpid()),
    )
    work = float(os.environ.get("JF_WORK", "0"))
    if work:
        time.sleep(work)  # the handler's work (so a kill finds handlers in the middle of it)
    apply(message)


def create_ledger(dsn: str, ns: str) -> None:
    """The ledger's tables in PostgreSQL and the handler's inbox."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {ns}_ledger (n bigserial PRIMARY KEY, order_no int NOT NULL, "
            "key text NOT NULL, kseq int NOT NULL, delivery int NOT NULL, pid int NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {ns}_deliveries (n bigserial PRIMARY KEY, order_no int NOT NULL, "
            "delivery int NOT NULL, pid int NOT NULL)"
        )
    with ledger_inbox(dsn, ns) as inbox:
        inbox.install()


if __name__ == "__main__":
    if sys.argv[1:2] == ["orders"]:
        orders_main()
    elif sys.argv[1:2] == ["relay"]:
        relay_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m tests.reliability._outbox_app orders | relay ARGS...")
