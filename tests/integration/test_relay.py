"""The outbox relay against the real servers: outboxes on PostgreSQL, MariaDB and SQLite,
published to Redis Streams, RabbitMQ, PostgreSQL and SQLite queues.

Rows are added by the application's own driver connection (psycopg, PyMySQL, sqlite3) in
transactions that commit or roll back; a consumer receives what the relay published. Killed,
stopped and signalled relays are real processes (``_relay_proc.py``); an unreachable broker
is a disposable redis-server that is killed and started again. Most tests run both flavours:
``Relay`` (blocking) and ``AsyncRelay``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence.backends.base import OutboxRow
from jobfence.integrations.outbox_targets import queues as queues_target
from jobfence.testing import ManualClock, hooked
from tests.integration._outbox_env import OUTBOX_KINDS, QUEUE_KINDS, OutboxSide, QueueSide
from tests.reliability._redis_server import RedisServer, wait_until
from tests.unit.test_telemetry import Otel, otel

pytestmark = pytest.mark.timeout(120)

__all__ = ["otel"]

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = ("sync", "async")


@pytest.fixture(params=OUTBOX_KINDS)
def outbox_side(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutboxSide]:
    side = OutboxSide(request.param, tmp_path)
    try:
        yield side
    finally:
        side.drop()


@contextlib.contextmanager
def outbox_of(kind: str, tmp_path: Path) -> Iterator[OutboxSide]:
    side = OutboxSide(kind, tmp_path)
    try:
        yield side
    finally:
        side.drop()


@pytest.fixture
def pg_outbox(tmp_path: Path) -> Iterator[OutboxSide]:
    with outbox_of("postgres", tmp_path) as side:
        yield side


@pytest.fixture
def sqlite_outbox(tmp_path: Path) -> Iterator[OutboxSide]:
    with outbox_of("sqlite", tmp_path) as side:
        yield side


@contextlib.contextmanager
def queue_of(kind: str, tmp_path: Path) -> Iterator[QueueSide]:
    side = QueueSide(kind, tmp_path)
    try:
        yield side
    finally:
        side.drop()


def run_relay(
    flavour: str, side: OutboxSide, to: Any, *, once: bool = True, **options: Any
) -> tuple[int, jobfence.RelayStats]:
    """``run_once()`` of a fresh relay of ``flavour`` on ``side``'s outbox; (published, stats).
    The relay and its outbox are closed afterwards."""
    if flavour == "sync":
        with side.open() as outbox, jobfence.Relay(outbox, to, **options) as relay:
            return relay.run_once(), relay.stats

    async def main() -> tuple[int, jobfence.RelayStats]:
        async with side.open_async() as outbox, jobfence.AsyncRelay(outbox, to, **options) as r:
            return await r.run_once(), r.stats

    return asyncio.run(main())


class RunningRelay:
    """A relay's ``run()`` in a thread of its own (the blocking ``Relay``, or an
    ``AsyncRelay`` on an event loop of the thread), stopped and joined by :meth:`stop`."""

    def __init__(self, flavour: str, side: OutboxSide, to: Any, **options: Any) -> None:
        self.flavour = flavour
        self.error: BaseException | None = None
        self.stats: jobfence.RelayStats | None = None
        self.relay: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(side, to, options), name="test-relay", daemon=True
        )
        self.thread.start()
        assert self.ready.wait(30), "the relay did not start"

    def _main(self, side: OutboxSide, to: Any, options: dict[str, Any]) -> None:
        try:
            if self.flavour == "sync":
                with side.open() as outbox:
                    self.relay = jobfence.Relay(outbox, to, **options)
                    self.ready.set()
                    self.stats = self.relay.run()
            else:

                async def main() -> None:
                    async with side.open_async() as outbox:
                        self.relay = jobfence.AsyncRelay(outbox, to, **options)
                        self.ready.set()
                        self.stats = await self.relay.run()

                asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def stop(self) -> jobfence.RelayStats:
        if self.relay is not None:
            self.relay.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the relay did not stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


def _bodies(n: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    return [{"body": {"n": i, "text": "é✓"}, **extra} for i in range(start, start + n)]


# -- end to end ------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("queue_kind", QUEUE_KINDS)
def test_committed_rows_reach_the_queue_once_rolled_back_rows_never(
    flavour: str, queue_kind: str, outbox_side: OutboxSide, tmp_path: Path
) -> None:
    """Each committed row reaches its queue once, as message id = the row's id, with its
    body (decoded by the queue's JSON serializer, unchanged) and headers; the rows of a
    rolled-back transaction never do; rows of two queue names go to two queues."""
    with queue_of(queue_kind, tmp_path) as dest:
        orders, mails = dest.name("orders"), dest.name("mails")
        with outbox_side.open() as outbox:
            kept = outbox_side.add(
                outbox,
                [
                    {"queue": orders, "headers": {"trace": f"t{i}"}, **b}
                    for i, b in enumerate(_bodies(5))
                ]
                + [{"queue": mails, "body": {"to": "a@example.org"}, "id": "mail-1"}],
            )
            gone = outbox_side.add(
                outbox, [{"queue": orders, **b} for b in _bodies(3, 100)], commit=False
            )
        published, stats = run_relay(flavour, outbox_side, dest.url)
        assert published == 6 and stats.published == 6 and stats.dead == 0

        got = dest.receive(orders, 5)
        assert [m.id for m in got] == kept[:5]  # one of each, in the order added
        assert [m.body for m in got] == [b["body"] for b in _bodies(5)]
        assert [m.headers.get("trace") for m in got] == [f"t{i}" for i in range(5)]
        assert not set(gone) & {m.id for m in got}
        mail = dest.receive(mails, 1)
        assert [(m.id, m.body) for m in mail] == [("mail-1", {"to": "a@example.org"})]

        with outbox_side.open() as outbox:
            states = collections.Counter(e.state for e in outbox_side.entries(outbox))
        assert states == {"published": 6}
        # nothing left to publish: a second relay publishes nothing again
        assert run_relay(flavour, outbox_side, dest.url)[0] == 0


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_routes_callables_and_a_queue_object(
    flavour: str, sqlite_outbox: OutboxSide, tmp_path: Path
) -> None:
    """A dict of routes: a queue URL, a callable (``async def`` under the blocking relay, a
    plain one under the asyncio relay) and a Queue object each get their queue's rows, in
    seq order; unrouted queues are not claimed."""
    dest = QueueSide("sqlite", tmp_path)
    seen: list[OutboxRow] = []

    def plain(rows: list[OutboxRow]) -> None:
        seen.extend(rows)

    async def coro(rows: list[OutboxRow]) -> None:
        seen.extend(rows)

    with sqlite_outbox.open() as outbox:
        sqlite_outbox.add(
            outbox,
            [{"queue": "a", "body": i} for i in range(3)]
            + [{"queue": "b", "body": i} for i in range(3)]
            + [{"queue": "c", "body": i} for i in range(2)]
            + [{"queue": "unrouted", "body": 0}],
        )
    with jobfence.Queue(dest.url, "c") as c_queue:
        # across flavours: a blocking Relay runs the async def on an event loop of its own,
        # an AsyncRelay runs the plain function in a thread
        to = {"a": dest.url, "b": coro if flavour == "sync" else plain, "c": c_queue}
        published, _ = run_relay(flavour, sqlite_outbox, to)
        assert published == 8
    assert [m.body for m in dest.receive("a", 3)] == [0, 1, 2]
    assert [(r.queue, json.loads(r.body)) for r in seen] == [("b", 0), ("b", 1), ("b", 2)]
    assert [m.body for m in dest.receive("c", 2)] == [0, 1]
    with sqlite_outbox.open() as outbox:
        pending = sqlite_outbox.entries(outbox, "pending")
    assert [e.queue for e in pending] == ["unrouted"]


# -- order ------------------------------------------------------------------------------------
def test_two_relays_keep_every_keys_order(outbox_side: OutboxSide) -> None:
    """Two relays running at once, rows of 40 keys added by many transactions meanwhile:
    every row is published once, each key's rows in the order they were added, and both
    relays publish (they share the work, not the keys' runs)."""
    order: list[tuple[str, str]] = []  # (relay, id) in publish order
    lock = threading.Lock()

    def sender(label: str) -> Callable[[list[OutboxRow]], None]:
        def send(rows: list[OutboxRow]) -> None:
            time.sleep(0.005)  # a broker round trip
            with lock:
                order.extend((label, r.id) for r in rows)

        return send

    keys = [f"k{i}" for i in range(40)]
    added: dict[str, list[str]] = collections.defaultdict(list)
    relays = [
        RunningRelay("sync", outbox_side, sender("A"), batch=7, poll=0.05),
        RunningRelay("async", outbox_side, sender("B"), batch=7, poll=0.05),
    ]
    try:
        with outbox_side.open() as outbox:
            for t in range(30):
                rows = [
                    {"queue": "q", "key": keys[(t * 7 + j) % 40], "body": [t, j]} for j in range(10)
                ]
                ids = outbox_side.add(outbox, rows)
                for row, id_ in zip(rows, ids, strict=True):
                    added[row["key"]].append(id_)
            wait_until(lambda: len(order) >= 300, 60, "300 rows published")
    finally:
        stats = [r.stop() for r in relays]
    ids = [id_ for _, id_ in order]
    assert len(ids) == 300 and len(set(ids)) == 300
    position = {id_: i for i, id_ in enumerate(ids)}
    for key, key_ids in added.items():
        assert sorted(key_ids, key=position.__getitem__) == key_ids, key
    assert {label for label, _ in order} == {"A", "B"}
    assert sum(s.published for s in stats) == 300


# -- failures ---------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_failing_row_goes_dead_and_holds_its_key_back(
    flavour: str, pg_outbox: OutboxSide, tmp_path: Path
) -> None:
    """A target that raises a non-transient error for one row: that row is retried, then
    dead after max_attempts with the error text; the other rows are published; the rows of
    its key behind it wait until it is dead, then go in their order."""
    published: list[str] = []
    attempts: list[str] = []

    def send(rows: list[OutboxRow]) -> None:
        for row in rows:
            if row.value() == "poison":
                if len(rows) == 1:  # sent alone: the relay looks for the failing row
                    attempts.append(row.id)
                raise ValueError("cannot encode poison")
        published.extend(r.id for r in rows)

    with pg_outbox.open() as outbox:
        ids = pg_outbox.add(
            outbox,
            [
                {"queue": "q", "key": "k", "body": "first"},
                {"queue": "q", "key": "k", "body": "poison", "id": "bad"},
                {"queue": "q", "key": "k", "body": "after-1"},
                {"queue": "q", "key": "other", "body": "x"},
                {"queue": "q", "key": "k", "body": "after-2"},
                {"queue": "q", "body": "no key"},
            ],
        )
    runner = RunningRelay(flavour, pg_outbox, send, max_attempts=2, poll=0.05, batch=10)
    try:
        # first attempt: the others of the batch are published, k's rows after "bad" wait
        wait_until(lambda: len(attempts) >= 1 and len(published) >= 3, 30, "a first pass")
        assert published[:3] == [ids[0], ids[3], ids[5]]
        with pg_outbox.open() as outbox:
            by_id = {e.id: e for e in pg_outbox.entries(outbox)}
        assert by_id["bad"].state == "pending" and by_id["bad"].attempts == 1
        assert "ValueError: cannot encode poison" in (by_id["bad"].last_error or "")
        assert ids[2] not in published and ids[4] not in published
        # the retry (after 2 s) fails too: dead; then k's rows go, in order
        wait_until(lambda: len(published) == 5, 60, "k's rows after the dead one")
    finally:
        stats = runner.stop()
    assert attempts == ["bad", "bad"]
    assert published[3:] == [ids[2], ids[4]]
    assert stats.dead == 1 and stats.failed == 1 and stats.published == 5
    with pg_outbox.open() as outbox:
        dead = pg_outbox.entries(outbox, "dead")
    assert [(e.id, e.attempts) for e in dead] == [("bad", 2)]
    assert dead[0].last_error is not None and "cannot encode poison" in dead[0].last_error


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_broker_down_no_row_dead_all_published_after_it_returns(
    flavour: str, sqlite_outbox: OutboxSide
) -> None:
    """The destination's redis-server is killed: the relay gives the rows back uncounted and
    backs off (its claims during the outage grow apart); no row is dead, none has an attempt
    counted; once a new server listens on the port, every row is published."""
    claims: list[float] = []
    publishes: list[float] = []

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.claim":
            claims.append(time.monotonic())
        elif point == "outbox.publish":
            publishes.append(time.monotonic())

    with RedisServer() as server, hooked(hook):
        url = server.url
        runner = RunningRelay(flavour, sqlite_outbox, url, poll=0.05, batch=50)
        try:
            with sqlite_outbox.open() as outbox:
                sqlite_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(10)])
            wait_until(lambda: runner.relay.stats.published == 10, 30, "10 rows published")
            server.kill()
            with sqlite_outbox.open() as outbox:
                later = sqlite_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(20, 10)])
            failed_from = len(publishes)
            outage_start = time.monotonic()
            wait_until(lambda: len(publishes) >= failed_from + 5, 60, "5 failed publishes")
            outage = time.monotonic() - outage_start
            during = [t for t in claims if t >= outage_start]
            with sqlite_outbox.open() as outbox:
                states = collections.Counter(e.state for e in sqlite_outbox.entries(outbox))
                attempts = {e.attempts for e in sqlite_outbox.entries(outbox)}
            assert states["dead"] == 0 and attempts == {0}
            server.start()
            wait_until(lambda: runner.relay.stats.published == 30, 60, "30 rows published")
        finally:
            stats = runner.stop()
        with jobfence.Queue(url, "q") as queue:
            got = queue.receive(100, wait=1.0)
        assert sorted(m.id for m in got) == sorted(later)  # the new server: the 20 later rows
    # backing off: 0.1 s doubling (jitter 0.8-1.2) -- n claims take at least
    # 0.08 * (2 ** (n - 1) - 1) s, so an outage of `outage` s allows about log2 of it
    bound = 2 + math.log2(1 + outage / 0.08)
    assert len(during) <= bound + 1, (len(during), outage)
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert all(
        later_gap > earlier for earlier, later_gap in itertools.pairwise(gaps) if earlier > 0.15
    )
    assert stats.dead == 0 and stats.failed == 0 and stats.released >= 20
    assert stats.last_error is not None


# -- processes --------------------------------------------------------------------------------
def _start_relay_process(
    side: OutboxSide, work: Path, mode: str, lease: float, batch: int
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration._relay_proc",
            side.full_url,
            str(work),
            mode,
            str(lease),
            str(batch),
        ],
        cwd=ROOT,
        env=env,
    )


def _sent(work: Path) -> list[str]:
    path = work / "sent"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_sigterm_settles_the_batch_in_hand(kind: str, tmp_path: Path) -> None:
    """SIGTERM to a ``Relay.run()`` process mid-stream: it sends and settles the batch in
    hand (its rows are published, none is left claimed) and exits; another relay publishes
    the rest; every row is published, none lost."""
    with outbox_of(kind, tmp_path) as side:
        with side.open() as outbox:
            ids = side.add(outbox, [{"queue": "q", **b} for b in _bodies(200)])
        work = tmp_path / "proc"
        work.mkdir()
        proc = _start_relay_process(side, work, "slow", 30.0, 10)
        try:
            wait_until(lambda: len(_sent(work)) >= 20, 30, "two batches sent")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        stats = json.loads((work / "stats.json").read_text())
        sent = _sent(work)
        with side.open() as outbox:
            by_id = {e.id: e for e in side.entries(outbox)}
        assert stats["published"] == len(sent) < 200  # everything it sent, it settled
        assert all(by_id[i].state == "published" for i in sent)
        assert not [e for e in by_id.values() if e.state == "claimed"]
        rest, _ = run_relay("sync", side, lambda rows: None)
        assert rest == 200 - len(sent)
        with side.open() as outbox:
            assert {e.id for e in side.entries(outbox, "published")} == set(ids)


def test_sigkill_rows_go_to_another_relay_after_the_lease(
    pg_outbox: OutboxSide, tmp_path: Path
) -> None:
    """A relay process SIGKILLed while it holds a batch: the rows stay claimed by it until
    its lease passes, then another relay publishes them."""
    with pg_outbox.open() as outbox:
        ids = pg_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(5)])
    work = tmp_path / "proc"
    work.mkdir()
    proc = _start_relay_process(pg_outbox, work, "hang", 2.0, 10)
    try:
        wait_until(lambda: len(_sent(work)) == 5, 30, "the batch sent")
    finally:
        proc.kill()
        proc.wait(10)
    owner = (work / "owner").read_text()
    with pg_outbox.open() as outbox:
        claimed = pg_outbox.entries(outbox, "claimed")
    assert [(e.id, e.claimed_by) for e in claimed] == [(i, owner) for i in ids]
    got: list[str] = []
    assert run_relay("sync", pg_outbox, lambda rows: got.extend(r.id for r in rows))[0] == 0
    runner = RunningRelay("sync", pg_outbox, lambda rows: got.extend(r.id for r in rows), poll=0.05)
    try:
        wait_until(lambda: len(got) == 5, 30, "the rows published after the lease")
    finally:
        runner.stop()
    assert got == ids


def test_a_stalled_relay_loses_its_rows_and_may_send_them_again(
    pg_outbox: OutboxSide, tmp_path: Path
) -> None:
    """A relay SIGSTOPped past its lease: another relay publishes its rows. When it wakes it
    finishes the send it had begun -- the one way a row is published twice, with the same id
    (the consumer's inbox recognises it) -- but it cannot mark them published: they are no
    longer its (its stats count none of them)."""
    with pg_outbox.open() as outbox:
        ids = pg_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(4)])
    work = tmp_path / "proc"
    work.mkdir()
    proc = _start_relay_process(pg_outbox, work, "stall", 1.0, 10)
    try:
        wait_until(lambda: len(_sent(work)) == 4, 30, "the batch sent")
        proc.send_signal(signal.SIGSTOP)
        got: list[str] = []
        runner = RunningRelay(
            "sync", pg_outbox, lambda rows: got.extend(r.id for r in rows), poll=0.05
        )
        try:
            wait_until(lambda: len(got) == 4, 30, "the rows published by the other relay")
        finally:
            other = runner.stop()
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    stats = json.loads((work / "stats.json").read_text())
    assert got == ids and other.published == 4
    assert _sent(work) == ids  # sent by the stalled relay as well: a re-send, same ids
    assert stats["published"] == 0
    with pg_outbox.open() as outbox:
        assert {e.id for e in pg_outbox.entries(outbox, "published")} == set(ids)


# -- waking up --------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_postgres_wakes_the_relay_before_the_poll_interval(
    flavour: str, pg_outbox: OutboxSide
) -> None:
    """A relay with poll=30 waits for PostgreSQL's notification: a row committed while it
    waits is published by the claim right after the wait, not after a poll interval (the
    relay claims twice in all: the empty claim, then the one the commit woke)."""
    events: list[str] = []
    published = threading.Event()
    waiting = threading.Event()

    def hook(point: str, **info: Any) -> None:
        if point in ("outbox.claim", "outbox.publish"):
            events.append(point)

    def send(rows: list[OutboxRow]) -> None:
        published.set()

    with hooked(hook):
        runner = RunningRelay(flavour, pg_outbox, send, poll=30.0)
        try:
            backend = runner.relay.backend
            real_wait = backend.wait
            if flavour == "sync":

                def wait(timeout: float) -> bool:
                    if timeout > 0:
                        waiting.set()
                    return bool(real_wait(timeout))
            else:

                async def wait(timeout: float) -> bool:  # type: ignore[misc]
                    if timeout > 0:
                        waiting.set()
                    return bool(await real_wait(timeout))

            backend.wait = wait
            assert waiting.wait(30), "the relay never waited"
            with pg_outbox.open() as outbox:
                pg_outbox.add(outbox, [{"queue": "q", "body": 1}])
            assert published.wait(20), "the commit did not wake the relay"
        finally:
            runner.stop()
    assert events[:3] == ["outbox.claim", "outbox.claim", "outbox.publish"]


# -- fork ---------------------------------------------------------------------------------------
def test_a_relay_used_before_fork_works_in_the_child(pg_outbox: OutboxSide, tmp_path: Path) -> None:
    """A relay (and its queue target) used in the parent, then fork(): the child relays with
    an owner id of its own and connections of its own, and the parent goes on working."""
    dest = QueueSide("sqlite", tmp_path)
    with pg_outbox.open() as outbox, jobfence.Relay(outbox, queues_target(dest.url)) as relay:
        pg_outbox.add(outbox, [{"queue": "q", "body": "parent-1"}])
        assert relay.run_once() == 1
        parent_owner = relay.owner
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                pg_outbox.add(outbox, [{"queue": "q", "body": "child"}])
                if relay.run_once() == 1 and relay.owner != parent_owner:
                    code = 0
            except BaseException:
                pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        pg_outbox.add(outbox, [{"queue": "q", "body": "parent-2"}])
        assert relay.run_once() == 1
        assert relay.owner == parent_owner
    assert [m.body for m in dest.receive("q", 3)] == ["parent-1", "child", "parent-2"]


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"batch": 0}, "batch"),
        ({"batch": 10_001}, "batch"),
        ({"lease": 0}, "lease"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"retention": -1}, "retention"),
        ({"poll": 0}, "poll"),
        ({"name": ""}, "name"),
        ({"queues": ["bad name"]}, "queues"),
        ({"queues": []}, "queues"),
        ({"to": 42}, "to"),
        ({"to": "no-scheme"}, "to"),
        ({"to": {}}, "to"),
        ({"to": {"a": {"b": "redis://"}}}, "to"),
        ({"to": {"a": print}, "queues": ["b"]}, "queues"),
        ({"outbox": 42}, "outbox"),
    ],
)
def test_bad_arguments_name_the_argument(
    options: dict[str, Any], argument: str, sqlite_outbox: OutboxSide
) -> None:
    """Every bad argument raises ConfigurationError naming it, in both flavours."""
    options = dict(options)
    to = options.pop("to", print)
    given = options.pop("outbox", sqlite_outbox.full_url)  # checked before it is opened
    for cls in (jobfence.Relay, jobfence.AsyncRelay):
        with pytest.raises(jobfence.ConfigurationError) as err:
            cls(given, to, **options)
        assert err.value.argument == argument


def test_a_blocking_relay_refuses_async_objects(sqlite_outbox: OutboxSide, tmp_path: Path) -> None:
    with sqlite_outbox.open() as outbox:
        queue = jobfence.AsyncQueue(f"sqlite:///{tmp_path / 'q.db'}", "q")
        with pytest.raises(jobfence.ConfigurationError) as err:
            jobfence.Relay(outbox, queue)
        assert err.value.argument == "to"
        aoutbox = sqlite_outbox.open_async()
        try:
            with pytest.raises(jobfence.ConfigurationError) as err:
                jobfence.Relay(aoutbox, print)  # type: ignore[arg-type]
            assert err.value.argument == "outbox"
        finally:
            asyncio.run(aoutbox.close())


# -- telemetry and hooks ------------------------------------------------------------------------
def test_metrics_and_hook_points(otel: Otel, sqlite_outbox: OutboxSide) -> None:
    """``jobfence.outbox.published`` / ``.failed`` / ``.dead`` / ``.lag`` by backend and
    queue, and the hook points a relay announces its calls at."""
    points: list[tuple[str, Any]] = []

    def hook(point: str, **info: Any) -> None:
        if point.startswith("outbox."):
            points.append((point, info.get("verb")))

    def send(rows: list[OutboxRow]) -> None:
        if any(json.loads(r.body) == "bad" for r in rows):
            raise ValueError("bad")

    with sqlite_outbox.open() as outbox:
        sqlite_outbox.add(
            outbox,
            [{"queue": "q", "body": i} for i in range(3)]
            + [
                {"queue": "q", "body": "bad", "key": "k"},
                {"queue": "q", "body": "behind", "key": "k"},
            ],
        )
    with hooked(hook):
        published, stats = run_relay("sync", sqlite_outbox, send, max_attempts=2)
    assert published == 3 and stats.failed == 1 and stats.released == 1
    assert otel.value("jobfence.outbox.published", backend="sqlite", queue="q") == 3
    assert otel.value("jobfence.outbox.lag", backend="sqlite", queue="q") == 3
    assert otel.value("jobfence.outbox.failed", backend="sqlite", queue="q") == 1
    with sqlite_outbox.open() as outbox:
        by_body = {e.body: e for e in sqlite_outbox.entries(outbox)}
    assert by_body[b'"bad"'].state == "pending" and by_body[b'"behind"'].state == "pending"
    assert ("outbox.claim", None) in points
    assert ("outbox.publish", None) in points
    verbs = {verb for point, verb in points if point == "outbox.settle"}
    assert {"published", "failed", "release", "purge"} <= verbs
    # dead: a new failing row under a relay with max_attempts=1 (the first waits its retry)
    with sqlite_outbox.open() as outbox:
        sqlite_outbox.add(outbox, [{"queue": "q", "body": "bad"}])
    published, stats = run_relay("sync", sqlite_outbox, send, max_attempts=1)
    assert published == 0 and stats.dead == 1
    assert otel.value("jobfence.outbox.dead", backend="sqlite", queue="q") == 1


# -- lease and retention -------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_slow_send_keeps_its_rows(flavour: str, pg_outbox: OutboxSide) -> None:
    """A batch whose send takes longer than its lease (1 s) keeps its rows: the relay
    extends the lease every half lease, so a second relay running meanwhile never sends
    them, and every row is published once."""
    sent: list[tuple[str, str]] = []
    verbs: list[str] = []
    first = threading.Event()

    def slow(rows: list[OutboxRow]) -> None:
        if not first.is_set():
            first.set()
            time.sleep(1.8)  # a broker that takes long to answer
        sent.extend(("slow", r.id) for r in rows)

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.settle":
            verbs.append(info["verb"])

    with pg_outbox.open() as outbox:
        ids = pg_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(5)])
    with hooked(hook):
        slow_relay = RunningRelay(flavour, pg_outbox, slow, lease=1.0, poll=0.05)
        try:
            assert first.wait(30)
            other = RunningRelay(
                flavour,
                pg_outbox,
                lambda rows: sent.extend(("other", r.id) for r in rows),
                lease=1.0,
                poll=0.05,
            )
            try:
                wait_until(lambda: len(sent) >= 5, 30, "the slow batch published")
            finally:
                other_stats = other.stop()
        finally:
            slow_stats = slow_relay.stop()
    assert sent == [("slow", i) for i in ids]
    assert slow_stats.published == 5 and other_stats.published == 0
    assert verbs.count("extend") >= 2


def test_published_rows_are_kept_for_retention_then_purged(sqlite_outbox: OutboxSide) -> None:
    """``retention=0`` deletes rows as they are published; a retention of 2 s keeps them for
    the admin views until a purge of the relay (every second here) finds them older."""
    with sqlite_outbox.open() as outbox:
        sqlite_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(3)])
        assert run_relay("sync", sqlite_outbox, lambda rows: None, retention=0)[0] == 3
        assert sqlite_outbox.entries(outbox) == []
        sqlite_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(3)])
        runner = RunningRelay("sync", sqlite_outbox, lambda rows: None, retention=2, poll=0.05)
        try:
            wait_until(lambda: runner.relay.stats.published == 3, 30, "3 rows published")
            assert len(sqlite_outbox.entries(outbox, "published")) == 3
            wait_until(lambda: not sqlite_outbox.entries(outbox), 30, "the rows purged")
        finally:
            runner.stop()


# -- polling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_polling_relay_backs_its_pauses_off_and_loops_on_full_batches(
    flavour: str, tmp_path: Path
) -> None:
    """On MariaDB (no server wake-up) an idle relay pauses 10 ms, then twice as long each
    time up to ``poll``; a claim that found rows (full or not) is followed by the next claim
    with no pause, and only the empty claim after it pauses, 10 ms again, then doubling. The
    pauses are read off a manual clock (each one the time the test moves on)."""
    claims: list[int] = []

    def hook(point: str, **info: Any) -> None:
        if point == "outbox.claim":
            claims.append(len(claims))

    with outbox_of("mysql", tmp_path) as side, ManualClock() as clock, hooked(hook):

        def pauses() -> list[float]:
            return [w for w in list(clock.waits) if w != 50.0]  # not the lease keeper's

        def step() -> None:  # let the relay's pause end
            assert clock.wait_for_waiters(1, 30), "the relay did not pause"
            deadline = clock.next_deadline
            assert deadline is not None
            clock.set(deadline)

        runner = RunningRelay(flavour, side, lambda rows: None, batch=5, poll=0.16, lease=100)
        try:
            for _ in range(5):
                step()
            wait_until(lambda: len(pauses()) >= 6, 30, "six pauses")
            before = len(claims)
            with side.open() as outbox:
                side.add(outbox, [{"queue": "q", **b} for b in _bodies(12)])
            step()
            wait_until(lambda: len(pauses()) >= 7, 30, "a pause after the rows")
            assert runner.relay.stats.published == 12
            claims_for_rows = len(claims) - before
            step()
            wait_until(lambda: len(pauses()) >= 8, 30, "an idle pause again")
        finally:
            clock.set(clock.monotonic() + 100)  # wake whatever waits, so that stop() is seen
            runner.stop()
    assert pauses()[:8] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.16, 0.01, 0.02]
    # 5 + 5 + 2 + an empty claim, all before the first pause after the rows: the full
    # batches and the batch of 2 were each followed by the next claim at once
    assert claims_for_rows == 4


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_run_once_raises_the_destinations_own_error_with_its_cause(
    flavour: str, sqlite_outbox: OutboxSide
) -> None:
    """A destination that is down makes ``run_once`` raise its error as it was raised, its
    driver error still its ``__cause__``, so ``jobfence.is_transient`` still tells an outage;
    the rows are given back with no attempt counted."""
    driver_error = ConnectionRefusedError("the broker refused the connection")

    def down(rows: list[OutboxRow]) -> None:
        raise jobfence.BackendError(
            "broker unreachable", backend="test", operation="publish"
        ) from driver_error

    with sqlite_outbox.open() as outbox:
        sqlite_outbox.add(outbox, [{"queue": "q", **b} for b in _bodies(2)])
        with pytest.raises(jobfence.BackendError) as raised:
            run_relay(flavour, sqlite_outbox, down)
        assert raised.value.__cause__ is driver_error
        assert jobfence.is_transient(raised.value)
        entries = sqlite_outbox.entries(outbox)
        assert [e.state for e in entries] == ["pending", "pending"]
        assert [e.attempts for e in entries] == [0, 0]
