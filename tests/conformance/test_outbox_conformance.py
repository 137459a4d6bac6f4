"""The outbox storage contract, run against every outbox backend (``specs.py``), sync and async.

``Outbox.add`` writes rows on a caller's connection inside the caller's transaction; the
outbox's backend (``outbox.backend``, the relay's side) claims the committed rows, holds them
for a lease by the database's clock and settles them (published, failed, released,
extended). Each test uses an outbox table of its own (``<namespace>_outbox``), dropped
afterwards. The timing tests use leases and delays of about a second: they check that a row
comes back after its lease or delay and not before, never how fast anything is.

The specs are written once, in ``test_outbox_conformance.py``, over ``AsyncOutbox``;
``test_outbox_conformance_sync.py`` is generated from it by ``tools/conformance_twins.py`` and
runs them over ``Outbox`` as plain sync code on the test's own thread (a second relay: a
thread). Code that differs between the flavours sits in ``if ASYNC:`` / ``else:`` branches.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

import pytest

import jobfence
from jobfence import ConfigurationError, SchemaMissing
from jobfence._core.flavour import ASYNC
from jobfence.backends.base import OutboxRow
from tests.conformance import flow_async
from tests.conformance.conftest import AsyncOutboxEnv

if ASYNC:
    from tests.integration import _sqldrivers

pytestmark = pytest.mark.timeout(120)

RELAY_A = "host-a:1:relay-a"
RELAY_B = "host-b:2:relay-b"


async def _installed(oenv_async: AsyncOutboxEnv, **options: Any) -> jobfence.AsyncOutbox:
    outbox = oenv_async.outbox(**options)
    await outbox.install()
    return outbox


async def _add_committed(
    oenv_async: AsyncOutboxEnv,
    outbox: jobfence.AsyncOutbox,
    bodies: list[Any],
    *,
    queue: str = "orders",
    key: str | None = None,
    **kw: Any,
) -> list[str]:
    """Add ``bodies`` in one transaction of a new caller connection, and commit it."""
    conn = await oenv_async.connect()
    ids = await outbox.add_many(conn, queue=queue, bodies=bodies, key=key, **kw)
    await oenv_async.commit(conn)
    return ids


async def _claim_until(
    backend: Any, relay: str, *, lease: float = 30.0, limit: int = 100, wait: float = 10.0
) -> list[OutboxRow]:
    """Claim until some row comes (or ``wait`` seconds pass): for rows that become claimable
    later (a delay, a lease running out)."""
    deadline = time.monotonic() + wait
    while True:
        rows = await backend.claim(relay, limit, lease)
        if rows or time.monotonic() > deadline:
            return list(rows)
        await flow_async.sleep(0.05)


async def _until_state(outbox: jobfence.AsyncOutbox, seq: int, state: str) -> None:
    """Wait until the row ``seq`` is in ``state`` by the database's clock (a lease running
    out), at most 10 seconds."""
    deadline = time.monotonic() + 10
    while True:
        states = {e.seq: e.state for e in await outbox.entries()}
        if states.get(seq) == state:
            return
        assert time.monotonic() < deadline, f"row {seq} is {states.get(seq)}, not {state}"
        await flow_async.sleep(0.05)


# -- adding in the caller's transaction ------------------------------------------------------


async def test_a_committed_add_is_claimable_with_what_was_added(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    conn = await oenv_async.connect()
    body = {"order_id": 7, "note": "café ✓", "items": [1, 2.5, None, True]}
    msg_id = await outbox.add(
        conn, queue="orders", body=body, key="customer:1", headers={"tenant": "acme"}
    )
    generated = await outbox.add(conn, queue="emails", body="hello")
    assert len(generated) == 32 and generated != msg_id  # a new uuid4 hex
    # not committed yet: the outbox's own connections see nothing
    assert await outbox.entries() == []
    assert (await outbox.stats()).pending == 0
    await oenv_async.commit(conn)
    rows = await outbox.backend.claim(RELAY_A, 10, 30.0)
    assert [(r.id, r.queue, r.key) for r in rows] == [
        (msg_id, "orders", "customer:1"),
        (generated, "emails", None),
    ]
    first = rows[0]
    # the body is encoded as Queue's default serializer encodes it
    assert first.body == json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    assert json.loads(first.body) == body and first.value() == body
    assert first.headers == {"tenant": "acme"} and rows[1].headers == {}
    assert first.attempts == 0
    assert abs(first.created_at - time.time()) < 60  # seconds since the epoch
    assert rows[0].seq < rows[1].seq


async def test_a_rolled_back_add_is_never_claimable(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    conn = await oenv_async.connect()
    await outbox.add(conn, queue="orders", body={"n": 1}, id="rolled-back")
    await oenv_async.rollback(conn)
    kept = await outbox.add(conn, queue="orders", body={"n": 2}, id="kept")
    await oenv_async.commit(conn)
    rows = await outbox.backend.claim(RELAY_A, 10, 30.0)
    assert [r.id for r in rows] == [kept]
    assert [e.id for e in await outbox.entries()] == ["kept"]
    stats = await outbox.stats()
    assert (stats.pending, stats.claimed, stats.published, stats.dead) == (0, 1, 0, 0)


async def test_add_many_adds_in_order_in_one_transaction(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    conn = await oenv_async.connect()
    ids = await outbox.add_many(
        conn, queue="orders", bodies=[{"n": i} for i in range(5)], key="k", headers={"a": "b"}
    )
    chosen = await outbox.add_many(conn, queue="orders", bodies=["x", "y"], ids=["id-x", "id-y"])
    assert chosen == ["id-x", "id-y"]
    assert await outbox.add_many(conn, queue="orders", bodies=[]) == []
    await oenv_async.commit(conn)
    rows = await outbox.backend.claim(RELAY_A, 100, 30.0)
    assert [r.id for r in rows] == [*ids, "id-x", "id-y"]
    assert [json.loads(r.body) for r in rows[:5]] == [{"n": i} for i in range(5)]
    assert all(r.key == "k" and r.headers == {"a": "b"} for r in rows[:5])
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)


async def test_an_id_already_in_the_outbox_is_not_added_again(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    await _add_committed(oenv_async, outbox, [{"v": 1}], ids=["dup"])
    await _add_committed(oenv_async, outbox, [{"v": 2}, {"v": 3}], ids=["dup", "other"])
    entries = await outbox.entries()
    assert [(e.id, json.loads(e.body)) for e in entries] == [("dup", {"v": 1}), ("other", {"v": 3})]
    # nor once it is published (and retained), nor once it is dead
    backend = outbox.backend
    rows = await backend.claim(RELAY_A, 10, 30.0)
    assert await backend.published(RELAY_A, [rows[0].seq], 600.0) == 1
    assert await backend.failed(RELAY_A, rows[1].seq, "gone", None)
    await _add_committed(oenv_async, outbox, [{"v": 4}, {"v": 5}], ids=["dup", "other"])
    assert [(e.id, e.state) for e in await outbox.entries()] == [
        ("dup", "published"),
        ("other", "dead"),
    ]


async def test_bad_input_raises_configuration_error_naming_the_argument(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    conn = await oenv_async.connect()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("queue", {"queue": ""}),
        ("queue", {"queue": "has space"}),
        ("queue", {"queue": 7}),
        ("key", {"key": ""}),
        ("key", {"key": "x" * 1025}),
        ("key", {"key": 5}),
        ("key", {"key": "nul\0"}),
        ("id", {"id": ""}),
        ("id", {"id": 12}),
        ("id", {"id": "é" * 513}),
        ("body", {"body": object()}),
        ("body", {"body": float("nan")}),
        ("body", {"body": {"a": {1, 2}}}),
        ("body", {"body": "\ud800"}),
        ("delay", {"delay": -1}),
        ("delay", {"delay": "soon"}),
        ("headers", {"headers": {"a": 1}}),
    ]
    for argument, kw in cases:
        call: dict[str, Any] = {"queue": "orders", "body": {"n": 1}, **kw}
        with pytest.raises(ConfigurationError) as info:
            await outbox.add(conn, **call)
        assert info.value.argument == argument, (argument, kw, info.value)
    with pytest.raises(ConfigurationError) as info:
        await outbox.add_many(conn, queue="orders", bodies=[1, 2], ids=["only-one"])
    assert info.value.argument == "ids"
    for wrong in (object(), "postgresql://not-a-connection"):
        with pytest.raises(ConfigurationError) as info:
            await outbox.add(wrong, queue="orders", body=1)
        assert info.value.argument == "conn"
    if ASYNC:
        blocking = sqlite3.connect(":memory:")
        try:
            with pytest.raises(ConfigurationError, match="blocking connection") as info:
                await outbox.add(blocking, queue="orders", body=1)
            assert info.value.argument == "conn"
        finally:
            blocking.close()
    for argument, view in (("state", {"state": "done"}), ("limit", {"limit": 0})):
        with pytest.raises(ConfigurationError) as info:
            await outbox.entries(**view)
        assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:
        oenv_async.outbox(table="bad name")
    assert info.value.argument == "table"
    with pytest.raises(ConfigurationError, match="memory") as info:
        jobfence.AsyncOutbox("memory://")
    assert info.value.argument == "url"
    await oenv_async.rollback(conn)
    assert await outbox.entries() == []  # nothing was written by a refused call


async def test_add_before_install_raises_schema_missing_and_install_conn_fixes_it(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = oenv_async.outbox()
    conn = await oenv_async.connect()
    with pytest.raises(SchemaMissing, match=r"install\(\)"):
        await outbox.add(conn, queue="orders", body={"n": 1})
    await oenv_async.rollback(conn)
    await outbox.install(conn)  # on the caller's connection, in its transaction
    await oenv_async.commit(conn)
    added = await outbox.add(conn, queue="orders", body={"n": 2})
    await oenv_async.commit(conn)
    assert [r.id for r in await outbox.backend.claim(RELAY_A, 10, 30.0)] == [added]
    await outbox.install()  # idempotent, also on the outbox's own connection
    await outbox.install(conn)
    await oenv_async.commit(conn)


# -- claiming --------------------------------------------------------------------------------


async def test_claim_returns_rows_in_seq_order_up_to_limit(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    ids = await _add_committed(oenv_async, outbox, list(range(6)), queue="a")
    ids += await _add_committed(oenv_async, outbox, list(range(6, 10)), queue="b")
    backend = outbox.backend
    first = await backend.claim(RELAY_A, 4, 30.0)
    second = await backend.claim(RELAY_B, 4, 30.0)
    third = await backend.claim(RELAY_A, 4, 30.0)
    assert [r.id for r in first + second + third] == ids
    assert [len(first), len(second), len(third)] == [4, 4, 2]
    assert await backend.claim(RELAY_B, 4, 30.0) == []
    stats = await outbox.stats()
    assert (stats.pending, stats.claimed) == (0, 10)


async def test_claim_takes_only_the_queues_asked_for(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    a = await _add_committed(oenv_async, outbox, [1, 2], queue="a")
    b = await _add_committed(oenv_async, outbox, [3, 4], queue="b")
    c = await _add_committed(oenv_async, outbox, [5], queue="c")
    backend = outbox.backend
    assert await backend.claim(RELAY_A, 10, 30.0, queues=[]) == []
    assert [r.id for r in await backend.claim(RELAY_A, 10, 30.0, queues=["b"])] == b
    assert [r.id for r in await backend.claim(RELAY_A, 10, 30.0, queues=["c", "a"])] == a + c
    assert await backend.claim(RELAY_A, 10, 30.0, queues=["a", "b", "c"]) == []


async def test_a_delayed_row_is_claimable_only_after_its_delay(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    conn = await oenv_async.connect()
    delayed = await outbox.add(conn, queue="orders", body=1, delay=1.0)
    now = await outbox.add(conn, queue="orders", body=2)
    await oenv_async.commit(conn)
    added_at = time.monotonic()
    backend = outbox.backend
    assert [r.id for r in await backend.claim(RELAY_A, 10, 30.0)] == [now]
    (entry,) = await outbox.entries(state="pending")
    assert entry.id == delayed
    assert entry.available_at is not None and entry.available_at - entry.created_at >= 0.99
    rows = await _claim_until(backend, RELAY_A)
    assert [r.id for r in rows] == [delayed]
    assert time.monotonic() - added_at >= 0.9  # not before its delay passed


# -- one key at a time, in order -------------------------------------------------------------


async def test_a_keys_rows_wait_while_an_earlier_row_is_held_elsewhere(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    k = await _add_committed(oenv_async, outbox, [1, 2, 3], key="k")
    other = await _add_committed(oenv_async, outbox, [4], key="other")
    free = await _add_committed(oenv_async, outbox, [5])
    backend = outbox.backend
    (held,) = await backend.claim(RELAY_A, 1, 30.0)
    assert held.id == k[0]
    # B gets the other keys' rows and the keyless one, never k's later rows
    assert [r.id for r in await backend.claim(RELAY_B, 10, 30.0)] == other + free
    assert await backend.claim(RELAY_B, 10, 30.0) == []
    assert await backend.published(RELAY_A, [held.seq], 600.0) == 1
    # k's next rows come in order, together, to whichever relay claims next
    assert [r.id for r in await backend.claim(RELAY_B, 10, 30.0)] == k[1:]


async def test_a_keys_rows_wait_behind_a_delayed_or_filtered_earlier_row(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    first = await _add_committed(oenv_async, outbox, [1], key="k", queue="a")
    rest = await _add_committed(oenv_async, outbox, [2, 3], key="k", queue="b")
    # the earlier row is of a queue this claim does not take: the later ones wait for it
    assert await backend.claim(RELAY_A, 10, 30.0, queues=["b"]) == []
    (row,) = await backend.claim(RELAY_A, 1, 30.0, queues=["a"])
    assert row.id == first[0]
    # a failed earlier row waits for its retry: its key's later rows wait with it
    assert await backend.failed(RELAY_A, row.seq, "broker said no", 1.0)
    failed_at = time.monotonic()
    assert await backend.claim(RELAY_B, 10, 30.0) == []
    (again,) = await outbox.entries(state="pending", queue="a")
    assert (again.attempts, again.last_error) == (1, "broker said no")
    rows = await _claim_until(backend, RELAY_B)
    assert time.monotonic() - failed_at >= 0.9
    assert [(r.id, r.attempts) for r in rows] == [(first[0], 1), (rest[0], 0), (rest[1], 0)]


async def test_a_dead_row_no_longer_holds_its_key_back(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    ids = await _add_committed(oenv_async, outbox, [1, 2], key="k")
    (row,) = await backend.claim(RELAY_A, 1, 30.0)
    assert await backend.failed(RELAY_A, row.seq, "poison", None)
    assert [r.id for r in await backend.claim(RELAY_B, 10, 30.0)] == ids[1:]


async def test_concurrent_relays_never_share_a_row_nor_split_a_key(
    oenv_async: AsyncOutboxEnv,
) -> None:
    """Two relays (two backends: tasks here, threads in the sync twin) claim and publish
    until the outbox is empty. Every row comes out exactly once; a key's rows are claimed in
    seq order; no relay claims a row of a key whose earlier row another relay holds."""
    writer = await _installed(oenv_async)
    keys = [f"key-{n}" for n in range(8)]
    expected: dict[str, list[str]] = {k: [] for k in keys}
    conn = await oenv_async.connect()
    for round_ in range(6):  # interleave the keys: each key's rows spread over the table
        for k in keys:
            expected[k] += await writer.add_many(
                conn, queue="orders", bodies=[round_, round_], key=k
            )
        await writer.add_many(conn, queue="orders", bodies=[round_, round_, round_])
        await oenv_async.commit(conn)
    total = (await writer.stats()).pending
    assert total == 6 * (8 * 2 + 3)

    mutex = threading.Lock()
    holder: dict[str, str] = {}  # key -> the relay holding some of its rows now
    claimed: list[int] = []  # every seq claimed, by either relay
    order: dict[str, list[str]] = {k: [] for k in keys}  # each key's ids, in claim order
    problems: list[str] = []

    async def relay(name: str) -> int:
        backend = oenv_async.outbox().backend
        published = 0
        empty = 0
        while empty < 3:
            rows = await backend.claim(name, 5, 30.0)
            if not rows:
                empty += 1
                await flow_async.sleep(0.02)
                continue
            empty = 0
            with mutex:
                for row in rows:
                    claimed.append(row.seq)
                    if row.key is None:
                        continue
                    other = holder.get(row.key)
                    if other not in (None, name):
                        problems.append(f"{name} claimed {row.id} of {row.key} held by {other}")
                    holder[row.key] = name
                    order[row.key].append(row.id)
            await flow_async.sleep(0)  # let the other relay claim meanwhile
            with mutex:  # let go of the keys before they are published, never after
                for row in rows:
                    if row.key is not None and holder.get(row.key) == name:
                        del holder[row.key]
            published += await backend.published(name, [r.seq for r in rows], 600.0)
        return published

    a = flow_async.spawn(lambda: relay(RELAY_A))
    b = flow_async.spawn(lambda: relay(RELAY_B))
    done = await flow_async.result(a, 60) + await flow_async.result(b, 60)
    assert problems == []
    assert done == total
    assert len(claimed) == total and len(set(claimed)) == total  # each row exactly once
    assert order == expected  # each key's rows in insertion order
    stats = await writer.stats()
    assert (stats.pending, stats.claimed, stats.published) == (0, 0, total)


# -- holding: leases by the database's clock -------------------------------------------------


async def test_a_row_whose_lease_ran_out_goes_to_the_next_relay(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    (added,) = await _add_committed(oenv_async, outbox, [{"n": 1}], key="k")
    (mine,) = await backend.claim(RELAY_A, 10, 0.5)
    claimed_at = time.monotonic()
    assert await backend.claim(RELAY_B, 10, 30.0) == []  # held
    (entry,) = await outbox.entries(state="claimed")
    assert entry.claimed_by == RELAY_A and entry.claimed_until is not None
    rows = await _claim_until(backend, RELAY_B)
    assert time.monotonic() - claimed_at >= 0.4
    assert [(r.id, r.seq) for r in rows] == [(added, mine.seq)]
    # A lost it: none of A's verbs touch it any more
    assert await backend.published(RELAY_A, [mine.seq], 600.0) == 0
    assert await backend.extend(RELAY_A, [mine.seq], 30.0) == 0
    assert await backend.release(RELAY_A, [mine.seq]) == 0
    assert not await backend.failed(RELAY_A, mine.seq, "late", 0.0)
    (entry,) = await outbox.entries()
    assert (entry.state, entry.claimed_by, entry.attempts) == ("claimed", RELAY_B, 0)
    assert await backend.published(RELAY_B, [mine.seq], 600.0) == 1


async def test_a_relay_past_its_lease_may_still_mark_published_what_nobody_took(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    await _add_committed(oenv_async, outbox, [1])
    (row,) = await backend.claim(RELAY_A, 10, 0.3)
    await _until_state(outbox, row.seq, "pending")  # its hold ran out, by the server's clock
    assert await backend.extend(RELAY_A, [row.seq], 30.0) == 0  # a run-out hold never extends
    assert await backend.published(RELAY_A, [row.seq], 600.0) == 1  # it was sent
    assert await backend.claim(RELAY_B, 10, 30.0) == []


async def test_settling_verbs_touch_only_the_callers_held_rows(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    await _add_committed(oenv_async, outbox, list(range(6)))
    a_rows = await backend.claim(RELAY_A, 3, 30.0)
    b_rows = await backend.claim(RELAY_B, 3, 30.0)
    a_seqs = [r.seq for r in a_rows]
    assert await backend.published(RELAY_B, a_seqs, 600.0) == 0
    assert await backend.release(RELAY_B, a_seqs) == 0
    assert await backend.extend(RELAY_B, a_seqs, 60.0) == 0
    assert not await backend.failed(RELAY_B, a_seqs[0], "not mine", None)
    assert await backend.published(RELAY_A, [999_999_999], 600.0) == 0  # no such row
    entries = await outbox.entries()
    assert [e.claimed_by for e in entries] == [RELAY_A] * 3 + [RELAY_B] * 3
    assert all(e.state == "claimed" and e.attempts == 0 for e in entries)
    # each relay settles its own
    assert await backend.extend(RELAY_A, [*a_seqs, a_seqs[0]], 60.0) == 3
    assert await backend.release(RELAY_A, a_seqs[:1]) == 1
    assert await backend.published(RELAY_A, a_seqs[1:], 600.0) == 2
    assert await backend.failed(RELAY_B, b_rows[0].seq, "boom", 0.0)
    assert await backend.published(RELAY_B, [r.seq for r in b_rows[1:]], 0.0) == 2
    states = {e.seq: e.state for e in await outbox.entries()}
    assert states == {
        a_seqs[0]: "pending",
        a_seqs[1]: "published",
        a_seqs[2]: "published",
        b_rows[0].seq: "pending",
    }  # b's published rows with retention 0 were deleted at once
    # released without an attempt; failed with one
    again = await backend.claim(RELAY_B, 10, 30.0)
    assert [(r.seq, r.attempts) for r in again] == [(a_seqs[0], 0), (b_rows[0].seq, 1)]


async def test_release_with_retry_in_holds_the_row_back(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    await _add_committed(oenv_async, outbox, [1])
    (row,) = await backend.claim(RELAY_A, 10, 30.0)
    assert await backend.release(RELAY_A, [row.seq], retry_in=1.0) == 1
    released_at = time.monotonic()
    assert await backend.claim(RELAY_B, 10, 30.0) == []
    (entry,) = await outbox.entries(state="pending")
    assert entry.claimed_by is None and entry.attempts == 0
    rows = await _claim_until(backend, RELAY_B)
    assert [r.seq for r in rows] == [row.seq]
    assert time.monotonic() - released_at >= 0.9


# -- failures, dead rows, retention ----------------------------------------------------------


async def test_failed_counts_attempts_and_gives_up_when_told(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    (msg_id,) = await _add_committed(oenv_async, outbox, [{"n": 1}])
    (row,) = await backend.claim(RELAY_A, 10, 30.0)
    assert await backend.failed(RELAY_A, row.seq, "first error", 0.0)
    (row,) = await backend.claim(RELAY_A, 10, 30.0)
    assert row.attempts == 1
    assert await backend.failed(RELAY_A, row.seq, "last error ✗", None)
    assert not await backend.failed(RELAY_A, row.seq, "again", None)  # not held any more
    assert await backend.claim(RELAY_B, 10, 30.0) == []
    (dead,) = await outbox.entries(state="dead")
    assert (dead.id, dead.attempts, dead.last_error) == (msg_id, 2, "last error ✗")
    assert dead.claimed_by is None
    stats = await outbox.stats()
    assert (stats.pending, stats.claimed, stats.dead) == (0, 0, 1)
    assert stats.oldest_pending is None


async def test_retry_dead_makes_dead_rows_pending_again(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    ids = await _add_committed(oenv_async, outbox, [1, 2, 3])
    for row in await backend.claim(RELAY_A, 10, 30.0):
        assert await backend.failed(RELAY_A, row.seq, "down", None)
    assert await outbox.retry_dead(["no-such-id"]) == 0
    assert await outbox.retry_dead([]) == 0
    assert await outbox.retry_dead([ids[1]]) == 1
    assert [(r.id, r.attempts) for r in await backend.claim(RELAY_B, 10, 30.0)] == [(ids[1], 0)]
    assert await outbox.retry_dead() == 2
    assert [r.id for r in await backend.claim(RELAY_B, 10, 30.0)] == [ids[0], ids[2]]
    assert (await outbox.stats()).dead == 0


async def test_purge_deletes_published_rows_past_their_retention(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async, retention=600.0)
    backend = outbox.backend
    ids = await _add_committed(oenv_async, outbox, [1, 2, 3])
    rows = await backend.claim(RELAY_A, 10, 30.0)
    assert await backend.published(RELAY_A, [r.seq for r in rows[:2]], 600.0) == 2
    assert await outbox.purge() == 0  # kept for the outbox's retention
    assert await outbox.purge(retention=600.0) == 0
    (published, _) = await outbox.entries(state="published")
    assert published.published_at is not None and published.claimed_until is None
    published_at = time.monotonic()
    deadline = published_at + 10
    purged = 0
    while purged < 2 and time.monotonic() < deadline:
        purged += await outbox.purge(retention=0.2)
        if purged < 2:
            await flow_async.sleep(0.05)
    assert purged == 2
    assert time.monotonic() - published_at >= 0.15  # not before their retention passed
    assert [e.id for e in await outbox.entries()] == [ids[2]]  # the held row is kept
    assert await outbox.purge(retention=0) == 0
    # retention 0 at publish time: deleted at once
    assert await backend.published(RELAY_A, [rows[2].seq], 0) == 1
    assert await outbox.entries() == []


async def test_entries_and_stats_describe_every_state(oenv_async: AsyncOutboxEnv) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    ids = await _add_committed(oenv_async, outbox, [1, 2, 3, 4], queue="a")
    ids += await _add_committed(oenv_async, outbox, [5], queue="b", headers={"h": "v"})
    rows = await backend.claim(RELAY_A, 3, 30.0)
    await backend.published(RELAY_A, [rows[0].seq], 600.0)
    await backend.failed(RELAY_A, rows[1].seq, "bad", None)
    entries = await outbox.entries()
    assert [(e.id, e.state) for e in entries] == [
        (ids[0], "published"),
        (ids[1], "dead"),
        (ids[2], "claimed"),
        (ids[3], "pending"),
        (ids[4], "pending"),
    ]
    assert entries[2].claimed_by == RELAY_A
    assert entries[2].claimed_until is not None and entries[2].claimed_until > time.time() + 20
    assert entries[4].headers == {"h": "v"} and json.loads(entries[4].body) == 5
    assert all(abs(e.created_at - time.time()) < 60 for e in entries)
    assert [e.id for e in await outbox.entries(state="pending")] == ids[3:]
    assert [e.id for e in await outbox.entries(queue="b")] == ids[4:]
    assert [e.id for e in await outbox.entries(state="pending", queue="a")] == [ids[3]]
    assert [e.id for e in await outbox.entries(limit=2)] == ids[:2]
    assert [e.id for e in await outbox.entries(after=entries[1].seq, limit=2)] == ids[2:4]
    stats = await outbox.stats()
    assert (stats.pending, stats.claimed, stats.published, stats.dead) == (2, 1, 1, 1)
    assert stats.oldest_pending is not None and 0 <= stats.oldest_pending < 60


# -- waking relays ---------------------------------------------------------------------------


async def test_wait_returns_when_an_add_commits_and_not_on_rollback(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    backend = outbox.backend
    if not backend.capabilities.server_wakeup:
        started = time.monotonic()
        assert await backend.wait(0.2) is False  # polls: the default sleep
        assert time.monotonic() - started >= 0.15
        return
    await backend.wait(0.0)  # start listening; forget what came before
    await backend.wait(0.0)
    conn = await oenv_async.connect()

    waiter = flow_async.spawn(lambda: backend.wait(30.0))
    await flow_async.sleep(0.2)  # the waiter is waiting
    assert not flow_async.done(waiter)
    await outbox.add(conn, queue="orders", body={"n": 1})
    await flow_async.sleep(0.2)
    assert not flow_async.done(waiter)  # not before the commit
    await oenv_async.commit(conn)
    committed_at = time.monotonic()
    assert await flow_async.result(waiter, 10) is True
    assert time.monotonic() - committed_at < 10
    assert len(await backend.claim(RELAY_A, 10, 30.0)) == 1

    await backend.wait(0.0)
    await backend.wait(0.0)
    waiter = flow_async.spawn(lambda: backend.wait(1.0))
    await flow_async.sleep(0.1)
    await outbox.add(conn, queue="orders", body={"n": 2})
    await oenv_async.rollback(conn)
    assert await flow_async.result(waiter, 10) is False


async def test_a_relays_first_wait_hears_of_rows_committed_after_its_first_claim(
    oenv_async: AsyncOutboxEnv,
) -> None:
    outbox = await _installed(oenv_async)
    relay = oenv_async.outbox().backend  # a fresh backend, as a starting relay has
    if not relay.capabilities.server_wakeup:
        return  # it polls (see the test above)
    assert await relay.claim(RELAY_A, 10, 30.0) == []
    await _add_committed(oenv_async, outbox, [{"n": 1}])  # between the claim and the wait
    assert await relay.wait(30.0) is True
    assert len(await relay.claim(RELAY_A, 10, 30.0)) == 1


# -- every driver ----------------------------------------------------------------------------

if ASYNC:

    @pytest.mark.timeout(300)
    async def test_add_on_every_driver_commits_and_rolls_back_with_the_caller(
        oenv_async: AsyncOutboxEnv,
    ) -> None:
        """``add`` on each connection kind the dialect has (sync and asyncio drivers,
        SQLAlchemy connections and sessions): committed rows are claimable, rolled-back
        ones never are."""
        drivers = [f for f in _sqldrivers.FLAVOURS if f.dialect == oenv_async.dialect]
        assert drivers
        for kind in drivers:
            flavour = kind(oenv_async.sqlite_path)
            flavour_outbox: Any = (
                oenv_async.outbox()
                if flavour.is_async
                else jobfence.Outbox(oenv_async.url, table=oenv_async.table)
            )
            conn = await flavour.connect()
            try:
                if flavour.is_async:
                    await flavour_outbox.install(conn)
                    await flavour.commit(conn)
                    kept = await flavour_outbox.add(
                        conn, queue="orders", body={"driver": kind.id}, key=kind.id
                    )
                    await flavour.commit(conn)
                    await flavour_outbox.add(conn, queue="orders", body={"gone": kind.id})
                    await flavour.rollback(conn)
                else:
                    flavour_outbox.install(conn)
                    await flavour.commit(conn)
                    kept = flavour_outbox.add(
                        conn, queue="orders", body={"driver": kind.id}, key=kind.id
                    )
                    await flavour.commit(conn)
                    flavour_outbox.add(conn, queue="orders", body={"gone": kind.id})
                    await flavour.rollback(conn)
            finally:
                await flavour.close(conn)
                if not flavour.is_async:
                    flavour_outbox.close()
            rows = await oenv_async.outbox().backend.claim(RELAY_A, 10, 30.0)
            assert [(r.id, json.loads(r.body), r.key) for r in rows] == [
                (kept, {"driver": kind.id}, kind.id)
            ], kind.id
