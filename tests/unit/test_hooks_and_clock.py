"""Every backend call passes through the one I/O hook, and sleeps through the one clock."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import jobfence
from jobfence.testing import set_hook


@pytest.fixture
def points() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    old = set_hook(lambda point, **info: seen.append((point, info)))
    try:
        yield seen
    finally:
        set_hook(old)


def test_lock_operations_call_the_hook(points: list[tuple[str, dict[str, Any]]]) -> None:
    locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
    lease = locks.try_acquire("inventory:1", ttl=5)
    assert lease is not None
    lease.extend()
    lease.release()
    # only this client's calls: a renewer left running elsewhere must not confuse the check
    mine = [(p, info) for p, info in points if info.get("name") == "inventory:1"]
    names = [p for p, _ in mine]
    assert names[:3] == ["lock.acquire", "lock.extend", "lock.release"]
    assert mine[0][1]["backend"] == "memory"
    locks.close()


async def test_async_hook_can_inject_a_fault(points: list[Any]) -> None:
    locks = jobfence.AsyncLocks(f"memory://{uuid.uuid4().hex}")

    async def fail_release(point: str, **info: Any) -> None:
        if point == "lock.release":
            raise ConnectionError("injected")

    old = set_hook(fail_release)
    try:
        lease = await locks.try_acquire("a", ttl=5)
        assert lease is not None
        with pytest.raises(jobfence.BackendError) as info:
            await lease.release()
        assert isinstance(info.value.__cause__, ConnectionError)
        assert info.value.operation == "lock.release" and info.value.backend == "memory"
    finally:
        set_hook(old)
        await locks.close()
