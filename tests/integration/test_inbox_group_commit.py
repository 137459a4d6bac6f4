"""AsyncInbox's group commit on the backends that take a batch in one round trip (PostgreSQL,
SQLite, Redis): claims and completions made while one is under way go together in the next
round trip, and each caller still gets exactly the answer a claim of its own would give.

Round trips are counted by wrapping the real backend's verbs (the calls still go to the real
server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import jobfence
from jobfence import BackendError, ClaimInProgress, ClaimState, FingerprintMismatch
from tests.conformance.specs import INBOX, Spec, inbox_table, new_namespace, spec_params
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL, REDIS_URL

#: each fixture inbox's URL (a second client of the same store opens it again)
URLS: dict[Any, str] = {}
BATCHING = spec_params(INBOX, lambda s: s.id in ("postgres", "sqlite", "redis"))


class Counted:
    """The backend's claim/complete verbs, counted: round trips, and the keys of each batch
    (which must be distinct)."""

    def __init__(self, inbox: jobfence.AsyncInbox) -> None:
        self.calls: dict[str, list[list[str]]] = {"claim": [], "complete": []}
        backend = inbox.backend
        for verb, many in (("claim", "claim_many"), ("complete", "complete_many")):
            self._wrap(backend, verb, verb, lambda args: [args[0]])
            self._wrap(backend, many, verb, lambda args: [item[0] for item in args[0]])

    def _wrap(self, backend: Any, name: str, family: str, keys_of: Any) -> None:
        real = getattr(backend, name)

        async def counted(*args: Any) -> Any:
            keys = keys_of(args)
            assert len(set(keys)) == len(keys), f"a batch with one key twice: {keys}"
            self.calls[family].append(keys)
            return await real(*args)

        setattr(backend, name, counted)

    def trips(self, family: str) -> int:
        return len(self.calls[family])

    def items(self, family: str) -> int:
        return sum(len(keys) for keys in self.calls[family])


@pytest.fixture(params=BATCHING)
async def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    spec: Spec = request.param
    url = spec.make_url(tmp_path)
    namespace = new_namespace()
    box = jobfence.AsyncInbox(url, table=inbox_table(namespace))
    URLS[box] = url
    assert box.backend.batches
    await box.install()
    try:
        yield box
    finally:
        await box.drop()
        await box.close()
        spec.cleanup(url, namespace)


async def test_concurrent_claims_and_completions_share_round_trips(inbox: Any) -> None:
    counted = Counted(inbox)
    claims = await asyncio.gather(*(inbox.claim(f"gc:{i}", ttl=30) for i in range(8)))
    assert [c.state for c in claims] == [ClaimState.NEW] * 8
    assert len({c.owner for c in claims}) == 8
    assert counted.items("claim") == 8 and counted.trips("claim") <= 2, counted.calls
    await asyncio.gather(*(c.complete({"i": i}) for i, c in enumerate(claims)))
    assert counted.items("complete") == 8 and counted.trips("complete") <= 2, counted.calls
    # each key kept its own result
    for i in range(8):
        replay = await inbox.claim(f"gc:{i}")
        assert replay.state is ClaimState.COMPLETED and replay.result == {"i": i}


async def test_one_key_claimed_many_times_at_once_has_exactly_one_winner(inbox: Any) -> None:
    counted = Counted(inbox)
    keys = ["dup"] * 5 + ["other"] * 3
    claims = await asyncio.gather(*(inbox.claim(key, ttl=30) for key in keys))
    for key in ("dup", "other"):
        mine = [c for c in claims if c.key == key]
        winners = [c for c in mine if c.state is ClaimState.NEW]
        assert len(winners) == 1, [c.state for c in mine]
        for loser in mine:
            if loser is not winners[0]:
                assert loser.state is ClaimState.IN_PROGRESS
                assert loser.owner == winners[0].owner
    assert counted.items("claim") == 8  # Counted checked that no batch held a key twice


async def test_a_refused_claim_in_a_batch_fails_only_its_own_caller(inbox: Any) -> None:
    first = await inbox.claim("fp-key", fingerprint="a")
    await first.complete("stored")
    outcomes = await asyncio.gather(
        inbox.claim("fp-key", fingerprint="b"),
        inbox.claim("fresh"),
        inbox.claim("fp-key", fingerprint="a"),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], FingerprintMismatch)
    assert outcomes[1].state is ClaimState.NEW
    assert outcomes[2].state is ClaimState.COMPLETED and outcomes[2].result == "stored"


async def test_guarded_calls_at_once_run_each_key_once(inbox: Any) -> None:
    runs: list[str] = []

    @jobfence.guarded(inbox=inbox, key="order:{n}")
    async def charge(n: int) -> dict[str, int]:
        runs.append(f"order:{n}")
        await asyncio.sleep(0)
        return {"charged": n}

    outcomes = await asyncio.gather(
        *(charge(n) for n in [*range(10), *range(10)]), return_exceptions=True
    )
    assert sorted(runs) == sorted(f"order:{n}" for n in range(10))
    for n, outcome in zip([*range(10), *range(10)], outcomes, strict=True):
        # a duplicate that came while the first ran is told so; one after it replays
        assert outcome == {"charged": n} or isinstance(outcome, ClaimInProgress), outcome
    again = await asyncio.gather(*(charge(n) for n in range(10)))
    assert again == [{"charged": n} for n in range(10)]
    assert len(runs) == 10


async def test_two_clients_batching_the_same_keys_in_opposite_orders_share_them_out(
    inbox: Any,
) -> None:
    """Two inboxes (two connection pools, as two worker processes would have) claim the same
    keys at once, in opposite orders, in batches: every key has exactly one winner, and no
    batch fails or falls back to one claim at a time (PostgreSQL's batches take their rows in
    key order, so two of them wait for each other rather than deadlock)."""
    other = jobfence.AsyncInbox(URLS[inbox], table=inbox.table)
    conflicts: list[BaseException] = []
    for box in (inbox, other):
        run = getattr(box.backend, "_run", None)
        if run is not None:

            async def watched(*args: Any, _run: Any = run) -> Any:
                try:
                    return await _run(*args)
                except Exception as exc:
                    conflicts.append(exc)
                    raise

            box.backend._run = watched
    try:
        keys = [f"both:{i:02d}" for i in range(64)]
        for rnd in range(10):
            names = [f"{k}:{rnd}" for k in keys]
            mine = [inbox.claim(k, ttl=30) for k in names]
            theirs = [other.claim(k, ttl=30) for k in reversed(names)]
            claims = await asyncio.gather(*mine, *theirs)
            by_key: dict[str, list[Any]] = {}
            for claim in claims:
                by_key.setdefault(claim.key, []).append(claim)
            for key, pair in by_key.items():
                states = sorted(c.state.value for c in pair)
                assert states == ["in_progress", "new"], (key, states)
        assert not conflicts, conflicts  # no batch deadlocked (or failed) and fell back
    finally:
        await other.close()


# -- cancellation and a broken link -----------------------------------------------------------


async def _wait_for_lock_wait(conn: psycopg.AsyncConnection[Any]) -> None:
    """Until a statement of another session waits on a lock (the blocked claim)."""
    for _ in range(500):
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        if row and row[0]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the claim never waited on the blocking transaction")


async def test_a_claim_cancelled_in_flight_gives_its_key_back_after_the_answer() -> None:
    """A claim whose batch is held up by a lock: cancelling its caller does not let the
    give-back (an owner-checked release) run before the claim itself. The caller waits for
    the answer, then gives the key back, so a redelivery takes it over at once instead of
    waiting out the claim's ttl; a claim cancelled before it was sent is never sent."""
    table = inbox_table(new_namespace())
    inbox = jobfence.AsyncInbox(POSTGRES_URL, table=table)
    await inbox.install()
    blocker = await psycopg.AsyncConnection.connect(POSTGRES_URL)
    watcher = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    try:
        # an uncommitted row for the key: the claim's upsert waits for this transaction
        await blocker.execute(
            f"INSERT INTO {table} (k, state, owner, attempt, expires_at) "
            "VALUES ('held', 'in_progress', 'someone', 1, now() - interval '1 hour')"
        )
        held = asyncio.ensure_future(inbox.claim("held", ttl=300))
        await _wait_for_lock_wait(watcher)
        never_sent = asyncio.ensure_future(inbox.claim("later", ttl=300))
        await asyncio.sleep(0)
        never_sent.cancel()
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await never_sent
        assert not held.done()  # waiting for the answer its claim is owed
        await blocker.rollback()  # the claim now takes the key (a new row)...
        with pytest.raises(asyncio.CancelledError):
            await held
        # ...and its cancelled caller gave it back: the next claim takes it over at once
        again = await inbox.claim("held", ttl=300)
        assert again.state is ClaimState.NEW and again.attempt == 2
        assert await inbox.claim_info("later") is None
    finally:
        await blocker.close()
        await watcher.close()
        await inbox.drop()
        await inbox.close()


async def test_a_batch_cut_off_by_the_network_fails_each_caller_and_claims_nothing() -> None:
    namespace = new_namespace()
    port = urlsplit(REDIS_URL).port or 6379
    with FaultProxy(port) as proxy:
        inbox = jobfence.AsyncInbox(
            proxy.url_for(REDIS_URL, port), table=inbox_table(namespace), timeout=2
        )
        direct = jobfence.AsyncInbox(REDIS_URL, table=inbox_table(namespace))
        try:
            await inbox.install()
            assert (await inbox.claim("warm-up")).state is ClaimState.NEW
            proxy.stall()
            calls = [asyncio.ensure_future(inbox.claim(f"cut:{i}", ttl=300)) for i in range(3)]
            while inbox._claims.items < 4:  # the three are in one batch, held by the proxy
                await asyncio.sleep(0.005)
            proxy.refuse(True)
            proxy.reset()
            for call in calls:
                with pytest.raises(BackendError):
                    await call
            for i in range(3):  # nothing reached the server: each key is free
                assert (await direct.claim(f"cut:{i}")).state is ClaimState.NEW
        finally:
            proxy.refuse(False)
            proxy.resume()
            await inbox.close()
            await direct.drop()
            await direct.close()
