"""Every backend call has a deadline: a request whose reply does not come within ``timeout``
fails with ``BackendError`` (its cause a ``TimeoutError``) and its connection is closed, never
reused in an unknown state -- PostgreSQL (both lock modes and the inbox), MySQL/MariaDB and
Redis, sync and async.

Each client talks to the real server through a :class:`FaultProxy`. The proxy stalls (bytes
are held, nothing is closed: a hung link), a request runs into its deadline, the proxy resumes,
and the client must go on with correct answers: a connection that still had the stalled
request's reply on its way would hand that reply to the next request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence._core.options import DEFAULT_TIMEOUT
from tests.conformance.specs import (
    _mysql_cleanup,
    _postgres_cleanup,
    _redis_cleanup,
    inbox_table,
    new_namespace,
)
from tests.netproxy import FaultProxy
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(60)

#: the deadline the clients are given, and the slack a test allows on it
TIMEOUT = 1.0
SLACK = 1.0


@dataclass(frozen=True)
class Server:
    url: str
    cleanup: Callable[[str, str], None]
    options: str = ""

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 0


SERVERS = {
    "postgres": Server(POSTGRES_URL, _postgres_cleanup),
    "postgres-session": Server(POSTGRES_URL, _postgres_cleanup, "mode=session"),
    "mysql": Server(MYSQL_URL, _mysql_cleanup),
    "redis": Server(REDIS_URL, _redis_cleanup),
}


def _with(url: str, options: str) -> str:
    return url + ("&" if "?" in url else "?") + options if options else url


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = new_namespace()
    yield ns
    for server in {s.url: s for s in SERVERS.values()}.values():
        server.cleanup(server.url, ns)


def _proxied(server: Server, proxy: FaultProxy) -> str:
    url = proxy.url_for(server.url, server.port)
    return _with(_with(url, server.options), f"timeout={TIMEOUT}")


def _timed_out(error: BaseException | None, seconds: float) -> None:
    """A BackendError caused by a timeout (builtin, or redis-py's), within the deadline."""
    assert isinstance(error, jobfence.BackendError), repr(error)
    cause = error.__cause__
    assert isinstance(cause, TimeoutError) or type(cause).__name__ == "TimeoutError", repr(cause)
    assert seconds < TIMEOUT + SLACK, seconds


def _released_or_timed_out(case: str, outcome: bool | BaseException, seconds: float) -> None:
    """The stalled release: a timeout -- or, in session mode, ``False``: the timeout closed the
    session that held the lock, which frees it (the lease is not ours any more)."""
    if case == "postgres-session" and outcome is False:
        assert seconds < TIMEOUT + SLACK, seconds
        return
    _timed_out(outcome if isinstance(outcome, BaseException) else None, seconds)


@pytest.mark.parametrize("case", list(SERVERS))
def test_a_lock_request_without_reply_fails_at_its_deadline(case: str, namespace: str) -> None:
    server = SERVERS[case]
    with (
        FaultProxy(server.port) as proxy,
        jobfence.Locks(_proxied(server, proxy), namespace=namespace) as locks,
    ):
        first = locks.try_acquire("first", ttl=30, renew=False)
        stalled = locks.try_acquire("stalled", ttl=2, renew=False)
        assert first is not None and stalled is not None
        proxy.stall()
        started = time.monotonic()
        outcome: bool | BaseException
        try:
            outcome = stalled.release()
        except jobfence.JobfenceError as exc:
            outcome = exc
        _released_or_timed_out(case, outcome, time.monotonic() - started)
        proxy.resume()
        # fresh connections, correct answers (a reused connection would answer the stalled
        # request here)
        second = locks.try_acquire("second", ttl=30, renew=False)
        assert second is not None and second.token > 0
        holder = locks.backend.holder("first")
        assert holder is not None and holder.token == first.token
        assert locks.try_acquire("first", ttl=30, renew=False) is None
        assert second.release()
        assert first.release()


@pytest.mark.parametrize("case", list(SERVERS))
async def test_async_a_lock_request_without_reply_fails_at_its_deadline(
    case: str, namespace: str
) -> None:
    server = SERVERS[case]
    with FaultProxy(server.port) as proxy:
        async with jobfence.AsyncLocks(_proxied(server, proxy), namespace=namespace) as locks:
            first = await locks.try_acquire("first", ttl=30, renew=False)
            stalled = await locks.try_acquire("stalled", ttl=2, renew=False)
            assert first is not None and stalled is not None
            proxy.stall()
            started = time.monotonic()
            outcome: bool | BaseException
            try:
                outcome = await stalled.release()
            except jobfence.JobfenceError as exc:
                outcome = exc
            _released_or_timed_out(case, outcome, time.monotonic() - started)
            proxy.resume()
            second = await locks.try_acquire("second", ttl=30, renew=False)
            assert second is not None and second.token > 0
            holder = await locks.backend.holder("first")
            assert holder is not None and holder.token == first.token
            assert await locks.try_acquire("first", ttl=30, renew=False) is None
            assert await second.release()
            assert await first.release()


INBOX_SERVERS = ["postgres", "mysql", "redis"]


@pytest.mark.parametrize("case", INBOX_SERVERS)
def test_an_inbox_request_without_reply_fails_at_its_deadline(case: str, namespace: str) -> None:
    server = SERVERS[case]
    with (
        FaultProxy(server.port) as proxy,
        jobfence.Inbox(_proxied(server, proxy), table=inbox_table(namespace)) as inbox,
    ):
        claim = inbox.claim("first")
        stalled = inbox.claim("stalled")
        assert claim.state is stalled.state is jobfence.ClaimState.NEW
        proxy.stall()
        started = time.monotonic()
        with pytest.raises(jobfence.BackendError) as info:
            stalled.complete({"done": 0})
        _timed_out(info.value, time.monotonic() - started)
        proxy.resume()
        claim.complete({"done": 1})
        again = inbox.claim("first")
        assert again.state is jobfence.ClaimState.COMPLETED and again.result == {"done": 1}
        assert inbox.claim("second").state is jobfence.ClaimState.NEW


@pytest.mark.parametrize("case", INBOX_SERVERS)
async def test_async_an_inbox_request_without_reply_fails_at_its_deadline(
    case: str, namespace: str
) -> None:
    server = SERVERS[case]
    with FaultProxy(server.port) as proxy:
        async with jobfence.AsyncInbox(
            _proxied(server, proxy), table=inbox_table(namespace)
        ) as inbox:
            claim = await inbox.claim("first")
            stalled = await inbox.claim("stalled")
            assert claim.state is stalled.state is jobfence.ClaimState.NEW
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(jobfence.BackendError) as info:
                await asyncio.wait_for(stalled.complete({"done": 0}), 30)
            _timed_out(info.value, time.monotonic() - started)
            proxy.resume()
            await claim.complete({"done": 1})
            again = await inbox.claim("first")
            assert again.state is jobfence.ClaimState.COMPLETED and again.result == {"done": 1}
            assert (await inbox.claim("second")).state is jobfence.ClaimState.NEW


def test_a_session_mode_wait_gets_its_wait_on_top_of_the_deadline(namespace: str) -> None:
    """PostgreSQL session mode waits in the server (pg_advisory_lock): that statement's
    deadline is its wait plus ``timeout``, so a wait longer than ``timeout`` is not cut off."""
    server = SERVERS["postgres-session"]
    url = _with(_with(server.url, server.options), f"timeout={TIMEOUT}")
    with (
        jobfence.Locks(url, namespace=namespace) as holder_client,
        jobfence.Locks(url, namespace=namespace) as waiter_client,
    ):
        held = holder_client.try_acquire("job", ttl=30)
        assert held is not None
        started = time.monotonic()
        with pytest.raises(jobfence.LockTimeout) as info:
            waiter_client.acquire("job", ttl=5, timeout=3 * TIMEOUT)
        assert time.monotonic() - started >= 3 * TIMEOUT - 0.05
        assert info.value.token == held.token  # session mode: no owner id, no ttl
        assert held.release()


def test_postgres_statements_have_a_deadline_by_default(namespace: str) -> None:
    """No option given: a PostgreSQL statement still waits at most the default ``timeout``
    (psycopg itself would wait forever on a hung link)."""
    server = SERVERS["postgres"]
    with (
        FaultProxy(server.port) as proxy,
        jobfence.Locks(proxy.url_for(server.url, server.port), namespace=namespace) as locks,
    ):
        stalled = locks.try_acquire("stalled", ttl=30, renew=False)
        assert stalled is not None
        proxy.stall()
        started = time.monotonic()
        with pytest.raises(jobfence.BackendError) as info:
            stalled.release()
        seconds = time.monotonic() - started
        assert isinstance(info.value.__cause__, TimeoutError)
        assert DEFAULT_TIMEOUT - 0.5 < seconds < DEFAULT_TIMEOUT + SLACK + 1
        proxy.resume()
        assert locks.try_acquire("other", ttl=30, renew=False) is not None
