"""A lease holder process frozen past its ttl (SIGSTOP) loses its lease for good.

Every backend whose leases honour ``ttl`` (PostgreSQL lease mode, MySQL/MariaDB, SQLite, Redis):
the holder runs in its own process with renewal on; it is stopped with SIGSTOP long enough for
its lease to expire on the backend's clock; this test's process takes the lease over with a
larger fencing token; the holder is resumed with SIGCONT. It must find out that its lease is
lost (on_lost runs, check() raises), the backend must refuse its extend and release (owner
check), and the new holder keeps the lease. Refusing the ex-holder's *write* is fencing's job:
``test_fenced_stale_holder.py``.

PostgreSQL session mode is the documented opposite (capability ``ttl_expiry=False``): a stopped
holder keeps its advisory lock, because its connection stays open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import jobfence
from tests.conformance.specs import FLAVOURS, LOCKS, spec_params

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
# the holder runs in a process of its own: only backends shared between processes
TTL_SPECS = spec_params(LOCKS, lambda s: s.cross_process and s.ttl_expiry)
NO_TTL_SPECS = spec_params(LOCKS, lambda s: s.cross_process and not s.ttl_expiry)

# The holder prints "TOKEN <token>", then waits for a line on stdin (it is stopped and resumed
# around here), then reports what it finds out about its lease.
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
        sys.stdin.readline()
        report(lease, lost)
        # the server's owner check, bypassing the lease object's local state
        print("SERVER-EXTEND", locks.backend.extend(name, lease.owner, 30), flush=True)
        print("SERVER-RELEASE", locks.backend.release(name, lease.owner), flush=True)
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
            ok = await locks.backend.extend(name, lease.owner, 30)
            print("SERVER-EXTEND", ok, flush=True)
            print("SERVER-RELEASE", await locks.backend.release(name, lease.owner), flush=True)
            try:
                await lease.extend()
                print("EXTENDED", flush=True)
            except jobfence.LockLost:
                print("EXTEND-LOCKLOST", flush=True)
            print("RELEASE", await lease.release(), flush=True)
    asyncio.run(main())
"""


def _start_holder(url: str, namespace: str, name: str, flavour: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, namespace, name, flavour],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _first_token(holder: subprocess.Popen[str]) -> int:
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line.startswith("TOKEN"), line + (holder.stderr.read() if holder.stderr else "")
    return int(line.split()[1])


def _stop(holder: subprocess.Popen[str]) -> None:
    if holder.poll() is None:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("backend", TTL_SPECS, indirect=True)
def test_stopped_holder_loses_its_lease_to_a_new_holder(
    backend: tuple[str, str], flavour: str
) -> None:
    url, namespace = backend
    name = "job:stale"
    holder = _start_holder(url, namespace, name, flavour)
    assert holder.stdin is not None
    try:
        old_token = _first_token(holder)
        with jobfence.Locks(url, namespace=namespace) as locks:
            assert locks.try_acquire(name, ttl=5) is None  # held (and renewed) by the holder
            os.kill(holder.pid, signal.SIGSTOP)  # frozen: no renewal any more
            try:
                # the lease expires on the backend's clock; this process takes it over
                new = locks.acquire(name, ttl=10, timeout=20)
                assert new.token > old_token
            finally:
                os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            out, err = holder.communicate(timeout=30)
            lines = out.splitlines()
            assert "LOST" in lines, out + err  # on_lost ran
            assert "CHECK-LOCKLOST" in lines, out + err
            assert "SERVER-EXTEND False" in lines, out + err
            assert "SERVER-RELEASE False" in lines, out + err
            assert "EXTEND-LOCKLOST" in lines, out + err
            assert "RELEASE False" in lines, out + err
            assert holder.returncode == 0, err
            # the new holder is untouched by the stale one
            new.check()
            assert locks.try_acquire(name, ttl=5) is None
            new.extend()
            assert new.release()
    finally:
        _stop(holder)


@pytest.mark.parametrize("backend", NO_TTL_SPECS, indirect=True)
def test_session_mode_stopped_holder_keeps_its_lock(backend: tuple[str, str]) -> None:
    """The documented trade-off of mode=session: no ttl expiry while the connection lives."""
    url, namespace = backend
    name = "job:stale"
    holder = _start_holder(url, namespace, name, "sync")
    assert holder.stdin is not None
    try:
        _first_token(holder)
        with jobfence.Locks(url, namespace=namespace) as locks:
            os.kill(holder.pid, signal.SIGSTOP)
            try:
                with pytest.raises(jobfence.LockTimeout):
                    locks.acquire(name, ttl=1, timeout=1.5)  # longer than the holder's ttl
            finally:
                os.kill(holder.pid, signal.SIGCONT)
    finally:
        _stop(holder)
