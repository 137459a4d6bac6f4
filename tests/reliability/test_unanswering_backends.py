"""Every wait is bounded: a server that accepts connections but never answers is reported
within the documented deadlines -- ``connect_timeout`` and ``timeout``, 5 s each by default --
on every network backend, with no misleading clean-up warning.

The silent server is a listening socket that never accepts: the kernel completes each TCP
handshake into the backlog, and no byte is ever read or written. ``rediss://`` against a plain
Redis server is the other classic hang: the TLS handshake never gets an answer.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence._core.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT
from tests.servers import REDIS_URL

pytestmark = pytest.mark.timeout(60)

#: added to a deadline before a test calls it missed (a loaded 2-core machine)
SLACK = 3.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        yield sock.getsockname()[1]


def _rediss_on_plain_redis() -> str:
    parts = urlsplit(REDIS_URL)
    return f"rediss://{parts.hostname}:{parts.port or 6379}/0?ssl_cert_reqs=none"


def _urls(port: int) -> dict[str, str]:
    return {
        "postgresql": f"postgresql://postgres@127.0.0.1:{port}/test",
        "mysql": f"mysql://root@127.0.0.1:{port}/test",
        "redis": f"redis://127.0.0.1:{port}/0",
        "rediss-on-plain-redis": _rediss_on_plain_redis(),
    }


def _with(url: str, options: str) -> str:
    return url + ("&" if "?" in url else "?") + options if options else url


def _attempt_sync(url: str, waiting: bool) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        with jobfence.Locks(url, namespace="silent") as locks:
            if waiting:
                locks.acquire("job", ttl=5, timeout=60)
            else:
                locks.try_acquire("job", ttl=5)
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def _attempt_async(url: str, waiting: bool) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        async with jobfence.AsyncLocks(url, namespace="silent") as locks:
            if waiting:
                await locks.acquire("job", ttl=5, timeout=60)
            else:
                await locks.try_acquire("job", ttl=5)
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def _attempt_all(
    flavour: str, cases: dict[str, tuple[str, bool]]
) -> dict[str, tuple[float, BaseException | None]]:
    """Run every case at once (each measures its own time): id -> (seconds, error)."""
    if flavour == "async":

        async def main() -> list[tuple[float, BaseException | None]]:
            return list(await asyncio.gather(*(_attempt_async(u, w) for u, w in cases.values())))

        return dict(zip(cases, asyncio.run(main()), strict=True))
    results: dict[str, tuple[float, BaseException | None]] = {}

    def run(case: str, url: str, waiting: bool) -> None:
        results[case] = _attempt_sync(url, waiting)

    threads = [
        threading.Thread(target=run, args=(case, url, waiting), daemon=True)
        for case, (url, waiting) in cases.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(50)
    assert set(results) == set(cases), f"still waiting: {set(cases) - set(results)}"
    return results


def _no_misleading_warnings(caplog: pytest.LogCaptureFixture) -> None:
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warnings if "wait queue" in m], warnings


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_silent_server_is_reported_within_the_default_deadlines(
    silent_port: int, flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    cases = {
        f"{backend}-{verb}": (url, verb == "acquire")
        for backend, url in _urls(silent_port).items()
        for verb in ("try_acquire", "acquire")
    }
    bound = max(DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT) + SLACK
    with caplog.at_level(logging.WARNING, logger="jobfence"):
        results = _attempt_all(flavour, cases)
    for case, (seconds, error) in results.items():
        assert isinstance(error, jobfence.BackendError), (case, error)
        assert error.operation == "lock.acquire", case
        assert seconds < bound, (case, seconds, error)
    _no_misleading_warnings(caplog)


#: options that shorten the deadlines, and which of them a silent server runs into
SHORT: dict[str, tuple[str, float, str]] = {
    # PostgreSQL and MySQL bound the whole opening of a connection by connect_timeout
    # (libpq counts whole seconds, at least 2)
    "postgresql": ("connect_timeout=2", 2.0, "connect_timeout"),
    "mysql": ("connect_timeout=1", 1.0, "connect_timeout"),
    # redis-py: connect_timeout for the TCP connection (and the TLS handshake on asyncio),
    # then timeout for each reply of the handshake (and the TLS handshake when blocking)
    "redis": ("connect_timeout=1&timeout=1", 1.0, "Timeout"),
    "rediss-on-plain-redis": ("connect_timeout=1&timeout=1", 1.0, "Timeout"),
}


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_timeout_options_shorten_the_wait_for_a_silent_server(
    silent_port: int, flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    urls = _urls(silent_port)
    cases = {backend: (_with(urls[backend], SHORT[backend][0]), False) for backend in SHORT}
    with caplog.at_level(logging.WARNING, logger="jobfence"):
        results = _attempt_all(flavour, cases)
    for backend, (seconds, error) in results.items():
        _, deadline, says = SHORT[backend]
        assert isinstance(error, jobfence.BackendError), (backend, error)
        assert says in str(error), (backend, error)
        assert seconds < deadline + SLACK, (backend, seconds, error)
    _no_misleading_warnings(caplog)


def _refused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: connections are refused


@pytest.mark.parametrize("backend", ["postgresql", "mysql", "redis"])
def test_try_acquire_on_an_unreachable_backend_logs_no_wait_queue_warning(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = _urls(_refused_port())[backend]

    async def run_async() -> None:
        async with jobfence.AsyncLocks(url) as alocks:
            with pytest.raises(jobfence.BackendError):
                await alocks.try_acquire("job")

    with caplog.at_level(logging.DEBUG, logger="jobfence"):
        with jobfence.Locks(url) as locks, pytest.raises(jobfence.BackendError):
            locks.try_acquire("job")
        asyncio.run(run_async())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], warnings  # nothing was asked of the lock, nothing to clean up
