"""``jobfence.doctor.diagnose`` against the real local servers, disposable redis-servers with
dangerous settings, and a disposable PgBouncer in transaction pooling mode."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis

import jobfence
from jobfence.backends.mysql.doctor import parse_version
from jobfence.backends.postgres.doctor import transaction_pooled
from jobfence.backends.redis.doctor import OLD_LAYOUT
from jobfence.backends.redis.keys import legacy_lock_key
from jobfence.doctor import Report, diagnose
from tests.conformance.specs import new_namespace
from tests.reliability._redis_server import free_port
from tests.servers import MYSQL_URL, POSTGRES_URL, RABBITMQ_URL, REDIS_URL

pytestmark = pytest.mark.timeout(120)


def _codes(report: Report, level: str) -> set[str]:
    return {f.code for f in report.findings if f.level == level}


def _finding(report: Report, code: str) -> tuple[str, str]:
    found = [f for f in report.findings if f.code == code]
    assert found, f"no {code} finding in {report.findings}"
    return found[0].level, found[0].message


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port}") from None
            time.sleep(0.02)


@pytest.fixture
def redis_server() -> Iterator[object]:
    """Start a disposable redis-server with extra arguments: ``start(*args) -> url``."""
    started: list[tuple[subprocess.Popen[bytes], str]] = []

    def start(*args: str) -> str:
        port, where = free_port(), tempfile.mkdtemp(prefix="jobfence-doctor-redis-")
        proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                where,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append((proc, where))
        _wait_port(port, proc, "redis-server")
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:  # listening is not yet loaded: wait for PING
            try:
                client.ping()
                break
            except redis.exceptions.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()
        return f"redis://127.0.0.1:{port}/0"

    yield start
    for proc, where in started:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(where, ignore_errors=True)


def test_redis_with_eviction_and_no_persistence(redis_server: object) -> None:
    url = redis_server(  # type: ignore[operator]
        "--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru",
        "--save", "", "--appendonly", "no",
    )  # fmt: skip
    report = diagnose(url)
    level, message = _finding(report, "redis-eviction")
    assert level == "error" and "allkeys-lru" in message
    level, message = _finding(report, "redis-persistence")
    assert level == "warning" and "clock floor" in message
    assert report.level == "error"
    assert report.probe is not None and report.probe.ok and report.probe.token
    assert report.server_version and report.rtt_ms is not None
    assert report.clock_offset_ms is not None and abs(report.clock_offset_ms) < 1000


def test_redis_volatile_policy_evicts_lock_keys_too(redis_server: object) -> None:
    url = redis_server(  # type: ignore[operator]
        "--maxmemory", "10mb", "--maxmemory-policy", "volatile-ttl", "--appendonly", "yes",
    )  # fmt: skip
    report = diagnose(url)
    level, message = _finding(report, "redis-eviction")
    assert level == "error" and "TTL" in message
    assert _finding(report, "redis-persistence")[0] == "ok"


def test_redis_with_maxmemory_0_cannot_evict(redis_server: object) -> None:
    url = redis_server("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru")  # type: ignore[operator]
    level, message = _finding(diagnose(url), "redis-eviction")
    assert level == "ok" and "never evicts" in message


def test_redis_without_config_reports_unknown(redis_server: object) -> None:
    url = redis_server("--rename-command", "CONFIG", "")  # type: ignore[operator]
    report = diagnose(url)
    for code in ("redis-eviction", "redis-persistence"):
        level, message = _finding(report, code)
        assert level == "warning" and message.startswith("unknown")
    assert report.probe is not None and report.probe.ok


def test_redis_keys_are_counted_by_kind() -> None:
    namespace = new_namespace()
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        lease = locks.acquire("job", ttl=30, renew=False)
        try:
            with jobfence.Queue(REDIS_URL, "jobs", namespace=namespace) as queue:
                queue.publish({"n": 1})
                report = diagnose(REDIS_URL, namespace=namespace, probe=False)
                queue.drop()
        finally:
            lease.release()
    assert report.keys["lease"] == 1
    assert report.keys["token counter"] == 1
    assert report.keys["queue stream"] == 1
    assert report.probe is None
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{namespace}:*"):
            client.delete(key)
    finally:
        client.close()


def test_redis_lock_waiters_and_their_flag_are_counted_as_waiters() -> None:
    """A queued waiter leaves three keys next to the lease: the queue, its deadlines and the
    waiters flag; doctor counts all three as lock waiters, none as "lock other"."""
    namespace = new_namespace()
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        backend = locks.backend
        try:
            assert backend.acquire("job", "holder", 30) is not None
            assert backend.acquire("job", "waiter", 30, wait=30) is None
            report = diagnose(REDIS_URL, namespace=namespace, probe=False)
        finally:
            backend.cancel_wait("job", "waiter")
            backend.release("job", "holder")
    assert report.keys["lease"] == 1
    assert report.keys["lock waiters"] == 3
    assert "lock other" not in report.keys
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{namespace}:*"):
            client.delete(key)
    finally:
        client.close()


def test_redis_keys_of_the_previous_layout_are_a_warning() -> None:
    namespace = new_namespace()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        report = diagnose(REDIS_URL, namespace=namespace, probe=False)
        assert OLD_LAYOUT not in report.keys
        assert all(f.code != "redis-old-keys" for f in report.findings)
        # a lease as earlier versions wrote it
        client.set(legacy_lock_key(namespace, "a{b}"), "1:old", px=30_000)
        with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
            lease = locks.acquire("a{b}", ttl=30, renew=False)  # the current layout
            report = diagnose(REDIS_URL, namespace=namespace, probe=False)
            lease.release()
        assert report.keys[OLD_LAYOUT] == 1 and report.keys["lease"] == 1
        level, message = _finding(report, "redis-old-keys")
        assert level == "warning" and message.startswith("1 key under")
    finally:
        for key in client.scan_iter(match=f"{namespace}:*"):
            client.delete(key)
        client.close()


def test_unreachable_server_is_an_error_finding_with_the_password_masked() -> None:
    report = diagnose("redis://:hunter2@127.0.0.1:1/0")
    level, message = _finding(report, "unreachable")
    assert level == "error" and "ConnectionError" in message
    assert "hunter2" not in str(report.to_dict())
    assert report.url == "redis://:***@127.0.0.1:1/0"


def test_postgres_tables_and_rows() -> None:
    namespace = new_namespace()
    report = diagnose(POSTGRES_URL, namespace=namespace, probe=False)
    tables = {t.component: t for t in report.tables}
    assert set(tables) == {"locks", "inbox", "fences", "queue"}
    assert not tables["locks"].installed  # doctor without a probe creates nothing
    assert "not installed (created on first use)" in _finding(report, "table-locks")[1]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f'"{namespace}_locks"',)).fetchone() == (
            None,
        )
    report = diagnose(POSTGRES_URL, namespace=namespace)  # the probe creates the lock tables
    assert report.probe is not None and report.probe.ok
    again = diagnose(POSTGRES_URL, namespace=namespace, probe=False)
    locks = next(t for t in again.tables if t.component == "locks")
    assert locks.installed and locks.schema_version == 1 and locks.rows == {"held": 0}
    assert _finding(again, "pgbouncer")[0] == "ok"
    assert report.clock_offset_ms is not None and abs(report.clock_offset_ms) < 1000
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for suffix in ("locks", "lock_tokens", "lock_queue", "schema"):
            conn.execute(f'DROP TABLE IF EXISTS "{namespace}_{suffix}"')


def test_postgres_queue_rows_by_state() -> None:
    name = new_namespace()
    with jobfence.Queue(POSTGRES_URL, name) as queue:
        queue.publish_many([1, 2])
        queue.publish(3, delay=3600)
        [message] = queue.receive(visibility=60)
        message.dead_letter("boom")
        queue.receive(visibility=60)
        report = diagnose(POSTGRES_URL, probe=False)
        queue.drop()
    table = next(t for t in report.tables if t.component == "queue")
    assert table.installed and table.schema_version == 1
    # other tests' queues share the table: each state holds at least this queue's message
    for state in ("queues", "delayed", "in_flight", "dead"):
        assert table.rows[state] >= 1, table.rows
    assert "queue table jobfence_queue, schema v1" in _finding(report, "table-queue")[1]


def test_mysql_version_and_tables() -> None:
    namespace = new_namespace()
    report = diagnose(MYSQL_URL, namespace=namespace)
    level, message = _finding(report, "mysql-version")
    assert level == "ok" and report.server_version and report.server_version in message
    assert report.probe is not None and report.probe.ok
    assert report.clock_offset_ms is not None and abs(report.clock_offset_ms) < 1000
    again = diagnose(MYSQL_URL, namespace=namespace, probe=False)
    locks = next(t for t in again.tables if t.component == "locks")
    assert locks.installed and locks.schema_version == 1
    import pymysql

    from tests.servers import mysql_params

    conn = pymysql.connect(**mysql_params())
    try:
        with conn.cursor() as cur:
            for suffix in ("locks", "schema"):
                cur.execute(f"DROP TABLE IF EXISTS `{namespace}_{suffix}`")
    finally:
        conn.close()


def test_mysql_and_mariadb_minimum_versions() -> None:
    assert parse_version("10.11.6-MariaDB-0+deb12u1") == ("MariaDB", (10, 11))
    assert parse_version("10.5.2-MariaDB") < ("MariaDB", (10, 6))
    assert parse_version("5.7.44-log") == ("MySQL", (5, 7))
    assert parse_version("8.0.36") == ("MySQL", (8, 0))


def test_sqlite_reports_tables_and_a_zero_offset(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/doctor.db"
    first = diagnose(url, probe=False)
    assert not (tmp_path / "doctor.db").exists()  # no probe: the file is not created
    assert all(not t.installed for t in first.tables)
    with jobfence.Queue(url, "q") as queue:
        queue.publish("x")
    report = diagnose(url)
    queue_table = next(t for t in report.tables if t.component == "queue")
    assert queue_table.rows == {"queues": 1, "ready": 1, "delayed": 0, "in_flight": 0, "dead": 0}
    assert report.clock_offset_ms == 0 and "host" in report.clock_note
    assert report.probe is not None and report.probe.ok


def test_rabbitmq_version_without_a_clock() -> None:
    report = diagnose(RABBITMQ_URL)
    assert report.server_version and report.server_version.startswith("RabbitMQ")
    assert report.clock_offset_ms is None and "unknown" in report.clock_note
    assert report.probe is None and report.level == "ok"


def test_memory_is_trivially_healthy() -> None:
    report = diagnose("memory://")
    assert report.level == "ok" and report.probe is not None and report.probe.ok


# -- PgBouncer ------------------------------------------------------------------------------
@pytest.fixture
def pgbouncer() -> Iterator[str]:
    """A disposable PgBouncer in transaction pooling mode in front of the local PostgreSQL;
    yields its URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError("pgbouncer is not installed (scripts/test.sh installs it)")
    target = urlsplit(POSTGRES_URL)
    user, database = target.username or "postgres", target.path.lstrip("/")
    where = Path(tempfile.mkdtemp(prefix="jobfence-pgbouncer-"))
    where.chmod(0o777)  # pgbouncer drops root for the database's user
    port = free_port()
    (where / "users.txt").write_text(f'"{user}" ""\n')
    (where / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={target.hostname} port={target.port or 5432} "
        f"dbname={database} user={user}\n"
        "[pgbouncer]\nlisten_addr = 127.0.0.1\n"
        f"listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
        f"auth_file = {where}/users.txt\npool_mode = transaction\ndefault_pool_size = 2\n"
        f"logfile = {where}/pgbouncer.log\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    proc = subprocess.Popen(
        [binary, "-u", user, str(where / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc, "pgbouncer")
        yield f"postgresql://{user}@127.0.0.1:{port}/{database}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(where, ignore_errors=True)


def test_pgbouncer_transaction_pooling_is_detected(pgbouncer: str) -> None:
    report = diagnose(pgbouncer, probe=False)
    level, message = _finding(report, "pgbouncer")
    assert level == "warning"
    assert "mode=session" in message and "LISTEN/NOTIFY" in message
    session = diagnose(pgbouncer + "?mode=session", probe=False)
    assert _finding(session, "pgbouncer")[0] == "error" and session.level == "error"


def test_pooling_detection_by_backend_pids(pgbouncer: str) -> None:
    with (
        psycopg.connect(pgbouncer, autocommit=True, prepare_threshold=None) as a,
        psycopg.connect(pgbouncer, autocommit=True, prepare_threshold=None) as b,
    ):
        assert transaction_pooled(a, b)
    with (
        psycopg.connect(POSTGRES_URL, autocommit=True) as a,
        psycopg.connect(POSTGRES_URL, autocommit=True) as b,
    ):
        assert not transaction_pooled(a, b)
