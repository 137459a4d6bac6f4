"""The specs of ``specs.py`` cover every registered backend, and say the truth about it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence.backends import backend_for, registered
from tests.conformance import _collected_specs
from tests.conformance.specs import (
    INBOX,
    LOCKS,
    SPECS,
    SUITES,
    Spec,
    inbox_table,
    new_namespace,
    spec_params,
)
from tests.servers import mysql_params

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _collected_spec_ids(tmp_path: Path) -> dict[str, set[str]]:
    """Suite file name -> the ids of the specs its collected tests run (a pytest subprocess
    collects the suites as they are, so a suite parametrised by hand is seen as it is)."""
    report = tmp_path / "collected.txt"
    suites = [str(HERE / name) for name in sorted(set(SUITES.values()))]
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, "-p", _collected_specs.__name__, *suites],
        cwd=ROOT,
        env={**os.environ, _collected_specs.ENV: str(report)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected: dict[str, set[str]] = {}
    for line in report.read_text().splitlines():
        suite, spec_id = line.split()
        collected.setdefault(suite, set()).add(spec_id)
    return collected


def test_every_part_of_every_registered_backend_runs_through_its_suite(tmp_path: Path) -> None:
    """For each backend jobfence can open and each part it provides, some spec must open that
    backend and be run by that part's conformance suite. A new backend, or a new part of a
    backend (or a part without a suite), fails here until a spec runs it."""
    parts_of: dict[str, set[str]] = {}  # backend name -> its parts, over all its schemes
    for info in registered().values():
        parts_of.setdefault(info.name, set()).update(info.parts)
    ids = [s.id for s in SPECS]
    assert len(ids) == len(set(ids)), f"spec ids must be unique (they are test ids): {ids}"

    problems: list[str] = []
    # every spec opens the backend it names, for each part it runs
    for spec in SPECS:
        if spec.backend not in parts_of:
            problems.append(f"spec {spec.id!r}: no registered backend {spec.backend!r}")
            continue
        scheme = urlsplit(spec.make_url(tmp_path)).scheme
        for part in sorted(spec.parts):
            try:
                opened = backend_for(scheme, part).name
            except jobfence.ConfigurationError as exc:
                opened = f"nothing ({exc})"
            if opened != spec.backend:
                problems.append(
                    f"spec {spec.id!r}: its URL opens {opened} for {part}, not {spec.backend}"
                )

    collected = _collected_spec_ids(tmp_path)
    for name, parts in sorted(parts_of.items()):
        for part in sorted(parts):
            suite = SUITES.get(part)
            if suite is None:
                problems.append(f"{name}: part {part!r} has no conformance suite in SUITES")
                continue
            wanted = {s.id for s in SPECS if s.backend == name and s.runs(part)}
            if not wanted:
                problems.append(f"{name}: no spec runs its {part!r} part")
            elif not wanted & collected.get(suite, set()):
                problems.append(
                    f"{name}: {suite} collects no test with its {part!r} spec(s) {sorted(wanted)}"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("spec", spec_params(LOCKS))
def test_lock_knobs_match_the_backend_capabilities(spec: Spec, tmp_path: Path) -> None:
    """The suites choose tests by a spec's knobs (a second process, ttl expiry, a FIFO wait
    queue, a wait inside the server): they must be what the backend declares."""
    url, namespace = spec.make_url(tmp_path), new_namespace()
    locks = jobfence.Locks(url, namespace=namespace)
    knobs = ("cross_process", "ttl_expiry", "fifo", "queue_follows_connection")
    try:
        caps = locks.capabilities
        assert {k: getattr(spec, k) for k in knobs} == {k: getattr(caps, k) for k in knobs}
    finally:
        locks.close()
        spec.cleanup(url, namespace)


@pytest.mark.parametrize("spec", spec_params(INBOX))
def test_inbox_knobs_match_the_backend_capabilities(spec: Spec, tmp_path: Path) -> None:
    url, namespace = spec.make_url(tmp_path), new_namespace()
    inbox = jobfence.Inbox(url, table=inbox_table(namespace))
    try:
        assert spec.cross_process == inbox.capabilities.cross_process
        # min_claim_ttl: the server keeps a claim of a shorter ttl that long (etcd's lease of
        # whole seconds, at least 2), or it ends the claim at its ttl (min_claim_ttl 0)
        inbox.claim("knob:ttl", ttl=0.5)
        info = inbox.claim_info("knob:ttl")
        assert info is not None
        if spec.min_claim_ttl:
            assert info.expires_in >= spec.min_claim_ttl / 2, info
        else:
            assert info.expires_in <= 0.5, info
    finally:
        inbox.close()
        spec.cleanup(url, namespace)


# -- clean-up -------------------------------------------------------------------------------


def _postgres_leftovers(url: str, namespace: str) -> list[str]:
    import psycopg

    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (namespace + "%",)
        ).fetchall()
        rows = conn.execute(
            "SELECT table_name FROM jobfence_inbox_schema WHERE table_name LIKE %s",
            (namespace + "%",),
        ).fetchall()
    return [f"table {t}" for (t,) in tables] + [f"schema row {r}" for (r,) in rows]


def _mysql_leftovers(url: str, namespace: str) -> list[str]:
    import pymysql

    conn = pymysql.connect(**mysql_params())
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE %s",
                (namespace + "%",),
            )
            tables = list(cur.fetchall())
            cur.execute(
                "SELECT table_name FROM jobfence_inbox_schema WHERE table_name LIKE %s",
                (namespace + "%",),
            )
            rows = list(cur.fetchall())
    finally:
        conn.close()
    return [f"table {t}" for (t,) in tables] + [f"schema row {r}" for (r,) in rows]


def _redis_leftovers(url: str, namespace: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(url.split("?", 1)[0])
    try:
        return [f"key {k!r}" for k in client.scan_iter(match=namespace + "*", count=1000)]
    finally:
        client.close()


#: how to list what a test left in a server (memory and SQLite leave nothing outside the test
#: process and its tmp_path)
LEFTOVERS: dict[str, Callable[[str, str], list[str]]] = {
    "postgres": _postgres_leftovers,
    "mysql": _mysql_leftovers,
    "redis": _redis_leftovers,
}


@pytest.mark.parametrize(
    "spec", [pytest.param(s, id=s.id) for s in SPECS if s.backend in LEFTOVERS]
)
def test_cleanup_removes_what_each_part_left(spec: Spec, tmp_path: Path) -> None:
    url, namespace = spec.make_url(tmp_path), new_namespace()
    leftovers = LEFTOVERS[spec.backend]
    if spec.runs(LOCKS):
        with jobfence.Locks(url, namespace=namespace) as locks:
            lease = locks.try_acquire("job:cleanup", ttl=30, renew=False)
            assert lease is not None
    if spec.runs(INBOX):
        inbox = jobfence.Inbox(url, table=inbox_table(namespace))
        try:
            inbox.claim("order:1").complete("done")
        finally:
            inbox.close()
    assert leftovers(url, namespace), "nothing was left to clean up: check the namespace"
    spec.cleanup(url, namespace)
    assert leftovers(url, namespace) == []
