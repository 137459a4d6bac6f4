"""Types shared by every lock backend, sync and async."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LockCapabilities", "RenewItem"]


@dataclass(frozen=True)
class LockCapabilities:
    """What a lock backend guarantees. The conformance suite reads these.

    * ``cross_process`` -- clients in different processes (or hosts) share the locks.
    * ``ttl_expiry`` -- a lease that is not renewed within ``ttl`` becomes free for others
      even while its holder is alive but paused. Every default mode has it; an opt-in mode
      that holds locks as long as a connection lives (a session advisory lock) does not.
    * ``fifo`` -- waiters get the lease in arrival order.
    * ``handoff`` -- release hands the lease straight to the next waiter (one wake-up, and
      the waiter already owns the lease when it wakes).
    * ``tokens_survive_data_loss`` -- fencing tokens keep increasing even if the backend
      restarts with its data gone.
    * ``queue_follows_connection`` -- a waiter waits in the server, and its place in the queue
      lives exactly as long as its connection (the server drops it when the waiter dies), so
      one wait may last the caller's whole timeout. Other backends hear from a waiter at least
      every few poll intervals, so that a dead waiter drops out of their queue soon.
    """

    cross_process: bool
    ttl_expiry: bool = True
    fifo: bool = False
    handoff: bool = False
    tokens_survive_data_loss: bool = False
    queue_follows_connection: bool = False


# (name, owner, ttl seconds)
RenewItem = tuple[str, str, float]
