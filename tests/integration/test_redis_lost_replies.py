"""A reply lost on the way back: redis-py re-sends the command, which already ran on the
server. Every jobfence script must give the same answer the second time (against the real
Redis of tests/servers.py; the loss is injected in the client's connection class)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

import jobfence
from tests.servers import REDIS_URL, delete_redis_keys

pytestmark = pytest.mark.timeout(60)


class ReplyLosingConnection(redis.Connection):
    """Once armed with a marker, drops the connection right after the server answered the next
    request that carries the marker: the command ran, its reply never reaches the caller, and
    redis-py's retry sends it again on a new connection (a network cut at the worst time)."""

    armed: bytes | None = None
    fired = 0
    _pending = False

    def send_command(self, *args: object, **kwargs: object) -> None:
        armed = ReplyLosingConnection.armed
        self._pending = armed is not None and any(
            armed in (a if isinstance(a, bytes) else str(a).encode()) for a in args
        )
        super().send_command(*args, **kwargs)

    def read_response(self, *args: object, **kwargs: object) -> object:
        response = super().read_response(*args, **kwargs)  # type: ignore[arg-type]
        if self._pending and ReplyLosingConnection.armed is not None:
            ReplyLosingConnection.armed = None
            ReplyLosingConnection.fired += 1
            self.disconnect()
            raise redis.ConnectionError("injected: the reply was lost on the way back")
        return response


@pytest.fixture
def ns() -> Iterator[str]:
    namespace = "lr" + uuid.uuid4().hex[:12]
    yield namespace
    delete_redis_keys(f"{namespace}*")


def _lose_next_reply_of(marker: str) -> int:
    ReplyLosingConnection.armed = marker.encode()
    return ReplyLosingConnection.fired


def test_a_resent_lock_release_still_reports_true(ns: str) -> None:
    """The first release did release: the re-sent one must not turn a clean exit into a
    false ``LockLost``."""
    raw = redis.Redis.from_url(REDIS_URL)
    with jobfence.Locks(REDIS_URL, namespace=ns, connection_class=ReplyLosingConnection) as locks:
        with locks.acquire("job:1", ttl=10) as lease:
            # the release is the only request carrying the owner here (renewal is 3 s away)
            fired = _lose_next_reply_of(lease.owner)
        assert ReplyLosingConnection.fired == fired + 1  # the injection fired on the release
        assert not lease.lost and lease.released
        assert raw.exists(f"{ns}:lock:{{job:1}}") == 0
        # only the releasing owner is remembered: another owner, or a later lease, gets False
        assert locks.backend.release("job:1", "someone-else") is False
        again = locks.try_acquire("job:1", ttl=10, renew=False)
        assert again is not None
        raw.delete(f"{ns}:lock:{{job:1}}")  # lost behind its back
        assert again.release() is False
    raw.close()


def test_a_resent_lock_acquire_returns_the_same_lease(ns: str) -> None:
    with jobfence.Locks(REDIS_URL, namespace=ns, connection_class=ReplyLosingConnection) as locks:
        fired = _lose_next_reply_of("job:2")
        lease = locks.try_acquire("job:2", ttl=10)
        assert ReplyLosingConnection.fired == fired + 1
        assert lease is not None  # not "held by someone else": that someone is us
        assert locks.try_acquire("job:2", ttl=10) is None
        assert lease.release() is True


def test_a_resent_claim_is_still_new(ns: str) -> None:
    inbox = jobfence.Inbox(REDIS_URL, table=ns, connection_class=ReplyLosingConnection)
    try:
        fired = _lose_next_reply_of("order:1")
        claim = inbox.claim("order:1", ttl=30)
        assert ReplyLosingConnection.fired == fired + 1
        assert claim.state is jobfence.ClaimState.NEW and claim.attempt == 1
        claim.complete({"ok": 1})
        assert inbox.claim("order:1").result == {"ok": 1}
    finally:
        inbox.close()


def test_resent_complete_and_release_keep_their_answer(ns: str) -> None:
    inbox = jobfence.Inbox(REDIS_URL, table=ns, connection_class=ReplyLosingConnection)
    try:
        first = inbox.claim("order:2", ttl=30)
        assert first.state is jobfence.ClaimState.NEW
        fired = _lose_next_reply_of(first._mine or "")
        assert first.release() is True  # re-sent: still True, not "not ours any more"
        assert ReplyLosingConnection.fired == fired + 1
        second = inbox.claim("order:2", ttl=30)
        assert second.state is jobfence.ClaimState.NEW and second.attempt == 2
        fired = _lose_next_reply_of(second._mine or "")
        second.complete("done")  # re-sent: no ClaimLost
        assert ReplyLosingConnection.fired == fired + 1
        replay = inbox.claim("order:2")
        assert replay.state is jobfence.ClaimState.COMPLETED and replay.result == "done"
    finally:
        inbox.close()
