"""The SQLite write gate: jobfence's SQLite clients of one process (of one event loop, async)
queue on one lock per database file instead of colliding in SQLite's sleeping busy handler."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

import jobfence
from jobfence.backends.sqlite import connect, connect_async


def test_one_gate_per_file_whatever_path_names_it(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    db.touch()
    link = tmp_path / "link.db"
    link.symlink_to(db)
    gate = connect.write_gate(os.path.realpath(db))
    assert connect.write_gate(os.path.realpath(link)) is gate
    assert connect.write_gate(os.path.realpath(tmp_path / "b.db")) is not gate


def test_async_gates_are_per_event_loop(tmp_path: Path) -> None:
    path = os.path.realpath(tmp_path / "a.db")

    async def two() -> tuple[object, object]:
        return connect_async.write_gate(path), connect_async.write_gate(path)

    first, again = asyncio.run(two())
    assert first is again
    other, _ = asyncio.run(two())
    assert other is not first  # an asyncio.Lock belongs to one loop


@pytest.mark.parametrize("part", ["inbox", "queue", "locks"])
def test_every_sqlite_client_waits_for_the_gate(tmp_path: Path, part: str) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    with (
        jobfence.Inbox(url) as inbox,
        jobfence.Queue(url, "q") as queue,
        jobfence.Locks(url) as locks,
    ):
        # open each client's connection and table first
        inbox.claim("warm").release()
        queue.publish({"warm": True})
        assert locks.try_acquire("warm", renew=False) is not None
        operation = {
            "inbox": lambda: inbox.claim("k"),
            "queue": lambda: queue.publish({"n": 1}),
            "locks": lambda: locks.try_acquire("n", renew=False),
        }[part]
        done = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                operation()
            except BaseException as exc:  # reported by the assertion below
                failed.append(exc)
            done.set()

        gate = connect.write_gate(os.path.realpath(tmp_path / "g.db"))
        with gate:
            thread = threading.Thread(target=run)
            thread.start()
            assert not done.wait(0.3), "the operation did not wait for the gate"
        assert done.wait(30)
        thread.join()
        assert not failed, failed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_process_does_not_inherit_a_held_gate(tmp_path: Path) -> None:
    path = os.path.realpath(tmp_path / "a.db")
    gate = connect.write_gate(path)
    with gate:  # held by this thread when the child is forked
        pid = os.fork()
        if pid == 0:  # the child: a fresh gate, free at once
            ok = connect.write_gate(path).acquire(timeout=5)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
