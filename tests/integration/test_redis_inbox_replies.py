"""The Redis inbox's claim replies: a key that was new comes back as its expiry alone (one
integer for the client to read instead of a seven-element array), and the record jobfence
builds from it is the one stored, as for every other outcome."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence import ClaimState
from tests.conformance.specs import inbox_table, new_namespace
from tests.servers import REDIS_URL


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    box = jobfence.Inbox(REDIS_URL, table=inbox_table(new_namespace()))
    try:
        yield box
    finally:
        box.drop()
        box.close()


def _raw_replies(inbox: jobfence.Inbox, items: list[tuple[str, str, str, int]]) -> list[Any]:
    """The claim script's replies for ``(key, owner, fingerprint, ttl_ms)`` items, unparsed."""
    backend: Any = inbox.backend
    keys = [backend._key(key) for key, _, _, _ in items]
    args: list[Any] = [int(backend.retention * 1000)]
    for _, owner, fingerprint, ttl_ms in items:
        args += [owner, fingerprint, ttl_ms]
    return list(backend._claim(keys, args))


def test_a_new_key_is_answered_with_its_expiry_alone(inbox: jobfence.Inbox) -> None:
    replies = _raw_replies(inbox, [("k", "host:1:a", "fp", 30_000)])
    assert len(replies) == 1 and isinstance(replies[0], int)
    # the same key again: a duplicate, answered with the whole record
    again = _raw_replies(inbox, [("k", "host:1:b", "fp", 30_000)])
    assert isinstance(again[0], list) and len(again[0]) == 7


def _matches_store(inbox: jobfence.Inbox, key: str, record: Any) -> None:
    info = inbox.backend.claim_info(key)
    assert info is not None
    assert (record.state, record.owner, record.attempt, record.fingerprint) == (
        info.state,
        info.owner,
        info.attempt,
        info.fingerprint,
    )
    assert record.expires_at is not None and info.claimed_at is not None
    assert record.expires_at > info.claimed_at


@pytest.mark.parametrize("fingerprint", [None, "fp-1"])
def test_records_of_new_duplicate_and_taken_over_keys_match_the_store(
    inbox: jobfence.Inbox, fingerprint: str | None
) -> None:
    backend: Any = inbox.backend
    new = backend.claim("new", "host:1:a", fingerprint, 30.0)
    assert new.mine and new.state is ClaimState.IN_PROGRESS and new.attempt == 1
    assert new.owner == "host:1:a" and new.fingerprint == fingerprint
    _matches_store(inbox, "new", new)
    dup = backend.claim("new", "host:1:b", fingerprint, 30.0)
    assert not dup.mine and dup.owner == "host:1:a"
    _matches_store(inbox, "new", dup)
    # a claim whose deadline passed is taken over: attempt 2, a full reply
    assert backend.claim("old", "host:1:c", fingerprint, 0.001).mine
    backend.client.pexpire(backend._key("old"), 60_000)  # the record itself stays
    backend.client.hset(backend._key("old"), "e", 1)  # its deadline is long past
    taken = backend.claim("old", "host:1:d", None, 30.0)
    assert taken.mine and taken.attempt == 2 and taken.owner == "host:1:d"
    assert taken.fingerprint == fingerprint  # a takeover without one keeps the key's
    _matches_store(inbox, "old", taken)
    # in one batch: new keys and a duplicate, each answered for its own caller
    batch = backend.claim_many(
        [
            ("b1", "host:2:a", fingerprint, 30.0),
            ("new", "host:2:b", fingerprint, 30.0),
            ("b2", "host:2:c", None, 30.0),
        ]
    )
    assert [r.mine for r in batch] == [True, False, True]
    assert [r.owner for r in batch] == ["host:2:a", "host:1:a", "host:2:c"]
    assert batch[2].fingerprint is None
    for key, record in zip(("b1", "new", "b2"), batch, strict=True):
        _matches_store(inbox, key, record)
