"""jobfence.testing: the public hook, clock and hook point names.

The source scan keeps :data:`jobfence.testing.POINTS` true: every point name a hook call in
``src/jobfence`` uses is listed, every listed point is used, and the keywords passed at each
point are the documented ones.
"""

from __future__ import annotations

import ast
import asyncio
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import jobfence
import jobfence._core.clock
import jobfence._core.hooks
from jobfence import testing
from jobfence.testing import (
    POINTS,
    Clock,
    ManualClock,
    clocked,
    get_clock,
    get_hook,
    hooked,
    set_clock,
    set_hook,
)

SRC = Path(jobfence.__file__).parent
HOOK_FUNCTIONS = {"hook", "ahook"}


# ------------------------------------------------------------------------ the source scan


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _keywords(call: ast.Call) -> set[str]:
    assert all(kw.arg is not None for kw in call.keywords), ast.unparse(call)
    return {kw.arg for kw in call.keywords if kw.arg is not None}


def _scan() -> tuple[dict[str, set[str]], dict[str, list[str]], list[str]]:
    """(point -> keywords passed, point -> where, problems) for every hook call in jobfence.

    A hook call passes a literal point name, or forwards a parameter of the function it is in:
    that function is a wrapper (``Locks._call``), and every call of it must pass a literal at
    that parameter's position."""
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8"), str(path))
        for path in sorted(SRC.rglob("*.py"))
    }
    used: dict[str, set[str]] = defaultdict(set)
    where: dict[str, list[str]] = defaultdict(list)
    problems: list[str] = []
    # wrapper name -> defining module -> (index of the point argument, keywords it passes)
    wrappers: dict[str, dict[Path, tuple[int, set[str]]]] = defaultdict(dict)

    for path, tree in trees.items():
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in func.args.posonlyargs + func.args.args]
            if params and params[0] in ("self", "cls"):
                params = params[1:]
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and _called_name(call) in HOOK_FUNCTIONS):
                    continue
                if not call.args:
                    problems.append(f"{path}:{call.lineno}: hook call without a point name")
                    continue
                point = _literal(call.args[0])
                if point is not None:
                    used[point] |= _keywords(call)
                    where[point].append(f"{path.relative_to(SRC)}:{call.lineno}")
                elif isinstance(call.args[0], ast.Name) and call.args[0].id in params:
                    index = params.index(call.args[0].id)
                    wrappers[func.name][path] = (index, _keywords(call))
                else:
                    problems.append(
                        f"{path}:{call.lineno}: hook point is neither a literal nor a parameter: "
                        + ast.unparse(call)
                    )

    for path, tree in trees.items():
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            name = _called_name(call)
            if name not in wrappers:
                continue
            # a wrapper of this module, else the only one (Locks.call_backend for Lease)
            definitions = wrappers[name]
            if path in definitions:
                index, keywords = definitions[path]
            elif len(set(map(repr, definitions.values()))) == 1:
                # one wrapper (in a module and its generated twin, say) forwarding alike
                (index, keywords), *_ = definitions.values()
            else:
                problems.append(f"{path}:{call.lineno}: which {name}() is this? {definitions}")
                continue
            point = _literal(call.args[index]) if len(call.args) > index else None
            if point is None:
                problems.append(
                    f"{path}:{call.lineno}: {name}() needs a literal point name: "
                    + ast.unparse(call)
                )
                continue
            used[point] |= keywords
            where[point].append(f"{path.relative_to(SRC)}:{call.lineno}")
    return used, where, problems


def test_every_hook_call_uses_a_listed_point_and_every_listed_point_is_used() -> None:
    used, where, problems = _scan()
    assert not problems, "\n".join(problems)
    # the scan itself works: the wrappers' call sites and the direct calls were both found
    assert {"lock.acquire", "inbox.claim", "lock.renew", "sleep"} <= used.keys()
    unlisted = {p: where[p] for p in used.keys() - POINTS.keys()}
    assert not unlisted, f"hook points used in src/jobfence but not in POINTS: {unlisted}"
    unused = sorted(POINTS.keys() - used.keys())
    assert not unused, f"POINTS lists points no hook call in src/jobfence uses: {unused}"


def test_each_point_carries_the_documented_keywords() -> None:
    used, where, _ = _scan()
    wrong = {
        name: (sorted(used[name]), point.info, where[name])
        for name, point in POINTS.items()
        if used[name] != set(point.info)
    }
    assert not wrong, f"point -> (keywords passed, documented, call sites): {wrong}"


def test_points_are_documented_and_read_only() -> None:
    assert list(POINTS) == [p.name for p in POINTS.values()]
    for name, point in POINTS.items():
        assert name == point.name
        assert "." in name or name == "sleep"
        assert point.meaning and "\n" not in point.meaning
        assert point.info and all(isinstance(k, str) for k in point.info)
    with pytest.raises(TypeError):
        POINTS["x"] = POINTS["sleep"]  # type: ignore[index]
    doc_path = SRC.parent.parent / "docs" / "reference" / "testing-seams.md"
    doc = doc_path.read_text(encoding="utf-8")
    missing = [name for name in POINTS if f"`{name}`" not in doc]
    assert not missing, f"docs/reference/testing-seams.md does not describe {missing}"


# ------------------------------------------------------------------------ the public API


def test_public_names_are_the_private_implementation() -> None:
    assert set_hook is jobfence._core.hooks.set_hook
    assert get_hook is jobfence._core.hooks.get_hook
    assert set_clock is jobfence._core.clock.set_clock
    assert get_clock is jobfence._core.clock.get_clock
    assert Clock is jobfence._core.clock.Clock
    seams = {
        "POINTS",
        "Clock",
        "HookFn",
        "HookPoint",
        "clocked",
        "get_clock",
        "get_hook",
        "hooked",
        "set_clock",
        "set_hook",
    }
    assert seams <= set(testing.__all__)
    assert all(hasattr(testing, name) for name in testing.__all__)


def test_hooked_restores_the_previous_hook_also_when_the_block_raises() -> None:
    def outer(point: str, **info: Any) -> None:
        pass

    def inner(point: str, **info: Any) -> None:
        pass

    before = get_hook()
    with hooked(outer) as installed:
        assert installed is outer and get_hook() is outer
        with pytest.raises(RuntimeError), hooked(inner):
            assert get_hook() is inner
            raise RuntimeError("boom")
        assert get_hook() is outer
        with hooked(None):
            assert get_hook() is None
        assert get_hook() is outer
    assert get_hook() is before


def test_clocked_restores_the_previous_clock_also_when_the_block_raises() -> None:
    before = get_clock()
    fake = ManualClock()
    with pytest.raises(RuntimeError), clocked(fake) as installed:
        assert installed is fake and get_clock() is fake
        raise RuntimeError("boom")
    assert get_clock() is before


def test_bad_hook_and_clock_are_refused_naming_the_argument() -> None:
    before_hook, before_clock = get_hook(), get_clock()
    with pytest.raises(jobfence.ConfigurationError) as info:
        set_hook("lock.acquire")  # type: ignore[arg-type]
    assert info.value.argument == "fn"
    with pytest.raises(jobfence.ConfigurationError) as info:
        set_clock(object())  # type: ignore[arg-type]
    assert info.value.argument == "clock" and "monotonic" in str(info.value)
    assert get_hook() is before_hook and get_clock() is before_clock


# ------------------------------------------------- the hook sees a scripted run, in order


def test_hook_sees_lock_and_inbox_points_in_order() -> None:
    uid = uuid.uuid4().hex
    locks = jobfence.Locks(f"memory://{uid}")
    inbox = jobfence.Inbox(f"memory://{uid}")
    me = threading.get_ident()
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(point: str, **info: Any) -> None:
        if threading.get_ident() == me:  # not a renewer thread left by another test
            seen.append((point, info))

    with hooked(record):
        lease = locks.acquire("job:1", ttl=30, timeout=5, renew=False)
        claim = inbox.claim("order:1")
        assert claim.state is jobfence.ClaimState.NEW
        claim.complete({"ok": True})
        assert lease.release()
    locks.try_acquire("job:1", ttl=30, renew=False)  # outside the block: not seen

    assert seen == [
        ("lock.acquire", {"name": "job:1", "backend": "memory"}),
        ("inbox.claim", {"key": "order:1", "backend": "memory"}),
        ("inbox.complete", {"key": "order:1", "backend": "memory"}),
        ("lock.release", {"name": "job:1", "backend": "memory"}),
    ]
    assert all(point in POINTS for point, _ in seen)
    locks.close()
    inbox.close()


async def test_async_hook_sees_lock_and_inbox_points_in_order() -> None:
    uid = uuid.uuid4().hex
    locks = jobfence.AsyncLocks(f"memory://{uid}")
    inbox = jobfence.AsyncInbox(f"memory://{uid}")
    me = asyncio.current_task()
    seen: list[tuple[str, dict[str, Any]]] = []

    async def record(point: str, **info: Any) -> None:  # a coroutine hook is awaited
        if asyncio.current_task() is me:
            await asyncio.sleep(0)
            seen.append((point, info))

    with hooked(record):
        lease = await locks.acquire("job:1", ttl=30, timeout=5, renew=False)
        claim = await inbox.claim("order:1")
        await claim.complete("done")
        assert await lease.release()

    assert [point for point, _ in seen] == [
        "lock.acquire",
        "inbox.claim",
        "inbox.complete",
        "lock.release",
    ]
    assert seen[1][1] == {"key": "order:1", "backend": "memory"}
    await locks.close()
    await inbox.close()


# ---------------------------------------------------------- a manual clock drives expiry


def test_a_fake_clock_expires_a_memory_lease_without_real_waiting() -> None:
    started = time.monotonic()
    ttl = 3600.0  # an hour: only the manual clock can let it run out during this test
    with clocked(ManualClock(10_000.0)) as clock:
        locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
        lease = locks.try_acquire("report", ttl=ttl, renew=False)
        assert lease is not None and lease.expires_in == ttl

        clock.advance(ttl - 1)
        assert lease.held and lease.expires_in == pytest.approx(1.0)
        assert locks.try_acquire("report", ttl=ttl, renew=False) is None  # still held

        clock.advance(1)
        assert lease.lost
        with pytest.raises(jobfence.LockLost):
            lease.check()
        successor = locks.try_acquire("report", ttl=ttl, renew=False)
        assert successor is not None and successor.token > lease.token
        assert not lease.release()  # owner-checked: the expired lease cannot free the name
        assert locks.try_acquire("report", ttl=ttl, renew=False) is None
        assert successor.release()
        locks.close()
    assert clock.sleeps == []
    assert time.monotonic() - started < ttl / 10


def test_a_fake_clock_expires_a_memory_inbox_claim_for_a_takeover() -> None:
    with clocked(ManualClock(10_000.0)) as clock:
        inbox = jobfence.Inbox(f"memory://{uuid.uuid4().hex}")
        first = inbox.claim("order:7", ttl=600)
        assert first.state is jobfence.ClaimState.NEW and first.attempt == 1

        clock.advance(599)
        assert inbox.claim("order:7").state is jobfence.ClaimState.IN_PROGRESS

        clock.advance(1)
        second = inbox.claim("order:7", ttl=600)
        assert second.state is jobfence.ClaimState.NEW and second.attempt == 2
        with pytest.raises(jobfence.ClaimLost):
            first.complete("late")
        second.complete("done")
        inbox.close()
