"""Test seams: the I/O hook, the clock, and the stable names of the hook points.

Every operation jobfence performs against a backend, and every sleep, first calls the
process-wide **I/O hook** with a point name from :data:`POINTS` (``"lock.acquire"``,
``"inbox.claim"``, ``"sleep"``...) and keywords describing the call. By default there is no
hook. A test installs one to observe the calls, to interleave workers (a hook may block until
the test lets it go) or to inject faults (a hook may raise)::

    from jobfence.testing import hooked

    seen = []
    with hooked(lambda point, **info: seen.append(point)):
        lease = locks.acquire("job:1", ttl=30)
        lease.release()
    assert seen[:2] == ["lock.acquire", "lock.release"]

Every deadline jobfence computes locally (lease expiry, renewal schedule, acquire timeouts,
retry deadlines), every sleep and every wait for an event (the renewer's pause, a backend's
wait for a release) goes through one :class:`Clock`. A test replaces it (:func:`set_clock`,
:func:`clocked`) with a :class:`ManualClock`, whose time moves only when the test advances it:
``memory://`` leases and inbox claims expire by that clock too, so a test of an expiry needs
no real sleeping.

Both are global to the process (every thread, every event loop), and :func:`hooked` /
:func:`clocked` restore what was there before. The point names, the keywords each one
carries and these functions are a stable API: a name is never renamed or removed, and a
keyword is never removed, without a deprecation period; new points and keywords may be
added. See ``docs/reference/testing-seams.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from .._core.clock import Clock, get_clock, set_clock
from .._core.hooks import HookFn, get_hook, set_hook
from . import faults, scenarios, strategies
from ._sim import SimClock, SimTask, Simulation, Violation, point
from .checkers import (
    Checker,
    at_most_holders,
    exactly_once,
    fencing_monotonic,
    no_lost_update,
    once_per_slot,
    published_once,
    single_holder,
)
from .clock import ManualClock
from .explore import Failure, Report, Tape, explore, replay
from .faults import Fault, InjectedFault
from .table import SimTable, SimTransaction, SyncTable, SyncTransaction, Write

__all__ = [
    "POINTS",
    "Checker",
    "Clock",
    "Failure",
    "Fault",
    "HookFn",
    "HookPoint",
    "InjectedFault",
    "ManualClock",
    "Report",
    "SimClock",
    "SimTable",
    "SimTask",
    "SimTransaction",
    "Simulation",
    "SyncTable",
    "SyncTransaction",
    "Tape",
    "Violation",
    "Write",
    "at_most_holders",
    "clocked",
    "exactly_once",
    "explore",
    "faults",
    "fencing_monotonic",
    "get_clock",
    "get_hook",
    "hooked",
    "no_lost_update",
    "once_per_slot",
    "point",
    "published_once",
    "replay",
    "scenarios",
    "set_clock",
    "set_hook",
    "single_holder",
    "strategies",
]

C = TypeVar("C", bound=Clock)


@dataclass(frozen=True)
class HookPoint:
    """One hook point: its dotted ``name``, what it stands for, and the keywords
    (``info``) the hook receives there, as in ``hook(name, **info)``."""

    name: str
    meaning: str
    info: tuple[str, ...]


_LOCK = ("name", "backend")
_INBOX = ("key", "backend")
_QUEUE = ("queue", "id", "delivery", "backend")

_POINT_LIST = (
    HookPoint(
        "lock.acquire", "one attempt to take a lock (try_acquire; each round of acquire)", _LOCK
    ),
    HookPoint("lock.wait", "a waiting acquire waits for a release or hand-off (one round)", _LOCK),
    HookPoint("lock.cancel_wait", "an acquire that timed out leaves the wait queue", _LOCK),
    HookPoint("lock.extend", "Lease.extend(): reset the lease's remaining lifetime", _LOCK),
    HookPoint("lock.release", "Lease.release(): give the lease back (owner-checked)", _LOCK),
    HookPoint("lock.force_release", "Locks.force_release(): drop whoever holds the name", _LOCK),
    HookPoint("lock.holder", "Locks.holder(): read who holds the name", _LOCK),
    HookPoint("lock.holders", "Locks.holders(): list the live leases (name is the prefix)", _LOCK),
    HookPoint("lock.install", 'Locks.install(): create the backend\'s tables (name is "*")', _LOCK),
    HookPoint(
        "lock.abandon_wait",
        "an interrupted acquire (or close() for one still waiting) leaves the wait queue",
        _LOCK,
    ),
    HookPoint(
        "lock.abandon_release",
        "then gives back, owner-checked, a lease it may have been granted meanwhile",
        _LOCK,
    ),
    HookPoint("lock.close_release", "Locks.close() gives back a lease still held", _LOCK),
    HookPoint("lock.renew", "one batched renewal round trip of a client's renewer", ("names",)),
    HookPoint("inbox.claim", "Inbox.claim(): one atomic claim of an idempotency key", _INBOX),
    HookPoint("inbox.complete", "Claim.complete(): store the result (owner-checked)", _INBOX),
    HookPoint("inbox.release", "Claim.release(): give the key back for a redelivery", _INBOX),
    HookPoint("inbox.extend", "Claim.extend(): reset the claim's remaining lifetime", _INBOX),
    HookPoint("inbox.renew", "one batched renewal round trip of an inbox's renewer", ("keys",)),
    HookPoint(
        "inbox.abandon",
        "an interrupted claim gives back, owner-checked, the key it may have been given",
        _INBOX,
    ),
    HookPoint(
        "inbox.claim_in",
        "Inbox.claim_in(conn, key): mark the key in the caller's transaction",
        _INBOX,
    ),
    HookPoint(
        "inbox.install", "Inbox.install() / install(conn): create the table (key is None)", _INBOX
    ),
    HookPoint("inbox.purge", "Inbox.purge(): delete expired records (key is None)", _INBOX),
    HookPoint("inbox.claims", "Inbox.claims(): list the records (key is the prefix)", _INBOX),
    HookPoint("inbox.claim_info", "Inbox.claim_info(): read the record of one key", _INBOX),
    HookPoint("inbox.forget", "Inbox.forget(): delete a key's record whatever its state", _INBOX),
    HookPoint("inbox.drop", "Inbox.drop(): delete the inbox's table or keys (key is None)", _INBOX),
    HookPoint(
        "fence.check",
        "fence() / fence_async(): the token check in the caller's transaction",
        ("resource", "token"),
    ),
    HookPoint(
        "versioned.update",
        "versioned_update(_async): the conditional UPDATE",
        ("table", "key", "version"),
    ),
    HookPoint(
        "queue.publish", "Queue.publish(_many)(): append messages", ("queue", "ids", "backend")
    ),
    HookPoint("queue.receive", "Queue.receive(): one receive round trip", ("queue", "backend")),
    HookPoint("queue.ack", "Message.ack(): remove the delivered message", _QUEUE),
    HookPoint("queue.nack", "Message.nack(): give the message back for redelivery", _QUEUE),
    HookPoint("queue.defer", "Message.defer(): give it back uncounted (not now)", _QUEUE),
    HookPoint("queue.dead_letter", "Message.dead_letter(): move it to the dead letters", _QUEUE),
    HookPoint("queue.extend", "Message.extend(): keep the delivery hidden longer", _QUEUE),
    HookPoint(
        "queue.renew", "one batched renewal round trip of a queue's renewer", ("queue", "receipts")
    ),
    HookPoint(
        "queue.manage",
        "Queue.stats/dead_letters/requeue_dead/purge/install/drop (operation names which)",
        ("queue", "operation", "backend"),
    ),
    HookPoint(
        "outbox.add",
        "Outbox.add(_many)(conn): the rows' INSERT in the caller's transaction",
        ("queue", "ids", "backend"),
    ),
    HookPoint(
        "outbox.claim",
        "a relay holds the next batch of committed outbox rows (one claim statement)",
        ("relay", "table", "backend"),
    ),
    HookPoint(
        "outbox.publish",
        "a relay sends rows to their target (one batch call; ids in seq order)",
        ("relay", "ids", "target"),
    ),
    HookPoint(
        "outbox.settle",
        "a relay settles rows it holds (verb: published, failed, release, extend) or purges "
        "published ones (verb purge, seqs empty)",
        ("relay", "verb", "seqs", "backend"),
    ),
    HookPoint(
        "outbox.manage",
        "Outbox.install/entries/stats/retry_dead/purge/drop (operation names which)",
        ("operation", "backend"),
    ),
    HookPoint("sleep", "a sleep through the clock (retry backoff, polling waits)", ("seconds",)),
)

POINTS: Mapping[str, HookPoint] = MappingProxyType({p.name: p for p in _POINT_LIST})
"""Every hook point, by dotted name, in a fixed order (locks, renewal, inbox, fencing,
versioned updates, sleeps): a read-only mapping of name to `HookPoint`;
``"lock.acquire" in POINTS`` works."""


@contextmanager
def hooked(fn: HookFn | None) -> Iterator[HookFn | None]:
    """Install ``fn`` as the I/O hook for the ``with`` block, then restore the previous one.

    ``fn(point, **info)`` replaces the previous hook inside the block (it does not chain to
    it); ``None`` runs the block without a hook. Yields ``fn``. See :func:`set_hook`.
    """
    old = set_hook(fn)
    try:
        yield fn
    finally:
        set_hook(old)


@contextmanager
def clocked(clock: C) -> Iterator[C]:
    """Use ``clock`` as jobfence's clock for the ``with`` block, then restore the previous one.

    Create the clients the clock should drive inside the block, and close them in it: a
    client's renewer reads the clock once, when it starts with the client's first lease, and
    waits between its checks through it. Yields ``clock``. See :func:`set_clock`.
    """
    old = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(old)
