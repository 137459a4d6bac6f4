"""Ready scenarios for the races background jobs meet: point one at your own function.

Each function here builds a scenario around your function (the job, the handler, the tick),
explores it with :func:`jobfence.testing.explore` and returns its
:class:`~jobfence.testing.Report`::

    from jobfence.testing import scenarios

    async def handle_payment(message, ctx):
        ...

    def test_charge_survives_redelivery():
        scenarios.duplicate_delivery(handle_payment).assert_ok()

=====================================  ===============================  ====================
scenario                               your function                    checked
=====================================  ===============================  ====================
:func:`lost_update`                    ``fn(ctx)``, ``workers`` at once ``no_lost_update``
:func:`duplicate_delivery`             ``fn(message, ctx)``             ``exactly_once``
:func:`lost_ack`                       ``fn(message, ctx)``             ``exactly_once``
:func:`paused_holder`                  ``fn(ctx)``, ``workers`` at once ``stale_write``
:func:`commit_unknown`                 ``fn(ctx)``, run again if it     ``exactly_once``
                                       fails
:func:`check_then_act`                 ``fn(ctx)``, ``workers`` at once ``exactly_once``
:func:`slot_fired_twice`               ``fn(slot, ctx)`` on every pod   ``once_per_slot``
:func:`over_limit`                     ``fn(ctx)``, ``limit + 1`` at    ``at_most_holders``
                                       once
:func:`dual_write`                     ``fn(ctx)``, one per order       ``published_once``
=====================================  ===============================  ====================

Your function is an ``async def``; it receives a context (``ctx``) holding what the race
needs, on the schedule's simulated resources: a simulated table (``ctx.table``), jobfence's
clients on the schedule's ``memory://`` store (``ctx.locks``, ``ctx.inbox``, ``ctx.queue``,
``ctx.outbox``), and the effect recorder ``await ctx.effect(kind, key)`` (a charge, an
e-mail, a fire). ``await ctx.effect(kind, key, tx=tx)`` records an effect that is part of a
transaction of ``ctx.table`` (a row your job writes, a balance it changes): it counts only
if ``tx`` commits.

A plain function (``def``) runs in the same scenarios as thread tasks, with the blocking
flavour of each: ``ctx.table`` is the table's blocking view (``table.sync``), the clients
are jobfence's ``Locks``, ``Inbox``, ``Queue`` and ``Outbox``, and the context's verbs are
called without ``await`` (``ctx.effect(...)``, ``with ctx.using(lease):``).

Every scenario takes the options of :func:`~jobfence.testing.explore` that matter here:
``schedules``, ``seed``, ``strategy``, ``faults`` (each scenario's default is the faults that
make its race: ``"auto"`` or a restriction of it) and ``checks`` (invariants of your own, on
top of the scenario's). Bad arguments raise :class:`~jobfence.ConfigurationError` naming the
argument. A failure is reported with its seed and tape like any exploration's, and
``failure.replay()`` runs it again.

Every scenario with a table (all but :func:`slot_fired_twice`, which has none, and
:func:`dual_write`, whose outbox rows live in memory) takes ``url``: ``None`` keeps the table
in memory; ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"`` keeps its
rows in that database (``sim.table(..., url=url)``, created and dropped by each schedule),
so the race runs on the database's own transactions and locks. A job ending with a conflict
of the database (SQLite's ``database is locked`` when two transactions overlap) ends with a
:class:`~jobfence.ConflictError` raised from it: an outcome of the schedule, not a bug.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, ConflictError, JobfenceError
from . import faults as _faults
from .checkers import Checker, at_most_holders, no_lost_update, once_per_slot
from .explore import Report, explore
from .faults import InjectedFault

if TYPE_CHECKING:
    from ._base import SimView
    from ._sim import Simulation
    from .table import SimTable

__all__ = [
    "CONSUMER_VISIBILITY",
    "Context",
    "LimitContext",
    "MessageContext",
    "OrderContext",
    "PodContext",
    "TableContext",
    "check_then_act",
    "commit_unknown",
    "dual_write",
    "duplicate_delivery",
    "lost_ack",
    "lost_update",
    "over_limit",
    "paused_holder",
    "slot_fired_twice",
]

#: seconds a delivery stays hidden from the other consumers (the queue's visibility) in the
#: message scenarios; a consumer stopped longer than that loses the message to another one
CONSUMER_VISIBILITY = 30.0
#: seconds a consumer of the message scenarios waits for a message before it stops
_CONSUMER_WAIT = 60.0
#: seconds a message handled with a failure waits before it is delivered again
_RETRY_DELAY = 5.0
#: the row keys of the effects recorded in a transaction (``ctx.effect(..., tx=tx)``)
_EFFECT_ROW = "jobfence.effect"


# -- the contexts ---------------------------------------------------------------------------


@dataclass
class Context:
    """What every scenario's function receives: ``sim`` (the
    :class:`~jobfence.testing.Simulation` of the schedule) and ``worker`` (the name of the task
    running the function: ``w1``, ``w2``... or ``pod-a``, ``pod-b``...), and the verbs below."""

    sim: Simulation
    worker: str

    def effect(self, kind: str, key: Any, *, tx: Any = None) -> Awaitable[None]:
        """Record an effect of ``kind`` for ``key`` (``"charge"``, ``"order-1"``), a point
        named ``effect.<kind>``. Without ``tx`` it is an external effect, done at once and
        never undone (a payment provider's charge, an e-mail). With ``tx``, a transaction of
        ``ctx.table`` (``async with ctx.table.transaction() as tx``), it is a row that ``tx``
        writes (a ``db.write`` point): it counts only if ``tx`` commits, as a change your job
        makes in its own database does. ``await`` it in an ``async def``; in a plain function
        (a thread task) call it without ``await``: it is done when it returns."""
        _check_point_name(kind, "kind")
        if tx is not None and (not callable(getattr(tx, "write", None))):
            raise ConfigurationError(
                "tx must be a transaction of ctx.table (async with ctx.table.transaction() as "
                f"tx) or None for an external effect, got {tx!r}",
                argument="tx",
            )
        if tx is None:
            return self.sim.effect(kind, key)  # awaitable, or done already in a thread task
        if not _in_thread(self.sim):
            return self._effect_in(kind, key, tx)
        tx.write(self._effect_row(kind, key), effect=kind)
        return _DONE

    async def _effect_in(self, kind: str, key: Any, tx: Any) -> None:
        await tx.write(self._effect_row(kind, key), effect=kind)

    def _effect_row(self, kind: str, key: Any) -> Any:
        counter = _counters.setdefault(self.sim, itertools.count(1))
        real = _real_effects.get(self.sim)
        if real is None:
            return (_EFFECT_ROW, kind, _hashable(key), next(counter))
        # a table in a real database keys its rows by JSON text: a str key, noted here
        row = f"{_EFFECT_ROW}.{next(counter)}"
        real[row] = (kind, _hashable(key))
        return row

    def point(self, name: str) -> Awaitable[None]:
        """A point of your own (``testing.point(name)``): a place where the schedule may
        switch tasks or inject a fault. ``await`` it in an ``async def``; in a plain
        function call it without ``await``."""
        from . import _sim

        return _sim.point(name)

    def sleep(self, seconds: float) -> Awaitable[None]:
        """Sleep ``seconds`` of virtual time (a ``sleep`` point). ``await`` it in an ``async
        def``; in a plain function call it without ``await``."""
        if not _in_thread(self.sim):
            return self.sim.sleep(seconds)
        from .._core.clock import get_clock

        get_clock().sleep(seconds)
        return _DONE


class _Done:
    """An awaitable already done: what a context's verb returns in a thread task."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that never yields

    def __repr__(self) -> str:
        return "<done>"


_DONE = _Done()


def _in_thread(sim: Simulation) -> bool:
    """The caller is a thread task (a plain function) of ``sim``."""
    task = sim.current()
    return task is not None and task.thread


def _check_point_name(name: object, argument: str) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in "#()"):
        raise ConfigurationError(
            f"{argument} must be a non-empty str without any of #(), got {name!r}",
            argument=argument,
        )


#: the effect-row counter of each simulation, so that two effects never share a row
_counters: weakref.WeakKeyDictionary[Simulation, itertools.count[int]] = weakref.WeakKeyDictionary()
#: for a simulation whose scenario table is in a real database: the str key of each effect
#: row (a real table's keys are JSON text, so no tuple) -> its (kind, key)
_real_effects: weakref.WeakKeyDictionary[Simulation, dict[str, tuple[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class TableContext(Context):
    """``table``: the scenario's simulated table
    (:class:`~jobfence.testing.SimTable`, ``read/write/update/transaction()``, which
    ``jobfence.versioned_update_async``, ``fence_async`` and ``inbox.claim_in`` take as a
    connection); ``key``: the row the race is about; ``inbox`` and ``locks``: jobfence's
    ``AsyncInbox`` and ``AsyncLocks`` on the schedule's ``memory://`` store. For a plain
    function: the table's blocking view (``table.sync``), ``Inbox`` and ``Locks``."""

    table: SimTable = field(repr=False, default=None)  # type: ignore[assignment]
    key: Any = None
    inbox: Any = field(repr=False, default=None)
    locks: Any = field(repr=False, default=None)


@dataclass
class MessageContext(Context):
    """For a message handler ``fn(message, ctx)``: ``table`` (a simulated table
    ``"payments"``, empty), ``inbox`` (an ``AsyncInbox``), ``locks`` (an ``AsyncLocks``);
    their blocking flavours for a plain function, which receives a ``Message``."""

    table: SimTable = field(repr=False, default=None)  # type: ignore[assignment]
    inbox: Any = field(repr=False, default=None)
    locks: Any = field(repr=False, default=None)


@dataclass
class OrderContext(TableContext):
    """A job about one order: ``order`` (its id, ``"order-1"``, ``"order-2"``...) on top of
    :class:`TableContext`; ``queue`` and ``outbox`` (an ``AsyncQueue`` named ``"orders"`` and
    an ``AsyncOutbox`` on the schedule's store) where the scenario announces orders."""

    order: str = ""
    queue: Any = field(repr=False, default=None)
    outbox: Any = field(repr=False, default=None)


@dataclass
class PodContext(Context):
    """A pod of :func:`slot_fired_twice`: ``schedule`` (the schedule's name, ``"report"``),
    ``locks`` and ``inbox`` shared by the pods, and :meth:`fire`."""

    schedule: str = "report"
    locks: Any = field(repr=False, default=None)
    inbox: Any = field(repr=False, default=None)

    def fire(self, slot: str) -> Awaitable[None]:
        """The schedule's job runs for ``slot`` (the effect ``("fire", (schedule, slot))``
        that ``once_per_slot`` counts); ``await`` it as :meth:`Context.effect`."""
        return self.effect("fire", (self.schedule, slot))


@dataclass
class LimitContext(Context):
    """A worker of :func:`over_limit`: ``name`` (the limited resource, ``"api"``),
    ``limit`` (how many may use it at once), ``locks`` (an ``AsyncLocks``: ``try_acquire``
    / ``acquire(name, limit=limit)``), ``table`` (a simulated table whose row ``name``
    holds ``{"used": 0}``, for a counter of your own) and :meth:`using`."""

    name: str = "api"
    limit: int = 2
    locks: Any = field(repr=False, default=None)
    table: SimTable = field(repr=False, default=None)  # type: ignore[assignment]

    def using(self, lease: Any = None) -> _Using:
        """Mark the block that uses the limited resource (``sim.critical(name, lease=)``):
        ``at_most_holders(limit)`` counts the workers inside. With a lease (a permit of
        ``locks.acquire(name, limit=)``), the worker counts only while it is valid. ``async
        with ctx.using(lease):`` in an ``async def``, ``with ctx.using(lease):`` in a plain
        function."""
        return _Using(self.sim, self.name, lease)


class _Using:
    """``ctx.using(lease)``: the critical section of :meth:`LimitContext.using`
    (``sim.critical``), entered with ``async with`` or ``with`` (a thread task)."""

    def __init__(self, sim: Simulation, name: str, lease: Any) -> None:
        self._sim = sim
        self._name = name
        self._lease = lease
        self._section: Any = None

    async def __aenter__(self) -> None:
        self._section = self._sim.critical(self._name, lease=self._lease)
        await self._section.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self._section.__aexit__(*exc)

    def __enter__(self) -> None:
        task = self._sim.current()
        if task is None or not task.thread:
            raise ConfigurationError(
                "with ctx.using(...) is for plain functions; use async with in an async def",
                argument="lease",
            )
        self._section = self._sim.critical(self._name, lease=self._lease)
        self._section.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._section.__exit__(*exc)


# -- checkers -------------------------------------------------------------------------------


class _Effects(Checker):
    """``exactly_once`` over every kind of effect: the external ones (``sim.effects``) and
    the committed effect rows of ``table``."""

    name = "exactly_once"

    def __init__(self, table: SimTable | None, sim: Simulation | None = None) -> None:
        self._table = table
        #: the effect rows of a table in a real database (str keys), see Context._effect_row
        self._real = _real_effects.get(sim) if sim is not None else None

    def step(self, sim: SimView) -> str | None:
        counts: dict[tuple[str, Any], int] = {}
        for kind, keys in sim.effects.items():
            for key in keys:
                counts[(kind, _hashable(key))] = counts.get((kind, _hashable(key)), 0) + 1
        if self._table is not None:
            for write in self._table.history:
                key = write.key
                if isinstance(key, tuple) and len(key) == 4 and key[0] == _EFFECT_ROW:
                    name = (key[1], _hashable(key[2]))
                    counts[name] = counts.get(name, 0) + 1
                elif self._real is not None and isinstance(key, str) and key in self._real:
                    name = self._real[key]
                    counts[name] = counts.get(name, 0) + 1
        twice: dict[str, list[Any]] = {}
        for (kind, key), count in counts.items():
            if count > 1:
                twice.setdefault(kind, []).append(key)
        if twice:
            return "; ".join(
                f"{kind} applied more than once for {', '.join(map(repr, keys))}"
                for kind, keys in twice.items()
            )
        return None


class _StaleWrite(Checker):
    """The writes to a row, in commit order, come from holders with non-decreasing fencing
    tokens: the token given to the write (``token=``), or else the token of the lease its
    writer held when it wrote."""

    name = "stale_write"

    def __init__(self, table: SimTable, holding: dict[str, tuple[str, int]]) -> None:
        self._table = table
        self._holding = holding
        self._seen = 0
        self._tokens: list[tuple[int | None, str | None]] = []

    def step(self, sim: SimView) -> str | None:
        history = self._table.history
        while self._seen < len(history):  # note each new write's holder as it is now
            write = history[self._seen]
            held = self._holding.get(write.task)
            token = write.token if write.token is not None else (held[1] if held else None)
            self._tokens.append((token, held[0] if held else None))
            self._seen += 1
        highest: dict[Any, tuple[int, str]] = {}
        for write, (token, _lock) in zip(history, self._tokens, strict=False):
            if token is None:
                continue
            top = highest.get(write.key)
            if top is not None and token < top[0]:
                return (
                    f"{write.task} wrote {self._table.name}[{write.key!r}] holding token "
                    f"{token}, after {top[1]} had written it with token {top[0]}: the write "
                    "of a holder whose lease had expired was accepted"
                )
            if top is None or token > top[0]:
                highest[write.key] = (token, write.task)
        return None


class _Announced(Checker):
    """``published_once`` for :func:`dual_write`: no message id published twice; at the
    end, every saved order published and nothing published whose order was not saved."""

    name = "published_once"

    def __init__(self, table: SimTable, queue: str) -> None:
        self._table = table
        self._queue = queue

    def step(self, sim: SimView) -> str | None:
        published = sim.published(self._queue)
        twice = sorted({i for i in published if published.count(i) > 1})
        if twice:
            return (
                f"message {', '.join(map(repr, twice))} published to queue {self._queue!r} "
                "more than once"
            )
        return None

    def end(self, sim: SimView) -> str | None:
        problem = self.step(sim)
        if problem:
            return problem
        saved = {key for key in self._table.rows() if isinstance(key, str)}
        published = set(sim.published(self._queue))
        lost = sorted(saved - published)
        if lost:
            return f"order {', '.join(map(repr, lost))} saved, never published (lost)"
        phantom = sorted(published - saved)
        if phantom:
            return f"message {', '.join(map(repr, phantom))} published, its order never saved"
        return None


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


# -- running the user's function ------------------------------------------------------------


@dataclass(frozen=True)
class _Fn:
    """The user's function and how it runs: an async task, or (``sync``) a thread task."""

    fn: Callable[..., Any]
    sync: bool

    def spawn(self, sim: Simulation, *args: Any, name: str) -> Any:
        """Start ``fn(*args)`` as the task ``name``."""
        if self.sync:
            return sim.spawn(_call_sync, self.fn, *args, name=name)
        return sim.spawn(_call_async(self.fn, *args), name=name)


async def _call_async(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return await fn(*args)
    except Exception as exc:
        outcome = _outcome(exc)
        if outcome is exc:
            raise
        raise outcome from exc


def _outcome(exc: Exception) -> Exception:
    """``exc`` as a job ends with it: a conflict of a real database (SQLite's ``database is
    locked`` when two transactions overlap) becomes a :class:`~jobfence.ConflictError`
    raised from it, an outcome of the schedule as a conflict of the in-memory table is, not
    a bug of the function; anything else is itself."""
    from ..conflicts import is_conflict

    if is_conflict(exc) and not _expected_in_memory(exc):
        return ConflictError(f"the database refused a transaction that overlapped: {exc!r}")
    return exc


def _call_sync(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        result = fn(*args)
    except Exception as exc:
        outcome = _outcome(exc)
        if outcome is exc:
            raise
        raise outcome from exc
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()  # never run: no "never awaited" warning on top of the error
        raise ConfigurationError(
            f"fn returned {type(result).__name__}: a plain function runs in a thread task and "
            "is not awaited; write a function returning an awaitable with async def",
            argument="fn",
        )
    return result


def _check_fn(fn: object, call: str = "fn(ctx)") -> _Fn:
    """``fn`` as the scenario will call it (``call``: ``"fn(ctx)"``, ``"fn(message, ctx)"``):
    an async function (an async task), or a plain one (a thread task with blocking clients),
    taking that many positional arguments."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not callable(fn):
        raise ConfigurationError(
            f"fn must be a function (async def or def) called as {call}, got {fn!r}",
            argument="fn",
        )
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        raise ConfigurationError(
            f"fn must be a function (async def or def) called as {call}, got the generator "
            f"function {getattr(fn, '__qualname__', fn)!r} (it yields): calling it runs none "
            "of its code",
            argument="fn",
        )
    sync = not (
        inspect.iscoroutinefunction(target)
        or inspect.iscoroutinefunction(getattr(target, "__call__", None))  # noqa: B004
    )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or a C callable: it will tell when called
        return _Fn(fn, sync)  # type: ignore[arg-type]
    try:
        signature.bind(*call[3:-1].split(", "))
    except TypeError as exc:
        raise ConfigurationError(
            f"fn is called as {call}; {getattr(fn, '__qualname__', fn)!r} cannot be: {exc}",
            argument="fn",
        ) from None
    return _Fn(fn, sync)  # type: ignore[arg-type]


def _client(sim: Simulation, kind: str, sync: bool, *args: Any) -> Any:
    """``sim.locks()``, ``sim.inbox()``, ``sim.queue(name)``, ``sim.outbox()``: the async
    client, or the blocking one for thread tasks."""
    make = getattr(sim, kind)
    return make(*args, sync=True) if sync else make(*args)


def _view(table: SimTable, sync: bool) -> Any:
    """The table as the user's function sees it: itself, or its blocking view."""
    return table.sync if sync else table  # type: ignore[attr-defined]


_URL_CHOICES = (
    "None (the table in memory), 'sqlite:///path/to/file.db' or 'postgresql://user@host:port/db'"
)


def _check_url(url: object) -> str | None:
    """``url`` of a scenario's table: ``None`` (in memory) or a database that
    ``sim.table(..., url=)`` takes (SQLite or PostgreSQL); refused before any schedule."""
    if url is None:
        return None
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"url must be {_URL_CHOICES}; got {url!r}", argument="url")
    from .table_real import _driver

    try:
        _driver(url)  # the scheme and the URL's form; nothing is opened
    except ConfigurationError as exc:
        raise ConfigurationError(f"url must be {_URL_CHOICES}: {exc}", argument="url") from None
    return url


def _table(
    sim: Simulation, name: str, rows: dict[Any, dict[str, Any]] | None, url: str | None
) -> Any:
    """The scenario's table ``name``: in memory, or in the database at ``url``; its effect
    rows then get str keys (see :meth:`Context._effect_row`)."""
    if url is None:
        return sim.table(name, rows)
    _real_effects.setdefault(sim, {})
    return sim.table(name, rows, url=url)


def _guard(exc: Exception) -> None:
    """Re-raise ``exc`` unless a job may end with it under faults (see :func:`_expected`)."""
    if not _expected(exc):
        raise exc


def _check_count(value: object, name: str, low: int, high: int = 1000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"{name} must be an int from {low} to {high}, got {value!r}", argument=name
        )
    return value


def _check_rows(rows: object) -> dict[Any, dict[str, Any]]:
    if (
        not isinstance(rows, dict)
        or not rows
        or not all(isinstance(r, dict) for r in rows.values())
    ):
        raise ConfigurationError(
            "rows must be a non-empty dict of row key -> dict of columns, e.g. "
            f"{{'counter': {{'value': 0}}}}, got {rows!r}",
            argument="rows",
        )
    return rows


def _expected(error: BaseException) -> bool:
    """What a job may end with under faults and concurrency: an injected fault or a jobfence
    error (see :func:`_expected_in_memory`), or a conflict of the database
    (:func:`jobfence.is_conflict`: SQLite's ``database is locked`` when two transactions of
    a table in a real database overlap); anything else is a bug of the function and fails
    the schedule."""
    from ..conflicts import is_conflict

    return _expected_in_memory(error) or is_conflict(error)


def _expected_in_memory(error: BaseException) -> bool:
    """An injected fault or a jobfence error, or one raised from them (``from``)."""
    link: BaseException | None = error
    for _ in range(20):
        if link is None:
            return False
        if isinstance(link, (InjectedFault, JobfenceError)):
            return True
        link = link.__cause__
    return False


def _explore(
    scenario: Callable[[Simulation], Awaitable[None]],
    *,
    schedules: int,
    seed: int,
    strategy: str,
    faults: Any,
    checks: Sequence[Checker],
) -> Report:
    if not isinstance(checks, (list, tuple)) or not all(isinstance(c, Checker) for c in checks):
        raise ConfigurationError(
            f"checks must be a list of jobfence.testing checkers, got {checks!r}",
            argument="checks",
        )

    return explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


# -- the scenarios --------------------------------------------------------------------------


def lost_update(
    fn: Callable[[TableContext], Awaitable[Any]],
    *,
    workers: int = 2,
    rows: dict[Any, dict[str, Any]] | None = None,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = _faults.auto(kinds=["transient"]),  # noqa: B008  # a frozen value
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs run ``fn(ctx)`` at once, each changing the same row of ``ctx.table``
    (read it, compute, write): no job may write a value computed from a version of the row
    that another job has replaced since (``no_lost_update``).

    ``ctx`` is a :class:`TableContext`: ``table`` (the simulated table ``"counters"`` holding
    ``rows``, default ``{"counter": {"value": 0}}``), ``key`` (the first row's key),
    ``inbox``, ``locks``. ``faults``: by default a transient failure at each point, tried one
    and two at a time (a retry that re-sends a stale value is the classic lost update).

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    url = _check_url(url)
    workers = _check_count(workers, "workers", 1)
    start = _check_rows(rows if rows is not None else {"counter": {"value": 0}})

    async def scenario(sim: Simulation) -> None:
        table = _table(sim, "counters", start, url)
        view = _view(table, job.sync)
        inbox, locks = _client(sim, "inbox", job.sync), _client(sim, "locks", job.sync)
        for i in range(1, workers + 1):
            ctx = TableContext(sim, f"w{i}", view, next(iter(start)), inbox, locks)
            job.spawn(sim, ctx, name=ctx.worker)
        sim.watch(no_lost_update(table))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


async def _consume(fn: Callable[..., Any], ctx: MessageContext, queue: Any) -> None:
    """A consumer: receive, handle, ack; a handler that fails gives the message back (it is
    delivered again); stops once no message came for a minute."""
    while batch := await queue.receive(visibility=CONSUMER_VISIBILITY, wait=_CONSUMER_WAIT):
        message = batch[0]
        try:
            await fn(message, ctx)
        except Exception as exc:
            _guard(exc)
            try:
                await message.nack(delay=_RETRY_DELAY)
            except Exception as again:
                _guard(again)
            continue
        try:
            await message.ack()
        except Exception as exc:  # the delivery was lost meanwhile (a stopped consumer)
            _guard(exc)


def _consume_sync(fn: Callable[..., Any], ctx: MessageContext, queue: Any) -> None:
    """:func:`_consume` in a thread task, with the blocking queue."""
    while batch := queue.receive(visibility=CONSUMER_VISIBILITY, wait=_CONSUMER_WAIT):
        message = batch[0]
        try:
            _call_sync(fn, message, ctx)
        except Exception as exc:
            _guard(exc)
            try:
                message.nack(delay=_RETRY_DELAY)
            except Exception as again:
                _guard(again)
            continue
        try:
            message.ack()
        except Exception as exc:
            _guard(exc)


def _messages(
    fn: Callable[..., Awaitable[Any]],
    *,
    workers: int,
    copies: int,
    schedules: int,
    seed: int,
    strategy: str,
    faults: Any,
    checks: Sequence[Checker],
    url: str | None,
) -> Report:
    job = _check_fn(fn, "fn(message, ctx)")
    url = _check_url(url)
    workers = _check_count(workers, "workers", 1)

    async def scenario(sim: Simulation) -> None:
        publisher = sim.queue("payments")
        for _ in range(copies):
            await publisher.publish({"order": "order-1", "amount": 42}, id="order-1")
        queue = _client(sim, "queue", job.sync, "payments")
        inbox, locks = _client(sim, "inbox", job.sync), _client(sim, "locks", job.sync)
        table = _table(sim, "payments", None, url)
        view = _view(table, job.sync)
        for i in range(1, workers + 1):
            ctx = MessageContext(sim, f"w{i}", view, inbox, locks)
            if job.sync:
                sim.spawn(_consume_sync, job.fn, ctx, queue, name=ctx.worker)
            else:
                sim.spawn(_consume(job.fn, ctx, queue), name=ctx.worker)
        sim.watch(_Effects(table, sim))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def duplicate_delivery(
    fn: Callable[[Any, MessageContext], Awaitable[Any]],
    *,
    workers: int = 2,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = "auto",
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """The message ``order-1`` (body ``{"order": "order-1", "amount": 42}``) is delivered
    twice, as at-least-once queues do (its producer published it twice), to ``workers``
    consumers, each calling ``fn(message, ctx)`` for what it receives, at once or one after
    the other: each effect must happen once (``exactly_once``).

    A consumer acks a message once ``fn`` returns; when ``fn`` fails (with an injected fault,
    a jobfence error or a conflict of the database) it gives the message back, and it is
    delivered again 5 s later. A delivery is hidden from the others for
    :data:`CONSUMER_VISIBILITY` seconds. ``ctx`` is a
    :class:`MessageContext`. ``faults``: ``"auto"`` by default, every fault at every point
    (a crash or a pause between the effect and the ack delivers it once more).

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    return _messages(
        fn,
        workers=workers,
        copies=2,
        schedules=schedules,
        seed=seed,
        strategy=strategy,
        faults=faults,
        checks=checks,
        url=url,
    )


def lost_ack(
    fn: Callable[[Any, MessageContext], Awaitable[Any]],
    *,
    workers: int = 2,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = _faults.auto(kinds=["lost_ack"]),  # noqa: B008  # a frozen value
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """The message ``order-1`` is published once and consumed by ``workers`` consumers
    calling ``fn(message, ctx)``; its ack is lost on the way (``lost_ack``), so the queue
    delivers it again once its visibility passes: each effect must happen once
    (``exactly_once``). The consumers and ``ctx`` are those of :func:`duplicate_delivery`.
    ``faults``: by default a lost ack at each ack, one and two at a time.

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    return _messages(
        fn,
        workers=workers,
        copies=1,
        schedules=schedules,
        seed=seed,
        strategy=strategy,
        faults=faults,
        checks=checks,
        url=url,
    )


class _RecordingLocks:
    """``AsyncLocks`` that notes the lease each task takes last: (name, token) by task."""

    def __init__(self, sim: Simulation, locks: Any, holding: dict[str, tuple[str, int]]) -> None:
        self._sim = sim
        self._locks = locks
        self._holding = holding

    def __getattr__(self, name: str) -> Any:
        return getattr(self._locks, name)

    def _note(self, lease: Any) -> Any:
        task = self._sim.current()
        if lease is not None and task is not None:
            self._holding[task.name] = (lease.name, lease.token)
        return lease

    async def try_acquire(self, name: str, **options: Any) -> Any:
        return self._note(await self._locks.try_acquire(name, **options))

    def acquire(self, name: str, **options: Any) -> _RecordedAcquire:
        return _RecordedAcquire(self, self._locks.acquire(name, **options))


class _RecordingSyncLocks(_RecordingLocks):
    """The blocking ``Locks`` noting the leases (``acquire`` returns the lease itself)."""

    def try_acquire(self, name: str, **options: Any) -> Any:  # type: ignore[override]
        return self._note(self._locks.try_acquire(name, **options))

    def acquire(self, name: str, **options: Any) -> Any:  # type: ignore[override]
        return self._note(self._locks.acquire(name, **options))


class _RecordedAcquire:
    """``locks.acquire(...)``, awaited or used as ``async with``, noting the lease."""

    def __init__(self, owner: _RecordingLocks, inner: Any) -> None:
        self._owner = owner
        self._inner = inner

    def __await__(self) -> Any:
        lease = yield from self._inner.__await__()
        return self._owner._note(lease)

    async def __aenter__(self) -> Any:
        return self._owner._note(await self._inner.__aenter__())

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


def paused_holder(
    fn: Callable[[TableContext], Awaitable[Any]],
    *,
    workers: int = 2,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = _faults.auto(kinds=["pause_past_ttl"]),  # noqa: B008  # a frozen value
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs run ``fn(ctx)`` at once: each takes the lock ``ctx.key``
    (``"report"``) from ``ctx.locks`` and writes the row ``ctx.key`` of ``ctx.table`` while
    holding it. A job's process stops past its lease's ttl (``pause_past_ttl``: the default
    ``faults`` try it at every point after the job took the lock), another job takes the
    lock over and writes, then the first one wakes up and writes too: the writes must never
    go back to an older holder
    (``stale_write``: the writes' fencing tokens, given with ``token=`` or else those of the
    leases their writers held, never go down).

    ``ctx`` is a :class:`TableContext` (``table`` is ``"reports"``, its row ``"report"``
    ``{"content": None}``, not fenced by itself: ``write(..., token=)`` is not checked by the
    table, ``jobfence.fence_async(tx, ...)`` in the write's transaction is how a job refuses
    a stale token).

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    url = _check_url(url)
    workers = _check_count(workers, "workers", 1)
    recording = _RecordingSyncLocks if job.sync else _RecordingLocks

    async def scenario(sim: Simulation) -> None:
        table = _table(sim, "reports", {"report": {"content": None}}, url)
        holding: dict[str, tuple[str, int]] = {}
        locks = recording(sim, _client(sim, "locks", job.sync), holding)
        inbox = _client(sim, "inbox", job.sync)
        for i in range(1, workers + 1):
            ctx = TableContext(sim, f"w{i}", _view(table, job.sync), "report", inbox, locks)
            job.spawn(sim, ctx, name=ctx.worker)
        sim.watch(_StaleWrite(table, holding))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def commit_unknown(
    fn: Callable[[OrderContext], Awaitable[Any]],
    *,
    workers: int = 2,
    deliveries: int = 3,
    rows: dict[Any, dict[str, Any]] | None = None,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = _faults.auto(kinds=["commit_unknown"]),  # noqa: B008  # a frozen value
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs, one per order (``ctx.order``: ``"order-1"``, ``"order-2"``...), run
    ``fn(ctx)``, which applies the order in a transaction of ``ctx.table`` and records its
    effect (``await ctx.effect("charge", ctx.order, tx=tx)``). A commit is applied but
    reported failed (``commit_unknown``, at each commit, one and two at a time: the default
    ``faults``); a job that fails is delivered again, up to
    ``deliveries`` times in all, as a queue would: each order's effect must be committed once
    (``exactly_once``).

    ``ctx`` is an :class:`OrderContext` (``table`` is ``"accounts"`` holding ``rows``, default
    ``{"account": {"balance": 100}}``; ``key`` its first row's key; ``inbox``, ``locks``).

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    url = _check_url(url)
    workers = _check_count(workers, "workers", 1)
    deliveries = _check_count(deliveries, "deliveries", 1, 100)
    start = _check_rows(rows if rows is not None else {"account": {"balance": 100}})

    async def delivered(ctx: OrderContext) -> None:
        for attempt in range(deliveries):
            try:
                await _call_async(job.fn, ctx)
                return
            except Exception as exc:
                if attempt == deliveries - 1:
                    raise
                _guard(exc)

    def delivered_sync(ctx: OrderContext) -> None:
        for attempt in range(deliveries):
            try:
                _call_sync(job.fn, ctx)
                return
            except Exception as exc:
                if attempt == deliveries - 1:
                    raise
                _guard(exc)

    async def scenario(sim: Simulation) -> None:
        table = _table(sim, "accounts", start, url)
        view = _view(table, job.sync)
        inbox, locks = _client(sim, "inbox", job.sync), _client(sim, "locks", job.sync)
        key = next(iter(start))
        for i in range(1, workers + 1):
            ctx = OrderContext(sim, f"w{i}", view, key, inbox, locks, f"order-{i}")
            if job.sync:
                sim.spawn(delivered_sync, ctx, name=ctx.worker)
            else:
                sim.spawn(delivered(ctx), name=ctx.worker)
        sim.watch(_Effects(table, sim))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def check_then_act(
    fn: Callable[[TableContext], Awaitable[Any]],
    *,
    workers: int = 2,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = None,
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs run ``fn(ctx)`` at once for the same key ``ctx.key`` (``"user-1"``):
    each looks whether the thing is done and does it if not (send the welcome e-mail, create
    the coupon): it must be done once (``exactly_once`` over ``ctx.effect``).

    ``ctx`` is a :class:`TableContext` (``table`` is ``"users"``, empty; ``inbox``,
    ``locks``). ``faults``: none by default: two jobs that both look before either acts
    need no fault.

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    url = _check_url(url)
    workers = _check_count(workers, "workers", 1)

    async def scenario(sim: Simulation) -> None:
        table = _table(sim, "users", None, url)
        view = _view(table, job.sync)
        inbox, locks = _client(sim, "inbox", job.sync), _client(sim, "locks", job.sync)
        for i in range(1, workers + 1):
            ctx = TableContext(sim, f"w{i}", view, "user-1", inbox, locks)
            job.spawn(sim, ctx, name=ctx.worker)
        sim.watch(_Effects(table, sim))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def _minute(epoch: float) -> str:
    return datetime.fromtimestamp(epoch // 60 * 60, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_fired_twice(
    fn: Callable[[str, PodContext], Awaitable[Any]],
    *,
    pods: int = 2,
    skew: float = -2.0,
    slots: int = 3,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = None,
    checks: Sequence[Checker] = (),
) -> Report:
    """``pods`` pods run the schedule ``"report"`` every minute: each wakes at the start of
    every minute by its own wall clock and calls ``fn(slot, ctx)``, ``slot`` being that
    minute (``"2026-01-01T00:01:00Z"``); the job runs with ``await ctx.fire(slot)``. The
    second pod's clock is ``skew`` seconds off (negative: behind), the others' are right.
    Each of the first ``slots`` minutes must fire once, on one pod (``once_per_slot``).

    ``ctx`` is a :class:`PodContext` (``schedule``, ``locks``, ``inbox``, ``fire``). A tick
    that fails (an injected fault, a jobfence error) is skipped. ``faults``: none by default:
    the clocks' skew makes the race.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn, "fn(slot, ctx)")
    pods = _check_count(pods, "pods", 1, 26)
    slots = _check_count(slots, "slots", 1, 60)
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not math.isfinite(skew):
        raise ConfigurationError(
            f"skew must be a finite number of seconds (negative: behind), got {skew!r}",
            argument="skew",
        )
    from .._core.clock import get_clock
    from ._sim import EPOCH

    expected = [("report", _minute(EPOCH + 60 * m)) for m in range(1, slots + 1)]

    async def pod(ctx: PodContext) -> None:
        for _ in range(slots):
            now = get_clock().time()
            await ctx.sleep((now // 60 + 1) * 60 - now)
            try:
                await job.fn(_minute(get_clock().time()), ctx)
            except Exception as exc:
                _guard(exc)

    def pod_sync(ctx: PodContext) -> None:
        for _ in range(slots):
            now = get_clock().time()
            get_clock().sleep((now // 60 + 1) * 60 - now)
            try:
                _call_sync(job.fn, _minute(get_clock().time()), ctx)
            except Exception as exc:
                _guard(exc)

    async def scenario(sim: Simulation) -> None:
        locks, inbox = _client(sim, "locks", job.sync), _client(sim, "inbox", job.sync)
        for i in range(pods):
            ctx = PodContext(sim, f"pod-{chr(ord('a') + i)}", "report", locks, inbox)
            if job.sync:
                task = sim.spawn(pod_sync, ctx, name=ctx.worker)
            else:
                task = sim.spawn(pod(ctx), name=ctx.worker)
            if i == 1 and skew:
                sim.skew(task, skew)
        sim.watch(once_per_slot("fire", expected=expected))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def over_limit(
    fn: Callable[[LimitContext], Awaitable[Any]],
    *,
    limit: int = 2,
    workers: int | None = None,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = None,
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs (default ``limit + 1``) run ``fn(ctx)`` at once; each uses the
    resource ``ctx.name`` (``"api"``), which at most ``limit`` may use at once, inside
    ``async with ctx.using(lease):``. At no step may more than ``limit`` valid users be inside
    (``at_most_holders``; a worker whose lease is lost or past its ttl does not count).

    ``ctx`` is a :class:`LimitContext`. ``faults``: none by default: workers that all look
    before any takes its place need no fault; ``faults="auto"`` adds pauses past the
    permits' ttl and crashes, which a permit of ``locks`` survives (a paused worker's
    permit is lost, and it no longer counts).

    ``url``: where the table's rows live: ``None`` (the default) in memory, or a real
    database, ``"sqlite:///path/to/file.db"`` or ``"postgresql://user@host:port/db"``
    (``sim.table(..., url=url)``): the same race on that database's transactions and locks.

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    url = _check_url(url)
    limit = _check_count(limit, "limit", 1)
    workers = _check_count(workers if workers is not None else limit + 1, "workers", 1)

    async def scenario(sim: Simulation) -> None:
        locks = _client(sim, "locks", job.sync)
        table = _view(_table(sim, "limits", {"api": {"used": 0}}, url), job.sync)
        for i in range(1, workers + 1):
            ctx = LimitContext(sim, f"w{i}", "api", limit, locks, table)
            job.spawn(sim, ctx, name=ctx.worker)
        sim.watch(at_most_holders(limit, "api"))

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )


def dual_write(
    fn: Callable[[OrderContext], Awaitable[Any]],
    *,
    workers: int = 2,
    schedules: int = 300,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = "auto",
    checks: Sequence[Checker] = (),
    url: str | None = None,
) -> Report:
    """``workers`` jobs each place one order: ``fn(ctx)`` saves the row ``ctx.order`` in
    ``ctx.table`` (``"orders"``) and announces it as the message of id ``ctx.order`` on the
    queue ``"orders"`` (``ctx.queue``, directly, or through ``ctx.outbox``, an
    ``AsyncOutbox`` whose committed rows a relay sends to ``ctx.queue`` once the jobs are
    done). Every order saved must be published, once, and nothing published whose order was
    not saved (``published_once``). A job that fails is not run again.

    ``ctx`` is an :class:`OrderContext` (``table``, ``order``, ``queue``, ``outbox``,
    ``inbox``, ``locks``). ``faults``: ``"auto"`` by default (a commit applied but reported
    failed, a transient failure of the publish...).

    ``url``: ``None`` only: the outbox's rows live in memory, next to the table, so the
    table cannot be in a real database here (any other value raises
    :class:`~jobfence.ConfigurationError`).

    ``schedules`` (how many to run), ``seed``, ``strategy`` and ``checks`` (invariants of
    your own, on top of the scenario's) are those of :func:`~jobfence.testing.explore`.
    """
    job = _check_fn(fn)
    if url is not None:
        raise ConfigurationError(
            "url must be None for dual_write: its outbox rows live in memory, next to the "
            f"table, which cannot be in a real database here; got {url!r}",
            argument="url",
        )
    workers = _check_count(workers, "workers", 1)

    async def scenario(sim: Simulation) -> None:
        from ..relay_async import AsyncRelay

        table = sim.table("orders")
        view = _view(table, job.sync)
        queue, outbox = sim.queue("orders"), sim.outbox()  # the relay's, async
        clients = [_client(sim, kind, job.sync) for kind in ("inbox", "locks", "outbox")]
        inbox, locks, theirs = clients
        mine = _client(sim, "queue", job.sync, "orders")
        for i in range(1, workers + 1):
            order = f"order-{i}"
            ctx = OrderContext(sim, f"w{i}", view, order, inbox, locks, order, mine, theirs)
            job.spawn(sim, ctx, name=ctx.worker)
        sim.watch(_Announced(table, "orders"))
        await sim.join()
        relay = AsyncRelay(outbox, queue, handle_signals=False)
        try:
            while await relay.run_once():
                pass
        finally:
            await relay.close()

    return _explore(
        scenario, schedules=schedules, seed=seed, strategy=strategy, faults=faults, checks=checks
    )
