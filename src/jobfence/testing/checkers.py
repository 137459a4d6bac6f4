"""Invariants checked after every step of a schedule and at its end.

Pass them to :func:`jobfence.testing.explore` (``checks=[...]``) or to ``sim.watch(...)``
inside a scenario. Each is a :class:`Checker`: :meth:`~Checker.step` runs at every decision,
:meth:`~Checker.end` once the scenario returned; either returns a description of what is
wrong, or ``None``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ._base import SimView

__all__ = [
    "Checker",
    "at_most_holders",
    "exactly_once",
    "fencing_monotonic",
    "no_lost_update",
    "once_per_slot",
    "published_once",
    "single_holder",
]


class Checker:
    """An invariant: ``name`` and the two checks (override one or both)."""

    name = "checker"

    def step(self, sim: SimView) -> str | None:
        return None

    def end(self, sim: SimView) -> str | None:
        return self.step(sim)


def _dupes(effects: Iterable[Any]) -> list[Any]:
    return [key for key, count in Counter(effects).items() if count > 1]


class _ExactlyOnce(Checker):
    name = "exactly_once"

    def __init__(self, effects: str | list[Any], expected: Iterable[Any] | None) -> None:
        self._effects = effects
        self._expected = list(expected) if expected is not None else None

    def _list(self, sim: SimView) -> list[Any]:
        if isinstance(self._effects, str):
            return sim.effects.get(self._effects, [])
        return self._effects

    def step(self, sim: SimView) -> str | None:
        effects = self._list(sim)
        dupes = _dupes(effects)
        if dupes:
            what = self._effects if isinstance(self._effects, str) else "effect"
            return f"{what} applied more than once for {', '.join(map(repr, dupes))}"
        return None

    def end(self, sim: SimView) -> str | None:
        problem = self.step(sim)
        if problem or self._expected is None:
            return problem
        done = set(self._list(sim))
        missing = [key for key in self._expected if key not in done]
        if missing:
            return f"no effect for {', '.join(map(repr, missing))}"
        return None


def exactly_once(effects: str | list[Any], expected: Iterable[Any] | None = None) -> Checker:
    """No effect twice at any step; at the end, one for each of ``expected`` (if given).

    ``effects`` is the kind passed to ``sim.effect(kind, key)`` (e.g. ``"charge"``), or a
    list the scenario appends keys to.
    """
    if not isinstance(effects, (str, list)) or effects == "":
        raise ConfigurationError(
            "effects must be the kind given to sim.effect() (a non-empty str) or a list the "
            f"scenario appends to, got {effects!r}",
            argument="effects",
        )
    if expected is not None and (isinstance(expected, (str, bytes)) or not _iterable(expected)):
        raise ConfigurationError(
            f"expected must be None or a list of keys, got {expected!r}", argument="expected"
        )
    return _ExactlyOnce(effects, expected)


class _PublishedOnce(Checker):
    name = "published_once"

    def __init__(self, queue: str, expected: list[Any] | None) -> None:
        self._queue = queue
        self._expected = expected

    def step(self, sim: SimView) -> str | None:
        dupes = _dupes(sim.published(self._queue))
        if dupes:
            return (
                f"message {', '.join(map(repr, dupes))} published to queue {self._queue!r} "
                "more than once"
            )
        return None

    def end(self, sim: SimView) -> str | None:
        problem = self.step(sim)
        if problem or self._expected is None:
            return problem
        done = set(sim.published(self._queue))
        missing = [msg_id for msg_id in self._expected if msg_id not in done]
        if missing:
            return f"no message {', '.join(map(repr, missing))} in queue {self._queue!r}"
        return None


def published_once(queue: str = "jobs", expected: Iterable[Any] | None = None) -> Checker:
    """No message id published twice to the schedule's queue ``queue`` (``sim.queue(queue)``,
    by any publisher, a relay's included) at any step; at the end, each id of ``expected``
    (if given) was published. It reads :meth:`Simulation.published
    <jobfence.testing.Simulation.published>`, acked messages included."""
    if not isinstance(queue, str) or not queue:
        raise ConfigurationError(
            f"queue must be a queue's name (a non-empty str), got {queue!r}", argument="queue"
        )
    if expected is not None and (isinstance(expected, (str, bytes)) or not _iterable(expected)):
        raise ConfigurationError(
            f"expected must be None or a list of message ids, got {expected!r}",
            argument="expected",
        )
    return _PublishedOnce(queue, list(expected) if expected is not None else None)


class _NoLostUpdate(Checker):
    name = "no_lost_update"

    def __init__(self, table: Any) -> None:
        self._table = table

    def step(self, sim: SimView) -> str | None:
        tables = [self._table] if self._table is not None else sim.tables
        for table in tables:
            for write in table.lost_updates():
                return (
                    f"{write.task} wrote {table.name}[{write.key!r}] = {write.values!r} from "
                    f"version {write.base} it read, over version {write.over} written since "
                    "by another: that change is lost"
                )
        return None


def no_lost_update(table: Any = None) -> Checker:
    """No committed write to a simulated table was computed from a read of an older version
    of its row than the one it replaced (a write that overwrites a change it never saw).
    Every table of the schedule, or only ``table``. Blind writes (no read of the row first)
    are not judged."""
    _check_table(table, "lost_updates")
    return _NoLostUpdate(table)


class _SingleHolder(Checker):
    name = "single_holder"

    def __init__(self, name: str | None) -> None:
        self._name = name

    def step(self, sim: SimView) -> str | None:
        for section, holders in sim.iter_holders():
            if self._name is not None and section != self._name:
                continue
            if len(holders) > 1:
                who = ", ".join(task.name for task in holders)
                return f"{who} are inside the critical section {section!r} at once"
        return None


def single_holder(name: str | None = None) -> Checker:
    """At most one task inside each ``sim.critical(name)`` section at any step (a task
    whose ``lease=`` is lost or past its ttl does not count); ``name=None`` checks every
    section."""
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(
            f"name must be None (every section) or a section's name, got {name!r}",
            argument="name",
        )
    return _SingleHolder(name)


class _AtMostHolders(Checker):
    name = "at_most_holders"

    def __init__(self, n: int, name: str | None) -> None:
        self._n = n
        self._name = name

    def step(self, sim: SimView) -> str | None:
        for section, holders in sim.iter_holders():
            if self._name is not None and section != self._name:
                continue
            if len(holders) > self._n:
                who = ", ".join(task.name for task in holders)
                return (
                    f"{who} are inside the critical section {section!r} at once: "
                    f"{len(holders)} holders, more than {self._n}"
                )
        return None


def at_most_holders(n: int, name: str | None = None) -> Checker:
    """At most ``n`` tasks inside each ``sim.critical(name)`` section at any step: the
    invariant of a semaphore of ``n`` permits (``single_holder`` is ``n=1``). Mark the block
    each permit guards with ``sim.critical(name, lease=permit)``: a task whose ``lease=`` is
    lost or past its ttl does not count, so any lease-like object with ``lost`` and
    ``expires_in`` works. ``name=None`` checks every section."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(
            f"n must be an int >= 1 (the permits of the semaphore), got {n!r}", argument="n"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(
            f"name must be None (every section) or a section's name, got {name!r}",
            argument="name",
        )
    return _AtMostHolders(n, name)


class _OncePerSlot(Checker):
    name = "once_per_slot"

    def __init__(self, fires: str | list[Any], expected: list[tuple[Any, Any]] | None) -> None:
        self._fires = fires
        self._expected = expected

    def _list(self, sim: SimView) -> list[Any]:
        if isinstance(self._fires, str):
            return sim.effects.get(self._fires, [])
        return self._fires

    def step(self, sim: SimView) -> str | None:
        counts: Counter[tuple[Any, Any]] = Counter()
        for fire in self._list(sim):
            if not isinstance(fire, tuple) or len(fire) != 2:
                return f"fires must hold (schedule, slot) pairs, got {fire!r}"
            counts[fire] += 1
        twice = [(fire, count) for fire, count in counts.items() if count > 1]
        if twice:
            return "; ".join(
                f"schedule {schedule!r} fired slot {slot!r} {count} times"
                for (schedule, slot), count in twice
            )
        return None

    def end(self, sim: SimView) -> str | None:
        problem = self.step(sim)
        if problem or self._expected is None:
            return problem
        fired = set(self._list(sim))
        missing = [pair for pair in self._expected if pair not in fired]
        if missing:
            return "; ".join(
                f"schedule {schedule!r} never fired slot {slot!r}" for schedule, slot in missing
            )
        return None


def once_per_slot(
    fires: str | list[Any], expected: Iterable[tuple[Any, Any]] | None = None
) -> Checker:
    """No slot of a schedule fired twice at any step; at the end, every ``expected`` slot
    fired.

    ``fires`` holds one ``(schedule, slot)`` pair per fire: the kind passed to
    ``sim.effect(kind, (schedule, slot))`` (e.g. ``"fire"``), or a list the scenario appends
    the pairs to. A slot is any hashable value naming the slot's time (an aware ``datetime``,
    an ISO string, epoch seconds), the same for every pod. ``expected``: ``(schedule, slot)``
    pairs that must each have fired by the end (``None``: not checked). The message names
    the schedule, the slot and how many times it fired, or the slot that never did.
    """
    if not isinstance(fires, (str, list)) or fires == "":
        raise ConfigurationError(
            "fires must be the kind given to sim.effect() (a non-empty str) or a list the "
            f"scenario appends (schedule, slot) pairs to, got {fires!r}",
            argument="fires",
        )
    pairs: list[tuple[Any, Any]] | None = None
    if expected is not None:
        if isinstance(expected, (str, bytes)) or not _iterable(expected):
            raise ConfigurationError(
                f"expected must be None or a list of (schedule, slot) pairs, got {expected!r}",
                argument="expected",
            )
        pairs = [tuple(pair) if isinstance(pair, list) else pair for pair in expected]
        bad = [pair for pair in pairs if not isinstance(pair, tuple) or len(pair) != 2]
        if bad:
            raise ConfigurationError(
                f"expected must hold (schedule, slot) pairs, got {bad[0]!r}",
                argument="expected",
            )
    return _OncePerSlot(fires, pairs)


class _FencingMonotonic(Checker):
    name = "fencing_monotonic"

    def __init__(self, table: Any) -> None:
        self._table = table

    def step(self, sim: SimView) -> str | None:
        tables = [self._table] if self._table is not None else sim.tables
        for table in tables:
            highest: dict[Any, tuple[int, str]] = {}
            for write in table.history:
                if write.token is None:
                    continue
                top = highest.get(write.key)
                if top is not None and write.token < top[0]:
                    return (
                        f"{write.task} wrote {table.name}[{write.key!r}] with token "
                        f"{write.token} after {top[1]} had written with token {top[0]}: a "
                        "stale holder's write was accepted"
                    )
                if top is None or write.token > top[0]:
                    highest[write.key] = (write.token, write.task)
        return None


def fencing_monotonic(table: Any = None) -> Checker:
    """The fencing tokens of the committed writes to each row never go down: a holder whose
    lease was taken over cannot write after its successor (``write(..., token=t)``).
    ``table``: one table from ``sim.table()``, or ``None`` for every table."""
    _check_table(table, "history")
    return _FencingMonotonic(table)


def _iterable(value: object) -> bool:
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def _check_table(table: object, attribute: str) -> None:
    if table is not None and not hasattr(table, attribute):
        raise ConfigurationError(
            f"table must be None (every table) or a table from sim.table(), got {table!r}",
            argument="table",
        )
