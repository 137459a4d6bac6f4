"""The one I/O hook every backend call goes through.

Every operation jobfence performs against a backend (and every sleep) first calls
:func:`hook` / :func:`ahook` with a stable point name, e.g. ``"lock.acquire"``,
``"lock.release"``, ``"lock.renew"``, ``"lock.wait"``, ``"inbox.claim"``, ``"fence.check"``,
``"sleep"``. By default it does nothing. The testing toolkit installs a function here to
interleave workers and inject faults at exactly these points: a hook may block, sleep or raise.
An exception a hook raises at a lock or inbox point surfaces exactly as a driver error there
would: as :class:`~jobfence.BackendError` with the hook's exception as ``__cause__``.

Stable point names (part of the public testing contract):

====================  ===========================================
``lock.acquire``   one acquire attempt (``name``)
``lock.release``   release (``name``)
``lock.extend``    extend (``name``)
``lock.renew``     one batched renewal round trip (``names``)
``lock.wait``      wait for a release notification (``name``)
``fence.check``    a fenced write's token check (``resource``, ``token``)
``versioned.update`` a versioned update (``table``, ``key``, ``version``)
``inbox.claim``    an idempotency claim (``key``); also ``inbox.complete``,
                   ``inbox.release``, ``inbox.claim_in``
``sleep``          any sleep jobfence performs (``seconds``)
====================  ===========================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["HookFn", "ahook", "get_hook", "hook", "set_hook"]

HookFn = Callable[..., Any]

_hook: HookFn | None = None


def set_hook(fn: HookFn | None) -> HookFn | None:
    """Install ``fn(point, **info)`` as the I/O hook (``None`` removes it); returns the old one.

    ``fn`` may be a plain function or a coroutine function. Sync code paths call it and ignore
    an awaitable result; async code paths await it when it returns one.
    """
    global _hook
    old, _hook = _hook, fn
    return old


def get_hook() -> HookFn | None:
    return _hook


def hook(point: str, **info: Any) -> None:
    fn = _hook
    if fn is not None:
        result = fn(point, **info)
        if inspect.isawaitable(result):  # an async hook called from sync code
            close = getattr(result, "close", None)
            if close is not None:
                close()


async def ahook(point: str, **info: Any) -> None:
    fn = _hook
    if fn is not None:
        result = fn(point, **info)
        if inspect.isawaitable(result):
            await result
