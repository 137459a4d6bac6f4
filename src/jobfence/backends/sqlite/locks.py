# Generated from backends/sqlite/locks_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""``sqlite:///path`` -- the embedded lock backend: on aiosqlite in ``locks_async.py``, on
sqlite3 in ``locks.py`` (generated from it).

Leases are rows in a SQLite file, so every process on one host that opens the same file
shares the locks. ``sqlite:///relative.db`` is relative to the working directory,
``sqlite:////abs/path.db`` absolute (SQLAlchemy's convention). The SQL lives in
``sql/locks.sql``.

* Every operation is one short transaction: ``BEGIN IMMEDIATE`` where it reads before it
  writes, a single autocommit statement otherwise. The uncontended cycle is two statements:
  ``take`` grants a name that is free and that nobody waits for, first thing in the acquire's
  transaction (which stays one, so that an acquire cancelled while it waits for the write lock
  grants nothing), and ``release_alone`` releases one without queue entries as an autocommit
  statement (a release goes on when its caller is cancelled anyway); when either changes
  nothing, the full statements follow in the same call (``run_unless`` for the release).
  Each is written once, as a plain function over a sqlite3 connection, and run whole by
  ``run_on`` (``connect_async.py``): in ``AsyncLocks``, one hop to aiosqlite's thread per
  operation. The file runs in WAL mode with a busy
  timeout, so concurrent processes queue for the write lock instead of failing; ``database is
  locked`` after the timeout propagates (the lock core wraps it in ``BackendError``).
* Expiry is measured by one clock only: SQLite's ``julianday('now')`` on this host.
* Fencing tokens come from a per-name counter row that outlives the lease row, and every
  grant floors the token at the host clock in microseconds (``max(counter + 1, now)``), so
  tokens never repeat, even after the file was restored from an older copy or lost its last
  unsynced pages (``tokens_survive_data_loss``).
* Waiting: SQLite cannot notify other processes, so :meth:`wait` polls with a short growing
  backoff (0.5 ms doubling to 50 ms by default). A release in the *same* process wakes a waiter
  at once (a process-wide registry per file, namespace and name).
* Fairness: a FIFO queue (``{namespace}_lock_queue``). A waiting acquire joins it; a free lease
  goes to its head, never to a newcomer or to the process that just released, and a release
  hands the lease straight to the head (its own ttl), whose next poll (every
  ``poll_initial``) finds the lease its own. Other waiters poll with the backoff. Each waiter
  renews its entry at least every ``next_in_line / 2`` seconds; an entry not renewed for
  ``next_in_line`` (0.25 s by default) is dead and skipped (``next_in_line=0``: no queue, no
  fairness: a releasing process can re-take the lock at once).

URL / keyword options: ``busy_timeout`` (seconds, default 5), ``synchronous`` (``full``
default, ``normal`` trades durability on power loss for speed), ``poll_initial`` and
``poll_max`` (seconds, the wait backoff), ``next_in_line`` (seconds, default 0.25; 0 disables).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..._core import compat, forks
from ..._core.clock import get_clock
from ..._core.url import BackendURL
from ..._core.validate import check_schema_version
from ...errors import ConfigurationError
from ..base import LockBackend, LockHolder, RenewItem
from .common import (
    CAPABILITIES,
    QUEUE_CAPABILITIES,
    SCHEMA_VERSION,
    WAITERS,
    SQLiteOptions,
    check_namespace,
    load_queries,
    sqlite_path,
)
from .connect import (
    count_rows,
    fetch_all,
    open_wal,
    rollback_quietly,
    run_in_transaction,
    run_on,
    run_unless,
    write_gate,
)

__all__ = ["SQLiteLockBackend"]

log = logging.getLogger("jobfence.backends.sqlite")


class SQLiteLockBackend(LockBackend):
    """Leases in a SQLite file, shared by every process on this host that opens the file.

    The connection is opened lazily on first use (the constructor needs no event loop) and
    guarded by a lock, so one backend serves the caller threads/tasks and the renewer.
    """

    kind = "sqlite"

    def __init__(self, url: BackendURL, *, namespace: str = "jobfence", **options: Any) -> None:
        self.namespace = check_namespace(namespace)
        self.path = sqlite_path(url)
        self.options = SQLiteOptions(url, options)
        self.capabilities = QUEUE_CAPABILITIES if self.options.next_in_line > 0 else CAPABILITIES
        self.queries = load_queries(namespace)
        self._key_prefix = (os.path.realpath(self.path), namespace)
        self._conn: sqlite3.Connection | None = None
        #: the real path of the file: the key of its write gate
        self._real_path = os.path.realpath(self.path)
        self._closed = False
        #: (name, owner) of this backend's waiters that are in a queue
        self._queued: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r} namespace={self.namespace!r}>"

    # -- connection ----------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        """The open connection (call with the write gate held); opens it and the schema once."""
        if self._conn is not None:
            if self._conn.in_transaction:  # an interrupted operation left one open
                run_on(self._conn, rollback_quietly)
            return self._conn
        if self._closed:
            raise ConfigurationError("this sqlite lock backend is closed", argument="self")
        self._conn = open_wal(
            self.path, self.options.busy_timeout, self.options.synchronous, self._create
        )
        return self._conn

    def _create(self, raw: sqlite3.Connection) -> None:
        """Create the tables (idempotent) and check their schema version."""
        try:
            raw.executescript("BEGIN IMMEDIATE;\n" + self.queries["schema"] + ";\nCOMMIT;")
        except BaseException:
            rollback_quietly(raw)
            raise
        row = raw.execute(self.queries["schema_version"]).fetchone()
        check_schema_version(
            row,
            SCHEMA_VERSION,
            backend=self.kind,
            tables=f"lock tables {self.namespace}_* in {self.path!r}",
        )

    def install(self) -> None:
        """Create the tables now (they are also created on first use)."""
        with write_gate(self._real_path):
            self._connection()

    def _key(self, name: str) -> tuple[str, str, str]:
        return (*self._key_prefix, name)

    # -- the verbs -----------------------------------------------------------------------
    def acquire(
        self, name: str, owner: str, ttl: float, *, wait: float | None = None
    ) -> int | None:
        window = 0.0
        if wait is not None and self.options.next_in_line > 0:
            window = min(self.options.next_in_line, max(wait, 0.001))
        key = (name, owner)
        with write_gate(self._real_path):
            conn = self._connection()
            # not queued: no entry of ours to take out, so a free name nobody waits for is
            # taken by one statement (``take``) before the others are needed
            fresh = key not in self._queued
            if window:
                # before the call: a caller cancelled as its transaction commits may have
                # joined the queue, and its clean-up (cancel_wait) and close() must know to
                # take the entry out
                self._queued.add(key)
            token, queued = run_in_transaction(
                conn, self._acquire_in, name, owner, ttl, wait is not None, window, fresh
            )
        if token is not None:
            self._queued.discard(key)  # granted or handed to us: no longer queued
        elif queued:
            self._queued.add(key)
        return token

    def _acquire_in(
        self,
        raw: sqlite3.Connection,
        name: str,
        owner: str,
        ttl: float,
        waiting: bool,
        window: float,
        fresh: bool = False,
    ) -> tuple[int | None, bool]:
        """The statements of :meth:`acquire`, inside its transaction: (the token if ``owner``
        holds ``name`` now, whether it is in the wait queue). ``fresh``: ``owner`` has no queue
        entry, so ``take`` is tried first. A transaction still, not an autocommit statement:
        an acquire cancelled while it waits for the file's write lock must not grant."""
        q = self.queries
        key = {"name": name, "owner": owner}
        if fresh:
            taken = raw.execute(q["take"], {**key, "ttl": ttl}).fetchall()
            if taken:
                return int(taken[0][0]), False
        row = raw.execute(q["peek"], key).fetchone()
        if row is not None and row[0]:  # a live lease of ours (handed to us): its token
            return int(row[1]), False
        # (owner, ttl) of the first live waiter
        head = raw.execute(q["queue_head"], {"name": name}).fetchone()
        other_heads = head is not None and head[0] != owner
        if row is None and not other_heads:  # free, and nobody waits before us
            token_row = raw.execute(q["next_token"], {"name": name}).fetchone()
            assert token_row is not None
            token = int(token_row[0])
            raw.execute(q["grant"], {**key, "token": token, "ttl": ttl})
            if waiting:
                raw.execute(q["dequeue"], key)
            return token, False
        if not window:
            return None, False
        # join the queue, or stay in it: renew the entry once a quarter of it has passed
        # (wait() comes back within half of it, so a live entry always has half its life as
        # margin), so that most polls write nothing
        entry = raw.execute(q["queue_entry"], key).fetchone()
        if entry is None or float(entry[0]) < window * 0.75:
            raw.execute(q["enqueue"], {**key, "window": window, "ttl": ttl})
        return None, True

    def _fetch(self, sql: str, params: dict[str, Any]) -> list[Any]:
        """Run a read and fetch all its rows in one call (async: ONE hop to aiosqlite's
        thread): a caller interrupted in between must not leave a half-read SELECT holding an
        old snapshot (the connection's next write would then fail with ``database is
        locked``)."""
        with write_gate(self._real_path):
            conn = self._connection()
            return run_on(conn, fetch_all, sql, params)

    def _count(self, sql: str, params: dict[str, Any]) -> int:
        """Run one writing statement in autocommit mode; the number of rows it changed."""
        with write_gate(self._real_path):
            conn = self._connection()
            return run_on(conn, count_rows, sql, params)

    def _peek(self, name: str, owner: str) -> tuple[bool, int, float] | None:
        """(owner holds it, token, seconds left) of the live lease on ``name``, or None."""
        rows = self._fetch(self.queries["peek"], {"name": name, "owner": owner})
        if not rows:
            return None
        row = rows[0]
        return bool(row[0]), int(row[1]), float(row[2])

    def prepare(self, *, waiting: bool = False) -> None:
        """Open the file and create the tables now, before a lease's clock starts."""
        with write_gate(self._real_path):
            self._connection()

    def holder(self, name: str) -> LockHolder | None:
        rows = self._fetch(self.queries["holder"], {"name": name})
        if not rows:
            return None
        owner, token, left = rows[0]
        return LockHolder(str(owner), int(token), max(0.0, float(left)))

    def holders(self, prefix: str, limit: int) -> list[tuple[str, LockHolder]]:
        rows = self._fetch(self.queries["holders"], {"prefix": prefix, "limit": limit})
        return [
            (str(name), LockHolder(str(owner), int(token), max(0.0, float(left))))
            for name, owner, token, left in rows
        ]

    def wait(self, name: str, owner: str, timeout: float) -> int | None:
        """Return once ``name`` looks free (``None``), at most after ``timeout`` seconds.

        Polls the lease row with a growing backoff, never sleeping past the row's expiry,
        and wakes at once when a release happens in this process.
        """
        clock = get_clock()
        deadline = clock.monotonic() + max(0.0, timeout)
        queued = (name, owner) in self._queued
        if queued:  # come back before our queue entry lapses
            deadline = min(deadline, clock.monotonic() + self.options.next_in_line / 2)
        key = self._key(name)
        event = compat.Event()
        wake = event.set
        ticket = WAITERS.add(key, wake)  # before the first look: no release goes unseen
        try:
            delay = self.options.poll_initial
            while True:
                state = self._peek(name, owner)
                if state is None:
                    return None  # free: the caller acquires now
                holds, token, left = state
                if holds:  # handed to us by a release
                    self._queued.discard((name, owner))
                    return token
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    return None
                if clock.wait(event, min(delay, remaining, left + 0.001)):
                    return None  # a release in this process
                if queued and self._heads_queue(name, owner):
                    delay = self.options.poll_initial  # the head polls fast: it is next
                else:
                    delay = min(delay * 2, self.options.poll_max)
        finally:
            WAITERS.remove(key, ticket)

    def _heads_queue(self, name: str, owner: str) -> bool:
        rows = self._fetch(self.queries["queue_head"], {"name": name})
        return bool(rows) and rows[0][0] == owner

    def cancel_wait(self, name: str, owner: str) -> int | None:
        """Leave the queue; return ``owner``'s token if it holds ``name`` (handed to it)."""
        if (name, owner) in self._queued:
            self._count(self.queries["dequeue"], {"name": name, "owner": owner})
            self._queued.discard((name, owner))  # only once the row is gone (close() retries)
        state = self._peek(name, owner)
        return state[1] if state is not None and state[0] else None

    def release(self, name: str, owner: str) -> bool:
        """Owner-checked; a waiter that is next in line gets the lease at once (hand-off)."""
        with write_gate(self._real_path):
            conn = self._connection()
            released = run_unless(
                conn,
                partial(self._release_alone, name=name, owner=owner),
                self._release_in,
                name,
                owner,
            )
        if released:
            WAITERS.notify(self._key(name))
        return released

    def _release_alone(self, raw: sqlite3.Connection, name: str, owner: str) -> bool | None:
        """The release of a name nobody waits for (``release_alone``): True, or None when it
        changed nothing (not ours, or a queue to hand the lease to or sweep)."""
        params = {"name": name, "owner": owner}
        return True if count_rows(raw, self.queries["release_alone"], params) == 1 else None

    def _release_in(self, raw: sqlite3.Connection, name: str, owner: str) -> bool:
        """The statements of :meth:`release`, inside its transaction: whether it released."""
        q = self.queries
        if raw.execute(q["release"], {"name": name, "owner": owner}).rowcount != 1:
            return False
        waiter = raw.execute(q["queue_head"], {"name": name}).fetchone()
        if waiter is not None:
            token_row = raw.execute(q["next_token"], {"name": name}).fetchone()
            assert token_row is not None
            handed = {"name": name, "owner": str(waiter[0])}
            raw.execute(q["grant"], {**handed, "token": int(token_row[0]), "ttl": float(waiter[1])})
            raw.execute(q["dequeue"], handed)
        raw.execute(q["sweep"], {"name": name})
        return True

    def extend(self, name: str, owner: str, ttl: float) -> bool:
        params = {"name": name, "owner": owner, "ttl": ttl}
        return self._count(self.queries["extend"], params) == 1

    def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        """Extend every item in ONE transaction; one bool per item."""
        if not items:
            return []
        with write_gate(self._real_path):
            conn = self._connection()
            return run_in_transaction(conn, self._renew_in, items)

    def _renew_in(self, raw: sqlite3.Connection, items: Sequence[RenewItem]) -> list[bool]:
        statement = self.queries["extend"]
        return [
            raw.execute(statement, {"name": name, "owner": owner, "ttl": ttl}).rowcount == 1
            for name, owner, ttl in items
        ]

    def force_release(self, name: str) -> bool:
        """Delete the lease on ``name`` whoever holds it (tests, operator tools)."""
        released = self._count(self.queries["force_release"], {"name": name}) == 1
        if released:
            WAITERS.notify(self._key(name))
        return released

    def close(self) -> None:
        """Close the connection; idempotent. Waiters of this backend still queued leave the
        queue first (a release must not hand the lease to an owner nobody waits for); leases
        still held are the core's to release, or expire."""
        with write_gate(self._real_path):
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    run_on(conn, self._dequeue_in, list(self._queued))
                    self._queued.clear()
                except Exception as exc:  # best effort: the entries lapse after next_in_line
                    log.warning("leaving the sqlite wait queue on close failed: %r", exc)
                conn.close()

    def _dequeue_in(self, raw: sqlite3.Connection, entries: list[tuple[str, str]]) -> None:
        for name, owner in entries:
            raw.execute(self.queries["dequeue"], {"name": name, "owner": owner})

    def after_fork(self) -> None:
        """In a child process right after ``fork()``: forget the connection and the queue
        entries inherited from the parent (its waiters are not here), without closing or
        leaving anything (see ``jobfence/_core/forks.py``)."""
        forks.keep(self._conn)
        self._conn = None
        self._queued = set()
