"""Your own database connection in a schedule: ``sim.attach(conn)``.

``conn = sim.attach(conn)`` instruments a connection the scenario opened itself, for the
rest of the schedule, and returns it (the same object): every statement run on it --
by your code, by an ORM on top of it, by ``jobfence.fence``, ``versioned_update``,
``Inbox.claim_in`` or ``Outbox.add`` -- is a point, so the scheduler orders the
statements of the tasks and faults can hit them:

=====================================  ====================================================
``db.read``                            a ``SELECT`` (also ``WITH`` without a write,
                                       ``SHOW``, ``VALUES``, ``EXPLAIN``, ``PRAGMA``)
``db.write``                           any other statement but transaction control
                                       (``BEGIN``, ``ROLLBACK``, ``SAVEPOINT``... are
                                       no points)
``db.commit``                          ``COMMIT``, ``conn.commit()``, the end of a
                                       transaction block (psycopg ``transaction()``,
                                       SQLAlchemy ``begin()``, Django ``atomic()``)
=====================================  ====================================================

The info of each point is ``{"table": <the first table the statement names, unquoted,
without its schema>, "key": None}``, so a fault can target a table
(``faults.transient("db.write", target="orders")``). A ``transient`` fault raises
:class:`~jobfence.testing.InjectedFault` before the statement runs; ``commit_unknown`` at
``db.commit`` commits, then raises it.

Supported: psycopg ``Connection`` and ``AsyncConnection``, PyMySQL and aiomysql
connections, ``sqlite3`` and aiosqlite connections, SQLAlchemy ``Engine``, ``Connection``,
``AsyncEngine`` and ``AsyncConnection`` (sessions through their bind), and a Django
connection (``django.db.connection`` or ``connections[alias]``).

* A blocking connection is for thread tasks (a plain function given to ``sim.spawn``):
  at a point the thread waits until the scheduler lets it go on. Used from an async task
  it raises :class:`~jobfence.ConfigurationError`.
* An async connection's statements run inside ``sim.real_io()``: the scheduler waits for
  the answer before it lets another task go (unless the statement waits for a lock a
  parked task holds: then it gives way after ``sim.block_timeout``).
* The scenario's own statements (outside spawned tasks: setup and checks) are no points:
  they run as they would without the simulation.
* The connection a crashed process used last is closed at the crash (a ``sqlite3`` one,
  stopped inside its statement, is interrupted then and closed when the schedule ends), so
  the server rolls back what that process left open, as it does when a process dies. Use
  another connection for the scenario's own checks.
* When the schedule ends, the connection is as it was before ``attach`` (usable again;
  closed if its process crashed). ``attach`` on the ``sim`` of a schedule that is over
  raises :class:`~jobfence.ConfigurationError`.

How: psycopg, PyMySQL, aiomysql and aiosqlite connections get a subclass of their class
for the schedule (``type(conn)`` is a subclass, which every check of the driver's class
still accepts); a SQLAlchemy engine gets event listeners (``do_execute``...) and its
dialect's ``do_commit`` wrapped; a Django connection gets an ``execute_wrapper`` and its
``commit`` wrapped; a ``sqlite3`` connection gets a trace callback. ``sqlite3`` has no seam
to raise from: there a ``transient`` fault interrupts the statement before it runs (it
fails with ``sqlite3.OperationalError: interrupted``) and ``commit_unknown`` has no effect
(use aiosqlite, or SQLAlchemy over ``sqlite3``, for those).
"""

from __future__ import annotations

import re
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigurationError
from .faults import Fault, InjectedFault
from .table import blocking_io, blocking_point

if TYPE_CHECKING:
    from ._base import AttachView

__all__ = ["attach", "statement_point", "table_named"]

C = TypeVar("C")

_COMMENTS = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)+", re.S)
_READS = frozenset({"SELECT", "SHOW", "VALUES", "EXPLAIN", "PRAGMA", "DESCRIBE", "DESC", "TABLE"})
_CONTROL = frozenset({"BEGIN", "START", "ROLLBACK", "SAVEPOINT", "RELEASE", "ABORT"})
_COMMITS = frozenset({"COMMIT", "END"})
_WRITES_IN_WITH = re.compile(r"\b(?:INSERT|UPDATE|DELETE|MERGE)\b", re.I)
_NAME = r"(?:`[^`]+`|\"[^\"]+\"|\[[^\]]+\]|[\w$]+)"
_TABLE = re.compile(
    rf"\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+(?:ONLY\s+|IF\s+(?:NOT\s+)?EXISTS\s+)?"
    rf"((?:{_NAME}\s*\.\s*)*{_NAME})",
    re.I,
)
_KEYWORDS = frozenset({"SET", "SELECT", "ONLY", "LATERAL", "NOWAIT", "SKIP", "OF", "WHERE"})


def _text(sql: Any) -> str:
    if isinstance(sql, bytes):
        return sql.decode("utf-8", "replace")
    if isinstance(sql, str):
        return sql
    return str(sql)


def statement_point(sql: Any) -> str | None:
    """The point of a statement: ``db.read``, ``db.write``, ``db.commit``, or ``None`` for
    transaction control (``BEGIN``, ``ROLLBACK``, ``SAVEPOINT``...)."""
    # a parenthesised query, "(SELECT ...) UNION (SELECT ...)", reads as its first word
    text = _COMMENTS.sub(" ", _text(sql)).strip().lstrip("( \t\r\n")
    word = re.match(r"[A-Za-z]+", text)
    first = word.group(0).upper() if word else ""
    if first in _COMMITS:
        return "db.commit"
    if first in _CONTROL:
        return None
    if first == "SET" and re.match(r"SET\s+(?:SESSION\s+)?TRANSACTION\b", text, re.I):
        return None
    if first in _READS:
        return "db.read"
    if first == "WITH":
        return "db.write" if _WRITES_IN_WITH.search(text) else "db.read"
    return "db.write"


def table_named(sql: Any) -> str | None:
    """The first table ``sql`` names (after ``FROM``, ``INTO``, ``UPDATE``, ``JOIN`` or
    ``TABLE``), unquoted and without its schema; ``None`` if it names none."""
    for found in _TABLE.finditer(_COMMENTS.sub(" ", _text(sql))):
        # the last name of schema.table, a quoted one whole ("a.b" is one name)
        last: str = re.findall(_NAME, found.group(1))[-1]
        name = last.strip('`"[]')
        if name.upper() not in _KEYWORDS:
            return name
    return None


# -- what every attached connection shares ------------------------------------------------
class _Registry:
    """The attachments of one schedule: closed (restored) with the schedule's clients."""

    def __init__(self, sim: AttachView) -> None:
        self.sim = sim
        self.attached: list[_Attached] = []

    def reap(self, *, in_loop: bool, unfinished: frozenset[int] = frozenset()) -> None:
        """Close the connections whose last user's process crashed (before any other
        statement runs), or is among ``unfinished`` (ids of processes the schedule's end
        stopped mid-job); ``in_loop``: on the loop's thread, where async connections can be
        closed too."""
        for att in self.attached:
            for key, (conn, owner) in list(att.owners.items()):
                if owner.crashed or id(owner) in unfinished:
                    del att.owners[key]
                    try:
                        att.kill(conn, in_loop)
                    except Exception:  # closing what is broken already
                        pass

    def reap_crashed(self) -> None:
        """A process crashed (:meth:`Simulation.crash`, on the loop's thread): close its
        connections at once."""
        self.reap(in_loop=True)

    async def close(self) -> None:
        """The schedule ended: every connection as it was, but those whose last user's
        process crashed or was stopped mid-job, closed (on the loop's thread, the schedule's
        threads stopped), as a dead process's are: the server would keep their transactions
        open, rows locked, after ``explore`` returned."""
        # a task the schedule's end stopped mid-job (a check failed, a budget ran out) is
        # cancelled after this: its connection may hold a transaction it never ends
        tasks = getattr(self.sim, "tasks", ())
        stopped = frozenset(id(t.process) for t in tasks if not t.done)
        self.reap(in_loop=True, unfinished=stopped)
        for att in reversed(self.attached):
            att.restore()
        self.attached.clear()


_REGISTRIES: weakref.WeakKeyDictionary[Any, _Registry] = weakref.WeakKeyDictionary()


def _registry(sim: AttachView) -> _Registry:
    found = _REGISTRIES.get(sim)
    if found is None:
        found = _REGISTRIES[sim] = _Registry(sim)
        sim.clients.append(found)  # closed when the schedule ends
    return found


class _Attached:
    """One attached connection (or engine): its points, its owner, its undoing."""

    def __init__(self, registry: _Registry, conn: Any, undo: Callable[[], None]) -> None:
        self.registry = registry
        self.sim = registry.sim
        self.conn = conn
        self.undo = undo
        self.live = True
        #: its statements are points (False: only real I/O, for a driver connection under
        #: an attached SQLAlchemy engine, whose points the engine makes)
        self.points = True
        #: per connection (an engine has several; by id): the connection and the process
        #: of the task that ran the last statement on it
        self.owners: dict[int, tuple[Any, Any]] = {}

    def kill(self, conn: Any, in_loop: bool) -> None:
        """Close ``conn`` at once: its owner crashed. ``in_loop``: on the loop's thread."""
        _terminate(conn, in_loop)

    def restore(self) -> None:
        if self.live:
            self.live = False
            self.undo()

    # -- the points ------------------------------------------------------------------
    def _arrive(self, in_loop: bool, conn: Any) -> None:
        self.registry.reap(in_loop=in_loop)
        task = self.sim.current()
        if task is not None and task.process is not self.sim.main:
            conn = self.conn if conn is None else conn
            self.owners[id(conn)] = (conn, task.process)

    def point(self, sql: Any, point: str | None = None, conn: Any = None) -> Fault | None:
        """A statement of a blocking connection (``conn``, for an engine) is about to run:
        its point (a thread task waits there); the ``commit_unknown`` fault to raise once
        it ran, if any."""
        if not self.live:
            return None
        self._arrive(False, conn)
        point = point or statement_point(sql)
        if point is None:
            return None
        return blocking_point(self.sim, point, {"table": table_named(sql), "key": None})

    async def apoint(self, sql: Any, point: str | None = None, conn: Any = None) -> Fault | None:
        """The same for a statement of an async connection."""
        if not self.live:
            return None
        self._arrive(True, conn)
        point = point or statement_point(sql)
        if point is None:
            return None
        gate = self.sim.on_point(point, {"table": table_named(sql), "key": None})
        if gate is None:
            return None
        fault: Fault | None = await gate
        return fault

    def blocking(self) -> Any:
        """The block of a blocking statement: gives way if it waits too long (a thread
        task's statement waiting for a lock a parked task holds)."""
        if not self.live or self.sim.stopping:
            return _NoIO()
        return blocking_io(self.sim)

    @contextmanager
    def io(self, conn: Any = None) -> Iterator[None]:
        """The block of an async statement on ``conn`` (default: the attached connection):
        ``sim.real_io()`` while attached, with the socket the driver waits on, so that the
        loop stops counting that socket as I/O to wait for once the statement stalls (it
        waits for a lock a parked or paused task holds); else every turn of the loop would
        wait ``block_timeout`` real seconds for it, and a pause of 300 virtual seconds would
        take minutes of wall time."""
        if not self.live or self.sim.stopping:
            yield
            return
        with self.sim.real_io() as statement:
            statement.fd = _fileno(self.driver_connection(conn))
            yield

    def driver_connection(self, conn: Any) -> Any:
        """The driver's connection a statement on ``conn`` runs on."""
        return self.conn if conn is None else conn


class _NoIO:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _terminate(raw: Any, in_loop: bool) -> None:
    """Close a driver connection at once, without waiting for anything (the server then
    rolls back what it had open)."""
    module = type(raw).__module__.split(".")[0]
    if module == "psycopg":
        raw.pgconn.finish()
    elif module == "aiosqlite":
        if in_loop:
            raw.stop()  # its thread closes the sqlite3 connection
    elif module == "asyncpg":
        raw.terminate()
    elif isinstance(raw, sqlite3.Connection):
        try:
            raw.close()
        except sqlite3.ProgrammingError:  # made in another thread: interrupt it at least
            raw.interrupt()
    else:  # PyMySQL, aiomysql (a sync close), anything with close()
        raw.close()


def _fileno(raw: Any) -> int | None:
    """The socket an async driver's connection waits on in the loop's selector, if any
    (aiosqlite answers from a thread: none)."""
    module = type(raw).__module__.split(".")[0]
    try:
        if module == "psycopg":
            return int(raw.pgconn.socket)
        if module == "aiomysql":
            return int(raw._writer.transport.get_extra_info("socket").fileno())
        if module == "asyncpg":
            return int(raw._transport.get_extra_info("socket").fileno())
    except Exception:  # closed, or not connected yet
        return None
    return None


def _of(obj: Any) -> _Attached | None:
    att: _Attached | None = getattr(obj, "_jobfence_attached", None)
    return att if att is not None and att.live else None


def _swap(conn: Any, cls: type) -> Callable[[], None]:
    """Make ``conn`` an instance of ``cls`` (a subclass of its class) until undone."""
    old = type(conn)
    conn.__class__ = cls

    def undo() -> None:
        if type(conn) is cls:
            conn.__class__ = old
        conn.__dict__.pop("_jobfence_attached", None)

    return undo


_SUBCLASSES: dict[tuple[type, str], type] = {}


def _subclass(base: type, name: str, body: dict[str, Any]) -> type:
    """A subclass of ``base`` with the methods of ``body`` (made once per class), named and
    placed like ``base`` so that whatever inspects the class name still recognises it."""
    key = (base, name)
    found = _SUBCLASSES.get(key)
    if found is None:
        namespace = dict(body)
        namespace["__module__"] = base.__module__
        namespace["__qualname__"] = base.__qualname__
        found = _SUBCLASSES[key] = type(base.__name__, (base,), namespace)
    return found


# -- psycopg --------------------------------------------------------------------------------
def _psycopg(registry: _Registry, conn: Any, is_async: bool) -> _Attached:
    base = type(conn)
    old_factory = conn.cursor_factory
    if is_async:
        cursor_cls = _subclass(old_factory, "psycopg-acursor", _PSYCOPG_ACURSOR)
        conn_cls = _subclass(base, "psycopg-aconn", _PSYCOPG_ACONN)
    else:
        cursor_cls = _subclass(old_factory, "psycopg-cursor", _PSYCOPG_CURSOR)
        conn_cls = _subclass(base, "psycopg-conn", _PSYCOPG_CONN)
    undo_class = _swap(conn, conn_cls)
    conn.cursor_factory = cursor_cls

    def undo() -> None:
        conn.cursor_factory = old_factory
        undo_class()

    att = _Attached(registry, conn, undo)
    conn._jobfence_attached = att
    return att


def _query_text(cursor: Any, query: Any) -> str:
    if isinstance(query, (str, bytes)):
        return _text(query)
    try:
        return str(query.as_string(cursor.connection))
    except Exception:
        return ""


def _pg_execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
    att = _of(self.connection)
    if att is None:
        return super(type(self), self).execute(query, params, **kwargs)
    fault = att.point(_query_text(self, query))
    with att.blocking():
        result = super(type(self), self).execute(query, params, **kwargs)
    if fault is not None:
        raise InjectedFault(fault)
    return result


def _pg_executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
    att = _of(self.connection)
    if att is None:
        return super(type(self), self).executemany(query, params_seq, **kwargs)
    fault = att.point(_query_text(self, query))
    with att.blocking():
        result = super(type(self), self).executemany(query, params_seq, **kwargs)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _pg_aexecute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
    att = _of(self.connection)
    if att is None:
        return await super(type(self), self).execute(query, params, **kwargs)
    fault = await att.apoint(_query_text(self, query))
    with att.io():
        result = await super(type(self), self).execute(query, params, **kwargs)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _pg_aexecutemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
    att = _of(self.connection)
    if att is None:
        return await super(type(self), self).executemany(query, params_seq, **kwargs)
    fault = await att.apoint(_query_text(self, query))
    with att.io():
        result = await super(type(self), self).executemany(query, params_seq, **kwargs)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _pg_afetch(self: Any, name: str, *args: Any) -> Any:
    att = _of(self.connection)
    method = getattr(super(type(self), self), name)
    if att is None:
        return await method(*args)
    with att.io():
        return await method(*args)


async def _pg_afetchone(self: Any) -> Any:
    return await _pg_afetch(self, "fetchone")


async def _pg_afetchmany(self: Any, size: int = 0) -> Any:
    return await _pg_afetch(self, "fetchmany", size)


async def _pg_afetchall(self: Any) -> Any:
    return await _pg_afetch(self, "fetchall")


_PSYCOPG_CURSOR = {"execute": _pg_execute, "executemany": _pg_executemany}
_PSYCOPG_ACURSOR = {
    "execute": _pg_aexecute,
    "executemany": _pg_aexecutemany,
    "fetchone": _pg_afetchone,
    "fetchmany": _pg_afetchmany,
    "fetchall": _pg_afetchall,
}


def _commit(self: Any) -> None:
    """``commit()`` of an attached blocking driver connection (psycopg, PyMySQL / aiomysql): a
    ``db.commit`` point, then the commit; a ``commit_unknown`` fault raises after it."""
    att = _of(self)
    if att is None:
        super(type(self), self).commit()
        return
    fault = att.point("COMMIT")
    with att.blocking():
        super(type(self), self).commit()
    if fault is not None:
        raise InjectedFault(fault)


@contextmanager
def _pg_transaction(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
    att = _of(self)
    if att is None:
        with super(type(self), self).transaction(*args, **kwargs) as tx:
            yield tx
        return
    block = super(type(self), self).transaction(*args, **kwargs)
    with att.blocking():
        tx = block.__enter__()
    fault = None
    try:
        yield tx
        if tx._outer_transaction and not tx.force_rollback:
            fault = att.point("COMMIT")  # a transient fault raises here: it rolls back
    except BaseException as exc:
        with att.blocking():
            if not block.__exit__(type(exc), exc, exc.__traceback__):
                raise
    else:
        with att.blocking():
            block.__exit__(None, None, None)
    if fault is not None:
        raise InjectedFault(fault)


async def _acommit(self: Any) -> None:
    """``commit()`` of an attached asyncio driver connection (psycopg, PyMySQL / aiomysql): a
    ``db.commit`` point, then the commit; a ``commit_unknown`` fault raises after it."""
    att = _of(self)
    if att is None:
        await super(type(self), self).commit()
        return
    fault = await att.apoint("COMMIT")
    with att.io():
        await super(type(self), self).commit()
    if fault is not None:
        raise InjectedFault(fault)


@asynccontextmanager
async def _pg_atransaction(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
    att = _of(self)
    block = super(type(self), self).transaction(*args, **kwargs)
    if att is None:
        async with block as tx:
            yield tx
        return
    with att.io():
        tx = await block.__aenter__()
    fault = None
    try:
        yield tx
        if tx._outer_transaction and not tx.force_rollback:
            fault = await att.apoint("COMMIT")
    except BaseException as exc:
        with att.io():
            if not await block.__aexit__(type(exc), exc, exc.__traceback__):
                raise
    else:
        with att.io():
            await block.__aexit__(None, None, None)
    if fault is not None:
        raise InjectedFault(fault)


_PSYCOPG_CONN = {"commit": _commit, "transaction": _pg_transaction}
_PSYCOPG_ACONN = {"commit": _acommit, "transaction": _pg_atransaction}


# -- PyMySQL and aiomysql --------------------------------------------------------------------
def _my_query(self: Any, sql: Any, unbuffered: bool = False) -> Any:
    att = _of(self)
    if att is None:
        return super(type(self), self).query(sql, unbuffered)
    fault = att.point(sql)
    with att.blocking():
        result = super(type(self), self).query(sql, unbuffered)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _amy_query(self: Any, sql: Any, unbuffered: bool = False) -> Any:
    att = _of(self)
    if att is None:
        return await super(type(self), self).query(sql, unbuffered)
    fault = await att.apoint(sql)
    with att.io():
        result = await super(type(self), self).query(sql, unbuffered)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _amy_plain(self: Any, name: str) -> Any:
    att = _of(self)
    method = getattr(super(type(self), self), name)
    if att is None:
        return await method()
    with att.io():
        return await method()


async def _amy_begin(self: Any) -> None:
    await _amy_plain(self, "begin")


async def _amy_rollback(self: Any) -> None:
    await _amy_plain(self, "rollback")


def _reading(conn: Any, on: bool) -> None:
    """Let aiomysql's socket be read (``on``) or not: an idle connection's socket stays out
    of the loop's selector, which counts every socket there as I/O to wait for."""
    writer = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is None or transport.is_closing():
        return
    if on:
        transport.resume_reading()
    else:
        transport.pause_reading()


async def _amy_read_packet(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _of(self) is None:
        return await super(type(self), self)._read_packet(*args, **kwargs)
    _reading(self, True)
    try:
        return await super(type(self), self)._read_packet(*args, **kwargs)
    finally:
        if _of(self) is not None:
            _reading(self, False)


_PYMYSQL = {"query": _my_query, "commit": _commit}
_AIOMYSQL = {
    "query": _amy_query,
    "commit": _acommit,
    "begin": _amy_begin,
    "rollback": _amy_rollback,
    "_read_packet": _amy_read_packet,
}


def _mysql(registry: _Registry, conn: Any, is_async: bool) -> _Attached:
    body, name = (_AIOMYSQL, "aiomysql") if is_async else (_PYMYSQL, "pymysql")
    undo_class = _swap(conn, _subclass(type(conn), name, body))
    if not is_async:
        undo = undo_class
    else:
        _reading(conn, False)

        def undo() -> None:
            undo_class()
            _reading(conn, True)

    att = _Attached(registry, conn, undo)
    conn._jobfence_attached = att
    return att


# -- aiosqlite -------------------------------------------------------------------------------
_AIOSQLITE_SQL = frozenset(
    {"execute", "executemany", "executescript", "_execute_insert", "_execute_fetchall"}
)


async def _aiosqlite_execute(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Every call aiosqlite's thread runs goes through here: a statement is a point, and
    each call (a fetch too) is real I/O the scheduler waits for."""
    att = _of(self)
    if att is None:
        return await super(type(self), self)._execute(fn, *args, **kwargs)
    name = getattr(fn, "__name__", "")
    fault = None
    if not att.points:
        pass
    elif name in _AIOSQLITE_SQL and args:
        fault = await att.apoint(args[0])
    elif name == "commit":
        fault = await att.apoint("COMMIT", "db.commit")
    with att.io():
        result = await super(type(self), self)._execute(fn, *args, **kwargs)
    if fault is not None:
        raise InjectedFault(fault)
    return result


async def _aiosqlite_connect(self: Any) -> Any:
    """Opening (``await sim.attach(aiosqlite.connect(path))``): real I/O too."""
    att = _of(self)
    if att is None:
        return await super(type(self), self)._connect()
    with att.io():
        return await super(type(self), self)._connect()


async def _aiosqlite_close(self: Any) -> None:
    """Closing waits for aiosqlite's thread to stop: real I/O too."""
    att = _of(self)
    if att is None:
        await super(type(self), self).close()
        return
    with att.io():
        await super(type(self), self).close()


def _aiosqlite(registry: _Registry, conn: Any) -> _Attached:
    body = {
        "_execute": _aiosqlite_execute,
        "_connect": _aiosqlite_connect,
        "close": _aiosqlite_close,
    }
    cls = _subclass(type(conn), "aiosqlite", body)
    att = _Attached(registry, conn, _swap(conn, cls))
    conn._jobfence_attached = att
    return att


# -- sqlite3 ---------------------------------------------------------------------------------
class _SqliteAttached(_Attached):
    """An attached ``sqlite3`` connection. Its points are taken inside sqlite3's trace
    callback, in the middle of the statement: a task stopped there (its process crashed)
    holds the connection until it unwinds, when the schedule ends. Closing the connection
    meanwhile would wait for the statement forever (from another thread) or free it under
    the statement (from the callback itself: a segmentation fault), so such a connection is
    only interrupted, and closed when the schedule ends, once no statement runs on it."""

    def __init__(self, registry: _Registry, conn: Any, undo: Callable[[], None]) -> None:
        super().__init__(registry, conn, undo)
        #: the threads inside the trace callback of this connection now
        self.inside: set[int] = set()
        #: its process crashed while a statement ran on it: close it at the schedule's end
        self.doomed = False

    def kill(self, conn: Any, in_loop: bool) -> None:
        if self.inside:
            self.doomed = True
            conn.interrupt()  # safe from any thread: the statement fails once it goes on
            return
        _terminate(conn, in_loop)

    def restore(self) -> None:
        live = self.live
        super().restore()
        if live and self.doomed and not self.inside:
            _terminate(self.conn, True)


def _sqlite3(registry: _Registry, conn: sqlite3.Connection) -> _Attached:
    def undo() -> None:
        try:
            conn.set_trace_callback(None)
        except sqlite3.ProgrammingError:  # closed
            pass

    att = _SqliteAttached(registry, conn, undo)

    def trace(sql: str) -> None:
        # runs as the statement starts; an exception raised here is dropped by sqlite3,
        # so a transient fault interrupts the statement instead
        me = threading.get_ident()
        att.inside.add(me)
        try:
            att.point(sql)
        except InjectedFault:
            conn.interrupt()
        except BaseException:  # a crashed task unwinding: do not let the statement run
            conn.interrupt()
        finally:
            att.inside.discard(me)

    conn.set_trace_callback(trace)
    return att


# -- SQLAlchemy ------------------------------------------------------------------------------
def _sqlalchemy(registry: _Registry, target: Any, kind: str) -> _Attached:
    from sqlalchemy import event

    if kind in ("sa-aengine", "sa-aconn"):
        sync = target.sync_engine if kind == "sa-aengine" else target.sync_connection
    else:
        sync = target
    if kind in ("sa-engine", "sa-aengine"):
        engine, only = sync, None
    else:
        engine, only = sync.engine, sync
    dialect = engine.dialect
    is_async = bool(getattr(dialect, "is_async", False))

    def mine(conn: Any) -> bool:
        return only is None or conn is only

    def run(conn: Any, sql: str, work: Callable[[], Any], point: str | None = None) -> Any:
        # a connection opened before the engine was attached never went through
        # engine_connect: its statements make it known, for do_commit to find it
        live_conns.add(conn)
        if is_async:
            from sqlalchemy.util import await_only

            fault = await_only(att.apoint(sql, point, conn))
            with att.io(conn):
                result = work()
        else:
            fault = att.point(sql, point, conn)
            with att.blocking():
                result = work()
        if fault is not None:
            raise InjectedFault(fault)
        return result

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        if not att.live or not mine(context.root_connection):
            return False
        run(context.root_connection, statement, lambda: cursor.execute(statement, parameters))
        return True

    def do_executemany(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        if not att.live or not mine(context.root_connection):
            return False
        run(
            context.root_connection,
            statement,
            lambda: cursor.executemany(statement, parameters),
        )
        return True

    def do_execute_no_params(cursor: Any, statement: str, context: Any) -> bool:
        if not att.live or not mine(context.root_connection):
            return False
        run(context.root_connection, statement, lambda: cursor.execute(statement))
        return True

    listeners: dict[str, Callable[..., Any]] = {
        "do_execute": do_execute,
        "do_executemany": do_executemany,
        "do_execute_no_params": do_execute_no_params,
    }
    original_commit = dialect.do_commit
    had_own = "do_commit" in vars(dialect)

    def do_commit(dbapi_connection: Any) -> None:
        conn = _root_of(dbapi_connection)
        if not att.live or conn is None or not mine(conn):
            original_commit(dbapi_connection)
            return
        run(conn, "COMMIT", lambda: original_commit(dbapi_connection), "db.commit")

    def _root_of(dbapi_connection: Any) -> Any:
        for conn in [only] if only is not None else list(live_conns):
            if conn is None or conn.closed or conn.invalidated:
                continue
            try:
                if conn.connection is dbapi_connection:
                    return conn
            except Exception:
                continue
        return None

    # the connections that ran a statement while attached, for do_commit to find its own
    live_conns: weakref.WeakSet[Any] = weakref.WeakSet()

    def engine_connect(conn: Any) -> None:
        live_conns.add(conn)

    def connect(dbapi_connection: Any, record: Any) -> None:
        # aiosqlite answers from its thread: every call of the driver's own connection
        # under the engine is real I/O to wait for (its points are the engine's)
        raw = getattr(dbapi_connection, "driver_connection", None)
        if att.live and _kind(raw) == "aiosqlite" and _of(raw) is None:
            inner = _aiosqlite(registry, raw)
            inner.points = False
            registry.attached.append(inner)

    if is_async:
        listeners["connect"] = connect
    for name, fn in listeners.items():
        event.listen(engine, name, fn)
    event.listen(engine, "engine_connect", engine_connect)
    dialect.do_commit = do_commit

    def undo() -> None:
        for name, fn in listeners.items():
            if event.contains(engine, name, fn):
                event.remove(engine, name, fn)
        if event.contains(engine, "engine_connect", engine_connect):
            event.remove(engine, "engine_connect", engine_connect)
        if had_own:
            dialect.do_commit = original_commit
        else:
            dialect.__dict__.pop("do_commit", None)

    att = _EngineAttached(registry, target, undo)
    att.engine, att.only = engine, only
    if only is not None:
        live_conns.add(only)
    return att


def _sa_engine(target: Any, kind: str) -> tuple[Any, Any]:
    """(the sync engine, the sync connection or ``None`` for a whole engine) of a SQLAlchemy
    target of ``kind``."""
    if kind in ("sa-aengine", "sa-aconn"):
        target = target.sync_engine if kind == "sa-aengine" else target.sync_connection
    if kind in ("sa-engine", "sa-aengine"):
        return target, None
    return target.engine, target


class _EngineAttached(_Attached):
    """An attached SQLAlchemy engine or connection: its owners are its connections."""

    #: the sync engine, and the one connection attached (``None``: the whole engine)
    engine: Any = None
    only: Any = None

    def driver_connection(self, conn: Any) -> Any:
        try:
            return conn.connection.driver_connection
        except Exception:  # closed or invalidated
            return None

    def kill(self, conn: Any, in_loop: bool) -> None:
        try:
            raw = conn.connection.driver_connection
        except Exception:  # closed or invalidated already
            return
        try:
            _terminate(raw, in_loop)
        finally:
            try:
                conn.invalidate()
            except Exception:  # async: it needs its greenlet; it finds out at its next use
                pass


# -- Django ----------------------------------------------------------------------------------
def _django(registry: _Registry, wrapper: Any) -> _Attached:

    def execute(run: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if not att.live:
            return run(sql, params, many, context)
        fault = att.point(sql)
        with att.blocking():
            result = run(sql, params, many, context)
        if fault is not None:
            raise InjectedFault(fault)
        return result

    original_commit = wrapper.commit

    def commit() -> None:
        if not att.live:
            original_commit()
            return
        fault = att.point("COMMIT")
        with att.blocking():
            original_commit()
        if fault is not None:
            raise InjectedFault(fault)

    wrapper.execute_wrappers.append(execute)
    wrapper.commit = commit

    def undo() -> None:
        if execute in wrapper.execute_wrappers:
            wrapper.execute_wrappers.remove(execute)
        wrapper.__dict__.pop("commit", None)
        wrapper.__dict__.pop("_jobfence_attached", None)

    att = _DjangoAttached(registry, wrapper, undo)
    wrapper._jobfence_attached = att
    return att


class _DjangoAttached(_Attached):
    def kill(self, conn: Any, in_loop: bool) -> None:
        raw = conn.connection  # the driver's connection of the Django wrapper
        if raw is not None:
            _terminate(raw, in_loop)


# -- the entry point -------------------------------------------------------------------------
def _kind(conn: object) -> str | None:
    if isinstance(conn, sqlite3.Connection):
        return "sqlite3"
    for cls in type(conn).__mro__:
        top = cls.__module__.split(".")[0]
        name = cls.__qualname__
        if top == "psycopg" and name in ("Connection", "AsyncConnection"):
            return "psycopg" if name == "Connection" else "psycopg-async"
        if top == "pymysql" and name == "Connection":
            return "pymysql"
        if top == "aiomysql" and name == "Connection":
            return "aiomysql"
        if top == "aiosqlite" and name == "Connection":
            return "aiosqlite"
        if top == "sqlalchemy":
            if name == "Engine":
                return "sa-engine"
            if name == "Connection":
                return "sa-conn"
            if name == "AsyncEngine":
                return "sa-aengine"
            if name == "AsyncConnection":
                return "sa-aconn"
        if cls.__module__ == "django.db.backends.base.base" and name == "BaseDatabaseWrapper":
            return "django"
        if cls.__module__ == "django.utils.connection" and name == "ConnectionProxy":
            return "django"
    return None


SUPPORTED = (
    "psycopg Connection / AsyncConnection, PyMySQL / aiomysql connections, sqlite3 / "
    "aiosqlite connections, a SQLAlchemy Engine / Connection / AsyncEngine / "
    "AsyncConnection, a Django connection"
)


def attach(sim: AttachView, conn: C) -> C:
    """Instrument ``conn`` for the rest of ``sim``'s schedule and return it (see the module
    docs). Attaching it again in the same schedule changes nothing."""
    if sim.stopping:
        raise ConfigurationError(
            "conn: this schedule is over (or ending): attach a connection while its scenario "
            "runs, with the sim the scenario received",
            argument="conn",
        )
    kind = _kind(conn)
    if kind is None:
        raise ConfigurationError(
            f"conn: cannot attach a {type(conn).__module__}.{type(conn).__qualname__}; "
            f"supported: {SUPPORTED}",
            argument="conn",
        )
    registry = _registry(sim)
    target: Any = conn
    if kind == "django" and type(conn).__name__ == "ConnectionProxy":
        target = conn._connections[conn._alias]  # type: ignore[attr-defined]  # this thread's
    if any(att.conn is target and att.live for att in registry.attached):
        return conn
    if getattr(target, "_jobfence_attached", None) is not None:
        raise ConfigurationError(
            "conn: this connection is attached to another schedule still running",
            argument="conn",
        )
    att: _Attached
    if kind in ("psycopg", "psycopg-async"):
        att = _psycopg(registry, conn, kind == "psycopg-async")
    elif kind in ("pymysql", "aiomysql"):
        att = _mysql(registry, conn, kind == "aiomysql")
    elif kind == "aiosqlite":
        att = _aiosqlite(registry, conn)
    elif kind == "sqlite3":
        att = _sqlite3(registry, conn)  # type: ignore[arg-type]
    elif kind == "django":
        att = _django(registry, target)
    else:
        engine, only = _sa_engine(conn, kind)
        for other in list(registry.attached):
            if (
                not isinstance(other, _EngineAttached)
                or not other.live
                or other.engine is not engine
            ):
                continue
            if other.only is None or other.only is only:
                return conn  # its statements are points already: once each
            if only is None:  # the whole engine now: its connection's attachment goes
                other.restore()
                registry.attached.remove(other)
        att = _sqlalchemy(registry, conn, kind)
    registry.attached.append(att)
    return conn
