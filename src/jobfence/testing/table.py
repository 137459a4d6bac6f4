"""Simulated data: a table of versioned rows whose reads, writes and commits are points.

``sim.table("inventory", {1: {"stock": 10}})`` makes one. Each row is a dict (reads return
shallow copies) with an int ``version`` column (1 unless given) that every write bumps. Its
operations are points, so the scheduler can switch tasks between them and faults can hit them:

========================================  ==========================================
``await db.read(key)``                    ``db.read``: the row (a copy) or ``None``
``await db.write(key, **values)``         ``db.write``: set columns, committed at once
``await db.update(key, version, **v)``    ``db.write``: only if the row is still at
                                          ``version``, else ``StaleVersion``
``async with db.transaction() as tx:``    the same verbs on ``tx``; the writes are
                                          applied at ``db.commit``, all or none
``db.get(key)``                           the committed row, no point (for checks)
========================================  ==========================================

``jobfence.versioned_update_async(db_or_tx, "inventory", {"id": key}, version, values)``,
``jobfence.fence_async(db_or_tx, resource, token)`` and ``inbox.claim_in(db_or_tx, key)``
work on a table (each committed at once) or a transaction (committed or rolled back with it)
as on a database connection: a table and a transaction are transactions of their own for
them (``jobfence._core.transaction``). The fences and the inbox markers live in the table's
database, as they would in the connection's, apart from its rows. Writes take ``token=`` (a
lease's fencing token): a table made with ``fenced=True`` refuses a token lower than one it
has accepted for that row (:class:`~jobfence.StaleToken`), and
:func:`~jobfence.testing.fencing_monotonic` checks the tokens either way. The table keeps
every committed write in :attr:`SimTable.history`, with the version its writer had read,
which is how :func:`~jobfence.testing.no_lost_update` tells a lost update.

``sim.table(name, rows, url="sqlite:///..." or "postgresql://...")`` keeps the rows in a
real database instead, with the same verbs, points and history
(:mod:`jobfence.testing.table_real`).

Thread tasks (a plain function given to ``sim.spawn``) use the blocking view of a table,
``db.sync`` (:class:`SyncTable`): the same verbs without ``await`` (``db.sync.read(key)``,
``with db.sync.transaction() as tx:``), the same points, faults and history, and the sync
``jobfence.fence``, ``jobfence.versioned_update``, ``Inbox.claim_in`` and ``Outbox.add``
take it or its transactions as they take a connection. At a point the thread waits until the
scheduler lets it go on.
"""

from __future__ import annotations

import contextvars
import copy
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import ConfigurationError, ConflictError, StaleToken, StaleVersion
from ._base import _Crashed, _Statement
from .faults import Fault, InjectedFault

if TYPE_CHECKING:
    from ..backends.memory.outbox import MemoryOutboxStore
    from ._base import SimView

__all__ = ["SimTable", "SimTransaction", "SyncTable", "SyncTransaction", "Write"]

T = TypeVar("T")
B = TypeVar("B", bound="_Base")

#: set while a verb of a blocking view runs: the points block the thread (no gate to
#: await), and a table in a real database uses its blocking connections
_BLOCKING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jobfence_sim_blocking", default=False
)


def blocking() -> bool:
    """Whether the code running now is a verb of a blocking view (:class:`SyncTable`)."""
    return _BLOCKING.get()


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end in this thread, as a blocking verb: a verb of a simulated
    table suspends only at a point's gate, and a point of a thread task (or of the
    scenario's own code) blocks instead of returning one, so the coroutine never suspends.
    The statements of a real-database table run on its blocking connections meanwhile."""
    token = _BLOCKING.set(True)
    try:
        try:
            coro.send(None)
        except StopIteration as stop:
            result: T = stop.value
            return result
        coro.close()
        raise RuntimeError("a blocking verb of a simulated table suspended")  # pragma: no cover
    finally:
        _BLOCKING.reset(token)


@contextmanager
def blocking_io(sim: Any) -> Iterator[_Statement]:
    """The block of a blocking statement of a thread task. The thread runs it alone (the
    loop waits for a running thread); if it has not answered within ``sim.block_timeout``
    real seconds (it waits for a lock a parked task holds, say), the thread gives way as an
    async statement does (:meth:`~jobfence.testing.Simulation.stalled_io`): it stops
    counting as running, so the scheduler lets another task go, and once the answer comes
    it waits at a point until the scheduler lets it go on. The order of events then depends
    on real timing. Anywhere else (the scenario's own code), the block just runs."""
    task = sim.current()
    loop = getattr(sim, "loop", None)
    go = getattr(task, "go", None)
    if (
        task is None
        or not getattr(task, "thread", False)
        or go is None
        or loop is None
        or sim.stopping
    ):
        yield _Statement()
        return
    statement = _Statement()
    lock = threading.Lock()
    state = {"done": False, "gave": False}

    def post(fn: Any) -> bool:
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: the schedule ended
            return False
        return True

    def give_way() -> None:  # on the loop's thread: the thread runs no more
        if sim.stopping:
            return
        sim.running_threads -= 1
        sim.external -= 1
        statement.stalled = True
        sim.statements.append(statement)

    def watchdog() -> None:
        with lock:
            if state["done"]:
                return
            state["gave"] = True
        post(give_way)

    timer = threading.Timer(sim.block_timeout, watchdog)
    timer.daemon = True
    timer.start()
    try:
        yield statement
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        if state["gave"]:
            go.clear()  # before it is a candidate: a release from now on is not lost

            def repark() -> None:  # on the loop's thread, after give_way
                if sim.stopping:
                    return
                if statement in sim.statements:
                    sim.statements.remove(statement)
                if not statement.stalled:  # the loop counted it again meanwhile
                    sim.external -= 1
                task.parked_at = "db.answer"
                sim.parked.append(task)

            if post(repark) and not sim.stopping:
                go.wait()
            if sim.stopping:
                raise _Crashed


def blocking_point(sim: SimView, point: str, info: dict[str, Any]) -> Fault | None:
    """Reach ``point`` in blocking code: ``sim.on_point`` blocks a thread task until the
    scheduler lets it go on (a ``transient`` fault raises there); the ``commit_unknown``
    fault planned for this hit, if any, is returned (the caller does the work, then raises
    :class:`InjectedFault`): the one the hit recorded in the schedule's trail.
    ConfigurationError from an async task (its points are gates it must await: it uses the
    table itself or an async connection)."""
    task = sim.current()
    trail: list[Any] | None = getattr(sim, "trail", None)
    before = len(trail) if trail is not None else 0
    gate = sim.on_point(point, info)
    if gate is not None:
        if hasattr(gate, "close"):
            gate.close()
        raise ConfigurationError(
            "the blocking view of a simulated table (table.sync) and an attached blocking "
            "connection are for thread tasks (a plain function given to sim.spawn): an async "
            "task uses the table itself (await table.read(...)) or an async connection",
            argument="table",
        )
    if task is None or not getattr(task, "thread", False) or trail is None:
        return None
    # the hit appended to the trail right at the point (before the thread waited there)
    for hit in trail[before : before + 1]:
        fault = getattr(hit, "fault", None)
        if getattr(hit, "task", None) is task and fault is not None:
            return fault if fault.kind == "commit_unknown" else None  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class Write:
    """One committed write: who, which row, the values, the version its writer had read of
    the row (``base``, ``None`` for a blind write), the version it replaced (``over``), the
    new ``version``, and the fencing ``token`` it carried."""

    task: str
    key: Any
    values: dict[str, Any]
    base: int | None
    over: int | None
    version: int
    token: int | None


def _check_values(values: Mapping[str, Any], version_column: str) -> None:
    if version_column in values:
        raise ConfigurationError(
            f"the {version_column!r} column is bumped by every write: leave it out",
            argument="values",
        )


class _Transaction:
    """What ``fence_async``, ``versioned_update_async`` and ``claim_in`` see of a simulated
    table or transaction (the ``AsyncTransaction`` of ``jobfence._core.transaction``)."""

    __slots__ = ("_of", "dialect")

    def __init__(self, of: _Base) -> None:
        self._of = of
        self.dialect = of.table.dialect

    async def versioned_update(
        self,
        table: str,
        key: dict[str, Any],
        version: int,
        values: dict[str, Any],
        version_column: str,
    ) -> int:
        return await self._of._versioned_update(table, key, version, values, version_column)

    @property
    def in_transaction(self) -> bool:
        return self._of._in_transaction()

    async def fence(self, resource: str, token: int, table: str) -> int:
        return await self._of._fence(resource, token, table)

    async def claim_in(
        self, table: str, key: str, fingerprint: str | None, retention: float
    ) -> tuple[bool, str | None]:
        return await self._of._claim_in(table, key, fingerprint)

    async def outbox_add(self, table: str, row: Mapping[str, Any]) -> None:
        await self._of._outbox_add(table, row)


class _Base:
    """What a table and a transaction share: the verbs."""

    table: _Table

    async def read(self, key: Any) -> dict[str, Any] | None:
        raise NotImplementedError

    async def write(self, key: Any, *, token: int | None = None, **values: Any) -> int:
        raise NotImplementedError

    async def update(
        self, key: Any, version: int, *, token: int | None = None, **values: Any
    ) -> int:
        raise NotImplementedError

    def __jobfence_transaction__(self) -> _Transaction:
        return _Transaction(self)

    def _in_transaction(self) -> bool:
        """A transaction still open (a table is none: each write commits on its own)."""
        return False

    async def _versioned_update(
        self,
        table: str,
        keys: dict[str, Any],
        version: int,
        values: dict[str, Any],
        version_column: str,
    ) -> int:
        own = self.table
        if table != own.name or list(keys) != [own.key_column]:
            raise ConfigurationError(
                f"this simulated table is {own.name!r} keyed by {own.key_column!r}; "
                f"got table {table!r} and key columns {list(keys)!r}",
                argument="key",
            )
        if version_column != own.version_column:
            raise ConfigurationError(
                f"the simulated table's version column is {own.version_column!r}",
                argument="version_column",
            )
        return await self.update(keys[own.key_column], version, **values)

    async def _fence(self, resource: str, token: int, table: str) -> int:
        """``fence_async`` here: record ``token`` for ``resource`` in the fence table
        ``table`` unless a newer one is there; the newest token recorded."""
        raise NotImplementedError

    async def _claim_in(
        self, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        """``claim_in`` here: mark ``key`` in the inbox table ``table``; (first, the
        fingerprint stored if not first)."""
        raise NotImplementedError

    async def _outbox_add(self, table: str, row: Mapping[str, Any]) -> None:
        """``AsyncOutbox.add`` here: add ``row`` to the outbox table ``table``, visible to
        the relays once it commits."""
        raise ConfigurationError(
            "an outbox row can be added to an in-memory simulated table or its transaction "
            "(sim.table(name) without url=); a real-database table keeps no outbox",
            argument="conn",
        )


class _Table(_Base):
    """What every simulated table keeps, wherever its rows live: the history of committed
    writes, the version of each row each task last read or wrote, and the points."""

    key_column = "id"
    version_column = "version"
    #: the database, as telemetry and jobfence's messages name it
    dialect = "simulated"

    def __init__(self, sim: SimView, name: str, fenced: bool) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"name must be a non-empty str, got {name!r}", argument="name")
        self.sim = sim
        self.name = name
        self.fenced = fenced
        self.history: list[Write] = []
        self._read: dict[tuple[str, Any], int | None] = {}
        # the class's column name, on the table itself: a read looks it up at every point,
        # and an attribute of the instance is found faster than one of its class
        self.version_column = self.version_column

    @property
    def table(self) -> _Table:  # type: ignore[override]  # read-only here, an attribute elsewhere
        """The table itself (a transaction's ``table`` is the table it runs on). A property,
        not an attribute: a table that referred to itself would be a reference cycle, left
        for the garbage collector with the schedule it belongs to."""
        return self

    def _initial(self, rows: Mapping[Any, Mapping[str, Any]]) -> dict[Any, dict[str, Any]]:
        """The starting rows, each a new dict with its version (1 unless given)."""
        out: dict[Any, dict[str, Any]] = {}
        for key, row in rows.items():
            if type(row) is not dict and not isinstance(row, Mapping):
                raise ConfigurationError(
                    f"rows must map each key to a dict of columns; {key!r} -> {row!r}",
                    argument="rows",
                )
            stored = dict(row)
            stored.setdefault(self.version_column, 1)
            out[key] = stored
        return out

    @property
    def sync(self) -> SyncTable:
        """The blocking view of the table, for thread tasks: ``db.sync.read(key)``,
        ``db.sync.write(key, **values)``, ``with db.sync.transaction() as tx:`` (see
        :class:`SyncTable`)."""
        return SyncTable(self)

    def get(self, key: Any) -> dict[str, Any] | None:
        raise NotImplementedError

    def rows(self) -> dict[Any, dict[str, Any]]:
        raise NotImplementedError

    def transaction(self) -> Any:
        raise NotImplementedError

    def lost_updates(self) -> list[Write]:
        """The committed writes computed from an older version than the one they replaced."""
        return [w for w in self.history if w.base is not None and w.base != w.over]

    async def _alone(
        self, key: Any, values: dict[str, Any], expected: int | None, token: int | None
    ) -> int:
        """Apply one write outside a transaction (at ``expected`` version if not ``None``),
        committed and recorded; the new version."""
        raise NotImplementedError

    async def write(self, key: Any, *, token: int | None = None, **values: Any) -> int:
        """Set ``values`` on the row (created if missing), committed at once; returns the
        new version; point ``db.write`` (a ``commit_unknown`` fault there applies, then
        raises)."""
        _check_values(values, self.version_column)
        fault = await self._point("db.write", key)
        version = await self._alone(key, values, None, token)
        if fault is not None:
            raise InjectedFault(fault)
        return version

    async def update(
        self, key: Any, version: int, *, token: int | None = None, **values: Any
    ) -> int:
        """Set ``values`` only if the row is still at ``version`` (else
        :class:`~jobfence.StaleVersion`); returns the new version; point ``db.write``."""
        _check_values(values, self.version_column)
        fault = await self._point("db.write", key)
        new = await self._alone(key, values, version, token)
        if fault is not None:
            raise InjectedFault(fault)
        return new

    # -- the points ------------------------------------------------------------------
    async def _point(self, point: str, key: Any) -> Fault | None:
        if _BLOCKING.get():
            return blocking_point(self.sim, point, {"table": self.name, "key": key})
        gate = self.sim.on_point(point, {"table": self.name, "key": key})
        if gate is None:
            return None
        result: Fault | None = await gate
        return result

    def _who(self) -> str:
        task = self.sim.current()
        return task.name if task is not None else "main"

    # -- the bookkeeping -------------------------------------------------------------
    def _stale(self, key: Any, expected: int, row: dict[str, Any] | None) -> StaleVersion:
        """The error of a write expecting ``expected`` while the row is ``row`` now."""
        ver = self.version_column
        return StaleVersion(
            f"stale version for {self.name} {key!r}: expected {ver} = {expected}, "
            f"but {'the row is gone' if row is None else f'it is at {row[ver]}'}",
            table=self.name,
            key={self.key_column: key},
            expected=expected,
            current=copy.deepcopy(row),
        )

    def _record(
        self,
        who: str,
        key: Any,
        values: dict[str, Any],
        over: int | None,
        new: int,
        token: int | None,
    ) -> None:
        """A committed write of ``who``: into the history, with the version ``who`` had
        read of the row (``base``); ``who`` has seen ``new`` since."""
        base = self._read.get((who, key))
        self.history.append(Write(who, key, dict(values), base, over, new, token))
        self._read[(who, key)] = new


class SimTable(_Table):
    """A simulated table (see the module docs). ``name``, ``key_column`` (``"id"``) and
    ``version_column`` (``"version"``) matter to ``versioned_update``."""

    def __init__(
        self, sim: SimView, name: str, rows: Mapping[Any, Mapping[str, Any]], fenced: bool
    ) -> None:
        super().__init__(sim, name, fenced)
        #: the simulation's lean point (``Simulation.lean_point``), if it has one
        self._lean: Callable[[str], Any] | None = getattr(sim, "lean_point", None)
        #: what the lean point returns to a task that goes on (nothing to await)
        self._passed: Any = getattr(sim, "passed", None)
        self._rows: dict[Any, dict[str, Any]] = self._initial(rows)
        self._tokens: dict[Any, int] = {}
        #: committed inbox markers: (inbox table, key) -> fingerprint
        self._markers: dict[tuple[str, str], str | None] = {}
        #: committed fences: (fence table, resource) -> newest token
        self._fences: dict[tuple[str, str], int] = {}

    # -- without points (checks, setup) ------------------------------------------------
    def get(self, key: Any) -> dict[str, Any] | None:
        """The committed row (a copy), or ``None``; no point."""
        row = self._rows.get(key)
        return copy.deepcopy(row) if row is not None else None

    def rows(self) -> dict[Any, dict[str, Any]]:
        """Every committed row (copies); no point."""
        return copy.deepcopy(self._rows)

    def _note_read(self, key: Any) -> dict[str, Any] | None:
        row = self._rows.get(key)
        self._read[(self._who(), key)] = row[self.version_column] if row is not None else None
        return dict(row) if row is not None else None

    def _apply(
        self,
        who: str,
        changes: list[tuple[Any, dict[str, Any], int | None, int | None, bool]],
        markers: Mapping[tuple[str, str], str | None] | None = None,
        fences: Mapping[tuple[str, str], int] | None = None,
    ) -> list[int]:
        """Apply (key, values, expected version or None, token, insert), the inbox
        ``markers`` and the ``fences`` of a transaction atomically. A marker or a fence
        another transaction committed first fails the commit (first committer wins): a
        :class:`~jobfence.ConflictError` for a key applied meanwhile, so that the re-run
        unit's ``claim_in`` finds it, a :class:`~jobfence.StaleToken` for a newer token."""
        ver = self.version_column
        for key, _values, expected, token, _insert in changes:
            row = self._rows.get(key)
            if expected is not None and (row is None or row[ver] != expected):
                raise self._stale(key, expected, row)
            if self.fenced and token is not None and token < self._tokens.get(key, token):
                raise StaleToken(f"{self.name}:{key}", token, self._tokens[key])
        for name in markers or ():
            if name in self._markers:
                raise ConflictError(
                    f"inbox key {name[1]!r} ({name[0]}) was applied by a transaction that "
                    "committed first: re-run the unit (its claim_in then returns False)"
                )
        for name, token in (fences or {}).items():
            newest = self._fences.get(name, token)
            if newest > token:
                raise StaleToken(name[1], token, newest)
        self._markers.update(markers or {})
        self._fences.update(fences or {})
        versions = []
        for key, values, _expected, token, _insert in changes:
            row = self._rows.get(key)
            over = row[ver] if row is not None else None
            new = (over or 0) + 1
            if row is None:
                row = self._rows[key] = {}
            row.update(copy.deepcopy(values))
            row[ver] = new
            self._record(who, key, values, over, new, token)
            if token is not None:
                self._tokens[key] = max(token, self._tokens.get(key, token))
            versions.append(new)
        return versions

    async def read(self, key: Any) -> dict[str, Any] | None:
        """The row as committed now (a copy), or ``None``; point ``db.read``."""
        # _point inlined: a read is the commonest point of a scenario (one coroutine less)
        lean = self._lean
        if lean is not None and not _BLOCKING.get():
            # the driven task being stepped, no fault to look up: decided now, and when it
            # goes on, nothing to await (no info dict, no gate, no look-up of the task)
            task = self.sim._stepping  # type: ignore[attr-defined]  # lean_point's task
            gate = lean("db.read")
            if gate is not None:
                if gate is not self._passed:
                    await gate
                row = self._rows.get(key)
                self._read[(task.name, key)] = row[self.version_column] if row is not None else None
                return dict(row) if row is not None else None
        if _BLOCKING.get():
            fault = blocking_point(self.sim, "db.read", {"table": self.name, "key": key})
        else:
            gate = self.sim.on_point("db.read", {"table": self.name, "key": key})
            fault = None if gate is None else await gate
        if fault is not None:
            raise InjectedFault(fault)
        return self._note_read(key)

    async def _alone(
        self, key: Any, values: dict[str, Any], expected: int | None, token: int | None
    ) -> int:
        (new,) = self._apply(self._who(), [(key, values, expected, token, False)])
        return new

    async def _fence(self, resource: str, token: int, table: str) -> int:
        name = (table, resource)
        newest = self._fences.get(name, token)
        if newest <= token:
            self._fences[name] = token
        return max(newest, token)

    async def _claim_in(
        self, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        name = (table, key)
        if name in self._markers:
            return False, self._markers[name]
        self._markers[name] = fingerprint
        return True, None

    async def _outbox_add(self, table: str, row: Mapping[str, Any]) -> None:
        self.outbox_store(table).add([row])  # no transaction: committed at once

    def outbox_store(self, table: str = "jobfence_outbox") -> MemoryOutboxStore:
        """The ``memory://`` outbox store of the outbox table ``table`` in this table's
        database: the schedule's own store, the one ``sim.outbox(table=...)`` relays from."""
        from .._core.url import parse_url
        from ..backends.memory.outbox import get_outbox_store

        return get_outbox_store(parse_url(f"memory://{self.sim.namespace}"), table)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SimTransaction]:
        """A transaction: its writes are applied together at ``db.commit`` when the block
        ends, or not at all if it raises."""
        tx = SimTransaction(self)
        try:
            yield tx
            await tx.commit()
        finally:
            tx._ended = True


class SimTransaction(_Base):
    """The verbs of :class:`SimTable` inside one transaction (reads see its own writes)."""

    table: SimTable

    def __init__(self, table: SimTable) -> None:
        self.table = table
        self._changes: list[tuple[Any, dict[str, Any], int | None, int | None, bool]] = []
        #: the inbox markers and fences this transaction made, applied at its commit
        self._markers: dict[tuple[str, str], str | None] = {}
        self._fences: dict[tuple[str, str], int] = {}
        #: the outbox rows it added, by outbox table, visible to the relays at its commit
        self._outbox: dict[str, list[Mapping[str, Any]]] = {}
        #: its ``async with`` block is over
        self._ended = False

    def _in_transaction(self) -> bool:
        return not self._ended

    async def read(self, key: Any) -> dict[str, Any] | None:
        table = self.table
        fault = await table._point("db.read", key)
        if fault is not None:
            raise InjectedFault(fault)
        row = table._note_read(key)
        for k, values, _e, _t, _i in self._changes:
            if k == key:
                row = {**(row or {}), **copy.deepcopy(values)}
        return row

    async def write(self, key: Any, *, token: int | None = None, **values: Any) -> int:
        table = self.table
        _check_values(values, table.version_column)
        fault = await table._point("db.write", key)
        if fault is not None:
            raise InjectedFault(fault)
        self._changes.append((key, dict(values), None, token, False))
        row = table._rows.get(key)
        return (row[table.version_column] if row is not None else 0) + 1

    async def update(
        self, key: Any, version: int, *, token: int | None = None, **values: Any
    ) -> int:
        table = self.table
        _check_values(values, table.version_column)
        fault = await table._point("db.write", key)
        if fault is not None:
            raise InjectedFault(fault)
        row = table._rows.get(key)
        current = row[table.version_column] if row is not None else None
        if current != version:
            raise table._stale(key, version, row)
        self._changes.append((key, dict(values), version, token, False))
        return version + 1

    async def commit(self) -> None:
        """Apply the writes (point ``db.commit``); a ``commit_unknown`` fault applies them
        and raises."""
        table = self.table
        fault = await table._point("db.commit", None)
        if fault is not None and fault.kind != "commit_unknown":
            raise InjectedFault(fault)
        changes, self._changes = self._changes, []
        markers, self._markers = self._markers, {}
        fences, self._fences = self._fences, {}
        outbox, self._outbox = self._outbox, {}
        if changes or markers or fences:
            table._apply(table._who(), changes, markers, fences)
        for name, rows in outbox.items():  # with the writes, in the same step: atomic
            table.outbox_store(name).add(rows)
        if fault is not None:
            raise InjectedFault(fault)

    async def _fence(self, resource: str, token: int, table: str) -> int:
        name = (table, resource)
        newest = max(self.table._fences.get(name, token), self._fences.get(name, token))
        if newest <= token:
            self._fences[name] = token
        return newest

    async def _claim_in(
        self, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        name = (table, key)
        for seen in (self._markers, self.table._markers):
            if name in seen:
                return False, seen[name]
        self._markers[name] = fingerprint
        return True, None

    async def _outbox_add(self, table: str, row: Mapping[str, Any]) -> None:
        self._outbox.setdefault(table, []).append(dict(row))


# -- the blocking views ------------------------------------------------------------------
class _BlockingTransaction:
    """What the sync ``fence``, ``versioned_update``, ``Inbox.claim_in`` and ``Outbox.add``
    see of a blocking view (the ``Transaction`` of ``jobfence._core.transaction``)."""

    __slots__ = ("_tx",)
    blocking = True

    def __init__(self, of: _Base) -> None:
        self._tx = _Transaction(of)

    @property
    def dialect(self) -> str:
        return self._tx.dialect

    @property
    def in_transaction(self) -> bool:
        return self._tx.in_transaction

    def versioned_update(
        self,
        table: str,
        key: dict[str, Any],
        version: int,
        values: dict[str, Any],
        version_column: str,
    ) -> int:
        return drive(self._tx.versioned_update(table, key, version, values, version_column))

    def fence(self, resource: str, token: int, table: str) -> int:
        return drive(self._tx.fence(resource, token, table))

    def claim_in(
        self, table: str, key: str, fingerprint: str | None, retention: float
    ) -> tuple[bool, str | None]:
        return drive(self._tx.claim_in(table, key, fingerprint, retention))

    def outbox_add(self, table: str, row: Mapping[str, Any]) -> None:
        drive(self._tx.outbox_add(table, row))


class _View(Generic[B]):
    """The blocking verbs over a table or a transaction."""

    __slots__ = ("_of",)

    def __init__(self, of: B) -> None:
        self._of = of

    def read(self, key: Any) -> dict[str, Any] | None:
        """The row (a copy) or ``None``; point ``db.read``."""
        return drive(self._of.read(key))

    def write(self, key: Any, *, token: int | None = None, **values: Any) -> int:
        """Set ``values`` on the row; the new version; point ``db.write``."""
        return drive(self._of.write(key, token=token, **values))

    def update(self, key: Any, version: int, *, token: int | None = None, **values: Any) -> int:
        """Set ``values`` only if the row is still at ``version`` (else
        :class:`~jobfence.StaleVersion`); the new version; point ``db.write``."""
        return drive(self._of.update(key, version, token=token, **values))

    def __jobfence_transaction__(self) -> _BlockingTransaction:
        return _BlockingTransaction(self._of)


class SyncTable(_View["_Table"]):
    """The blocking view of a simulated table (``db.sync``; ``of`` is the table), for thread
    tasks: the verbs of :class:`SimTable` / :class:`~jobfence.testing.table_real.RealTable`
    without ``await``, with the same points, faults and history. ``jobfence.fence``,
    ``jobfence.versioned_update``, ``Inbox.claim_in`` and ``Outbox.add`` accept it (each call
    committed at once) and its transactions."""

    __slots__ = ()

    @property
    def table(self) -> _Table:
        """The table this is a view of."""
        return self._of

    @property
    def name(self) -> str:
        """The table's name (what ``versioned_update`` is given as its table)."""
        return self._of.name

    def get(self, key: Any) -> dict[str, Any] | None:
        """The committed row, or ``None``; no point (for checks)."""
        return self._of.get(key)

    def rows(self) -> dict[Any, dict[str, Any]]:
        """Every committed row; no point (for checks)."""
        return self._of.rows()

    @contextmanager
    def transaction(self) -> Iterator[SyncTransaction]:
        """A transaction (a ``with`` block): its writes commit at ``db.commit`` when the
        block ends, or roll back if it raises."""
        block = self._of.transaction()
        tx = drive(block.__aenter__())
        try:
            yield SyncTransaction(tx)
        except BaseException:
            if not drive(block.__aexit__(*sys.exc_info())):
                raise
        else:
            drive(block.__aexit__(None, None, None))

    def __repr__(self) -> str:
        return f"{self._of!r}.sync"


class SyncTransaction(_View["_Base"]):
    """The blocking verbs of one transaction of a :class:`SyncTable` (``of`` is the
    transaction of the table's ``transaction()`` block; reads see its own writes)."""

    __slots__ = ()
