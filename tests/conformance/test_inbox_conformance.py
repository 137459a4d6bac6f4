"""One conformance suite for every inbox backend, sync and async.

Each test runs on every spec of ``specs_for("inbox")`` (memory, sqlite, redis, postgres,
mysql, etcd), on a table of its own that is removed afterwards. A claim's expiry is awaited as
a state (:func:`wait_until_stuck`, :func:`wait_for_new`), with deadlines that grow by the
spec's ``min_claim_ttl``: on etcd the server ends a claim with its lease, of whole seconds,
at least 2, however short the claim's ttl. The specs are written once, in
``test_inbox_conformance.py``, over ``AsyncInbox``; ``test_inbox_conformance_sync.py`` is
generated from it by ``tools/conformance_twins.py`` and runs them over ``Inbox`` as plain
sync code on the test's own thread. Code that differs between the flavours sits in
``if ASYNC:`` / ``else:`` branches.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import jobfence
from jobfence import ClaimLost, ClaimState, FingerprintMismatch, InboxError
from jobfence._core.flavour import ASYNC
from jobfence._core.hooks import set_hook
from tests.conformance import flow_async
from tests.conformance._inbox_workers import claim_and_hang, claim_worker
from tests.conformance.conftest import AsyncInboxEnv
from tests.conformance.specs import FLAVOURS, INBOX, Spec, spec_params

if ASYNC:
    import asyncio

FORK = multiprocessing.get_context("fork")
#: the specs whose claims outlive the process that made them (a second process sees them)
CROSS_PROCESS = spec_params(INBOX, lambda s: s.cross_process)


async def wait_for_new(inbox: Any, key: str, *, within: float, **kw: Any) -> Any:
    """Claim ``key`` until the claim is NEW (the previous claim's ttl ran out)."""
    deadline = time.monotonic() + within
    while True:
        claim = await inbox.claim(key, **kw)
        if claim.state is ClaimState.NEW or time.monotonic() > deadline:
            return claim
        await flow_async.sleep(0.05)


async def wait_until_stuck(inbox: Any, key: str, *, within: float = 15.0) -> jobfence.ClaimInfo:
    """Read ``key``'s record until its deadline has passed by the server's clock."""
    deadline = time.monotonic() + within
    while True:
        info = await inbox.claim_info(key)
        assert info is not None
        if info.stuck or time.monotonic() > deadline:
            return info
        await flow_async.sleep(0.05)


async def wait_until_ended(inbox: Any, keys: list[str], *, within: float = 15.0) -> None:
    """Read the records of ``keys`` until each is gone or has no time left by the server's
    clock (a claim past its deadline, a completed record past its retention)."""
    deadline = time.monotonic() + within
    for key in keys:
        while True:
            info = await inbox.claim_info(key)
            if info is None or info.expires_in <= 0:
                break
            assert time.monotonic() < deadline, f"{key!r} never ended: {info}"
            await flow_async.sleep(0.05)


async def test_first_claim_is_new_and_a_duplicate_sees_it_in_progress(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    first = await inbox.claim("order:1", ttl=30)
    assert first.state is ClaimState.NEW
    assert first.attempt == 1
    assert first.owned
    second = await inbox.claim("order:1", ttl=30)
    assert second.state is ClaimState.IN_PROGRESS
    assert second.owner == first.owner and second.owner is not None
    assert second.attempt == 1
    assert second.expires_at == first.expires_at
    assert second.result is None
    with pytest.raises(InboxError):
        await second.complete("not mine")
    # another key is independent
    assert (await inbox.claim("order:2")).state is ClaimState.NEW


async def test_result_is_replayed_after_completion(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("order:7", fingerprint="abc")
    result = {"charged": 1250, "items": ["a", "b"], "note": "naïve ✓"}
    await claim.complete(result)
    assert claim.state is ClaimState.COMPLETED
    again = await inbox.claim("order:7", fingerprint="abc")
    assert again.state is ClaimState.COMPLETED
    assert again.result == result
    assert again.attempt == 1
    # another client sees the same record
    other = ienv_async.inbox()
    replay = await other.claim("order:7")
    assert replay.state is ClaimState.COMPLETED and replay.result == result
    if ASYNC:  # and a client of the other flavour
        sync = jobfence.Inbox(ienv_async.url, table=ienv_async.table)
        try:
            replay = await asyncio.to_thread(sync.claim, "order:7")
            assert replay.state is ClaimState.COMPLETED and replay.result == result
        finally:
            await asyncio.to_thread(sync.close)


async def test_none_is_a_result_too(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    await (await inbox.claim("k")).complete()
    replay = await inbox.claim("k")
    assert replay.state is ClaimState.COMPLETED and replay.result is None


async def test_fingerprint_mismatch_is_never_a_silent_replay(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("pay:1", fingerprint="digest-A")
    with pytest.raises(FingerprintMismatch) as info:
        await inbox.claim("pay:1", fingerprint="digest-B")
    assert info.value.key == "pay:1"
    await claim.complete("paid A")
    with pytest.raises(FingerprintMismatch):
        await inbox.claim("pay:1", fingerprint="digest-B")
    same = await inbox.claim("pay:1", fingerprint="digest-A")
    assert same.state is ClaimState.COMPLETED and same.result == "paid A"
    # no fingerprint given: nothing to compare
    assert (await inbox.claim("pay:1")).result == "paid A"


async def test_release_lets_a_redelivery_retry(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    first = await inbox.claim("msg:1", ttl=60)
    assert await first.release() is True
    assert await first.release() is False
    retry = await inbox.claim("msg:1", ttl=60)
    assert retry.state is ClaimState.NEW
    assert retry.attempt == 2
    with pytest.raises(ClaimLost):
        await first.complete("too late")
    await retry.complete("done")
    assert (await inbox.claim("msg:1")).result == "done"


async def test_expired_claim_is_taken_over_and_the_old_owner_cannot_complete(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    stale = await inbox.claim("job:1", ttl=0.3)
    assert stale.state is ClaimState.NEW
    fresh = await wait_for_new(inbox, "job:1", within=5 + 2 * ienv_async.spec.min_claim_ttl, ttl=60)
    assert fresh.state is ClaimState.NEW
    assert fresh.attempt == 2
    with pytest.raises(ClaimLost):
        await stale.complete("stale result")
    assert await stale.release() is False
    await fresh.complete("fresh result")
    replay = await inbox.claim("job:1")
    assert replay.state is ClaimState.COMPLETED
    assert replay.result == "fresh result"
    assert replay.attempt == 2


async def test_takeover_with_another_fingerprint_is_a_mismatch(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    await inbox.claim("job:2", ttl=0.2, fingerprint="one")
    await wait_until_stuck(inbox, "job:2")
    with pytest.raises(FingerprintMismatch):
        await inbox.claim("job:2", fingerprint="two")
    taken = await inbox.claim("job:2", fingerprint="one")
    assert taken.state is ClaimState.NEW and taken.attempt == 2


async def test_a_takeover_without_a_fingerprint_keeps_the_keys(ienv_async: AsyncInboxEnv) -> None:
    """The stored fingerprint is the payload the key was first claimed with: a redelivery
    that takes the key over without one must not erase it (found in review)."""
    inbox = ienv_async.inbox()
    first = await inbox.claim("pay:9", fingerprint="digest-A", ttl=60)
    assert await first.release() is True
    taken = await inbox.claim("pay:9", ttl=60)  # no fingerprint
    assert taken.state is ClaimState.NEW and taken.attempt == 2
    assert taken.fingerprint == "digest-A"
    await taken.complete("paid A")
    with pytest.raises(FingerprintMismatch):
        await inbox.claim("pay:9", fingerprint="digest-B")


async def test_a_claim_completes_once(ienv_async: AsyncInboxEnv) -> None:
    """A second ``complete`` must not overwrite a result duplicates may have replayed."""
    inbox = ienv_async.inbox()
    claim = await inbox.claim("order:once")
    await claim.complete({"x": 1})
    with pytest.raises(InboxError):
        await claim.complete({"x": 2})
    replay = await inbox.claim("order:once")
    assert replay.state is ClaimState.COMPLETED and replay.result == {"x": 1}


async def test_purge_removes_expired_completed_and_abandoned_records_only(
    ienv_async: AsyncInboxEnv,
) -> None:
    short = ienv_async.inbox(retention=0.2)
    long = ienv_async.inbox(retention=3600)
    abandoned = await short.claim("d", ttl=0.05)  # its worker "died"
    assert abandoned.state is ClaimState.NEW
    await (await short.claim("a")).complete("expires soon")
    await flow_async.sleep(0.5)  # past a's retention, and d's deadline + retention
    await wait_until_ended(short, ["a", "d"])  # and past where the server ends them
    await (await long.claim("c")).complete("kept")
    live = await long.claim("b", ttl=60)
    assert live.state is ClaimState.NEW
    ended = [info.key for info in await short.claims() if info.stuck]
    purged = await short.purge()
    if short.capabilities.native_expiry:
        # the server expired the records by itself; what it keeps of a claim that ended
        # (etcd: the last attempt's number, listed as a stuck claim) purge deletes
        assert ended in ([], ["d"])
        assert purged == len(ended)
    else:
        assert purged == 2
    assert (await long.purge()) == 0  # nothing else is due
    kept = await long.claim("c")
    assert kept.state is ClaimState.COMPLETED and kept.result == "kept"
    busy = await long.claim("b")
    assert busy.state is ClaimState.IN_PROGRESS and busy.owner == live.owner
    gone_a = await long.claim("a")
    assert gone_a.state is ClaimState.NEW and gone_a.attempt == 1
    gone_d = await long.claim("d")  # a takeover would say attempt 2: the record was removed
    assert gone_d.state is ClaimState.NEW and gone_d.attempt == 1


async def test_drop_removes_the_table_and_every_record(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    await (await inbox.claim("done")).complete("kept until drop")
    held = await inbox.claim("held", ttl=60)
    assert held.state is ClaimState.NEW
    await inbox.drop()
    # the next call installs the table again, empty
    again = await inbox.claim("done")
    assert again.state is ClaimState.NEW and again.attempt == 1 and again.result is None
    fresh = await inbox.claim("held", ttl=60)
    assert fresh.state is ClaimState.NEW and fresh.attempt == 1


async def test_serializer_is_pluggable(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox(serializer=pickle)
    await (await inbox.claim("p")).complete({1, 2, 3})
    assert (await inbox.claim("p")).result == {1, 2, 3}


async def test_hooks_run_before_each_backend_call(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    seen: list[tuple[str, Any]] = []

    def hook(point: str, **info: Any) -> None:
        if point.startswith("inbox."):
            seen.append((point, info.get("key")))
            if point == "inbox.claim" and info.get("key") == "boom":
                raise RuntimeError("injected before the claim")

    old = set_hook(hook)
    try:
        claim = await inbox.claim("h")
        await claim.release()
        claim = await inbox.claim("h")
        await claim.complete(1)
        with pytest.raises(jobfence.BackendError) as info:  # as a driver error would
            await inbox.claim("boom")
        assert isinstance(info.value.__cause__, RuntimeError)
    finally:
        set_hook(old)
    assert seen == [
        ("inbox.claim", "h"),
        ("inbox.release", "h"),
        ("inbox.claim", "h"),
        ("inbox.complete", "h"),
        ("inbox.claim", "boom"),
        ("inbox.abandon", "boom"),  # the interrupted claim gives back what it may hold
    ]
    # the failing hook ran BEFORE the I/O: the key was never claimed
    assert (await inbox.claim("boom")).state is ClaimState.NEW


async def test_claim_as_context_manager_releases_on_error(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("ctx", ttl=60)
    with pytest.raises(ValueError):
        async with claim:
            raise ValueError("work failed")
    retry = await inbox.claim("ctx", ttl=60)
    assert retry.state is ClaimState.NEW and retry.attempt == 2


# -- extend and renew ---------------------------------------------------------------------


async def test_extend_keeps_a_claim_past_its_ttl_and_is_owner_checked(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("ext:1", ttl=0.5)
    owner = claim.owner
    assert await inbox.backend.extend("ext:1", owner, 30.0) is True
    # past the claim's first deadline, and where the server would have ended it
    await flow_async.sleep(0.8 + ienv_async.spec.min_claim_ttl)
    busy = await inbox.claim("ext:1")
    assert busy.state is ClaimState.IN_PROGRESS and busy.owner == owner
    assert busy.expires_at is not None and claim.expires_at is not None
    assert busy.expires_at > claim.expires_at  # the backend moved the deadline
    assert await inbox.backend.extend("ext:1", "another-owner", 30.0) is False
    assert await inbox.backend.extend("ext:unknown", owner, 30.0) is False
    await claim.complete("done")  # the backend's owner check, whatever the local deadline
    assert await inbox.backend.extend("ext:1", owner, 30.0) is False  # completed
    replay = await inbox.claim("ext:1")
    assert replay.state is ClaimState.COMPLETED and replay.result == "done"


async def test_an_expired_or_released_claim_is_never_extended(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    expired = await inbox.claim("ext:2", ttl=0.2)
    await wait_until_stuck(inbox, "ext:2")
    assert await inbox.backend.extend("ext:2", expired.owner, 30.0) is False
    taken = await inbox.claim("ext:2", ttl=30)
    assert taken.state is ClaimState.NEW and taken.attempt == 2
    released = await inbox.claim("ext:3", ttl=30)
    owner = released.owner
    assert await released.release() is True
    assert await inbox.backend.extend("ext:3", owner, 30.0) is False
    again = await inbox.claim("ext:3")
    assert again.state is ClaimState.NEW and again.attempt == 2


async def test_renew_extends_many_claims_in_one_call_with_one_answer_each(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    expired = await inbox.claim("ren:expired", ttl=0.1)
    await wait_until_stuck(inbox, "ren:expired")
    live = [await inbox.claim(key, ttl=0.6) for key in ("ren:0", "ren:ü✓", "ren:2")]
    gone = await inbox.claim("ren:released", ttl=30)
    gone_owner = gone.owner
    assert await gone.release() is True
    items = [(c.key, c.owner, 30.0) for c in live]
    items.insert(1, ("ren:released", gone_owner, 30.0))
    items += [
        ("ren:0", "another-owner", 30.0),
        ("ren:expired", expired.owner, 30.0),
        ("ren:unknown", "nobody", 30.0),
    ]
    answers = await inbox.backend.renew(items)
    assert answers == [True, False, True, True, False, False, False]
    assert await inbox.backend.renew([]) == []
    # past the live claims' first deadline, and where the server would have ended them
    await flow_async.sleep(0.7 + ienv_async.spec.min_claim_ttl)
    for claim in live:
        busy = await inbox.claim(claim.key)
        assert busy.state is ClaimState.IN_PROGRESS and busy.owner == claim.owner
    taken = await inbox.claim("ren:expired")
    assert taken.state is ClaimState.NEW and taken.attempt == 2


async def test_claim_many_answers_each_key_as_a_claim_alone_would(
    ienv_async: AsyncInboxEnv,
) -> None:
    """The batch verb behind the group commit: one record per item, in order, each what
    ``claim`` would have answered for that key alone (new, duplicate, in progress, takeover,
    fingerprint refusal), whether or not the backend sends the batch in one round trip."""
    inbox = ienv_async.inbox()
    done = await inbox.claim("many:done", fingerprint="fp-a")
    await done.complete({"paid": 5})
    busy = await inbox.claim("many:busy", ttl=30)
    expired = await inbox.claim("many:expired", fingerprint="fp-x", ttl=0.1)
    mismatch = await inbox.claim("many:mismatch", fingerprint="fp-m", ttl=0.1)
    released = await inbox.claim("many:released", ttl=30)
    assert await released.release() is True
    for key in ("many:expired", "many:mismatch"):  # past their deadlines
        await wait_until_stuck(inbox, key)
    items = [
        ("many:new ü✓", "owner-1", "fp-n", 30.0),
        ("many:done", "owner-2", "fp-a", 30.0),
        ("many:busy", "owner-3", None, 30.0),
        ("many:expired", "owner-4", None, 30.0),
        ("many:mismatch", "owner-5", "fp-other", 30.0),
        ("many:released", "owner-6", None, 30.0),
    ]
    records = await inbox.backend.claim_many(items)
    # (a completed record's owner is not part of the answer: some backends keep the last one)
    got = [
        (
            r.mine,
            r.state,
            r.attempt,
            r.owner if r.state is ClaimState.IN_PROGRESS else "-",
            r.fingerprint,
        )
        for r in records
    ]
    assert got == [
        (True, ClaimState.IN_PROGRESS, 1, "owner-1", "fp-n"),
        (False, ClaimState.COMPLETED, 1, "-", "fp-a"),
        (False, ClaimState.IN_PROGRESS, 1, busy.owner, None),
        (True, ClaimState.IN_PROGRESS, 2, "owner-4", "fp-x"),  # a takeover keeps the key's
        (False, ClaimState.IN_PROGRESS, 1, mismatch.owner, "fp-m"),
        (True, ClaimState.IN_PROGRESS, 2, "owner-6", None),
    ]
    assert inbox.serializer.loads(records[1].result) == {"paid": 5}
    assert await inbox.backend.claim_many([]) == []
    # what the batch took is held: a claim of its own sees the batch's owner
    again = await inbox.claim("many:new ü✓")
    assert again.state is ClaimState.IN_PROGRESS and again.owner == "owner-1"
    assert expired.owner != "owner-4"


async def test_complete_many_is_owner_checked_per_key(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claims = [await inbox.claim(f"cm:{i}", ttl=30) for i in range(3)]
    data = [inbox.serializer.dumps({"n": i}) for i in range(4)]
    data = [d if isinstance(d, bytes) else d.encode() for d in data]
    items = [
        ("cm:0", claims[0].owner, data[0]),
        ("cm:1", "not-the-owner", data[1]),
        ("cm:2", claims[2].owner, data[2]),
        ("cm:unknown", "nobody", data[3]),
    ]
    assert await inbox.backend.complete_many(items, 60.0) == [True, False, True, False]
    assert await inbox.backend.complete_many([], 60.0) == []
    for i, state in ((0, ClaimState.COMPLETED), (1, ClaimState.IN_PROGRESS)):
        seen = await inbox.claim(f"cm:{i}")
        assert seen.state is state
    replay = await inbox.claim("cm:2")
    assert replay.state is ClaimState.COMPLETED and replay.result == {"n": 2}
    assert await inbox.claim_info("cm:unknown") is None


async def test_claim_extend_moves_the_deadline_and_reports_a_lost_claim(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("cext:1", ttl=1.5)  # room for the extend on a loaded machine
    assert not claim.renews
    await claim.extend(30)
    await flow_async.sleep(1.8 + ienv_async.spec.min_claim_ttl)
    assert not claim.lost
    claim.check()
    busy = await inbox.claim("cext:1")
    assert busy.state is ClaimState.IN_PROGRESS and busy.owner == claim.owner
    await claim.complete("ok")
    with pytest.raises(InboxError):
        await claim.extend()
    with pytest.raises(InboxError):
        await busy.extend()  # never ours
    # dropped behind its back: extend finds out, the claim is lost, on_lost runs
    gone = await inbox.claim("cext:2", ttl=30)
    told: list[Any] = []
    gone.on_lost(told.append)
    assert await inbox.backend.release("cext:2", gone.owner) is True
    with pytest.raises(ClaimLost):
        await gone.extend()
    assert gone.lost and told == [gone]
    with pytest.raises(ClaimLost):
        gone.check()
    # a claim past its ttl is lost as far as its holder knows
    stale = await inbox.claim("cext:3", ttl=0.2)
    await flow_async.sleep(0.3)
    assert stale.lost
    with pytest.raises(ClaimLost):
        await stale.extend(30)


async def test_a_renewed_claim_outlives_its_ttl_until_completed(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    # ttl 2: three renewal chances a ttl, and room for a slow round trip on a loaded machine
    claim = await inbox.claim("long:1", ttl=2.0, renew=True)
    assert claim.renews and claim.state is ClaimState.NEW
    await flow_async.sleep(2.8)  # the work outlasts the ttl
    assert not claim.lost
    busy = await inbox.claim("long:1")
    assert busy.state is ClaimState.IN_PROGRESS and busy.owner == claim.owner
    await claim.complete("done")
    replay = await inbox.claim("long:1")
    assert replay.state is ClaimState.COMPLETED and replay.result == "done"


async def test_a_renewed_claim_taken_away_is_reported_lost(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("long:2", ttl=0.6, renew=True)
    lost = threading.Event()
    claim.on_lost(lambda _claim: lost.set())
    assert await inbox.backend.release("long:2", claim.owner) is True  # behind its back
    assert await flow_async.wait_event(lost, 5), "the renewer did not find the claim gone"
    assert claim.lost
    with pytest.raises(ClaimLost):
        claim.check()
    with pytest.raises(ClaimLost):
        await claim.complete("too late")


async def test_close_gives_back_the_renewed_claims_and_tells_their_holders(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("long:3", ttl=30, renew=True)
    plain = await inbox.claim("long:4", ttl=30)
    await inbox.close()
    assert claim.lost
    with pytest.raises(ClaimLost, match="Inbox was closed"):
        claim.check()
    other = ienv_async.inbox()
    redelivery = await other.claim("long:3")  # not after 30 s: now
    assert redelivery.state is ClaimState.NEW and redelivery.attempt == 2
    busy = await other.claim("long:4")  # a claim without renewal is left to its ttl
    assert busy.state is ClaimState.IN_PROGRESS and busy.owner == plain.owner


# -- many processes -----------------------------------------------------------------------


# -- the operator's reads: claims(), claim_info(), forget() ---------------------------------


async def test_claims_lists_by_state_and_prefix_sorted_by_key(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    for key in ("b:2", "a:1", "b:1", "c"):
        claim = await inbox.claim(key, ttl=60, fingerprint="fp-" + key)
        assert claim.state is ClaimState.NEW
        if key in ("a:1", "b:2"):
            await claim.complete({"done": key})
    everything = await inbox.claims()
    assert [i.key for i in everything] == ["a:1", "b:1", "b:2", "c"]
    by_key = {i.key: i for i in everything}
    assert by_key["a:1"].state is ClaimState.COMPLETED
    assert by_key["b:1"].state is ClaimState.IN_PROGRESS
    assert by_key["b:1"].owner is not None and by_key["b:1"].owner.count(":") >= 2
    assert by_key["b:1"].fingerprint == "fp-b:1" and by_key["b:1"].attempt == 1
    assert all(isinstance(i, jobfence.ClaimInfo) for i in everything)
    assert [i.key for i in await inbox.claims(state=ClaimState.IN_PROGRESS)] == ["b:1", "c"]
    assert [i.key for i in await inbox.claims(state="completed")] == ["a:1", "b:2"]
    assert [i.key for i in await inbox.claims(prefix="b:")] == ["b:1", "b:2"]
    assert [i.key for i in await inbox.claims(prefix="b:", state="in_progress")] == ["b:1"]
    assert [i.key for i in await inbox.claims(limit=2)] == ["a:1", "b:1"]
    assert [i.key for i in await inbox.claims(state="completed", limit=1)] == ["a:1"]
    assert await inbox.claims(prefix="z") == []
    assert await inbox.claims(prefix="B:") == []  # case-sensitive


async def test_claims_prefix_is_matched_literally_and_sorted_by_code_point(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    keys = ["a%_*?[x]", "a%_*?[", "aXY*?[", "a%b", "a_c", "a\\d", "a*", "ab", "é:1", "z", "Ω"]
    for key in keys:
        assert (await inbox.claim(key, ttl=60)).state is ClaimState.NEW
    assert [i.key for i in await inbox.claims()] == sorted(keys)
    assert [i.key for i in await inbox.claims(prefix="a%_*?[")] == ["a%_*?[", "a%_*?[x]"]
    assert [i.key for i in await inbox.claims(prefix="a%")] == ["a%_*?[", "a%_*?[x]", "a%b"]
    assert [i.key for i in await inbox.claims(prefix="a_")] == ["a_c"]
    assert [i.key for i in await inbox.claims(prefix="a*")] == ["a*"]
    assert [i.key for i in await inbox.claims(prefix="a\\")] == ["a\\d"]
    assert [i.key for i in await inbox.claims(prefix="é")] == ["é:1"]
    assert await inbox.claims(prefix="a?") == []
    assert await inbox.claims(prefix="a[") == []


async def test_claim_info_reports_the_clock_and_a_missing_key_is_none(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox(retention=3600)
    assert await inbox.claim_info("nothing-here") is None
    live = await inbox.claim("live", ttl=30)
    info = await inbox.claim_info("live")
    assert info is not None and info.key == "live"
    assert info.state is ClaimState.IN_PROGRESS and info.owner == live.owner
    assert 15 < info.expires_in <= 30.5  # by the server's clock: generous slack
    assert not info.stuck
    assert info.claimed_at is not None and info.claimed_at.utcoffset() == timedelta(0)
    assert info.age is not None and -5 < info.age < 15
    await (await inbox.claim("done")).complete("x")
    done = await inbox.claim_info("done")
    assert done is not None and done.state is ClaimState.COMPLETED
    assert 3000 < done.expires_in <= 3600.5 and not done.stuck
    (listed,) = await inbox.claims(prefix="live")
    assert replace(listed, expires_in=0) == replace(info, expires_in=0)


async def test_an_expired_claim_is_stuck_and_a_takeover_counts_its_attempt(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    first = await inbox.claim("job", ttl=0.3)
    before = await inbox.claim_info("job")
    assert before is not None and before.expires_in > 0
    stuck = await wait_until_stuck(inbox, "job")
    assert stuck.stuck and stuck.expires_in <= 0 and stuck.owner == first.owner
    assert [i.key for i in await inbox.claims(state="in_progress") if i.stuck] == ["job"]
    second = await inbox.claim("job", ttl=30)
    assert second.state is ClaimState.NEW and second.attempt == 2
    after = await inbox.claim_info("job")
    assert after is not None and after.attempt == 2 and after.owner == second.owner
    assert not after.stuck and after.expires_in > 15
    assert after.claimed_at is not None and before.claimed_at is not None
    assert after.claimed_at > before.claimed_at


async def test_a_released_claim_has_no_owner_and_is_stuck(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    claim = await inbox.claim("r", ttl=60)
    assert await claim.release()
    info = await wait_until_stuck(inbox, "r")
    assert info.owner is None and info.stuck and info.attempt == 1


async def test_forget_deletes_a_record_whatever_its_state(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    held = await inbox.claim("held", ttl=60)
    await (await inbox.claim("done")).complete("stored")
    assert await inbox.forget("missing") is False
    assert await inbox.forget("held") is True
    assert await inbox.claim_info("held") is None
    assert await inbox.forget("held") is False
    # the owner of the forgotten claim has lost it: nothing is stored
    with pytest.raises(ClaimLost):
        await held.complete("too late")
    assert await inbox.claim_info("held") is None
    assert await inbox.forget("done") is True
    again = await inbox.claim("done")
    assert again.state is ClaimState.NEW and again.attempt == 1 and again.result is None
    fresh = await inbox.claim("held", ttl=60)
    assert fresh.state is ClaimState.NEW and fresh.attempt == 1
    assert [i.key for i in await inbox.claims()] == ["done", "held"]


async def test_a_forgotten_claim_reclaimed_by_another_worker_stays_theirs(
    ienv_async: AsyncInboxEnv,
) -> None:
    inbox = ienv_async.inbox()
    old = await inbox.claim("k", ttl=60)
    assert await inbox.forget("k")
    new = await inbox.claim("k", ttl=60)
    assert new.state is ClaimState.NEW
    with pytest.raises(ClaimLost):
        await old.complete("old worker")
    with pytest.raises(ClaimLost):
        await old.extend(30)
    info = await inbox.claim_info("k")
    assert info is not None and info.owner == new.owner and info.state is ClaimState.IN_PROGRESS
    await new.complete("new worker")
    assert (await inbox.claim("k")).result == "new worker"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"state": "new"}, "state"),
        ({"state": ClaimState.NEW}, "state"),
        ({"state": 3}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 100_001}, "limit"),
        ({"limit": True}, "limit"),
        ({"prefix": None}, "prefix"),
        ({"prefix": "x" * 1025}, "prefix"),
    ],
)
async def test_claims_validates_its_arguments(
    ienv_async: AsyncInboxEnv, kwargs: dict[str, Any], argument: str
) -> None:
    inbox = ienv_async.inbox()
    with pytest.raises(jobfence.ConfigurationError) as info:
        await inbox.claims(**kwargs)
    assert info.value.argument == argument
    with pytest.raises(jobfence.ConfigurationError) as info:
        await inbox.claim_info("")
    assert info.value.argument == "key"
    with pytest.raises(jobfence.ConfigurationError) as info:
        await inbox.forget("")
    assert info.value.argument == "key"


async def test_the_operator_reads_go_through_their_hook_points(ienv_async: AsyncInboxEnv) -> None:
    inbox = ienv_async.inbox()
    seen: list[tuple[str, Any]] = []

    def hook(point: str, **info: Any) -> None:
        if point in ("inbox.claims", "inbox.claim_info", "inbox.forget"):
            seen.append((point, info.get("key")))
            if info.get("key") == "boom":
                raise RuntimeError("injected")

    old = set_hook(hook)
    try:
        await inbox.claims(prefix="p:")
        await inbox.claim_info("p:1")
        await inbox.forget("p:1")
        with pytest.raises(jobfence.BackendError):
            await inbox.forget("boom")
    finally:
        set_hook(old)
    assert seen == [
        ("inbox.claims", "p:"),
        ("inbox.claim_info", "p:1"),
        ("inbox.forget", "p:1"),
        ("inbox.forget", "boom"),
    ]


# the many-process tests run both flavours by their own parametrisation, from this file
if ASYNC:

    @pytest.mark.slow
    @pytest.mark.parametrize("flavour", FLAVOURS)
    @pytest.mark.parametrize("spec", spec_params(INBOX))
    def test_16_concurrent_claimants_exactly_one_is_new(
        spec: Spec, flavour: str, tmp_path: Path
    ) -> None:
        env = AsyncInboxEnv(spec, tmp_path)
        key = "contended:" + uuid.uuid4().hex[:12]
        results: list[tuple[str, str | None, int]] = []
        try:
            if not jobfence.Inbox(env.url, table=env.table).capabilities.cross_process:
                # one process holds the store: 16 threads claim at the same moment instead
                inbox = jobfence.Inbox(env.url, table=env.table)
                barrier = threading.Barrier(16)
                lock = threading.Lock()

                def run() -> None:
                    barrier.wait()
                    c = inbox.claim(key, ttl=60)
                    with lock:
                        results.append((c.state.value, c.owner, c.attempt))

                threads = [threading.Thread(target=run) for _ in range(16)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
            else:
                barrier = FORK.Barrier(16)
                out = FORK.Queue()
                procs = [
                    FORK.Process(
                        target=claim_worker,
                        args=(env.url, env.table, key, flavour == "sync", barrier, out),
                    )
                    for _ in range(16)
                ]
                for p in procs:
                    p.start()
                results = [out.get(timeout=60) for _ in procs]
                for p in procs:
                    p.join(10)
            errors = [r for r in results if r[0] == "error"]
            assert not errors, errors
            assert len(results) == 16
            states = sorted(r[0] for r in results)
            assert states.count("new") == 1, states
            assert states.count("in_progress") == 15, states
            owners = {r[1] for r in results}
            assert len(owners) == 1, "every duplicate must name the one winner as the owner"
            assert {r[2] for r in results} == {1}
        finally:
            asyncio.run(env.aclose())

    @pytest.mark.slow
    @pytest.mark.parametrize("flavour", FLAVOURS)
    @pytest.mark.parametrize("spec", CROSS_PROCESS)
    def test_kill_9_mid_work_then_takeover_after_ttl(
        spec: Spec, flavour: str, tmp_path: Path
    ) -> None:
        env = AsyncInboxEnv(spec, tmp_path)
        key = "crash:1"
        out = FORK.Queue()
        child = FORK.Process(
            target=claim_and_hang, args=(env.url, env.table, key, 1.0, flavour == "sync", out)
        )
        child.start()
        try:
            state, owner, attempt = out.get(timeout=30)
            assert (state, attempt) == ("new", 1), owner
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(10)
            assert child.exitcode == -signal.SIGKILL

            async def after_crash() -> None:
                inbox = env.inbox()
                blocked = await inbox.claim(key)
                # the dead worker's claim still counts until its ttl runs out
                if blocked.state is ClaimState.IN_PROGRESS:
                    assert blocked.owner == owner
                taken = await wait_for_new(inbox, key, within=10, ttl=30)
                assert taken.state is ClaimState.NEW
                assert taken.attempt == 2
                await taken.complete("recovered")
                replay = await inbox.claim(key)
                assert replay.result == "recovered" and replay.attempt == 2

            asyncio.run(after_crash())
        finally:
            if child.is_alive():
                child.kill()
            asyncio.run(env.aclose())
