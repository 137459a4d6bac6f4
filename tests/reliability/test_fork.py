"""Clients touched before a ``fork()`` keep working on both sides of it.

The parent opens a ``Locks`` and an ``Inbox``, uses them (so their pools hold connections and
the lock renewer runs), holds a lease, and forks children with ``multiprocessing`` (fork
start method). Every child uses the very same client objects at the same time as its siblings
and the parent: it must get connections of its own (no statement may fail), a renewer of its
own for its own leases and claims, and it must leave the parent's lease alone -- never renew
it, never release it (not even when the child closes the clients), never report it lost. The
parent's lease stays held, renewed by the parent only, and the parent's clients keep working.

The sync clients are used as a prefork worker uses them; the async ones from an event loop
that runs in a thread of the parent while its main thread forks, each child then running a
loop of its own with the inherited clients. ``test_celery_prefork.py`` does the same with a
real Celery worker.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from typing import Any

import pytest

import jobfence
from jobfence.testing import hooked
from tests.conformance.specs import LOCKS, inbox_table, spec_params

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FORK = multiprocessing.get_context("fork")
#: backends shared between processes (PostgreSQL in both modes)
SPECS = spec_params(LOCKS, lambda s: s.cross_process)
CHILDREN = 3
ROUNDS = 8
PARENT_TTL = 1.5
#: a child's leases and claims: renewed about every CHILD_TTL / 3, so a hold of CHILD_HOLD sees
#: a renewal, with room for a slow round trip on a loaded machine (a 0.6 s ttl once expired
#: under a parallel test run, and its release found it gone)
CHILD_TTL = 1.2
CHILD_HOLD = 0.5


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _recorder(report: dict[str, Any]) -> Any:
    """A hook recording every name this process renews or releases into ``report``."""

    def hook(point: str, **info: Any) -> None:
        if point in ("lock.renew", "inbox.renew"):
            report["renewed"] += info.get("names") or info.get("keys") or []
        elif point == "lock.release":
            report["released"].append(info["name"])

    return hook


def _send(report: dict[str, Any], records: _Records, parent_name: str, out: Any) -> None:
    report["warnings"] = records.messages
    report["renewed_parent"] = parent_name in report["renewed"]
    report["released_parent"] = parent_name in report["released"]
    out.put(report)
    out.close()
    out.join_thread()
    os._exit(0)


def _new_report() -> tuple[dict[str, Any], _Records]:
    records = _Records()
    logging.getLogger("jobfence").addHandler(records)
    return {"pid": os.getpid(), "errors": [], "renewed": [], "released": []}, records


def _child(locks: Any, inbox: Any, parent_name: str, out: Any) -> None:
    """Runs in a forked child: works with the inherited clients, reports what it saw."""
    report, records = _new_report()
    try:
        with hooked(_recorder(report)):
            for i in range(ROUNDS):
                name = f"child:{os.getpid()}:{i}"
                try:
                    lease = locks.try_acquire(name, ttl=CHILD_TTL)
                    assert lease is not None, "a free name was not granted"
                    claim = inbox.claim(name, ttl=CHILD_TTL, renew=True)
                    assert claim.state is jobfence.ClaimState.NEW, claim
                    time.sleep(CHILD_HOLD)  # long enough for a renewal of both
                    claim.complete({"i": i})
                    assert inbox.claim(name).result == {"i": i}
                    assert lease.release()
                except Exception as exc:
                    report["errors"].append(f"round {i}: {type(exc).__name__}: {exc}")
            # the child's renewer tracks only the child's leases (all released by now)
            report["tracked"] = len(locks._renewer)
            locks.close()
            inbox.close()
    except BaseException as exc:
        report["errors"].append(f"{type(exc).__name__}: {exc}")
    _send(report, records, parent_name, out)


def _async_child(locks: Any, inbox: Any, parent_name: str, out: Any) -> None:
    """:func:`_child` with ``AsyncLocks``/``AsyncInbox``, on an event loop of the child's."""
    report, records = _new_report()

    async def work() -> None:
        for i in range(ROUNDS):
            name = f"child:{os.getpid()}:{i}"
            try:
                lease = await locks.try_acquire(name, ttl=CHILD_TTL)
                assert lease is not None, "a free name was not granted"
                claim = await inbox.claim(name, ttl=CHILD_TTL, renew=True)
                assert claim.state is jobfence.ClaimState.NEW, claim
                await asyncio.sleep(CHILD_HOLD)
                await claim.complete({"i": i})
                assert (await inbox.claim(name)).result == {"i": i}
                assert await lease.release()
            except Exception as exc:
                report["errors"].append(f"round {i}: {type(exc).__name__}: {exc}")
        report["tracked"] = len(locks._renewer)
        await locks.close()
        await inbox.close()

    try:
        with hooked(_recorder(report)):
            asyncio.run(work())
    except BaseException as exc:
        report["errors"].append(f"{type(exc).__name__}: {exc}")
    _send(report, records, parent_name, out)


def _check(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert report["errors"] == [], report
        assert report["warnings"] == [], report  # nothing reported lost
        assert report["tracked"] == 0, report
        assert not report["renewed_parent"], report
        assert not report["released_parent"], report
        assert any(name.startswith("child:") for name in report["renewed"]), report


def _held_elsewhere(url: str, namespace: str, name: str) -> bool:
    other = jobfence.Locks(url, namespace=namespace)
    try:
        return other.try_acquire(name, ttl=1, renew=False) is None
    finally:
        other.close()


def _inbox_url(url: str) -> str:
    """The lock URL without the lock-only option ``mode`` (PostgreSQL session mode)."""
    return url.replace("?mode=session", "")


@pytest.mark.parametrize("backend", SPECS, indirect=True)
def test_forked_children_get_their_own_connections_and_leave_the_parents_lease_alone(
    backend: tuple[str, str],
) -> None:
    url, namespace = backend
    locks = jobfence.Locks(url, namespace=namespace)
    inbox = jobfence.Inbox(_inbox_url(url), table=inbox_table(namespace))
    parent_renewals: list[str] = []
    parent = threading.get_ident()

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and threading.get_ident() != parent:
            parent_renewals.extend(info["names"])

    try:
        inbox.install()
        warm = inbox.claim("warm")  # the pools hold connections now
        warm.complete(None)
        lease = locks.try_acquire("parent", ttl=PARENT_TTL)
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _l: lost.set())
        with hooked(hook):
            out = FORK.Queue()
            children = [
                FORK.Process(target=_child, args=(locks, inbox, "parent", out))
                for _ in range(CHILDREN)
            ]
            for child in children:
                child.start()
            # the parent goes on using its clients while the children run
            for i in range(ROUNDS):
                claim = inbox.claim(f"parent:{i}")
                assert claim.state is jobfence.ClaimState.NEW
                claim.complete(i)
                assert inbox.claim(f"parent:{i}").result == i
                time.sleep(0.1)
            reports = [out.get(timeout=60) for _ in children]
            for child in children:
                child.join(10)
            time.sleep(PARENT_TTL)  # the parent's lease lives on past its ttl
        _check(reports)
        assert not lost.is_set()
        assert lease.held
        assert "parent" in parent_renewals  # renewed by the parent ...
        assert _held_elsewhere(url, namespace, "parent")  # ... and held on the backend
        assert lease.release()
    finally:
        inbox.drop()
        inbox.close()
        locks.close()


@pytest.mark.parametrize("backend", SPECS, indirect=True)
def test_forked_children_of_an_async_parent_run_their_own_loop_with_its_clients(
    backend: tuple[str, str],
) -> None:
    url, namespace = backend
    locks = jobfence.AsyncLocks(url, namespace=namespace)
    inbox = jobfence.AsyncInbox(_inbox_url(url), table=inbox_table(namespace))
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="parent-loop", daemon=True)
    runner.start()
    parent_renewals: list[str] = []

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    def hook(point: str, **info: Any) -> None:
        if point == "lock.renew" and threading.current_thread() is runner:
            parent_renewals.extend(info["names"])

    async def setup() -> Any:
        await inbox.install()
        await (await inbox.claim("warm")).complete(None)
        return await locks.try_acquire("parent", ttl=PARENT_TTL)

    async def parent_round(i: int) -> None:
        claim = await inbox.claim(f"parent:{i}")
        assert claim.state is jobfence.ClaimState.NEW
        await claim.complete(i)
        assert (await inbox.claim(f"parent:{i}")).result == i

    try:
        lease = on_loop(setup())
        assert lease is not None
        lost = threading.Event()
        lease.on_lost(lambda _l: lost.set())
        with hooked(hook):
            out = FORK.Queue()
            children = [
                FORK.Process(target=_async_child, args=(locks, inbox, "parent", out))
                for _ in range(CHILDREN)
            ]
            for child in children:
                child.start()
            for i in range(ROUNDS):
                on_loop(parent_round(i))
                time.sleep(0.1)
            reports = [out.get(timeout=60) for _ in children]
            for child in children:
                child.join(10)
            time.sleep(PARENT_TTL)
        _check(reports)
        assert not lost.is_set()
        assert lease.held
        assert "parent" in parent_renewals
        assert _held_elsewhere(url, namespace, "parent")
        assert on_loop(lease.release())
    finally:
        try:
            on_loop(inbox.drop())
        finally:
            on_loop(inbox.close())
            on_loop(locks.close())
            loop.call_soon_threadsafe(loop.stop)
            runner.join(10)
            loop.close()
