"""Deadlines and visible waits in the lock core, and the timeout options of every backend.

* A lease's local clock starts after the backend's connection setup (``prepare``), right
  before the grant request: setup time is never counted against the lease.
* A waiting acquire logs at DEBUG how long it has waited; ``LockTimeout`` names the holder.
* ``connect_timeout`` and ``timeout`` are validated the same way on every network backend.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

import jobfence
from jobfence._core.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, option_timeouts
from jobfence._core.url import parse_url
from jobfence.backends.memory.locks import AsyncMemoryLockBackend, MemoryLockBackend
from jobfence.testing import ManualClock, clocked
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

SETUP = 7.0  # seconds the fake connection setup takes


class SlowSetupBackend(MemoryLockBackend):
    """A memory backend whose connection setup takes SETUP seconds of the fake clock."""

    def __init__(self, clock: ManualClock, calls: list[str]) -> None:
        super().__init__(parse_url(f"memory://{uuid.uuid4().hex}"))
        self.clock = clock
        self.calls = calls

    def prepare(self, *, waiting: bool = False) -> None:
        self.calls.append(f"prepare waiting={waiting}")
        self.clock.advance(SETUP)

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        self.calls.append("acquire")
        return super().acquire(name, owner, ttl, wait=wait)


class AsyncSlowSetupBackend(AsyncMemoryLockBackend):
    def __init__(self, clock: ManualClock, calls: list[str]) -> None:
        super().__init__(parse_url(f"memory://{uuid.uuid4().hex}"))
        self.clock = clock
        self.calls = calls

    async def prepare(self, *, waiting: bool = False) -> None:
        self.calls.append(f"prepare waiting={waiting}")
        self.clock.advance(SETUP)

    async def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        self.calls.append("acquire")
        return await super().acquire(name, owner, ttl, wait=wait)


def test_a_leases_clock_starts_after_the_connection_setup() -> None:
    with clocked(ManualClock(10_000.0, auto_advance=True)) as clock:
        calls: list[str] = []
        locks = jobfence.Locks(SlowSetupBackend(clock, calls))
        lease = locks.try_acquire("job", ttl=10, renew=False)
        assert lease is not None
        assert lease.expires_in == 10.0  # not 10 - SETUP: setup came before the clock started
        assert calls == ["prepare waiting=False", "acquire"]
        assert lease.release()

        calls.clear()
        lease = locks.acquire("job", ttl=10, timeout=30, renew=False)
        assert lease.expires_in == 10.0
        assert calls == ["prepare waiting=True", "acquire"]
        assert lease.release()
        locks.close()


async def test_async_a_leases_clock_starts_after_the_connection_setup() -> None:
    with clocked(ManualClock(10_000.0, auto_advance=True)) as clock:
        calls: list[str] = []
        locks = jobfence.AsyncLocks(AsyncSlowSetupBackend(clock, calls))
        lease = await locks.try_acquire("job", ttl=10, renew=False)
        assert lease is not None
        assert lease.expires_in == 10.0
        assert calls == ["prepare waiting=False", "acquire"]
        assert await lease.release()

        calls.clear()
        lease = await locks.acquire("job", ttl=10, timeout=30, renew=False)
        assert lease.expires_in == 10.0
        assert calls == ["prepare waiting=True", "acquire"]
        assert await lease.release()
        await locks.close()


class FailingSetupBackend(MemoryLockBackend):
    """A backend that cannot be reached: its connection setup fails."""

    def __init__(self) -> None:
        super().__init__(parse_url(f"memory://{uuid.uuid4().hex}"))
        self.calls: list[str] = []

    def prepare(self, *, waiting: bool = False) -> None:
        raise ConnectionRefusedError("nothing listens there")

    def cancel_wait(self, name: str, owner: str) -> int | None:
        self.calls.append("cancel_wait")
        return super().cancel_wait(name, owner)

    def release(self, name: str, owner: str) -> bool:
        self.calls.append("release")
        return super().release(name, owner)


def test_a_failed_connection_setup_is_a_backend_error_with_nothing_to_clean_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FailingSetupBackend()
    locks = jobfence.Locks(backend)
    with caplog.at_level(logging.DEBUG, logger="jobfence"):
        with pytest.raises(jobfence.BackendError, match="nothing listens there") as info:
            locks.try_acquire("job")
        assert info.value.operation == "lock.acquire"
        with pytest.raises(jobfence.BackendError):
            locks.acquire("job", timeout=5)
    assert backend.calls == []  # no request was sent: no queue to leave, no lease to give back
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    locks.close()


class ReplyLostBackend(MemoryLockBackend):
    """The grant request is sent, but its reply never arrives; giving back fails too."""

    def __init__(self) -> None:
        super().__init__(parse_url(f"memory://{uuid.uuid4().hex}"))
        self.calls: list[str] = []

    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        raise ConnectionResetError("the reply was lost")

    def cancel_wait(self, name: str, owner: str) -> int | None:
        self.calls.append("cancel_wait")
        raise ConnectionResetError("still unreachable")

    def release(self, name: str, owner: str) -> bool:
        self.calls.append("release")
        raise ConnectionResetError("still unreachable")


def test_try_acquire_clean_up_gives_back_and_never_claims_to_leave_a_wait_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = ReplyLostBackend()
    locks = jobfence.Locks(backend)
    with (
        caplog.at_level(logging.WARNING, logger="jobfence"),
        pytest.raises(jobfence.BackendError, match="the reply was lost"),
    ):
        locks.try_acquire("job")
    assert backend.calls == ["release"]  # a try never joins a wait queue
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "wait queue" in m], messages
    assert any("could not give back 'job'" in m for m in messages), messages
    locks.close()


def test_a_waiting_acquire_logs_how_long_it_has_waited_and_names_the_holder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    with jobfence.Locks(url) as locks:
        held = locks.try_acquire("job", ttl=30)
        assert held is not None
        with (
            caplog.at_level(logging.DEBUG, logger="jobfence.locks"),
            pytest.raises(jobfence.LockTimeout) as info,
        ):
            locks.acquire("job", ttl=5, timeout=0.3)
        waits = [r for r in caplog.records if r.getMessage().startswith("waiting for 'job'")]
        assert waits and all(r.levelno == logging.DEBUG for r in waits)
        assert "s so far" in waits[0].getMessage()
        error = info.value
        assert error.name == "job"
        assert error.owner == held.owner
        assert error.token == held.token
        assert error.expires_in is not None and 0 < error.expires_in <= 30
        assert held.owner in str(error) and f"token {held.token}" in str(error)
        assert held.release()


def test_lock_timeout_without_a_holder_keeps_its_plain_message() -> None:
    error = jobfence.LockTimeout("could not acquire 'x' within 1 s", name="x")
    assert (error.owner, error.token, error.expires_in) == (None, None, None)
    assert isinstance(error, TimeoutError) and str(error) == "could not acquire 'x' within 1 s"


async def test_async_lock_timeout_names_the_holder() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    async with jobfence.AsyncLocks(url) as locks:
        held = await locks.try_acquire("job", ttl=30)
        assert held is not None
        with pytest.raises(jobfence.LockTimeout) as info:
            await asyncio.wait_for(locks.acquire("job", ttl=5, timeout=0.2), 10)
        assert (info.value.owner, info.value.token) == (held.owner, held.token)
        assert await held.release()


# -- the timeout options -----------------------------------------------------------------------


def test_timeout_options_default_to_five_seconds_and_keywords_win() -> None:
    assert DEFAULT_CONNECT_TIMEOUT == DEFAULT_TIMEOUT == 5.0
    assert option_timeouts({}, {}) == (
        option_timeouts({}, {"connect_timeout": "5", "timeout": "5.0"})
    )
    got = option_timeouts({"timeout": 2}, {"timeout": "9", "connect_timeout": "0.5"})
    assert (got.connect, got.request) == (0.5, 2.0)


BAD_VALUES: list[Any] = ["soon", 0, -1, "nan", "inf", 3601, True]


@pytest.mark.parametrize("argument", ["connect_timeout", "timeout"])
@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("part", ["locks", "inbox"])
@pytest.mark.parametrize("url", [POSTGRES_URL, MYSQL_URL, REDIS_URL], ids=["pg", "mysql", "redis"])
def test_bad_timeouts_are_refused_naming_the_option(
    url: str, part: str, value: Any, argument: str
) -> None:
    open_ = jobfence.Locks if part == "locks" else jobfence.Inbox
    with pytest.raises(jobfence.ConfigurationError) as info:
        open_(url, **{argument: value})
    assert info.value.argument == argument
    assert "seconds" in str(info.value)
    sep = "&" if "?" in url else "?"
    with pytest.raises(jobfence.ConfigurationError) as info:
        open_(f"{url}{sep}{argument}={value}")
    assert info.value.argument == argument


@pytest.mark.parametrize("part", ["locks", "inbox"])
@pytest.mark.parametrize("url", [POSTGRES_URL, MYSQL_URL, REDIS_URL], ids=["pg", "mysql", "redis"])
def test_good_timeouts_are_accepted_as_keywords_and_url_options(url: str, part: str) -> None:
    open_ = jobfence.Locks if part == "locks" else jobfence.Inbox
    sep = "&" if "?" in url else "?"
    for client in (
        open_(url, connect_timeout=2, timeout=0.5),
        open_(f"{url}{sep}connect_timeout=2&timeout=0.5"),
    ):
        client.close()  # nothing was opened yet


def test_redis_refuses_the_same_deadline_under_two_names() -> None:
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Locks(REDIS_URL, timeout=1, socket_timeout=2)
    assert info.value.argument == "timeout"
    with pytest.raises(jobfence.ConfigurationError) as info:
        jobfence.Inbox(REDIS_URL + "?socket_connect_timeout=1", connect_timeout=2)
    assert info.value.argument == "connect_timeout"


def test_redis_timeout_options_reach_redis_py() -> None:
    with jobfence.Locks(REDIS_URL, connect_timeout=1.5, timeout=2.5) as locks:
        kwargs = locks.backend._client.connection_pool.connection_kwargs
        assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (1.5, 2.5)
    with jobfence.Locks(REDIS_URL) as locks:  # the defaults
        kwargs = locks.backend._client.connection_pool.connection_kwargs
        assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (5.0, 5.0)
