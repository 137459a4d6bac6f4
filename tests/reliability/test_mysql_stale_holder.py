"""A lease holder process frozen past its ttl (SIGSTOP) loses its MySQL lease for good.

The holder runs in its own process with renewal on. It is stopped with SIGSTOP long enough for
its lease to expire on the server; another process (this test) takes the lease over with a
larger fencing token; the holder is resumed with SIGCONT. It must find out that its lease is
lost (on_lost runs, check() raises), must not be able to extend or release the new holder's
lease, and the new holder keeps it. (Refusing the stale holder's *writes* is fencing's job:
tests/reliability/test_fenced_stale_holder.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

import jobfence
from tests.servers import MYSQL_URL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]

HOLDER = r"""
import asyncio, sys, threading
import jobfence

url, namespace, name, flavour = sys.argv[1:5]
TTL = 1.0

def report(lease, lost):
    print("LOST" if lost.wait(20) else "NOT-LOST", flush=True)
    try:
        lease.check()
        print("CHECK-OK", flush=True)
    except jobfence.LockLost:
        print("CHECK-LOCKLOST", flush=True)

if flavour == "sync":
    with jobfence.Locks(url, namespace=namespace) as locks:
        lease = locks.try_acquire(name, ttl=TTL)
        lost = threading.Event()
        lease.on_lost(lambda _l: lost.set())
        print("TOKEN", lease.token, flush=True)
        sys.stdin.readline()  # paused (SIGSTOP) and resumed (SIGCONT) around here
        report(lease, lost)
        try:
            lease.extend()
            print("EXTENDED", flush=True)
        except jobfence.LockLost:
            print("EXTEND-LOCKLOST", flush=True)
        print("RELEASE", lease.release(), flush=True)
else:
    async def main():
        async with jobfence.AsyncLocks(url, namespace=namespace) as locks:
            lease = await locks.try_acquire(name, ttl=TTL)
            lost = threading.Event()
            lease.on_lost(lambda _l: lost.set())
            print("TOKEN", lease.token, flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            await asyncio.to_thread(report, lease, lost)
            try:
                await lease.extend()
                print("EXTENDED", flush=True)
            except jobfence.LockLost:
                print("EXTEND-LOCKLOST", flush=True)
            print("RELEASE", await lease.release(), flush=True)
    asyncio.run(main())
"""


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = "tmys" + uuid.uuid4().hex[:10]
    try:
        yield ns
    finally:
        from urllib.parse import urlsplit

        u = urlsplit(MYSQL_URL)
        conn = pymysql.connect(
            host=u.hostname,
            port=u.port or 3306,
            user=u.username,
            password=u.password or "",
            database=u.path.lstrip("/"),
            autocommit=True,
        )
        try:
            with conn.cursor() as cur:
                for suffix in ("_locks", "_schema", "_lock_tokens"):
                    cur.execute(f"DROP TABLE IF EXISTS `{ns}{suffix}`")
        finally:
            conn.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_stopped_holder_loses_its_lease_to_a_new_holder(namespace: str, flavour: str) -> None:
    name = "job:stale"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, MYSQL_URL, namespace, name, flavour],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        line = holder.stdout.readline()
        assert line.startswith("TOKEN"), line + (holder.stderr.read() if holder.stderr else "")
        old_token = int(line.split()[1])
        with jobfence.Locks(MYSQL_URL, namespace=namespace) as locks:
            assert locks.try_acquire(name, ttl=5) is None  # held (and renewed) by the holder
            os.kill(holder.pid, signal.SIGSTOP)  # frozen: no renewal any more
            try:
                # the lease expires on the server's clock; this process takes it over
                new = locks.acquire(name, ttl=10, timeout=20)
                assert new.token > old_token
            finally:
                os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            out, err = holder.communicate(timeout=30)
            lines = out.split()
            assert "LOST" in lines, out + err
            assert "CHECK-LOCKLOST" in lines, out + err
            assert "EXTEND-LOCKLOST" in lines, out + err
            assert "RELEASE False" in out, out + err
            assert holder.returncode == 0, err
            # the new holder is untouched by the stale one
            new.check()
            assert locks.try_acquire(name, ttl=5) is None
            new.extend()
            assert new.release()
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()
