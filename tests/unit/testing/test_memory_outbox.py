"""The memory:// outbox backend: the semantics of the SQL backends, in memory, on
jobfence's clock.

Rows are held by one relay at a time for their lease (a ManualClock runs it out), a key's
rows go in seq order and are never split between two relays, the settling verbs touch only
rows the relay still holds, an id is added once while the table keeps it, and a commit wakes
a waiting relay."""

from __future__ import annotations

import asyncio
import importlib
import uuid
from typing import Any

import pytest

import jobfence
from jobfence._core.url import parse_url
from jobfence.backends.memory.outbox import (
    AsyncMemoryOutboxBackend,
    MemoryOutboxBackend,
    get_outbox_store,
)
from jobfence.testing import ManualClock


def _row(msg_id: str, key: str | None = None, queue: str = "orders", delay: float = 0.0) -> Any:
    return {"id": msg_id, "queue": queue, "key": key, "body": b"{}", "headers": {}, "delay": delay}


@pytest.fixture
def clock() -> Any:
    with ManualClock() as clock:
        yield clock


@pytest.fixture
def backend() -> MemoryOutboxBackend:
    return MemoryOutboxBackend(parse_url(f"memory://{uuid.uuid4().hex}"))


def _add(backend: MemoryOutboxBackend, *rows: Any) -> list[str]:
    return backend.store.add(rows)


def test_a_claim_holds_rows_in_seq_order_for_one_relay_until_the_lease_runs_out(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(backend, _row("a"), _row("b"), _row("c"))
    first = backend.claim("r1", 2, lease=30)
    assert [r.id for r in first] == ["a", "b"] and [r.seq for r in first] == [1, 2]
    assert first[0].attempts == 0 and first[0].created_at == clock.time()
    assert [r.id for r in backend.claim("r2", 10, lease=30)] == ["c"]  # never a held row
    assert backend.claim("r3", 10, lease=30) == []
    clock.advance(29.9)
    assert backend.extend("r1", [1], lease=30) == 1  # a: held 30 s more from now
    clock.advance(0.2)  # b's and c's leases ran out; a's did not
    assert [r.id for r in backend.claim("r3", 10, lease=30)] == ["b", "c"]
    assert backend.published("r1", [1, 2], retention=600) == 1  # b is r3's now
    assert backend.extend("r1", [2], lease=30) == 0 and not backend.failed("r1", 2, "x", 1.0)
    assert backend.release("r1", [2]) == 0
    assert [e.state for e in backend.entries(None, None, 10)] == ["published", "claimed", "claimed"]


def test_a_keys_rows_go_in_order_and_are_never_split_between_relays(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(backend, _row("k1", "k"), _row("x1", "x"), _row("k2", "k"), _row("n1"), _row("k3", "k"))
    first = backend.claim("r1", 1, lease=30)
    assert [r.id for r in first] == ["k1"]
    # k2, k3 wait behind k1, held by r1; the other keys' rows and keyless ones go
    assert [r.id for r in backend.claim("r2", 10, lease=30)] == ["x1", "n1"]
    assert backend.published("r1", [first[0].seq], retention=600) == 1
    assert [r.id for r in backend.claim("r2", 10, lease=30)] == ["k2", "k3"]  # one run, one relay


def test_a_failed_or_delayed_row_holds_back_the_rest_of_its_key(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(backend, _row("k1", "k"), _row("k2", "k"), _row("later", "l", delay=5))
    (k1, k2) = backend.claim("r1", 10, lease=30)
    assert backend.failed("r1", k1.seq, "boom", retry_in=10)
    assert backend.release("r1", [k2.seq]) == 1
    assert backend.claim("r1", 10, lease=30) == []  # k1 waits 10 s; k2 behind it; later in 5
    clock.advance(5)
    assert [r.id for r in backend.claim("r1", 10, lease=30)] == ["later"]
    clock.advance(5)
    again = backend.claim("r1", 10, lease=30)
    assert [(r.id, r.attempts) for r in again] == [("k1", 1), ("k2", 0)]
    (entry,) = backend.entries("claimed", None, 1)
    assert entry.id == "k1" and entry.last_error == "boom" and entry.claimed_by == "r1"


def test_a_dead_row_no_longer_holds_back_its_key_and_retry_dead_revives_it(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(backend, _row("k1", "k"), _row("k2", "k"))
    (k1,) = backend.claim("r1", 1, lease=30)
    assert backend.failed("r1", k1.seq, "bad body", retry_in=None)
    assert [e.id for e in backend.entries("dead", None, 10)] == ["k1"]
    assert [r.id for r in backend.claim("r1", 10, lease=30)] == ["k2"]
    assert backend.stats().dead == 1 and backend.stats().claimed == 1
    assert backend.retry_dead(["nope"]) == 0 and backend.retry_dead() == 1
    (entry,) = backend.entries("pending", None, 10)
    assert entry.id == "k1" and entry.attempts == 0


def test_an_id_is_added_once_while_the_table_keeps_its_row(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    assert _add(backend, _row("a"), _row("a"), _row("b")) == ["a", "b"]
    rows = backend.claim("r1", 10, lease=30)
    assert backend.published("r1", [rows[0].seq], retention=600) == 1
    assert backend.published("r1", [rows[1].seq], retention=0) == 1  # deleted at once
    assert _add(backend, _row("a"), _row("b")) == ["b"]  # a is retained, b is gone
    clock.advance(600.5)
    assert backend.purge(600) == 1
    assert _add(backend, _row("a")) == ["a"]
    assert [e.id for e in backend.entries(None, None, 10)] == ["b", "a"]


def test_the_queues_filter_and_the_admin_views(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(
        backend,
        _row("m1", "k", queue="mail"),
        _row("o1", "k"),
        _row("o2"),
        _row("m2", queue="mail"),
    )
    # o1 waits behind m1 (same key), whichever queue the claim is for
    assert [r.id for r in backend.claim("r1", 10, lease=30, queues=["orders"])] == ["o2"]
    assert [r.id for r in backend.claim("r2", 10, lease=30, queues=["mail"])] == ["m1", "m2"]
    assert [e.id for e in backend.entries(None, "mail", 10)] == ["m1", "m2"]
    assert [e.id for e in backend.entries(None, None, 2, after=1)] == ["o1", "o2"]
    clock.advance(7)
    stats = backend.stats()
    assert (stats.pending, stats.claimed, stats.published, stats.dead) == (1, 3, 0, 0)
    assert stats.oldest_pending == 7
    with pytest.raises(jobfence.ConfigurationError) as info:
        backend.entries("held", None, 10)
    assert info.value.argument == "state"
    backend.drop()
    assert backend.stats().oldest_pending is None and backend.entries(None, None, 10) == []


def test_sync_and_async_backends_of_one_url_and_table_share_the_store() -> None:
    url = parse_url(f"memory://{uuid.uuid4().hex}?table=shop_outbox")
    sync, other = MemoryOutboxBackend(url), MemoryOutboxBackend(url, table="ignored_by_url")
    assert sync.table == "shop_outbox" and sync.store is other.store
    assert AsyncMemoryOutboxBackend(url).store is sync.store
    assert get_outbox_store(url, "shop_outbox") is sync.store
    assert MemoryOutboxBackend(parse_url(url.raw.split("?")[0])).store is not sync.store


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"colour": "red"}, "colour"),
        ({"table": "bad name"}, "table"),
        ({"client": object()}, "client"),
    ],
)
def test_bad_options_are_refused_naming_the_argument(
    options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        MemoryOutboxBackend(parse_url(f"memory://{uuid.uuid4().hex}"), **options)
    assert argument in str(info.value)


def test_a_waiting_relay_wakes_when_a_transaction_adds_rows() -> None:
    async def main() -> tuple[bool, bool]:
        backend = AsyncMemoryOutboxBackend(parse_url(f"memory://{uuid.uuid4().hex}"))
        idle = await backend.wait(0.01)  # nothing added: times out
        waiter = asyncio.ensure_future(backend.wait(60))
        await asyncio.sleep(0)
        backend.store.add([_row("a")])
        woke = await asyncio.wait_for(waiter, 10)
        return idle, woke

    assert asyncio.run(main()) == (False, True)


def test_a_row_sent_after_its_hold_ran_out_is_marked_published_unless_claimed_since(
    clock: ManualClock, backend: MemoryOutboxBackend
) -> None:
    _add(backend, _row("a"), _row("b"))
    a, b = backend.claim("r1", 10, lease=30)
    clock.advance(31)  # r1 stalled past its hold while sending
    assert backend.extend("r1", [a.seq], lease=30) == 0  # a hold that ran out is not renewed
    assert [r.id for r in backend.claim("r2", 1, lease=30)] == ["a"]
    assert backend.published("r1", [a.seq, b.seq], retention=600) == 1  # b: nobody took it
    (entry,) = backend.entries("published", None, 10)
    assert entry.id == "b" and entry.published_at == clock.time() and entry.claimed_until is None
    assert backend.published("r2", [a.seq], retention=600) == 1


# -- the outbox conformance suite, on memory ---------------------------------------------------
class _Caller:
    """A caller's connection to a ``memory://`` outbox: a transaction of its own
    (``__jobfence_transaction__``, as a simulated table's), whose outbox rows are added when
    :meth:`MemoryOutboxEnv.commit` commits it and dropped by a rollback."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def __jobfence_transaction__(self) -> _CallerTransaction:
        return _CallerTransaction(self)


class _CallerTransaction:
    dialect = "simulated"
    in_transaction = True

    def __init__(self, caller: _Caller) -> None:
        self.caller = caller

    async def outbox_add(self, table: str, row: dict[str, Any]) -> None:
        self.caller.rows.setdefault(table, []).append(dict(row))


class MemoryOutboxEnv:
    """What the outbox suite's specs use of ``oenv_async``, on a ``memory://`` store."""

    def __init__(self) -> None:
        self.url = f"memory://{uuid.uuid4().hex}"
        self.table = "t_outbox"
        self.outboxes: list[jobfence.AsyncOutbox] = []

    def outbox(self, **options: Any) -> jobfence.AsyncOutbox:
        table = options.pop("table", self.table)
        backend = AsyncMemoryOutboxBackend(parse_url(self.url), table=table)
        outbox = jobfence.AsyncOutbox(backend, **options)
        self.outboxes.append(outbox)
        return outbox

    async def connect(self) -> _Caller:
        return _Caller(self.url)

    async def commit(self, conn: _Caller) -> None:
        rows, conn.rows = conn.rows, {}
        for table, added in rows.items():
            get_outbox_store(parse_url(self.url), table).add(added)

    async def rollback(self, conn: _Caller) -> None:
        conn.rows = {}

    async def aclose(self) -> None:
        for outbox in self.outboxes:
            await outbox.close()


SUITE = importlib.import_module("tests.conformance.test_outbox_conformance")
#: the suite's specs that test what only a database has: its schema, its drivers
SQL_ONLY = {
    "test_add_before_install_raises_schema_missing_and_install_conn_fixes_it": "no schema",
    "test_add_on_every_driver_commits_and_rolls_back_with_the_caller": "no drivers",
}
SPECS = sorted(name for name in vars(SUITE) if name.startswith("test_") and name not in SQL_ONLY)


def test_the_suite_is_found_and_what_memory_leaves_out_exists() -> None:
    assert len(SPECS) >= 15 and set(SQL_ONLY) <= set(vars(SUITE))


@pytest.mark.parametrize("name", SPECS)
def test_the_outbox_suite_runs_on_memory(name: str) -> None:
    """Each spec of the outbox conformance suite (async; its sync twin's ``Outbox.add``
    takes driver connections only), on a ``memory://`` outbox whose caller's connection is
    a transaction of its own, as a simulated table's."""

    async def run() -> None:
        env = MemoryOutboxEnv()
        try:
            await getattr(SUITE, name)(env)
        finally:
            await env.aclose()

    asyncio.run(run())
