"""A simulated table whose rows live in a real database: ``sim.table(name, rows, url=...)``.

``url`` is ``sqlite:///path/to/file.db`` (``sqlite:////absolute/path.db``) or
``postgresql://user@host:port/db`` (also ``postgres://``). The table offers the verbs, the
points, the history and the faults of the in-memory :class:`~jobfence.testing.SimTable`;
only the rows are elsewhere. Every statement still runs right after its point, so the
scheduler orders the statements of the tasks, and the answer is awaited before any other
task goes on: as long as no statement waits for a lock another task holds, a schedule is as
deterministic as in memory and replays the same.

What the database holds, per schedule: a table created from ``rows`` when ``sim.table``
is called and dropped when the schedule ends (``close()``), in a schema of its own on
PostgreSQL (``jfsim_<hex>.<name>``) or under a name of its own in the SQLite file
(``<name>_jfsim_<hex>``, the file switched to WAL): :attr:`RealTable.sql_name`. Its
columns are ``id`` (the key as JSON text, so ``1`` and ``"1"`` stay apart), ``version``,
``token`` (the highest fencing token written) and ``data`` (the other columns as JSON).

Each task has a connection of its own (opened at its first statement, with one more for
each transaction it holds open at once), so a transaction is that task's alone; a write
outside a transaction is a transaction of its own (the row read, checked and written
under the database's lock, ``SELECT ... FOR UPDATE`` / ``BEGIN IMMEDIATE``). The
connections of a crashed process are closed at the next statement, so the database rolls
back what it left open, as it would when a process dies.

``get()`` and ``rows()`` query the committed rows on a connection of the table's own.

The blocking view, ``table.sync``, for thread tasks, runs the same statements on blocking
connections of the thread task's own (``sqlite3``, psycopg's ``Connection``). A thread's
statement that waits for a lock a parked task holds gives way after ``sim.block_timeout``
as an async one does (:func:`~jobfence.testing.table.blocking_io`).

``fence_async``, ``versioned_update_async`` and ``claim_in`` on the table or one of its
transactions run their statement there, on the task's connection: a fence and an inbox
marker are rows of the table whose ``id`` starts with ``#`` (no key's JSON text does), left
out of ``rows()``, upserted as jobfence's own statements do (``INSERT ... ON CONFLICT``), so
they lock, wait, commit and roll back as those would in that database.

Where it differs from memory, it is the database's behaviour: a transaction's statements
take effect in the database at once (PostgreSQL locks the rows it wrote until it ends; a
SQLite transaction reads a snapshot and its first write takes the file's write lock: after
a read, if another connection holds that lock or committed since, the write fails at once
with ``database is locked``, a conflict ``retry_unit`` retries), and its reads see its own
writes with their new version.

Determinism holds as long as no statement waits for a lock another task holds, which is
the case of optimistic updates (``versioned_update`` with the version read, no
transaction held open across points). A statement that does wait (for a row or the SQLite
write lock held by a parked task) does not answer: after ``sim.block_timeout`` real
seconds the simulation stops waiting for it (:meth:`Simulation.stalled_io`) and lets
another task go, or moves virtual time on to the next timer if none can; its answer is
taken whenever it comes, so the rest of such a schedule depends on real timing (and so
does one with a statement slower than ``block_timeout`` for any other reason). A statement
gives up a lock wait after :data:`LOCK_WAIT` real seconds (PostgreSQL ``lock_timeout``,
the SQLite busy timeout), so the wait for a holder that never goes on ends too.

Both drivers run on the simulation's loop unchanged: aiosqlite answers from its threads
through ``call_soon_threadsafe`` and psycopg waits on the loop's selector; psycopg bounds a
connect by the real clock (virtual time only paces its polling), so a virtual clock
running ahead never times it out. PostgreSQL sessions run with ``synchronous_commit=off``
(the rows live as long as the schedule), SQLite connections with ``synchronous=OFF``.
"""

from __future__ import annotations

import importlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from .._core.sqlconn import check_ident
from .._core.url import mask_url
from ..backends import parse_backend_url, registered, sql_dialect
from ..errors import ConfigurationError, StaleToken
from ._base import _Statement
from .faults import InjectedFault
from .table import _Base, _check_values, _Table, blocking, blocking_io

if TYPE_CHECKING:
    from ._base import SimView, TaskView

__all__ = ["LOCK_WAIT", "RealTable", "RealTransaction"]

#: seconds a statement waits for a lock another connection holds before the database
#: gives up (PostgreSQL ``lock_timeout``, SQLite busy timeout)
LOCK_WAIT = 10.0
#: seconds to open a connection (PostgreSQL ``connect_timeout`` unless the URL sets one)
CONNECT_TIMEOUT = 10

_URLS = "'sqlite:///path/to/file.db' or 'postgresql://user@host:port/db'"
T = TypeVar("T")


class _Conn:
    """A task's connection (of ``driver``, a blocking one for the blocking view):
    ``open_tx`` while a transaction of the task uses it, ``running`` while a round trip is
    in flight on it, for the statement ``io``."""

    __slots__ = ("driver", "io", "open_tx", "raw", "running")

    def __init__(self, raw: Any, driver: _Driver) -> None:
        self.raw = raw
        self.driver = driver
        self.open_tx = False
        self.running = False
        self.io: _Statement | None = None


class _Driver:
    """What differs between the databases: connecting, running a statement, the SQL."""

    dialect = "sqlite"
    mark = "?"
    #: how a write outside a transaction begins (it reads the row under the write lock)
    begin_alone = "BEGIN"
    #: appended to the read of a row about to be written
    lock_row = ""
    #: its connections are the driver's blocking ones (for the blocking view, ``table.sync``)
    blocking = False

    def blocking_twin(self) -> _Driver:
        """The same database through the driver's blocking connections."""
        raise NotImplementedError

    def admin(self) -> Any:
        raise NotImplementedError

    def admin_run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        raise NotImplementedError

    def create(self, conn: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def drop(self, conn: Any, table: str) -> None:
        raise NotImplementedError

    def qualified(self, name: str, uid: str) -> str:
        """The table's name in the database, quoted (schema-qualified on PostgreSQL)."""
        raise NotImplementedError

    async def connect(self) -> Any:
        raise NotImplementedError

    def fileno(self, conn: Any) -> int | None:
        """The socket a statement on ``conn`` waits on in the loop's selector, if any."""
        return None

    async def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        raise NotImplementedError

    async def commit(self, conn: Any) -> None:
        await self.run(conn, "COMMIT")

    async def rollback(self, conn: Any) -> None:
        raise NotImplementedError

    async def interrupt(self, admin: Any, conn: Any) -> None:
        """Stop the statement running on ``conn`` (before closing it)."""

    async def close(self, conn: Any) -> None:
        raise NotImplementedError


def _import_driver(module: str, what: str, extra: str) -> Any:
    """The driver module, or a ConfigurationError naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - the extra brings it
        raise ConfigurationError(
            f"a simulated table in {what}: pip install 'jobfence[{extra}]'", argument="url"
        ) from None


class _SQLite(_Driver):
    begin_alone = "BEGIN IMMEDIATE"

    def __init__(self, path: str) -> None:
        self.aiosqlite = _import_driver("aiosqlite", "SQLite needs aiosqlite", "sqlite")
        self.path = path

    def admin(self) -> Any:
        import sqlite3

        conn = sqlite3.connect(self.path, timeout=LOCK_WAIT, isolation_level=None)
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=OFF")
        except BaseException:
            conn.close()
            raise
        return conn

    def admin_run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return list(conn.execute(sql, params).fetchall())

    def create(self, conn: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                f"CREATE TABLE {table} (id TEXT PRIMARY KEY, version INTEGER NOT NULL, "
                "token INTEGER, data TEXT NOT NULL)"
            )
            conn.executemany(
                f"INSERT INTO {table} (id, version, token, data) VALUES (?, ?, ?, ?)", rows
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def drop(self, conn: Any, table: str) -> None:
        conn.execute(f"DROP TABLE IF EXISTS {table}")

    def qualified(self, name: str, uid: str) -> str:
        return f'"{name}_jfsim_{uid}"'

    def blocking_twin(self) -> _Driver:
        return _SQLiteBlocking(self.path)

    async def connect(self) -> Any:
        pending = self.aiosqlite.connect(
            self.path, timeout=LOCK_WAIT, isolation_level=None, check_same_thread=False
        )
        # aiosqlite answers from a thread of its own, a non-daemon one: a connection left
        # open must not keep the interpreter from exiting
        thread = getattr(pending, "_thread", None)
        if isinstance(thread, threading.Thread) and not thread.is_alive():
            thread.daemon = True
        conn = await pending
        try:
            await conn.execute_fetchall("PRAGMA synchronous=OFF")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return list(await conn.execute_fetchall(sql, params))

    async def rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")

    async def interrupt(self, admin: Any, conn: Any) -> None:
        await conn.interrupt()  # from this thread: the statement fails with "interrupted"

    async def close(self, conn: Any) -> None:
        await conn.close()
        # aiosqlite's worker thread answers the close, then exits: wait for that (a moment),
        # so that no thread of a finished schedule is still running when explore returns
        thread = getattr(conn, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)


class _SQLiteBlocking(_SQLite):
    """SQLite through ``sqlite3`` for the blocking view: its "coroutines" never suspend."""

    blocking = True

    def __init__(self, path: str) -> None:  # no aiosqlite needed
        self.path = path

    async def connect(self) -> Any:
        import sqlite3

        conn = sqlite3.connect(
            self.path, timeout=LOCK_WAIT, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA synchronous=OFF")
        return conn

    async def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return list(conn.execute(sql, params).fetchall())

    async def rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    async def interrupt(self, admin: Any, conn: Any) -> None:
        conn.interrupt()

    async def close(self, conn: Any) -> None:
        conn.close()


class _Postgres(_Driver):
    dialect = "postgresql"
    mark = "%s"
    lock_row = " FOR UPDATE"

    def __init__(self, url: str, params: Mapping[str, str]) -> None:
        self.psycopg = _import_driver("psycopg", "PostgreSQL needs psycopg 3", "postgres")
        self.url = url
        # commits need not wait for the disk: the rows live as long as the schedule
        session = f"-c lock_timeout={int(LOCK_WAIT * 1000)} -c synchronous_commit=off"
        self.kwargs: dict[str, Any] = {
            "autocommit": True,
            "options": f"{params.get('options', '')} {session}".strip(),
        }
        if "connect_timeout" not in params:
            self.kwargs["connect_timeout"] = CONNECT_TIMEOUT

    def admin(self) -> Any:
        return self.psycopg.connect(self.url, **self.kwargs)

    def admin_run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else []

    def create(self, conn: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        schema = table.split(".")[0]
        with conn.transaction():
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(
                f"CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL, "
                "token bigint, data text NOT NULL)"
            )
            with conn.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO {table} (id, version, token, data) VALUES (%s, %s, %s, %s)",
                    rows,
                )

    def drop(self, conn: Any, table: str) -> None:
        conn.execute(f"DROP SCHEMA IF EXISTS {table.split('.')[0]} CASCADE")

    def qualified(self, name: str, uid: str) -> str:
        return f'"jfsim_{uid}"."{name}"'

    def blocking_twin(self) -> _Driver:
        twin = _PostgresBlocking.__new__(_PostgresBlocking)
        twin.psycopg, twin.url, twin.kwargs = self.psycopg, self.url, self.kwargs
        return twin

    async def connect(self) -> Any:
        return await self.psycopg.AsyncConnection.connect(self.url, **self.kwargs)

    def fileno(self, conn: Any) -> int | None:
        try:
            return int(conn.fileno())
        except Exception:  # closed
            return None

    async def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cursor = await conn.execute(sql, params)
        rows: list[Any] = await cursor.fetchall() if cursor.description is not None else []
        return rows

    async def commit(self, conn: Any) -> None:
        cursor = await conn.execute("COMMIT")
        if cursor.statusmessage != "COMMIT":  # a failed transaction ends in ROLLBACK
            raise self.psycopg.errors.InFailedSqlTransaction(
                "the transaction had failed: COMMIT rolled it back"
            )

    async def rollback(self, conn: Any) -> None:
        if conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")

    async def interrupt(self, admin: Any, conn: Any) -> None:
        # a backend waiting for a lock would notice its client gone only once it got it
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))

    async def close(self, conn: Any) -> None:
        await conn.close()


class _PostgresBlocking(_Postgres):
    """PostgreSQL through psycopg's blocking ``Connection`` for the blocking view."""

    blocking = True

    async def connect(self) -> Any:
        return self.psycopg.connect(self.url, **self.kwargs)

    def fileno(self, conn: Any) -> int | None:
        return None  # not waited for on the loop: the thread blocks

    async def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else []

    async def commit(self, conn: Any) -> None:
        cursor = conn.execute("COMMIT")
        if cursor.statusmessage != "COMMIT":
            raise self.psycopg.errors.InFailedSqlTransaction(
                "the transaction had failed: COMMIT rolled it back"
            )

    async def rollback(self, conn: Any) -> None:
        if conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")

    async def close(self, conn: Any) -> None:
        conn.close()


def _driver(url: object) -> tuple[_Driver, str]:
    """The driver for ``url`` and the URL to show; ConfigurationError(argument="url")."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"url must be {_URLS}; got {url!r}", argument="url")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    info = registered().get(scheme)
    if info is None or info.name not in ("sqlite", "postgres"):
        raise ConfigurationError(
            f"url must be {_URLS} (a real database for the simulated table); got {mask_url(url)}",
            argument="url",
        )
    parsed = parse_backend_url(url, argument="url")
    assert info.dialect is not None  # both are SQL backends
    if sql_dialect(info.dialect).in_process:
        from ..backends.sqlite.common import sqlite_path

        return _SQLite(sqlite_path(parsed)), parsed.masked
    return _Postgres(url, parsed.options), parsed.masked


class RealTable(_Table):
    """A simulated table in a real database (see the module docs): the verbs, points and
    checks of :class:`~jobfence.testing.SimTable`. :attr:`sql_name` is the table's name
    in the database, quoted (for a look with a connection of your own while the schedule
    runs)."""

    def __init__(
        self,
        sim: SimView,
        name: str,
        rows: Mapping[Any, Mapping[str, Any]],
        fenced: bool,
        url: str,
    ) -> None:
        super().__init__(sim, name, fenced)
        check_ident(name, "name", qualified=False)
        self._keys: dict[tuple[type, Any], str] = {}
        ver = self.version_column
        initial = []
        for key, row in self._initial(rows).items():
            version = row.pop(ver)
            if isinstance(version, bool) or not isinstance(version, int):
                raise ConfigurationError(
                    f"the {ver!r} of row {key!r} must be an int, got {version!r}",
                    argument="rows",
                )
            initial.append((self._key(key), version, None, self._dump(row, "rows")))
        self._driver, self.url = _driver(url)
        #: the table's name in the database, quoted, as a statement of your own names it
        self.sql_name = self._driver.qualified(name, uuid.uuid4().hex[:12])
        m = self._driver.mark
        t = self.sql_name
        self._select = f"SELECT version, token, data FROM {t} WHERE id = {m}"
        self._select_lock = self._select + self._driver.lock_row
        self._insert = f"INSERT INTO {t} (id, version, token, data) VALUES ({m}, {m}, {m}, {m})"
        self._update = f"UPDATE {t} SET version = {m}, token = {m}, data = {m} WHERE id = {m}"
        # an inbox marker: inserted by the first transaction to apply the key (a concurrent
        # one waits for it on the key, as claim_in's INSERT does)
        self._mark = (
            f"INSERT INTO {t} (id, version, token, data) VALUES ({m}, 1, NULL, {m}) "
            "ON CONFLICT (id) DO NOTHING RETURNING version"
        )
        # a fence: the token recorded unless a newer one is (fence.sql's upsert)
        self._fence_sql = (
            f"INSERT INTO {t} AS cur (id, version, token, data) VALUES ({m}, 1, {m}, '{{}}') "
            "ON CONFLICT (id) DO UPDATE SET token = excluded.token "
            "WHERE cur.token <= excluded.token RETURNING token"
        )
        self.dialect = self._driver.dialect
        self._conns: dict[TaskView | None, list[_Conn]] = {}
        self._blocking_driver: _Driver | None = None
        self._closed = False
        self._admin = self._driver.admin()
        try:
            self._driver.create(self._admin, self.sql_name, initial)
        except BaseException:
            self._admin.close()
            raise

    def __repr__(self) -> str:
        return f"RealTable({self.name!r}, {self.sql_name!r} at {self.url})"

    # -- encoding ------------------------------------------------------------------------
    def _key(self, key: Any) -> str:
        """The key as JSON text; only keys that come back the same are allowed."""
        try:
            return self._keys[(type(key), key)]
        except KeyError:
            pass
        except TypeError:
            raise ConfigurationError(
                f"a key must be hashable, got {key!r}", argument="key"
            ) from None
        try:
            text = json.dumps(key)
            back = json.loads(text)
        except (TypeError, ValueError):
            back = text = None
        if text is None or type(back) is not type(key) or back != key:
            raise ConfigurationError(
                "a key of a table in a real database is stored as JSON text: it must be a "
                f"str, int, float, bool or None, got {key!r}",
                argument="key",
            )
        self._keys[(type(key), key)] = text
        return text

    def _dump(self, data: dict[str, Any], argument: str) -> str:
        try:
            return json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"the columns of a table in a real database are stored as JSON: {exc}",
                argument=argument,
            ) from None

    def _row(self, found: list[Any]) -> dict[str, Any] | None:
        if not found:
            return None
        version, _token, data = found[0]
        row: dict[str, Any] = json.loads(data)
        row[self.version_column] = version
        return row

    # -- without points (checks, setup) --------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError(
                f"the table {self.sql_name} was dropped when its schedule ended: read it "
                "inside the scenario",
                argument="table",
            )

    def get(self, key: Any) -> dict[str, Any] | None:
        """The row as the database holds it committed (a query of its own), or ``None``;
        no point."""
        self._check_open()
        return self._row(self._driver.admin_run(self._admin, self._select, (self._key(key),)))

    def rows(self) -> dict[Any, dict[str, Any]]:
        """Every committed row, in the order of their keys' JSON text; no point."""
        self._check_open()
        out = {}
        for text, version, data in self._driver.admin_run(
            self._admin,
            f"SELECT id, version, data FROM {self.sql_name} "
            "WHERE substr(id, 1, 1) <> '#' ORDER BY id",
        ):
            row = json.loads(data)
            row[self.version_column] = version
            out[json.loads(text)] = row
        return out

    # -- connections -----------------------------------------------------------------------
    def _io(self) -> AbstractContextManager[_Statement]:
        """The block of one statement: ``sim.real_io()`` on the loop; in the blocking view a
        statement blocks its thread, which the loop waits for anyway."""
        if blocking():
            return blocking_io(self.sim)
        return self.sim.real_io()

    async def _connection(self, task: TaskView | None, io: _Statement) -> _Conn:
        """A connection of ``task`` no transaction of it holds (opened if needed), for the
        statement ``io`` (``sim.real_io()``): a blocking one in the blocking view."""
        flavour = blocking()
        conns = self._conns
        for owner in [t for t in conns if t is not None and t.process.crashed]:
            # the process died: so did its connections (those of the other flavour wait for
            # a statement of that flavour, which can close them)
            for conn in [c for c in conns[owner] if c.driver.blocking or not flavour]:
                await self._discard(conn, owner)
            if not conns[owner]:
                del conns[owner]
        mine = conns.get(task)
        if mine is None:
            mine = conns[task] = []
        for conn in mine:
            if conn.driver.blocking != flavour:
                continue
            if conn.running:  # a statement of it was cut off: its state is unknown
                await self._discard(conn, task)
                return await self._connection(task, io)
            if not conn.open_tx:
                self._serve(conn, io)
                return conn
        if flavour:
            if self._blocking_driver is None:
                self._blocking_driver = self._driver.blocking_twin()
            driver = self._blocking_driver
        else:
            driver = self._driver
        conn = _Conn(await driver.connect(), driver)
        mine.append(conn)
        self._serve(conn, io)
        return conn

    def _serve(self, conn: _Conn, io: _Statement) -> None:
        """``conn`` runs the statement ``io`` (whose socket it is, for the loop)."""
        conn.io = io
        io.fd = conn.driver.fileno(conn.raw)

    def _answered(self, conn: _Conn) -> None:
        conn.running = False
        if conn.io is not None and conn.io.stalled:
            self.sim.answered(conn.io)

    async def _run(self, conn: _Conn, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Run one statement on ``conn``; ``conn.running`` stays set if it is cut off."""
        conn.running = True
        try:
            rows = await conn.driver.run(conn.raw, sql, params)
        except Exception:  # the database answered with an error
            self._answered(conn)
            raise
        self._answered(conn)
        return rows

    async def _commit(self, conn: _Conn) -> None:
        conn.running = True
        try:
            await conn.driver.commit(conn.raw)
        except Exception:
            self._answered(conn)
            raise
        self._answered(conn)

    async def _discard(self, conn: _Conn, task: TaskView | None) -> None:
        """Close ``conn`` (whatever state it is in) and forget it."""
        mine = self._conns.get(task)
        if mine is not None and conn in mine:
            mine.remove(conn)
        try:
            if conn.running:
                await conn.driver.interrupt(self._admin, conn.raw)
            await conn.driver.close(conn.raw)
        except Exception:  # closing what is broken already
            pass

    async def _finish(self, conn: _Conn, task: TaskView | None) -> None:
        """Roll back whatever ``conn`` has open; a connection that cannot is closed (the
        database rolls back then)."""
        conn.open_tx = False
        if not conn.running:
            conn.running = True
            try:
                await conn.driver.rollback(conn.raw)
                conn.running = False
                return
            except Exception:
                pass
        await self._discard(conn, task)

    async def close(self) -> None:
        """Close every connection and drop the table (its schema on PostgreSQL); the
        simulation calls it when the schedule ends."""
        if self._closed:
            return
        self._closed = True
        conns, self._conns = self._conns, {}
        try:
            with self.sim.real_io():
                for mine in conns.values():
                    for conn in mine:
                        await self._discard(conn, None)
            self._driver.drop(self._admin, self.sql_name)
        finally:
            self._admin.close()

    # -- the statements ------------------------------------------------------------------
    def _seen(self, who: str, key: Any, found: list[Any]) -> dict[str, Any] | None:
        """``who`` read ``found`` of the row ``key``: noted (for the history), returned."""
        self._read[(who, key)] = found[0][0] if found else None
        return self._row(found)

    async def _change(
        self,
        conn: _Conn,
        key: Any,
        values: dict[str, Any],
        expected: int | None,
        token: int | None,
    ) -> tuple[int | None, int]:
        """In an open transaction of ``conn``: read the row for writing, check ``expected``
        and ``token``, write; (the version it had, the new one)."""
        text = self._key(key)
        found = await self._run(conn, self._select_lock, (text,))
        if found:
            over, top, data = found[0]
            row = json.loads(data)
        else:
            over = top = None
            row = {}
        if expected is not None and over != expected:
            raise self._stale(key, expected, self._row(found))
        if self.fenced and token is not None and top is not None and token < top:
            raise StaleToken(f"{self.name}:{key}", token, top)
        row.update(values)
        new = (over or 0) + 1
        if token is not None:
            top = token if top is None else max(top, token)
        if found:
            await self._run(conn, self._update, (new, top, self._dump(row, "values"), text))
        else:
            await self._run(conn, self._insert, (text, new, top, self._dump(row, "values")))
        return over, new

    async def _alone(
        self, key: Any, values: dict[str, Any], expected: int | None, token: int | None
    ) -> int:
        """A write outside a transaction: a transaction of its own, recorded once committed."""
        task = self.sim.current()
        with self._io() as io:
            conn = await self._connection(task, io)
            await self._run(conn, conn.driver.begin_alone)
            try:
                over, new = await self._change(conn, key, values, expected, token)
                await self._commit(conn)
            except BaseException:
                await self._finish(conn, task)
                raise
        self._record(task.name if task is not None else "main", key, values, over, new, token)
        return new

    # -- fences and inbox markers -----------------------------------------------------------
    async def _fence_on(self, conn: _Conn, resource: str, token: int, table: str) -> int:
        """In an open transaction of ``conn``: ``fence_async``'s upsert; the newest token."""
        name = json.dumps(["fence", table, resource])
        if await self._run(conn, self._fence_sql, (f"#{name}", token)):
            return token
        found = await self._run(conn, self._select, (f"#{name}",))
        return int(found[0][1]) if found and found[0][1] is not None else token

    async def _claim_on(
        self, conn: _Conn, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        """In an open transaction of ``conn``: ``claim_in``'s marker; (first, stored)."""
        name = f"#{json.dumps(['inbox', table, key])}"
        if await self._run(conn, self._mark, (name, json.dumps({"fingerprint": fingerprint}))):
            return True, None
        found = await self._run(conn, self._select, (name,))
        stored = json.loads(found[0][2]).get("fingerprint") if found else None
        return False, stored

    async def _statement_alone(self, work: Callable[[_Conn], Awaitable[T]]) -> T:
        """``work`` in a transaction of its own, committed (as a write outside one is)."""
        task = self.sim.current()
        with self._io() as io:
            conn = await self._connection(task, io)
            await self._run(conn, conn.driver.begin_alone)
            try:
                result = await work(conn)
                await self._commit(conn)
            except BaseException:
                await self._finish(conn, task)
                raise
        return result

    async def _fence(self, resource: str, token: int, table: str) -> int:
        return await self._statement_alone(lambda c: self._fence_on(c, resource, token, table))

    async def _claim_in(
        self, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        return await self._statement_alone(lambda c: self._claim_on(c, table, key, fingerprint))

    async def read(self, key: Any) -> dict[str, Any] | None:
        """The row as committed now, or ``None``; point ``db.read``."""
        fault = await self._point("db.read", key)
        if fault is not None:
            raise InjectedFault(fault)
        task = self.sim.current()
        with self._io() as io:
            conn = await self._connection(task, io)
            found = await self._run(conn, self._select, (self._key(key),))
        return self._seen(task.name if task is not None else "main", key, found)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[RealTransaction]:
        """A transaction on a connection of the task's own: it begins with its first
        statement and commits at ``db.commit`` when the block ends, or rolls back if the
        block raises."""
        tx = RealTransaction(self, self.sim.current())
        try:
            yield tx
            await tx.commit()
        finally:
            await tx._end()


class RealTransaction(_Base):
    """The verbs of :class:`RealTable` inside one database transaction."""

    table: RealTable

    def __init__(self, table: RealTable, task: TaskView | None) -> None:
        self.table = table
        self._task = task
        self._who = task.name if task is not None else "main"
        self._conn: _Conn | None = None
        self._open = False
        #: the writes done, recorded in the history once committed
        self._writes: list[tuple[Any, dict[str, Any], int | None, int, int | None]] = []
        #: the version each row written had before this transaction wrote it
        self._before: dict[Any, int | None] = {}
        #: its ``async with`` block is over
        self._ended = False

    def _in_transaction(self) -> bool:
        return not self._ended

    async def _begin(self, io: _Statement) -> _Conn:
        """The transaction's connection, the transaction begun, for the statement ``io``."""
        table = self.table
        conn = self._conn
        if conn is None:
            conn = self._conn = await table._connection(self._task, io)
            conn.open_tx = True
        else:
            table._serve(conn, io)
        if not self._open:
            await table._run(conn, "BEGIN")
            self._open = True
        return conn

    async def read(self, key: Any) -> dict[str, Any] | None:
        table = self.table
        fault = await table._point("db.read", key)
        if fault is not None:
            raise InjectedFault(fault)
        with table._io() as io:
            conn = await self._begin(io)
            found = await table._run(conn, table._select, (table._key(key),))
        row = table._seen(self._who, key, found)
        if key in self._before:  # of a row it wrote, it has read the version before that
            table._read[(self._who, key)] = self._before[key]
        return row

    async def _write(
        self, key: Any, values: dict[str, Any], expected: int | None, token: int | None
    ) -> int:
        table = self.table
        _check_values(values, table.version_column)
        fault = await table._point("db.write", key)
        if fault is not None:
            raise InjectedFault(fault)
        with table._io() as io:
            conn = await self._begin(io)
            over, new = await table._change(conn, key, values, expected, token)
        self._before.setdefault(key, over)
        self._writes.append((key, dict(values), over, new, token))
        return new

    async def write(self, key: Any, *, token: int | None = None, **values: Any) -> int:
        return await self._write(key, values, None, token)

    async def _fence(self, resource: str, token: int, table: str) -> int:
        with self.table._io() as io:
            conn = await self._begin(io)
            return await self.table._fence_on(conn, resource, token, table)

    async def _claim_in(
        self, table: str, key: str, fingerprint: str | None
    ) -> tuple[bool, str | None]:
        with self.table._io() as io:
            conn = await self._begin(io)
            return await self.table._claim_on(conn, table, key, fingerprint)

    async def update(
        self, key: Any, version: int, *, token: int | None = None, **values: Any
    ) -> int:
        return await self._write(key, values, version, token)

    async def commit(self) -> None:
        """Commit (point ``db.commit``); a ``commit_unknown`` fault commits and raises."""
        table = self.table
        fault = await table._point("db.commit", None)
        if fault is not None and fault.kind != "commit_unknown":
            raise InjectedFault(fault)
        writes, self._writes = self._writes, []
        self._before = {}
        if self._open and self._conn is not None:
            conn = self._conn
            with table._io() as io:
                table._serve(conn, io)
                await table._commit(conn)
            self._open = False
        for key, values, over, new, token in writes:
            table._record(self._who, key, values, over, new, token)
        if fault is not None:
            raise InjectedFault(fault)

    async def _end(self) -> None:
        """The block is over: roll back what is left open, give the connection back."""
        self._ended = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._open = False
        table = self.table
        with table._io() as io:
            table._serve(conn, io)
            await table._finish(conn, self._task)
