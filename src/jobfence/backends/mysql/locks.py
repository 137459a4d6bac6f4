# Generated from backends/mysql/locks_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``mysql://`` / ``mariadb://`` -- the MySQL 8 / MariaDB 10.6+ lock backend: on aiomysql in
``locks_async.py``, on PyMySQL in ``locks.py`` (generated from it).

``mysql://user:password@host:3306/dbname`` (``mariadb://`` is the same backend). Leases are rows
of the InnoDB table ``{namespace}_locks``, created on first use; the SQL, with its parameter
contract, lives in ``sql/locks.sql``.

* **One round trip per verb.** ``acquire`` is one ``INSERT ... ON DUPLICATE KEY UPDATE`` that
  takes the row only if it is free and returns the new fencing token through
  ``LAST_INSERT_ID(expr)`` in the OK packet; ``release``/``extend`` are one owner-checked
  ``UPDATE``; ``renew`` extends every due lease with one ``UPDATE`` (a second statement only
  when some lease turned out lost).
* **One clock**: expiry is the server's ``UTC_TIMESTAMP(6)``; ttls are sent as microseconds.
* **Tokens** are ``GREATEST(previous + 1, server time in microseconds)`` in a row that is never
  deleted, so they strictly increase per name, also after the table is lost.
* **Waiting** polls (MySQL cannot notify other connections): a short growing backoff, and the
  waiter that is "next in line" (recorded in the row, see the SQL) polls fastest and is the only
  one allowed to take a freed lease for a moment, so a releasing worker cannot re-take the lock
  ahead of one that was waiting. A release in the same process wakes a waiter at once.
* **Connections**: one autocommit connection per backend, opened lazily (the constructor needs
  no event loop, and :meth:`prepare` opens it before ``Locks`` starts a lease's clock) and
  guarded by a lock, shared by the callers and the renewer. A connection that was lost (killed,
  server restarted) is replaced, and the statement retried once (every statement here is safe
  to repeat); if the server stays unreachable, the error propagates and the renewer marks
  leases lost when their ttl runs out.
* **Deadlines**: opening a connection (TCP, the server's greeting, the login) waits at most
  ``connect_timeout``, every statement at most ``timeout`` for its reply; a statement past its
  deadline has its connection closed (its protocol state is unknown) and is not retried.

URL / keyword options: ``mode`` (``lease``, the default and only mode), ``connect_timeout`` and
``timeout`` (seconds, default 5: connecting, and one statement), ``poll_initial`` /
``poll_max`` (the wait backoff, default 0.002 / 0.05 s), ``next_in_line`` (how long a waiter
stays next in line without polling again, default 0.25 s; 0 disables), ``unix_socket``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..._core import compat, forks
from ..._core.clock import get_clock
from ..._core.options import request_timed_out
from ..._core.source import Source, open_source
from ..._core.url import BackendURL
from ..._core.validate import check_schema_version
from ...errors import ConfigurationError
from ..base import LockBackend, LockHolder, RenewItem
from .common import (
    CAPABILITIES,
    SCHEMA_VERSION,
    SESSION_SETUP,
    WAITERS,
    MySQLOptions,
    check_namespace,
    held_statement,
    is_deadlock,
    is_disconnect,
    is_timeout,
    load_queries,
    micros,
    name_hash,
    renew_statement,
    use_request_timeouts,
)
from .connect import connect
from .dialect import DIALECT

pass

__all__ = ["MySQLLockBackend"]

#: how often a statement that InnoDB chose as a deadlock victim is retried
_DEADLOCK_RETRIES = 5
#: forget wait bookkeeping of owners that vanished without cancel_wait beyond this many
_MAX_WAITING = 10_000

Result = tuple[int, int, list[tuple[Any, ...]]]


def _text(value: Any) -> str:
    """A text column as PyMySQL returns it (bytes under a binary collation) as ``str``."""
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


class MySQLLockBackend(LockBackend):
    """Leases in a MySQL/MariaDB table, shared by every client of the same database."""

    kind = "mysql"
    capabilities = CAPABILITIES

    def __init__(
        self,
        url: BackendURL,
        *,
        namespace: str = "jobfence",
        client: Any = None,
        **options: Any,
    ) -> None:
        self.namespace = check_namespace(namespace)
        #: a caller's SQLAlchemy engine: the one connection is taken from its pool, and
        #: closed (invalidated) when done, since jobfence changed its session settings
        self._source: Source | None = None
        #: connections of the source given up without a round trip, to hand back
        self._dropped: list[Any] = []
        if client is not None:
            if "connect_timeout" in options:
                raise ConfigurationError(
                    "option 'connect_timeout' configures the connection the mysql lock "
                    "backend opens; with a client passed in, configure its connections",
                    argument="connect_timeout",
                )
            self._source = open_source(client, DIALECT, "mysql lock backend")
        self.options = MySQLOptions.parse(url, options)
        self.url = url.masked
        self.queries = load_queries(namespace)
        self._key_prefix = (self.options.server_key, namespace)
        self._conn: Any = None
        self._mutex = compat.Lock()
        self._closed = False
        self._schema_ready = False
        # wait bookkeeping, per (name, owner): the current backoff; who is next in line
        self._backoff: dict[tuple[str, str], float] = {}
        self._next: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} namespace={self.namespace!r}>"

    # -- connection ----------------------------------------------------------------------
    def _open_own(self) -> Any:
        """A new connection of jobfence's own (not yet set up)."""
        options = self.options
        conn = connect(
            options.connect_kwargs(),
            options.database,
            connect_timeout=options.connect_timeout,
            timeout=options.timeout,
        )
        return conn

    def _connect(self) -> Any:
        options = self.options
        if self._source is not None:
            conn = self._source.get()
            use_request_timeouts(conn, options.timeout)
        else:
            conn = self._open_own()
        try:
            with conn.cursor() as cur:
                for statement in SESSION_SETUP:
                    cur.execute(statement)
                if not self._schema_ready:
                    self._create_schema(cur)
                    self._schema_ready = True
        except BaseException:
            _close_quietly(conn)
            if self._source is not None:
                self._dropped.append(conn)  # handed back (to be replaced) by the next _open
            raise
        return conn

    def _create_schema(self, cur: Any) -> None:
        q = self.queries
        cur.execute(q["create_schema_table"])
        cur.execute(q["create_locks_table"])
        cur.execute(q["record_schema_version"], {"version": SCHEMA_VERSION})
        cur.execute(q["schema_version"])
        row = cur.fetchone()
        check_schema_version(
            row, SCHEMA_VERSION, backend=self.kind, tables=f"lock tables {self.namespace}_*"
        )

    def _drop(self) -> None:
        """Forget the connection after an error (closing it without a round trip)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)
            if self._source is not None:
                self._dropped.append(conn)  # handed back (to be replaced) by the next _open

    def _run(self, sql: str, args: Any) -> Result:
        """Execute one statement: (affected rows, insert id, rows). Call with ``_mutex`` held."""
        conn = self._conn
        with conn.cursor() as cur:
            cur.execute(sql, args)
            rows = cur.fetchall()
            return int(cur.rowcount), int(cur.lastrowid or 0), list(rows or ())

    def _open(self) -> bool:
        """Make sure the shared connection is open (call with ``_mutex`` held); return
        whether it was opened just now."""
        if self._closed:
            raise ConfigurationError("this mysql lock backend is closed", argument="self")
        if self._conn is not None:
            return False
        self._hand_back_dropped()
        self._conn = self._connect()
        return True

    def _execute(self, sql: str, args: Any) -> Result:
        """Run one statement on the shared connection, reconnecting once if it was lost.

        Every statement of this backend may be repeated safely (a repeated acquire by the same
        owner finds its own lease and returns the same token), so a statement that failed
        because the connection died is sent again on a new connection -- once. A deadlock
        victim (rolled back by InnoDB) is retried a few times.
        """
        with self._mutex:
            reconnected = False
            deadlocks = 0
            while True:
                fresh = self._open()
                try:
                    return self._run(sql, args)
                except Exception as exc:
                    if is_timeout(exc):  # no reply in time: not retried
                        self._drop()  # a statement cut off mid-way leaves the protocol unusable
                        raise request_timed_out(self.options.timeout) from exc
                    if is_deadlock(exc) and deadlocks < _DEADLOCK_RETRIES:
                        deadlocks += 1
                        continue
                    if not is_disconnect(exc):
                        raise
                    self._drop()
                    if fresh or reconnected:
                        raise
                    reconnected = True
                except BaseException:  # interrupted mid-statement: the connection is unusable
                    self._drop()
                    raise

    def install(self) -> None:
        """Create the tables now (they are also created on first use)."""
        with self._mutex:
            self._open()

    def prepare(self, *, waiting: bool = False) -> None:
        """Open the connection (and create the tables) now, before a lease's clock starts."""
        self.install()

    def holder(self, name: str) -> LockHolder | None:
        _, _, rows = self._execute(self.queries["holder"], {"hash": name_hash(name)})
        if not rows:
            return None
        owner, token, left_us = rows[0]
        owner = owner.decode("utf-8") if isinstance(owner, (bytes, bytearray)) else str(owner)
        return LockHolder(owner, int(token), max(0, int(left_us)) / 1_000_000)

    def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        _, _, rows = self._execute(self.queries["holders"], {"prefix": prefix, "limit": limit})
        found = []
        for name, owner, token, left_us in rows:
            found.append(
                (
                    _text(name),
                    LockHolder(_text(owner), int(token), max(0, int(left_us)) / 1_000_000),
                )
            )
        return found

    def _key(self, name: str) -> tuple[str, str, str]:
        return (*self._key_prefix, name)

    def _forget(self, name: str, owner: str) -> None:
        self._backoff.pop((name, owner), None)
        self._next.discard((name, owner))

    # -- the verbs -----------------------------------------------------------------------
    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        window = None
        if wait is not None and self.options.next_in_line > 0:
            window = micros(min(self.options.next_in_line, max(wait, 0.001)))
            # the statement may make this owner next in line on the server and be cut off
            # before its answer arrives (cancelled, timed out): until the answer says
            # otherwise, cancel_wait must clear the turn, or it would hold the name free for
            # nobody until its window ends
            self._next.add((name, owner))
        _, token, _ = self._execute(
            self.queries["acquire"],
            {
                "hash": name_hash(name),
                "name": name,
                "owner": owner,
                "ttl_us": micros(ttl),
                "window_us": window,
            },
        )
        if token > 1:
            self._forget(name, owner)
            return token
        if wait is not None:
            if len(self._backoff) > _MAX_WAITING:
                self._backoff.clear()
                self._next.clear()
            if token == 1:
                self._next.add((name, owner))
            else:
                self._next.discard((name, owner))
        return None

    def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Sleep until the next poll (or a release in this process); always returns ``None``.

        MySQL cannot notify other connections, so waiters poll: the waiter that is next in
        line every ``poll_initial`` seconds, the others with a backoff growing from
        ``poll_initial`` to ``poll_max``. The caller then tries :meth:`acquire` again.
        """
        options = self.options
        key = (name, owner)
        if key in self._next:
            delay = options.poll_initial
        else:
            delay = self._backoff.get(key, options.poll_initial * 2)
            self._backoff[key] = min(delay * 2, options.poll_max)
        delay = min(delay * random.uniform(0.5, 1.0), max(0.0, timeout))
        if delay <= 0:
            return None
        event = compat.Event()
        wake = event.set
        wait_key = self._key(name)
        ticket = WAITERS.add(wait_key, wake, owner)
        try:
            get_clock().wait(event, delay)
        finally:
            WAITERS.remove(wait_key, ticket)
        return None

    def cancel_wait(self, name: str, owner: str) -> int | None:
        """Stop being next in line (if ``owner`` was); nothing is ever handed over."""
        was_next = (name, owner) in self._next
        self._forget(name, owner)
        if was_next:
            self._execute(self.queries["cancel_wait"], {"hash": name_hash(name), "owner": owner})
        return None

    def _notify(self, name: str) -> None:
        WAITERS.notify(self._key(name), lambda owner: (name, owner) in self._next)

    def release(self, name: str, owner: str) -> bool:
        affected, _, _ = self._execute(
            self.queries["release"], {"hash": name_hash(name), "owner": owner}
        )
        if affected == 1:
            self._notify(name)
            return True
        return False

    def extend(self, name: str, owner: str, ttl: float) -> bool:
        return (self.renew([(name, owner, ttl)]))[0]

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every item with ONE statement; a second one only if some were not held."""
        if not items:
            return []
        keyed = [(name_hash(name), owner, ttl) for name, owner, ttl in items]
        if len(keyed) == 1:
            h, owner, ttl = keyed[0]
            sql: str = self.queries["extend"]
            args: Any = {"hash": h, "owner": owner, "ttl_us": micros(ttl)}
        else:
            sql, args = renew_statement(self.queries["renew"], keyed)
        affected, _, _ = self._execute(sql, args)
        if affected == len(keyed):
            return [True] * len(keyed)
        # some lease was not extended: ask which ones are still held (also covers the
        # harmless case of a new expiry equal to the old one, which counts as unchanged)
        sql, args = held_statement(self.queries["held"], sorted({h for h, _o, _t in keyed}))
        _, _, rows = self._execute(sql, args)
        live = {(str(h), str(owner)) for h, owner in rows}
        return [(h, owner) in live for h, owner, _t in keyed]

    def force_release(self, name: str) -> bool:
        """Free the lease on ``name`` whoever holds it (tests, operator tools)."""
        affected, _, _ = self._execute(self.queries["force_release"], {"hash": name_hash(name)})
        if affected == 1:
            self._notify(name)
            return True
        return False

    def _hand_back_dropped(self) -> None:
        """Give the caller's pool back the connections dropped after an error (closed)."""
        source = self._source
        while source is not None and self._dropped:
            source.discard(self._dropped.pop())

    def close(self) -> None:
        """Close the connection; idempotent. Leases still held are left to expire. One of a
        caller's engine goes back to it closed (jobfence changed its session settings)."""
        with self._mutex:
            self._closed = True
            self._hand_back_dropped()
            conn, self._conn = self._conn, None
            if conn is None:
                return
            if self._source is not None:
                self._source.discard(conn)
                return
            try:
                conn.close()
            except Exception:  # the server is gone already: nothing left to close
                _close_quietly(conn)

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connection and the wait
        bookkeeping inherited from the parent, without closing anything (see
        ``jobfence/_core/forks.py``)."""
        forks.keep(self._conn)
        self._conn = None
        self._mutex = compat.Lock()
        self._backoff = {}
        self._next = set()


def _close_quietly(conn: Any) -> None:
    """Close ``conn`` without a round trip; it may be broken or closed already."""
    try:
        conn.close()
    except Exception:
        pass
