"""Faults a simulation injects at the n-th hit of a point.

Each fault names a point (a jobfence hook point such as ``"inbox.claim"`` or ``"queue.ack"``,
a point of a simulated table such as ``"db.write"``, or a name the scenario passes to
``testing.point``) and which hit of it, counted over every task of the schedule from 1::

    from jobfence.testing import faults

    faults.transient("db.write", nth=1)      # the first write fails (a network blip)
    faults.commit_unknown("db.commit")       # applied, but the caller hears it failed
    faults.lost_ack()                        # the first ack is lost: the message comes back
    faults.pause_past_ttl("effect.charge")   # the process stops there past every lease
    faults.crash("inbox.complete")           # the process dies there (SIGKILL)

    # only the hits of that point at that target: the first write to the table "orders"
    faults.transient("db.write", target="orders")
    faults.pause_past_ttl("lock.renew", target="job:1")  # only job:1's renewals

A hit's target (:func:`target_of`) is the table of a ``db.*`` or ``versioned.update`` point,
the lock's name at ``lock.*``, the inbox key at ``inbox.*``, the queue at ``queue.*``, the
resource at ``fence.check``, the outbox table or relay at ``outbox.*``, and the ``target=``
given to ``testing.point``. With a target, ``nth`` counts only the hits of the point at that
target; without one, every hit of the point.

``faults="auto"`` (in :func:`jobfence.testing.explore`) builds them by itself from the points
the scenario actually hits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "KINDS",
    "Auto",
    "Fault",
    "InjectedFault",
    "auto",
    "commit_unknown",
    "crash",
    "lost_ack",
    "parse",
    "pause_past_ttl",
    "target_of",
    "transient",
]

KINDS = ("transient", "commit_unknown", "lost_ack", "pause_past_ttl", "crash")
"""Every kind of fault, in the order ``faults="auto"`` tries them at one hit."""

#: the points where a fault of these kinds can happen: a simulated table's write and commit
#: (applied, then raising), a simulated queue's ack (lost on its way)
_ONLY_AT = {"commit_unknown": ("db.write", "db.commit"), "lost_ack": ("queue.ack",)}

#: how long ``pause_past_ttl`` stops a process unless told (virtual seconds): ten times
#: jobfence's default ttl, claim ttl and visibility (30 s); pass ``seconds=`` for longer ones
DEFAULT_PAUSE = 300.0

#: characters a target cannot hold: they delimit it in ``kind(point[target]#nth)`` and in a
#: tape's text (a hit whose target has one is planned by ``faults="auto"`` without a target)
_NOT_IN_TARGET = "[]()|"

#: the keyword of the hook info that names a jobfence point's target, by the point's family
_TARGET_KEY = {
    "db": ("table",),
    "lock": ("name", "names"),
    "inbox": ("key", "keys"),
    "queue": ("queue",),
    "outbox": ("table", "relay"),
    "fence": ("resource",),
    "versioned": ("table",),
}


def target_of(point: str, info: Mapping[str, Any]) -> str | None:
    """The target of one hit of ``point`` whose hook info is ``info``: what a fault's
    ``target=`` is compared with. The table at ``db.*`` and ``versioned.update``, the lock's
    name at ``lock.*``, the inbox key at ``inbox.*``, the queue at ``queue.*``, the resource
    at ``fence.check``, the outbox table (``outbox.claim``) or the relay (``outbox.publish``,
    ``outbox.settle``) at ``outbox.*``, and ``info["target"]`` at a point of your own
    (``testing.point(name, target=...)``) or where the keyword above is missing. A renewal
    round (``lock.renew``, ``inbox.renew``) has the name it renews when it renews only one.
    ``None`` when there is none (``sleep``, a renewal of several, an ``outbox.add``...).
    A target that is not a ``str`` is given as its ``str()``."""
    value: Any = None
    for keyword in _TARGET_KEY.get(point.partition(".")[0], ()):
        value = info.get(keyword)
        if value is not None:
            break
    else:
        value = info.get("target")
    if isinstance(value, (list, tuple)):  # a renewal round of several names: no one target
        value = value[0] if len(value) == 1 else None
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _nameable(target: str | None) -> bool:
    """Whether a fault can name ``target`` (a hit's target with one of ``[]()|`` cannot: its
    fault is written without a target)."""
    return target is not None and bool(target) and not any(c in target for c in _NOT_IN_TARGET)


class InjectedFault(ConnectionResetError):
    """The error an injected ``transient`` or ``commit_unknown`` fault raises.

    A ``ConnectionResetError``, so ``jobfence.is_transient`` (and therefore ``retry_unit``)
    treats it as a transient failure, as it would a dropped connection. Raised from the
    commit of a simulated table's transaction (``db.commit``), it is also a commit whose
    outcome is unknown (``jobfence.is_commit_outcome_unknown``), as a driver's failing
    ``commit()`` is: ``retry_unit`` re-runs only a protected unit then. ``fault`` is the
    :class:`Fault` that raised it.
    """

    def __init__(self, fault: Fault) -> None:
        super().__init__(f"injected fault: {fault}")
        self.fault = fault


@dataclass(frozen=True)
class Fault:
    """One fault: its ``kind`` (see :data:`KINDS`), the ``point`` and which hit of it
    (``nth``, from 1, counted over all tasks), optionally only in the task named ``task``,
    for ``pause_past_ttl`` how many virtual ``seconds`` the process stops, and optionally
    the ``target`` (:func:`target_of`): then ``nth`` counts only the hits of ``point`` at
    that target (the first write to the table ``orders``, not the first write)."""

    kind: str
    point: str
    nth: int = 1
    task: str | None = None
    seconds: float | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigurationError(
                f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}", argument="kind"
            )
        if (
            not isinstance(self.point, str)
            or not self.point
            or any(c in self.point for c in "#()[]")
        ):
            raise ConfigurationError(
                f"point must be a non-empty point name without any of #()[], got {self.point!r}",
                argument="point",
            )
        if self.target is not None and (
            not isinstance(self.target, str) or not _nameable(self.target)
        ):
            raise ConfigurationError(
                "target must be None (every hit of the point) or a non-empty str without any "
                f"of {_NOT_IN_TARGET} (a table, lock name, inbox key, queue, resource or the "
                f"target= of testing.point), got {self.target!r}",
                argument="target",
            )
        if self.task is not None and (
            not isinstance(self.task, str)
            or not self.task
            or any(c in self.task for c in " #@()+,|")
        ):
            raise ConfigurationError(
                "task must be None or a task's name (t1, t1.1, or the name= given to spawn), "
                f"got {self.task!r}",
                argument="task",
            )
        if isinstance(self.nth, bool) or not isinstance(self.nth, int) or self.nth < 1:
            raise ConfigurationError(
                f"nth must be an int >= 1 (the first hit is 1), got {self.nth!r}",
                argument="nth",
            )
        where = _ONLY_AT.get(self.kind)
        if where is not None and self.point not in where:
            raise ConfigurationError(
                f"a {self.kind} fault works at {' or '.join(where)} only (elsewhere it would do "
                f"nothing), got point {self.point!r}",
                argument="point",
            )
        if self.seconds is not None and self.kind != "pause_past_ttl":
            raise ConfigurationError(
                f"seconds is for pause_past_ttl faults only, got {self.seconds!r} for {self.kind}",
                argument="seconds",
            )
        if self.seconds is not None and (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, (int, float))
            or not 0 < self.seconds < math.inf
        ):
            raise ConfigurationError(
                f"seconds must be a finite number > 0 or None (a process that never goes on "
                f"is a crash), got {self.seconds!r}",
                argument="seconds",
            )

    def __str__(self) -> str:
        extra = ""
        if self.task is not None:
            extra += f"@{self.task}"
        if self.seconds is not None:
            # short where that reads back exactly, else every digit: a printed tape replays
            # the pause it ran, not a rounded one
            short = f"{self.seconds:g}"
            extra += f"+{short if float(short) == self.seconds else repr(float(self.seconds))}s"
        target = f"[{self.target}]" if self.target is not None else ""
        return f"{self.kind}({self.point}{target}#{self.nth}{extra})"


_PATTERN = re.compile(
    r"^(?P<kind>\w+)\((?P<point>[^#()\[\]]+)(?:\[(?P<target>[^\[\]()|]+)\])?#(?P<nth>\d+)"
    r"(?:@(?P<task>[^+)]+))?(?:\+(?P<seconds>[0-9.e+-]+)s)?\)$"
)


def parse(text: str) -> Fault:
    """The :class:`Fault` that ``text`` writes as ``str(fault)`` does, e.g.
    ``"transient(db.write#1)"``, ``"transient(db.write[orders]#1)"`` or
    ``"pause_past_ttl(lock.renew#2@t1+600s)"`` (a tape's fault part; ``[target]`` is
    optional, as in the tapes written before targets existed); a
    :class:`~jobfence.ConfigurationError` if ``text`` is not one."""
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ConfigurationError(
            "a fault is written kind(point#nth) or kind(point[target]#nth), e.g. "
            f"'transient(db.write#1)' or 'transient(db.write[orders]#1)'; got {text!r}",
            argument="fault",
        )
    seconds = match["seconds"]
    try:
        pause = float(seconds) if seconds is not None else None
    except ValueError:
        raise ConfigurationError(
            f"a fault's seconds are written +<number>s, e.g. '+12.5s'; got {text!r}",
            argument="fault",
        ) from None
    return Fault(
        match["kind"],
        match["point"],
        int(match["nth"]),
        match["task"],
        pause,
        match["target"],
    )


def transient(
    point: str, nth: int = 1, *, task: str | None = None, target: str | None = None
) -> Fault:
    """The ``nth`` hit of ``point`` fails with :class:`InjectedFault` before doing anything (at a
    jobfence point: as a :class:`~jobfence.BackendError` caused by it). ``task``: only hits by
    the task of that name (``t1``, ``t1.1`` or the ``name=`` given to ``spawn``) count; ``None``
    (the default) counts every task. ``target``: only hits of ``point`` at that target count
    (:func:`target_of`: ``target="orders"`` is the ``nth`` write to the table ``orders``)."""
    return Fault("transient", point, nth, task, target=target)


def commit_unknown(
    point: str = "db.commit", nth: int = 1, *, task: str | None = None, target: str | None = None
) -> Fault:
    """The ``nth`` commit (or auto-committed write) of a simulated table is applied, then raises
    :class:`InjectedFault`: the caller cannot tell it happened. At ``db.commit`` the error is a
    commit outcome unknown, as production's; at ``db.write`` it is what a statement in
    autocommit mode gives, a transient error only. ``point``: ``db.commit`` (the default) or
    ``db.write``. ``task``: only hits by the task of that name (``t1``, ``t1.1`` or the
    ``name=`` given to ``spawn``) count; ``None`` (the default) counts every task.
    ``target``: only commits or writes of that table count."""
    return Fault("commit_unknown", point, nth, task, target=target)


def lost_ack(
    nth: int = 1, *, point: str = "queue.ack", task: str | None = None, target: str | None = None
) -> Fault:
    """The ``nth`` ack of a simulated queue is answered as done but never arrives: the message is
    delivered again once its visibility passes. ``point``: the ack's point (``queue.ack``).
    ``task``: only hits by the task of that name (``t1``, ``t1.1`` or the ``name=`` given to
    ``spawn``) count; ``None`` (the default) counts every task. ``target``: only acks of
    that queue count."""
    return Fault("lost_ack", point, nth, task, target=target)


def pause_past_ttl(
    point: str,
    nth: int = 1,
    *,
    seconds: float | None = None,
    task: str | None = None,
    target: str | None = None,
) -> Fault:
    """The process of the task hitting ``point`` the ``nth`` time stops there (a GC pause, SIGSTOP)
    for ``seconds`` of virtual time (default :data:`DEFAULT_PAUSE`, 300 s: past leases of
    jobfence's default 30 s); its renewers stop with it. Every other task goes on meanwhile.
    ``task``: only hits by the task of that name (``t1``, ``t1.1`` or the ``name=`` given to
    ``spawn``) count; ``None`` (the default) counts every task. ``target``: only hits of
    ``point`` at that target count (:func:`target_of`)."""
    return Fault("pause_past_ttl", point, nth, task, seconds, target)


def crash(point: str, nth: int = 1, *, task: str | None = None, target: str | None = None) -> Fault:
    """The process of the task hitting ``point`` the ``nth`` time dies there (SIGKILL): none of its
    tasks runs again and nothing of it is cleaned up; what it held expires. ``task``: only hits
    by the task of that name (``t1``, ``t1.1`` or the ``name=`` given to ``spawn``) count;
    ``None`` (the default) counts every task. ``target``: only hits of ``point`` at that
    target count (:func:`target_of`)."""
    return Fault("crash", point, nth, task, target=target)


@dataclass(frozen=True)
class Auto:
    """``faults="auto"`` with limits: only these ``kinds``, at most ``depth`` (1 or 2) faults
    per schedule."""

    kinds: tuple[str, ...] = KINDS
    depth: int = 2


def auto(kinds: Sequence[str] = KINDS, depth: int = 2) -> Auto:
    """What ``faults="auto"`` explores, restricted to ``kinds`` (e.g. ``["transient"]``) and
    to single faults (``depth=1``) or single and double ones (``depth=2``, the default)."""
    chosen = tuple(kinds)
    unknown = [k for k in chosen if k not in KINDS]
    if not chosen or unknown:
        raise ConfigurationError(
            f"kinds must be a non-empty list of {', '.join(KINDS)}; got {list(kinds)!r}",
            argument="kinds",
        )
    if depth not in (1, 2):
        raise ConfigurationError(f"depth must be 1 or 2, got {depth!r}", argument="depth")
    return Auto(chosen, depth)
