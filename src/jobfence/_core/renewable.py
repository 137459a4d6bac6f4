"""What a renewer drives: the :class:`Renewable` protocol (public as ``jobfence.Renewable``).

A client's renewer (:class:`jobfence._core.renewer_async.AsyncRenewer` and its sync twin
``Renewer``) keeps leases alive with batched, owner-checked renewals. It knows nothing of
locks, claims or queue deliveries: it reads what this protocol lists and, when it gives up on
one, calls :meth:`Renewable.mark_lost`. ``AsyncLease`` / ``Lease`` implement it directly; a
NEW claim of an inbox and a queue delivery implement it through a small object each (the
claim's and the message's own ``state`` attribute means something else).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .lease_state import LeaseState

__all__ = ["Renewable", "RenewableHandle"]


@runtime_checkable
class Renewable(Protocol):
    """What a renewer needs of one thing it renews (a lease, a claim, a queue delivery).

    The renewer reads ``name``, ``owner``, ``token``, ``renews``, ``state`` and ``label``
    once, when the thing is added; it holds only a weak reference to it, so an object that
    is garbage-collected is given back, not renewed. It looks at ``released`` after a
    renewal that found the thing gone (a released one is no loss), and calls ``mark_lost``
    when the thing is lost.

    Attributes:
        name: The name the backend's ``renew`` is called with: the lock name, the inbox key
            or the delivery's receipt.
        owner: The owner id the backend checks renewals against.
        token: The fencing token logs name (0 where there is none).
        renews: Whether it is renewed at all; one that is not only expires.
        state: Its local deadlines (:class:`~jobfence._core.lease_state.LeaseState`), which
            the renewer updates with each renewal.
        label: What the renewer's log lines call it (empty: "the lease on NAME (token N)").
        released: Whether its holder gave it back, or is giving it back right now.
    """

    @property
    def name(self) -> str: ...

    @property
    def owner(self) -> str: ...

    @property
    def token(self) -> int: ...

    @property
    def renews(self) -> bool: ...

    @property
    def state(self) -> LeaseState: ...

    @property
    def label(self) -> str: ...

    @property
    def released(self) -> bool: ...

    def mark_lost(self, reason: str, *, background: bool = False) -> None:
        """Record the loss and tell the holder. ``reason`` says why, in words for the holder;
        ``background`` is true when the renewer found the loss (a sync lease then runs its
        ``on_lost`` callbacks in a thread of their own, so the renewer goes on renewing)."""


class RenewableHandle:
    """A :class:`Renewable` for an object that cannot be one itself (an inbox's claim, a
    queue delivery): it carries the names and the :class:`LeaseState` the renewer reads, and
    asks its holder, through the two functions it was given, whether it is ``released``
    (``released()``) and to record a loss (``lost(reason)``).

    The holder keeps the handle for as long as it is renewed (the renewer holds only a weak
    reference to it). A function that is a method of the holder is kept as a weak reference
    to the holder and the plain function: the holder refers to its handle, so a bound method
    held here would make a reference cycle, and every claim or delivery garbage for the
    cyclic collector instead of freed when its last reference goes (in a worker with a large
    heap, the collections that garbage triggers cost more than the claim itself). A handle
    whose holder is gone answers ``released`` and is told of no loss.
    """

    __slots__ = ("__weakref__", "_lost", "_released", "label", "name", "owner", "state", "token")

    def __init__(
        self,
        name: str,
        owner: str,
        state: LeaseState,
        *,
        label: str,
        released: Callable[[], bool],
        lost: Callable[[str], None],
        token: int = 0,
    ) -> None:
        self.name = name
        self.owner = owner
        self.state = state
        self.label = label
        self.token = token
        self._released = _unbound(released)
        self._lost = _unbound(lost)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"

    @property
    def renews(self) -> bool:
        return self.state.renews

    @property
    def released(self) -> bool:
        holder, fn = self._released
        if holder is None:
            return bool(fn())
        target = holder()
        return True if target is None else bool(fn(target))

    def mark_lost(self, reason: str, *, background: bool = False) -> None:
        """Tell the holder (``lost(reason)``); its callbacks run in place, background or not."""
        holder, fn = self._lost
        if holder is None:
            fn(reason)
            return
        target = holder()
        if target is not None:
            fn(target, reason)


def _unbound(fn: Callable[..., Any]) -> tuple[weakref.ref[Any] | None, Callable[..., Any]]:
    """``(weak reference to the object, plain function)`` for a bound method of an object
    that takes weak references; ``(None, fn)`` for anything else."""
    target = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", None)
    if target is None or func is None:
        return None, fn
    try:
        return weakref.ref(target), func
    except TypeError:  # e.g. list.append: no weak references, and no cycle through it
        return None, fn
