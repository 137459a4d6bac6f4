"""The one I/O hook every backend call goes through (public API: :mod:`jobfence.testing`).

Every operation jobfence performs against a backend (the clean-ups after an interrupted call
and those of ``close()`` included, and every sleep) first calls :func:`hook` / :func:`ahook`
with a stable point name, e.g. ``"lock.acquire"``, ``"inbox.claim"``, ``"fence.check"``,
``"sleep"``, and keywords describing the call. By default it does nothing. A test installs a
function here to observe calls, interleave workers or inject faults at exactly these points: a
hook may block, sleep or raise. An exception a hook raises at a lock or inbox point surfaces
exactly as a driver error there would: as :class:`~jobfence.BackendError` with the hook's
exception as ``__cause__`` (at a clean-up's point: logged, as the clean-up's own failure).

The point names and their keywords are listed in :data:`jobfence.testing.POINTS`;
``tests/unit/test_testing_seams.py`` fails when a hook call anywhere in jobfence uses a name
that is not listed there, or when a listed name is never used.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .root_errors import ConfigurationError

__all__ = ["HookFn", "ahook", "get_hook", "hook", "set_hook"]

HookFn = Callable[..., Any]
"""The type of an I/O hook: ``hook(point, **info)``, called with a point name of
``jobfence.testing.POINTS`` and that point's keywords; it may block, or raise to inject a
fault. An awaitable it returns is awaited on the async code paths (and closed, not awaited, on
the sync ones)."""

_hook: HookFn | None = None


def set_hook(fn: HookFn | None) -> HookFn | None:
    """Install ``fn(point, **info)`` as the I/O hook (``None`` removes it); returns the old one.

    The hook is process-wide: every client, thread and event loop calls it, in the thread or
    task doing the operation (``lock.renew`` in the client's renewer). ``fn`` may be a plain
    function or a coroutine function: async code paths await the awaitable it returns, sync
    code paths close it without running it. Raises :class:`~jobfence.ConfigurationError`
    (``argument="fn"``) if ``fn`` is neither callable nor ``None``.
    """
    if fn is not None and not callable(fn):
        raise ConfigurationError(
            f"fn must be a callable fn(point, **info) or None, got {fn!r}", argument="fn"
        )
    global _hook
    old, _hook = _hook, fn
    return old


def get_hook() -> HookFn | None:
    """The installed I/O hook, or ``None``."""
    return _hook


def hook(point: str, **info: Any) -> None:
    """Call the hook (sync code paths). An awaitable it returns is closed, never awaited."""
    fn = _hook
    if fn is not None:
        result = fn(point, **info)
        if inspect.isawaitable(result):  # an async hook called from sync code
            close = getattr(result, "close", None)
            if close is not None:
                close()


async def ahook(point: str, **info: Any) -> None:
    """Call the hook (async code paths), awaiting its result when it returns an awaitable."""
    fn = _hook
    if fn is not None:
        result = fn(point, **info)
        if inspect.isawaitable(result):
            await result
