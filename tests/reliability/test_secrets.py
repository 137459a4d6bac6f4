"""No secret of a backend URL is ever shown: not in an error message, a ``repr``, a ``url``
attribute, a log record or the output of ``jobfence doctor``.

Against a disposable redis-server with ``requirepass`` and a disposable PostgreSQL that checks
passwords with SCRAM over TCP (and the shared MySQL/MariaDB server): good and wrong passwords,
in the user-info and as ``?password=``, percent-encoded and with an unencoded ``/``, ``?`` or
``#``. Every text produced is searched for each secret.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import jobfence
from tests.reliability._pg_server import ScramPostgres
from tests.reliability._redis_server import RedisServer
from tests.servers import MYSQL_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Two halves that never occur in jobfence's own texts; a password joins them with a
# character that needs percent-encoding, so a half shown alone is caught too.
LEFT, RIGHT = "Hunter2xq", "Zebra9zk"
WRONG = "Wr0ngPwd7"
SECRETS = (LEFT, RIGHT, WRONG)


class Seen:
    """Every text a test could show a user."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def add(self, *texts: object) -> None:
        self.texts.extend(str(t) for t in texts)

    def error(self, exc: BaseException) -> None:
        """The message of ``exc`` and of every exception chained to it."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            self.add(f"{type(current).__name__}: {current}", repr(current))
            current = current.__cause__ or current.__context__

    def client(self, client: Any) -> None:
        self.add(repr(client), client.url, repr(client.backend))

    def run(self, fn: Callable[[], Any]) -> BaseException | None:
        try:
            fn()
        except jobfence.JobfenceError as exc:
            self.error(exc)
            return exc
        return None

    def assert_clean(self, caplog: pytest.LogCaptureFixture) -> None:
        texts = list(self.texts)
        for record in caplog.records:
            texts.append(record.getMessage())
            if record.exc_info:
                texts.append(logging.Formatter().formatException(record.exc_info))
        assert texts
        leaks = [t for t in texts if any(s in t for s in SECRETS)]
        assert not leaks, leaks


def _locks_round(seen: Seen, url: str, **options: Any) -> BaseException | None:
    locks = jobfence.Locks(url, namespace=f"s{uuid.uuid4().hex[:8]}", **options)
    seen.client(locks)

    def body() -> None:
        lease = locks.try_acquire("secret-job", ttl=10, renew=False)
        assert lease is not None
        seen.add(repr(lease))
        assert lease.release()

    try:
        return seen.run(body)
    finally:
        locks.close()


def _inbox_round(seen: Seen, url: str) -> BaseException | None:
    inbox = jobfence.Inbox(url, table=f"s{uuid.uuid4().hex[:8]}")
    seen.client(inbox)

    def body() -> None:
        claim = inbox.claim("secret-key")
        seen.add(repr(claim))
        claim.complete("done")
        inbox.drop()

    try:
        return seen.run(body)
    finally:
        inbox.close()


async def _async_round(seen: Seen, url: str) -> list[BaseException | None]:
    outcomes: list[BaseException | None] = []
    locks = jobfence.AsyncLocks(url, namespace=f"s{uuid.uuid4().hex[:8]}")
    inbox = jobfence.AsyncInbox(url, table=f"s{uuid.uuid4().hex[:8]}")
    seen.client(locks)
    seen.client(inbox)
    try:
        for step in (locks.try_acquire("secret-job", ttl=10, renew=False), inbox.claim("k")):
            try:
                result = await step
                seen.add(repr(result))
                outcomes.append(None)
            except jobfence.JobfenceError as exc:
                seen.error(exc)
                outcomes.append(exc)
    finally:
        await locks.close()
        await inbox.close()
    return outcomes


def _refused(seen: Seen, url: str) -> None:
    """An unencoded ``/``, ``?`` or ``#`` in the password: a ConfigurationError, masked."""
    for cls in (jobfence.Locks, jobfence.Inbox, jobfence.AsyncLocks, jobfence.AsyncInbox):
        with pytest.raises(jobfence.ConfigurationError) as info:
            cls(url)
        assert info.value.argument == "url"
        assert "percent-encode" in str(info.value)
        seen.error(info.value)


def _doctor(seen: Seen, *urls: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(jobfence.__file__).resolve().parents[1])  # the jobfence under test
    result = subprocess.run(
        [sys.executable, "-m", "jobfence.cli.app", "doctor", *urls],
        capture_output=True,
        text=True,
        timeout=90,
        env={"COLUMNS": "400", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": src},
        check=False,
    )
    seen.add(result.stdout, result.stderr)
    return result


def _doctor_levels(seen: Seen, *urls: str) -> list[str]:
    """Each URL's outcome by ``jobfence doctor --json``: its probe lease worked (``ok``), or
    its worst finding's level; the output is checked for secrets too."""
    result = _doctor(seen, "--json", *urls)
    reports = json.loads(result.stdout)["reports"]
    return [
        "ok" if (r["probe"] or {}).get("ok") and r["level"] != "error" else r["level"]
        for r in reports
    ]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password=f"{LEFT}/{RIGHT}") as server:
        yield server


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Iterator[Seen]:
    caplog.set_level(logging.DEBUG)
    seen = Seen()
    yield seen
    seen.assert_clean(caplog)


def test_redis_passwords_never_show(redis_server: RedisServer, seen: Seen) -> None:
    port, good = redis_server.port, quote(f"{LEFT}/{RIGHT}", safe="")
    base = f"127.0.0.1:{port}/0"
    for url in (f"redis://:{good}@{base}", f"redis://{base}?password={good}"):
        assert _locks_round(seen, url) is None
        assert _inbox_round(seen, url) is None
    for url in (f"redis://:{WRONG}@{base}", f"redis://{base}?password={WRONG}"):
        for outcome in (_locks_round(seen, url), _inbox_round(seen, url)):
            assert isinstance(outcome, jobfence.BackendError)
            assert "AuthenticationError" in str(outcome)
    for sep in "/?#":
        _refused(seen, f"redis://:{LEFT}{sep}{RIGHT}@{base}")
        _refused(seen, f"redis://user:{LEFT}{sep}{RIGHT}@{base}")
    urls = (
        f"redis://{base}?password={good}",
        f"redis://{base}?password={WRONG}&socket_timeout=5",
        f"redis://:{LEFT}/{RIGHT}@{base}",
    )
    result = _doctor(seen, *urls)
    assert result.returncode == 1
    assert "password=***" in result.stdout and "redis://***@" in result.stdout
    # the right password works; the wrong one and the unusable URL are each an error
    assert _doctor_levels(seen, *urls) == ["ok", "error", "error"]


async def test_async_redis_clients_never_show_the_password(
    redis_server: RedisServer, seen: Seen
) -> None:
    base = f"127.0.0.1:{redis_server.port}/0"
    good = quote(f"{LEFT}/{RIGHT}", safe="")
    assert await _async_round(seen, f"redis://{base}?password={good}") == [None, None]
    outcomes = await _async_round(seen, f"redis://{base}?password={WRONG}")
    assert all(isinstance(o, jobfence.BackendError) for o in outcomes)


def test_postgres_passwords_never_show(seen: Seen) -> None:
    with ScramPostgres(f"{LEFT}/{RIGHT}") as pg:
        for url in (
            pg.url_with(),
            pg.url_with(in_query=True),
            pg.url_with(query=f"sslpassword={RIGHT}"),
        ):
            assert _locks_round(seen, url) is None
            assert _inbox_round(seen, url) is None
            assert _locks_round(seen, url, mode="session") is None
        for url in (pg.url_with(password=WRONG), pg.url_with(password=WRONG, in_query=True)):
            for outcome in (_locks_round(seen, url), _inbox_round(seen, url)):
                assert isinstance(outcome, jobfence.BackendError)
                assert "password authentication failed" in str(outcome)
        for sep in "/?#":
            _refused(seen, f"postgresql://postgres:{LEFT}{sep}{RIGHT}@127.0.0.1:{pg.port}/db")
        urls = (pg.url_with(in_query=True), pg.url_with(password=WRONG))
        assert _doctor(seen, *urls).returncode == 1
        assert _doctor_levels(seen, *urls) == ["ok", "error"]


async def test_async_postgres_clients_never_show_the_password(seen: Seen) -> None:
    with ScramPostgres(f"{LEFT}#{RIGHT}") as pg:
        assert await _async_round(seen, pg.url_with(in_query=True)) == [None, None]
        outcomes = await _async_round(seen, pg.url_with(password=WRONG))
        assert all(isinstance(o, jobfence.BackendError) for o in outcomes)


def test_mysql_passwords_never_show(seen: Seen) -> None:
    rest = MYSQL_URL.split("@", 1)[1]
    wrong = f"mysql://jobfence_nobody:{WRONG}@{rest}"
    for outcome in (_locks_round(seen, wrong), _inbox_round(seen, wrong)):
        assert isinstance(outcome, jobfence.BackendError)
    inbox = jobfence.Inbox(f"{MYSQL_URL}?password={WRONG}")
    seen.client(inbox)
    inbox.close()
    _refused(seen, f"mysql://root:{LEFT}?{RIGHT}@{rest}")
    result = _doctor(seen, wrong)
    assert result.returncode == 1
