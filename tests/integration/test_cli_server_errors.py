"""The operator commands against a server they cannot use -- a Redis that refuses the password,
a port nothing listens on -- fail with exit code 1 and a message naming the backend and the
operation, the password masked. Nothing prints an empty answer as if the server had one: the
inbox purge on Redis, which has nothing to delete (records expire by themselves), still asks
the server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from jobfence.cli.app import cli
from tests.reliability._redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(90)

PASSWORD = "s3cret-pw"
WRONG = "wr0ng-pw"

#: each command, how it reads the URL, and the operation its error names
COMMANDS = [
    (("inbox", "purge", "{url}"), "inbox.purge"),
    (("inbox", "list", "{url}"), "inbox.claims"),
    (("inbox", "show", "{url}", "order:1"), "inbox.claim_info"),
    (("inbox", "purge", "{url}", "--key", "order:1", "--yes"), "inbox.claim_info"),
    (("locks", "list", "{url}"), "lock.holders"),
    (("locks", "show", "{url}", "job"), "lock.holder"),
    (("locks", "break", "{url}", "job", "--yes"), "lock.holder"),
    (("queue", "stats", "{url}", "emails"), "stats"),
    (("queue", "list", "{url}"), "listing the queue names"),
    (("queue", "dead-letters", "{url}", "emails"), "dead_letters"),
    (("queue", "requeue", "{url}", "emails"), "requeue_dead"),
]
IDS = [" ".join(a for a in args if a != "{url}") for args, _ in COMMANDS]


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[RedisServer]:
    """A disposable Redis that requires a password."""
    server = RedisServer(password=PASSWORD).start()
    try:
        yield server
    finally:
        server.kill()


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _fails(args: tuple[str, ...], url: str, operation: str, backend: str) -> str:
    code, out, err = _run(*(url if a == "{url}" else a for a in args))
    assert code == 1, (code, out, err)
    assert out == "", out  # no empty table or "purged 0" as if the server had answered
    assert f"Error: {backend} " in err and f"{operation}" in err and "failed" in err, err
    return err


@pytest.mark.parametrize(("args", "operation"), COMMANDS, ids=IDS)
def test_a_wrong_redis_password_fails_every_command(
    guarded_redis: RedisServer, args: tuple[str, ...], operation: str
) -> None:
    url = f"redis://:{WRONG}@127.0.0.1:{guarded_redis.port}/0"
    err = _fails(args, url, operation, "redis")
    assert "AuthenticationError" in err or "invalid username-password" in err, err
    assert WRONG not in err and f"redis://:***@127.0.0.1:{guarded_redis.port}/0" in err


@pytest.mark.parametrize(("args", "operation"), COMMANDS, ids=IDS)
def test_an_unreachable_redis_fails_every_command(args: tuple[str, ...], operation: str) -> None:
    port = free_port()  # bound, released: nothing listens there
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    err = _fails(args, url, operation, "redis")
    assert "ConnectionError" in err and PASSWORD not in err, err
    assert f"redis://:***@127.0.0.1:{port}/0" in err


def test_the_purge_fails_on_redis_as_on_postgresql() -> None:
    port = free_port()
    redis_err = _fails(
        ("inbox", "purge", "{url}"), f"redis://:{PASSWORD}@127.0.0.1:{port}/0", "inbox", "redis"
    )
    pg_err = _fails(
        ("inbox", "purge", "{url}"),
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/test",
        "inbox",
        "postgres",
    )
    for err in (redis_err, pg_err):
        assert "inbox.purge failed" in err and PASSWORD not in err and ":***@" in err, err


def test_the_purge_on_a_working_redis_says_why_it_purged_nothing(
    guarded_redis: RedisServer,
) -> None:
    code, out, err = _run("inbox", "purge", guarded_redis.url)
    assert code == 0, err
    assert "purged 0 expired records" in out and "redis expires the records by itself" in out
