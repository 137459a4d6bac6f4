"""Round trips per claim on the MySQL/MariaDB inbox, counted on the driver (commands sent to
the server), not assumed: a NEW key costs ONE round trip (the short insert whose OK packet
carries the deadline), a duplicate two (that insert, then the takeover upsert + read)."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta, timezone
from typing import Any

import pymysql
import pytest

import jobfence
from jobfence import ClaimState
from tests.servers import MYSQL_URL, mysql_params

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def inbox() -> Iterator[jobfence.Inbox]:
    box = jobfence.Inbox(MYSQL_URL, table="trips_" + uuid.uuid4().hex[:10])
    box.install()
    yield box
    box.drop()
    box.close()


def _commands(inbox: jobfence.Inbox, op: Callable[[], Any]) -> tuple[int, Any]:
    """How many commands ``op`` sends on the inbox's (one, pooled) connection."""
    conn: pymysql.connections.Connection = inbox.backend._pool._idle[-1]  # type: ignore[attr-defined]
    sent = 0
    original = conn._execute_command

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal sent
        sent += 1
        return original(*args, **kw)

    conn._execute_command = counting  # type: ignore[method-assign]
    try:
        result = op()
    finally:
        conn._execute_command = original  # type: ignore[method-assign]
    return sent, result


def test_a_new_claim_is_one_round_trip_and_a_duplicate_two(inbox: jobfence.Inbox) -> None:
    inbox.claim("warm-up")  # opens the pooled connection
    trips, claim = _commands(inbox, lambda: inbox.claim("order:1", ttl=60))
    assert claim.state is ClaimState.NEW and claim.attempt == 1
    assert trips == 1
    trips, dup = _commands(inbox, lambda: inbox.claim("order:1", ttl=60))
    assert dup.state is ClaimState.IN_PROGRESS and dup.owner == claim.owner
    assert trips == 2
    # the deadline reported by the one round trip is the stored one, to the microsecond
    assert dup.expires_at == claim.expires_at
    assert claim.expires_at is not None
    assert timedelta(seconds=55) < claim.expires_at - _server_now() < timedelta(seconds=65)


async def test_a_duplicate_claim_raises_no_server_warning() -> None:
    """A duplicate key must not make the server warn: aiomysql would spend a SHOW WARNINGS
    round trip on it and hand the caller a Python ``Warning``."""
    inbox = jobfence.AsyncInbox(MYSQL_URL, table="trips_" + uuid.uuid4().hex[:10])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = await inbox.claim("order:2")
            second = await inbox.claim("order:2")
        assert first.state is ClaimState.NEW and second.state is ClaimState.IN_PROGRESS
    finally:
        await inbox.drop()
        await inbox.close()


def _server_now() -> Any:
    conn = pymysql.connect(**mysql_params())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT UTC_TIMESTAMP(6)")
            return cur.fetchone()[0].replace(tzinfo=timezone.utc)
    finally:
        conn.close()
