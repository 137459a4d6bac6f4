"""A property of the batch verbs behind the group commit, on every backend that batches:
``claim_many`` answers each item exactly as a claim of that key alone would, and leaves the
store as those claims one after another would, whatever the records already there (in
progress or completed, with or without fingerprints) and whatever the batch asks.

Two tables of one backend get the same records first; then one takes the batch, the other
the same claims one by one, and their answers and records must be equal. Hypothesis picks
the records and the batches (and shrinks a failure to a smallest example)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobfence
from tests.conformance.specs import INBOX, Spec, inbox_table, new_namespace, spec_params

BATCHING = spec_params(INBOX, lambda s: s.id in ("postgres", "sqlite", "redis"))
KEYS = [f"key {i} ✓" for i in range(6)]
FINGERPRINTS = st.sampled_from([None, "fp-a", "fp-b"])
#: what is there before the batch: per key, a claim in progress, a completed one or a
#: released one (which the next claim takes over)
BEFORE = st.dictionaries(
    st.sampled_from(KEYS),
    st.tuples(st.sampled_from(["in_progress", "completed", "released"]), FINGERPRINTS),
    max_size=len(KEYS),
)
#: the batch: distinct keys (as the group commit sends them), each with a fingerprint
BATCH = st.lists(
    st.tuples(st.sampled_from(KEYS), FINGERPRINTS),
    min_size=1,
    max_size=len(KEYS),
    unique_by=lambda item: item[0],
)
_examples = itertools.count()


@pytest.fixture(params=BATCHING)
def two_tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    spec: Spec = request.param
    url = spec.make_url(tmp_path)
    namespace = new_namespace()
    inboxes = [jobfence.Inbox(url, table=inbox_table(namespace) + suffix) for suffix in "ab"]
    for inbox in inboxes:
        assert inbox.backend.batches
        inbox.install()
    try:
        yield inboxes[0].backend, inboxes[1].backend
    finally:
        for inbox in inboxes:
            inbox.drop()
            inbox.close()
        spec.cleanup(url, namespace)


def _answer(record: Any) -> tuple[Any, ...]:
    in_progress = record.state is jobfence.ClaimState.IN_PROGRESS
    return (
        record.mine,
        record.state,
        record.attempt,
        record.owner if in_progress else None,  # a completed record's owner is not an answer
        record.fingerprint,
        None if in_progress else record.result,
    )


def _stored(backend: Any, key: str) -> tuple[Any, ...] | None:
    info = backend.claim_info(key)
    if info is None:
        return None
    return (info.state, info.owner, info.attempt, info.fingerprint)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(before=BEFORE, batch=BATCH)
def test_a_batch_of_claims_is_the_same_claims_one_by_one(
    two_tables: tuple[Any, Any], before: dict[str, tuple[str, str | None]], batch: list[Any]
) -> None:
    batched, one_by_one = two_tables
    prefix = f"ex{next(_examples)}:"  # each example has keys of its own
    for backend in (batched, one_by_one):
        for key, (state, fingerprint) in before.items():
            record = backend.claim(prefix + key, "first-owner", fingerprint, 300.0)
            assert record.mine
            if state == "completed":
                assert backend.complete(prefix + key, "first-owner", b'"stored"', 600.0)
            elif state == "released":
                assert backend.release(prefix + key, "first-owner")
    items = [
        (prefix + key, f"owner-{n}", fingerprint, 300.0)
        for n, (key, fingerprint) in enumerate(batch)
    ]
    together = batched.claim_many(items)
    alone = [one_by_one.claim(*item) for item in items]
    assert [_answer(r) for r in together] == [_answer(r) for r in alone]
    for key in KEYS:
        assert _stored(batched, prefix + key) == _stored(one_by_one, prefix + key)
