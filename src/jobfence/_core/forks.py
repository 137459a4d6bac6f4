"""Clients that live on in a process forked from their own (a Celery prefork worker, a
``multiprocessing`` fork, a server that forks its workers after importing the application).

A ``fork()`` copies every client of the parent into the child: its pooled connections (the
same sockets the parent goes on using), its listener, its renewer with the parent's leases and
claims, its mutexes (perhaps held at that instant by a parent thread that does not exist in
the child). Used as they are, two processes would talk on one socket at once (PostgreSQL:
``DuplicatePreparedStatement`` and garbled replies; MySQL/MariaDB: lost connections), and
the child would renew the parent's leases, release them when it closes the client, or report
them lost.

So every ``Locks``/``AsyncLocks`` and ``Inbox``/``AsyncInbox`` registers here (weakly: a
client that is no longer used is forgotten), and right after a fork, in the child only
(``os.register_at_fork(after_in_child=...)``), each live client resets itself: a fresh
renewer (the parent's leases and claims stay the parent's: the child neither renews nor
releases nor reports them), and a backend that has forgotten the inherited connections and
opens its own on first use. Nothing happens in the parent.

The inherited connections are not closed in the child: closing some of them talks to the
server (a MySQL ``COM_QUIT``, a PostgreSQL ``Terminate``) and would end the parent's session.
:func:`keep` holds them for the life of the child instead, unused, so that no finalizer closes
them either.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Protocol

__all__ = ["Resettable", "keep", "register"]

log = logging.getLogger("jobfence.forks")


class Resettable(Protocol):
    def _after_fork(self) -> None:
        """Called in the child right after a fork; no I/O."""


_clients: weakref.WeakSet[Any] = weakref.WeakSet()
#: what the children of this process inherited and must neither use nor close (never read)
_inherited: list[Any] = []


def register(client: Resettable) -> None:
    """Reset ``client`` (its ``_after_fork()``) in every child forked from now on."""
    _clients.add(client)


def keep(*objects: Any) -> None:
    """Keep ``objects`` -- connections, listeners, renewers inherited from the parent --
    referenced for the life of this process, so that nothing closes them (see the module
    docstring)."""
    _inherited.extend(obj for obj in objects if obj is not None)


def _after_fork_in_child() -> None:
    for client in list(_clients):
        try:
            client._after_fork()
        except Exception:  # one client must not keep the others from being reset
            log.exception("resetting %r after a fork failed", client)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
