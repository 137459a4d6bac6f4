"""Inside a guarded job with a lock, ``fence(conn)`` fences the job's own lock name with its
own token: the resource is not a second string kept in sync with the lock template."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

import jobfence
from jobfence.fencing import install
from jobfence.fencing_async import install_async


def _tokens(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT resource, token FROM jobfence_fences"))


def test_fence_without_arguments_uses_the_guarded_jobs_lock_name_and_token(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        install(conn)
    locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    seen: dict[str, Any] = {}

    @jobfence.guarded(locks=locks, lock="order:{order}")
    def job(order: int) -> None:
        with sqlite3.connect(db) as conn:
            jobfence.fence(conn)
        seen["token"] = jobfence.current_lease().token

    try:
        job(7)
        assert _tokens(db) == {"order:7": seen["token"]}
        first = seen["token"]
        job(7)  # the next lease of the same name has a newer token, and fences it again
        assert seen["token"] > first
        assert _tokens(db) == {"order:7": seen["token"]}
        with sqlite3.connect(db) as conn, pytest.raises(jobfence.StaleToken):
            jobfence.fence(conn, "order:7", first)  # the old holder's token is refused
    finally:
        locks.close()


async def test_fence_async_without_arguments_inside_a_guarded_coroutine(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    async with aiosqlite.connect(db) as conn:
        await install_async(conn)
        await conn.commit()
    locks = jobfence.AsyncLocks(f"memory://{uuid.uuid4().hex}")
    seen: dict[str, Any] = {}

    @jobfence.guarded(locks=locks, lock="order:{order}")
    async def job(order: int) -> None:
        async with aiosqlite.connect(db) as conn:
            await jobfence.fence_async(conn)
            await conn.commit()
        seen["token"] = jobfence.current_lease().token

    try:
        await job(3)
        assert _tokens(db) == {"order:3": seen["token"]}
    finally:
        await locks.close()


def test_outside_a_guarded_job_resource_and_token_are_required(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "app.db") as conn:
        install(conn)
        with pytest.raises(jobfence.ConfigurationError) as no_job:
            jobfence.fence(conn)
        assert no_job.value.argument == "resource"
        with pytest.raises(jobfence.ConfigurationError) as half:
            jobfence.fence(conn, "order:1")
        assert half.value.argument == "token"
