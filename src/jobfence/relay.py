# Generated from relay_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The outbox relay: publishes the rows committed to an outbox to their destination.

``AsyncRelay`` lives here; ``Relay`` in ``relay.py``, generated from it. Rows are added to
the outbox by ``Outbox.add`` in the caller's own transaction; a relay claims them in batches
and sends them on (a jobfence queue, a framework's broker, a callable: see
:mod:`jobfence.integrations.outbox_targets`). What it keeps:

* **order and single ownership**: a claim holds up to ``batch`` rows for ``lease`` seconds
  (by the database's clock), in ``seq`` order, never a row of a key whose earlier row is
  held by another relay or still waits; claims are serialised per table, so two relays never
  publish one row at once and never split one key's run. A batch is sent in ``seq`` order, in
  runs of consecutive rows with the same target (one batch call each), then marked published
  in one statement;
* **the destination down is not the rows' fault**: a broken link (``is_transient``, a
  ``BackendError``, ``ConnectionError``/``OSError``/``TimeoutError``) gives the rows back
  without counting an attempt, and the relay backs off (0.1 s, doubling to 10 s, with jitter;
  back to nothing after a success). No row is given up because of an outage, however long;
* **a row that fails on its own** is found by sending the run one row at a time: it is
  retried after ``min(2 ** attempts, 300)`` seconds, and after ``max_attempts`` failures it
  is *dead* with its last error (``Outbox.retry_dead`` brings it back). The rows of the same
  key behind it are given back, uncounted, and wait for it;
* **waking up**: where the outbox's server can say that rows were committed (PostgreSQL
  ``LISTEN/NOTIFY``, SQLite's ``data_version``) the relay waits for that, and claims again at
  least every ``poll * 5`` seconds (delayed and retried rows); elsewhere it polls: a claim
  that found rows is followed by the next claim at once, an empty one by a pause of 10 ms,
  doubling up to ``poll`` seconds while the outbox stays empty;
* **the lease** of a batch is extended every ``lease / 2`` seconds while it is being sent;
  a relay that dies or stalls past its lease loses its rows to the next claim. A stalled
  relay that wakes up may then send rows another relay sent already: the one case of a
  second publish, which the consumer's inbox recognises by the message id (the row's id);
* **published rows** are kept ``retention`` seconds (0: deleted when published) and purged
  by the relay every ``min(max(retention / 10, 1), 60)`` seconds;
* **stopping** (:meth:`AsyncRelay.stop`, or SIGTERM/SIGINT while :meth:`AsyncRelay.run` runs
  in the main thread): the batch in hand is sent and settled, what was not sent is given
  back, and the relay closes. A second signal stops sending at once (the rest is given back);
* **fork safety**: a relay used before a ``fork()`` gets a new owner id in the child, and its
  backend forgets the parent's connections; the rows the parent holds stay the parent's.

Every call to the outbox goes through the I/O hook (``outbox.claim``, ``outbox.publish``,
``outbox.settle``); logger ``jobfence.relay``; metrics ``jobfence.outbox.published``,
``.failed``, ``.dead`` and ``.lag`` (:mod:`jobfence.telemetry`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from . import telemetry
from ._core import compat, forks
from ._core.clock import get_clock
from ._core.hooks import hook
from ._core.validate import check_name, check_ttl
from .backends.base import OutboxBackend, OutboxRow
from .conflicts import is_transient
from .errors import BackendError, ConfigurationError, JobfenceError, SchemaMissing
from .integrations.outbox_targets import Destination, OutboxTarget, resolve

if TYPE_CHECKING:
    from .outbox import Outbox

__all__ = ["Relay", "RelayStats"]

log = logging.getLogger("jobfence.relay")

T = TypeVar("T")

#: the first pause of a polling relay after an empty claim (seconds), doubling up to poll
FIRST_POLL = 0.01
#: the backoff while the destination or the outbox is down: first pause and longest (s)
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 10.0
#: the longest delay before a failed row is tried again (seconds)
MAX_RETRY_IN = 300.0
#: a wait for committed rows is made of waits of at most this long, so that a stop is seen
WAIT_SLICE = 0.5
#: the most rows one claim may hold
MAX_BATCH = 10_000
#: the most bytes of a stored error text
MAX_ERROR = 8192

_HOST = socket.gethostname()[:64]


@dataclasses.dataclass
class RelayStats:
    """What a relay did so far.

    * ``published`` -- rows sent and marked published;
    * ``failed`` -- failed sends of a row that left it for a retry (its attempts counted);
    * ``dead`` -- rows given up after ``max_attempts`` failures;
    * ``released`` -- rows given back without counting an attempt (the destination was
      down, the relay stopped, an earlier row of their key failed);
    * ``batches`` -- claims that returned rows;
    * ``last_error`` -- the text of the last error met (a row's, or the destination's), or
      None.
    """

    published: int = 0
    failed: int = 0
    dead: int = 0
    released: int = 0
    batches: int = 0
    last_error: str | None = None


def _int(value: object, argument: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigurationError(
            f"{argument} must be an int from 1 to {high}, got {value!r}", argument=argument
        )
    return value


def _seconds(value: object, argument: str, *, zero: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0 <= value <= 31_536_000)
        or (not zero and value == 0)
    ):
        allowed = ">= 0" if zero else "> 0"
        raise ConfigurationError(
            f"{argument} must be a number of seconds {allowed} (at most one year), got {value!r}",
            argument=argument,
        )
    return float(value)


def _new_owner(name: str) -> str:
    return f"{name}:{os.getpid()}:{uuid.uuid4().hex}"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR]


def _is_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the destination (or the outbox) is unreachable, not that the
    rows are bad: such a failure counts no attempt."""
    if isinstance(exc, ConfigurationError):
        return False
    return isinstance(exc, (BackendError, ConnectionError, OSError, TimeoutError)) or (
        is_transient(exc)
    )


class _Down(Exception):
    """The destination was down while a batch was sent (the batch was settled)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Relay:
    """Publish the rows of ``outbox`` to ``to``; see the module documentation.

    ``outbox``: an :class:`~jobfence.AsyncOutbox` (``Relay``: an :class:`~jobfence.Outbox`),
    its URL (then the relay opens it and closes it), or an outbox backend. ``to``: a queue
    URL, a queue, an outbox target, a callable ``send(rows)``, or a dict of those by queue
    name (:mod:`jobfence.integrations.outbox_targets`). ``queues``: claim only the rows of these
    queue names (default: all of them, or those ``to`` implies: a queue's name, a dict's
    keys). ``batch``: the most rows one claim holds (1 to 10000). ``lease``: seconds a claim
    holds its rows (extended while they are sent). ``max_attempts``: failed sends of a row
    before it is dead. ``retention``: seconds published rows are kept (0: deleted at once).
    ``poll``: the longest pause between claims of a polling relay (the wait for committed rows
    is ``poll * 5`` where the server wakes the relay). ``name``: the first part of the
    relay's owner id (``name:pid:uuid``; default: the host name), what the outbox's admin
    views show as ``claimed_by``. ``handle_signals``: whether :meth:`run`, in the main thread,
    stops on SIGTERM/SIGINT.
    """

    def __init__(
        self,
        outbox: Outbox | OutboxBackend | str,
        to: Destination,
        *,
        queues: Sequence[str] | None = None,
        batch: int = 100,
        lease: float = 30.0,
        max_attempts: int = 10,
        retention: float = 600.0,
        poll: float = 1.0,
        name: str | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.batch = _int(batch, "batch", MAX_BATCH)
        self.lease = check_ttl(lease, argument="lease")
        self.max_attempts = _int(max_attempts, "max_attempts", 1_000_000)
        self.retention = _seconds(retention, "retention", zero=True)
        self.poll = _seconds(poll, "poll", zero=False)
        if name is None:
            name = _HOST
        elif len(check_name(name, argument="name").encode("utf-8")) > 128:
            raise ConfigurationError(
                f"name must have at most 128 bytes in UTF-8, got {name!r}", argument="name"
            )
        self.name = name
        self.handle_signals = bool(handle_signals)
        if not isinstance(outbox, (str, OutboxBackend)) and not isinstance(
            getattr(outbox, "backend", None), OutboxBackend
        ):
            raise ConfigurationError(
                "outbox must be a jobfence.AsyncOutbox (Relay: an Outbox), its URL, or its "
                f"backend, got {outbox!r}",
                argument="outbox",
            )
        self._routes = resolve(to, queues, asynchronous=False)
        #: the queue names this relay claims (None: every queue)
        self.queues: list[str] | None = self._routes.queues
        self._owns_outbox = isinstance(outbox, str)
        if isinstance(outbox, str):
            from .outbox import Outbox

            outbox = Outbox(outbox)
        #: the outbox the relay reads (or the backend it was given)
        self.outbox: Outbox | OutboxBackend = outbox
        self.backend: OutboxBackend = (
            outbox if isinstance(outbox, OutboxBackend) else outbox.backend
        )
        #: this relay's owner id (``name:pid:uuid``): who holds the rows it claimed
        self.owner = _new_owner(name)
        self.stats = RelayStats()
        self._held_mutex = threading.Lock()
        self._closed = False
        self._running = False
        self._stopping = False
        self._abort = False  # a second signal: stop sending the batch in hand
        self._failures = 0  # outages in a row (the backoff's exponent)
        self._next_purge = 0.0  # get_clock().monotonic() of the next purge
        self._stop_event = threading.Event()
        forks.register(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.owner} table={self.backend.table}>"

    def _after_fork(self) -> None:
        """In a child process right after ``fork()``: an owner id of its own (the rows the
        parent holds stay the parent's), a backend that opens its own connections, and a
        ``run()`` that starts afresh."""
        self.owner = _new_owner(self.name)
        self._held_mutex = threading.Lock()
        self._running = False
        self._stopping = False
        self._abort = False
        self._stop_event = threading.Event()
        if self.outbox is self.backend:  # an Outbox resets its backend itself
            self.backend.after_fork()

    # -- control -------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to return once the batch in hand is sent and settled. Safe from
        any thread and from a signal handler."""
        self._stopping = True
        if self._stop_event is None:
            return
        self._stop_event.set()

    def _on_signal(self, sig: int) -> None:
        if self._stopping:
            log.warning("signal %d again: giving back the rows not sent yet", sig)
            self._abort = True
        else:
            log.info("signal %d: stopping once the batch in hand is settled", sig)
        self.stop()

    def _install_signals(self) -> Callable[[], None]:
        """Stop on SIGTERM / SIGINT while :meth:`run` runs in the main thread."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        signals = (signal.SIGTERM, signal.SIGINT)
        old = {sig: signal.getsignal(sig) for sig in signals}
        for sig in signals:
            signal.signal(sig, lambda number, _frame: self._on_signal(number))

        def restore() -> None:
            for sig, handler in old.items():
                signal.signal(sig, handler)

        return restore

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> RelayStats:
        """Claim, send and settle batches until :meth:`stop` (or SIGTERM/SIGINT in the main
        thread); then close the relay. Returns the stats. A destination or an outbox that is
        down is waited out (with a backoff); a missing table
        (:class:`~jobfence.errors.SchemaMissing`) or a bad argument is raised."""
        self._check_open()
        if self._running:
            raise ConfigurationError("this relay is already running", argument="self")
        self._running = True
        restore = self._install_signals()
        try:
            log.info(
                "relay %s: outbox %s (table %s) to %s, queues %s",
                self.owner,
                getattr(self.outbox, "url", "?"),
                self.backend.table,
                self._routes.describe(),
                self.queues or "all",
            )
            if self.backend.capabilities.server_wakeup:
                # listen before the first claim: a row committed after it wakes the wait
                self._wait_for_rows(0.0)
            idle = FIRST_POLL
            while not self._stopping:
                try:
                    self._purge_if_due()
                    claimed, _ = self._one_batch()
                except (SchemaMissing, ConfigurationError):
                    raise
                except Exception as exc:
                    self._back_off(exc)
                    continue
                self._failures = 0
                if claimed >= self.batch:
                    idle = FIRST_POLL
                elif claimed:
                    # a batch that was not full: the outbox was drained. A waking backend's
                    # wait hears of the rows committed since the claim; a polling relay
                    # claims again at once and pauses only after an empty claim
                    idle = FIRST_POLL
                    if self.backend.capabilities.server_wakeup:
                        self._wait_for_rows(self.poll * 5)
                elif self.backend.capabilities.server_wakeup:
                    self._wait_for_rows(self.poll * 5)
                else:
                    self._pause(idle)
                    idle = min(idle * 2, self.poll)
        finally:
            restore()
            self._running = False
            self.close()
        return self.stats

    def run_once(self) -> int:
        """Publish what is committed now: claim and send batches until a claim is not full;
        return how many rows were published. A destination that is down raises (its rows
        were given back, uncounted)."""
        self._check_open()
        total = 0
        self._purge_if_due()
        while True:
            down: BaseException | None = None
            try:
                claimed, published = self._one_batch()
            except _Down as exc:
                down = exc.cause
            if down is not None:
                # raised outside the handler: the destination's error keeps its own cause
                # (a BackendError's driver error, which is_transient() reads)
                raise down
            total += published
            if claimed < self.batch or self._stopping:
                return total

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the relay is asked to stop."""
        get_clock().wait(self._stop_event, seconds)

    def _back_off(self, exc: BaseException) -> None:
        cause = exc.cause if isinstance(exc, _Down) else exc
        self.stats.last_error = _error_text(cause)
        self._failures += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(self._failures - 1, 20))
        delay *= random.uniform(0.8, 1.2)
        what = "the destination" if isinstance(exc, _Down) else "the outbox"
        log.warning(
            "relay %s: %s is unreachable (%s); trying again in %.2f s",
            self.owner,
            what,
            self.stats.last_error,
            delay,
        )
        self._pause(delay)

    def _wait_for_rows(self, timeout: float) -> None:
        """Wait until the outbox's server says rows were committed, ``timeout`` passes or the
        relay is asked to stop (the wait is cut in slices to see the stop)."""
        clock = get_clock()
        deadline = clock.monotonic() + timeout
        while not self._stopping:
            left = max(0.0, deadline - clock.monotonic())
            try:
                if self.backend.wait(min(left, WAIT_SLICE)) or left <= 0:
                    return
            except Exception as exc:  # the claim that follows meets the outage too
                log.debug("relay %s: waiting for rows failed: %r", self.owner, exc)
                self._pause(min(left, WAIT_SLICE))
                return

    # -- one batch -----------------------------------------------------------------------
    def _one_batch(self) -> tuple[int, int]:
        """Claim a batch, send it, settle it: (rows claimed, rows published). Raises
        :class:`_Down` (after settling) when the destination was down."""
        rows = self._claim()
        if not rows:
            return 0, 0
        self.stats.batches += 1
        held = {row.seq for row in rows}
        done = compat.Event()
        keeper = compat.spawn(lambda: self._keep_held(held, done), "jobfence-relay-lease")
        try:
            return len(rows), self._send_batch(rows, held)
        finally:
            done.set()
            compat.join(keeper, 5.0)

    def _send_batch(self, rows: list[OutboxRow], held: set[int]) -> int:
        """Send ``rows`` run by run, find the failing rows of a run that raised, then mark
        the sent rows published and give the rest back; how many were published."""
        sent: list[OutboxRow] = []
        blocked: set[str] = set()  # keys with a failed row in this batch
        down: BaseException | None = None
        try:
            for target, run in self._routes.runs(rows):
                if self._abort:
                    break
                ready = [r for r in run if r.key is None or r.key not in blocked]
                if not ready:
                    continue
                try:
                    self._send(target, ready)
                    sent.extend(ready)
                    continue
                except Exception as exc:
                    if _is_down(exc):
                        down = exc
                        break
                    log.info(
                        "relay %s: a batch to %s failed (%s); sending its rows one by one",
                        self.owner,
                        target.name,
                        _error_text(exc),
                    )
                for row in ready:
                    if self._abort:
                        break
                    if row.key is not None and row.key in blocked:
                        continue
                    try:
                        self._send(target, [row])
                    except Exception as exc:
                        if _is_down(exc):
                            down = exc
                            break
                        self._row_failed(row, exc, held)
                        if row.key is not None:
                            blocked.add(row.key)
                    else:
                        sent.append(row)
                if down is not None:
                    break
        finally:
            published = self._settle(sent, held)
        if down is not None:
            raise _Down(down)
        return published

    def _send(self, target: OutboxTarget, rows: list[OutboxRow]) -> None:
        hook("outbox.publish", relay=self.owner, ids=[r.id for r in rows], target=target.name)
        target.send(rows)

    def _settle(self, sent: list[OutboxRow], held: set[int]) -> int:
        """Mark ``sent`` published (one statement) and give back the rest of ``held``; a
        failure here is logged: the rows come back after their lease (and may be sent
        again)."""
        published = 0
        if sent:
            seqs = [r.seq for r in sent]
            try:
                published = self._call(
                    "published", seqs, self.backend.published, self.owner, seqs, self.retention
                )
            except JobfenceError as exc:
                self.stats.last_error = _error_text(exc)
                log.error(
                    "relay %s: marking %d sent rows published failed (they are sent again "
                    "after their lease): %s",
                    self.owner,
                    len(seqs),
                    exc,
                )
            else:
                self._count_published(sent, published)
            with self._held_mutex:
                held.difference_update(seqs)
        with self._held_mutex:
            rest = sorted(held)
            held.clear()
        if rest:
            try:
                released = self._call("release", rest, self.backend.release, self.owner, rest, 0.0)
                self.stats.released += released
            except JobfenceError as exc:
                log.warning(
                    "relay %s: giving back %d rows failed (they come back after their lease): %s",
                    self.owner,
                    len(rest),
                    exc,
                )
        return published

    def _count_published(self, sent: list[OutboxRow], published: int) -> None:
        self.stats.published += published
        if published < len(sent):
            log.warning(
                "relay %s: %d of %d sent rows were no longer held (their lease passed): "
                "another relay may send them again",
                self.owner,
                len(sent) - published,
                len(sent),
            )
        now = get_clock().time()
        lags: dict[str, list[float]] = {}
        for row in sent:
            lags.setdefault(row.queue, []).append(max(0.0, now - row.created_at))
        for queue, values in lags.items():
            telemetry.outbox_published(self.backend.kind, queue, values)

    def _row_failed(self, row: OutboxRow, exc: BaseException, held: set[int]) -> None:
        attempts = row.attempts + 1
        dead = attempts >= self.max_attempts
        retry_in = None if dead else min(2.0**attempts, MAX_RETRY_IN)
        error = _error_text(exc)
        self.stats.last_error = error
        with self._held_mutex:
            held.discard(row.seq)
        try:
            ok = self._call(
                "failed", [row.seq], self.backend.failed, self.owner, row.seq, error, retry_in
            )
        except JobfenceError as err:
            log.error(
                "relay %s: recording the failure of row %r failed (it comes back after its "
                "lease): %s",
                self.owner,
                row.id,
                err,
            )
            return
        if not ok:
            return
        if dead:
            self.stats.dead += 1
            telemetry.outbox_dead(self.backend.kind, row.queue)
            log.error(
                "relay %s: row %r (queue %r) is dead after %d attempts: %s",
                self.owner,
                row.id,
                row.queue,
                attempts,
                error,
            )
        else:
            self.stats.failed += 1
            telemetry.outbox_failed(self.backend.kind, row.queue)
            log.warning(
                "relay %s: row %r (queue %r) failed (attempt %d of %d), retried in %.0f s: %s",
                self.owner,
                row.id,
                row.queue,
                attempts,
                self.max_attempts,
                retry_in,
                error,
            )

    def _keep_held(self, held: set[int], done: Any) -> None:
        """While a batch is being sent: every ``lease / 2`` seconds, hold its unsettled rows
        for another ``lease``."""
        clock = get_clock()
        while not clock.wait(done, self.lease / 2):
            with self._held_mutex:
                seqs = sorted(held)
            if not seqs:
                continue
            try:
                kept = self._call("extend", seqs, self.backend.extend, self.owner, seqs, self.lease)
            except JobfenceError as exc:
                log.warning("relay %s: extending the lease of a batch failed: %s", self.owner, exc)
                continue
            if kept < len(seqs):
                log.warning(
                    "relay %s: %d of %d rows of the batch were no longer held (their lease "
                    "passed): another relay may send them too",
                    self.owner,
                    len(seqs) - kept,
                    len(seqs),
                )

    # -- outbox calls --------------------------------------------------------------------
    def _claim(self) -> list[OutboxRow]:
        backend = self.backend
        self._check_open()
        try:
            hook("outbox.claim", relay=self.owner, table=backend.table, backend=backend.kind)
            return list(backend.claim(self.owner, self.batch, self.lease, self.queues))
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{backend.kind} outbox {backend.table!r}: claim failed: "
                f"{type(exc).__name__}: {exc}",
                backend=backend.kind,
                operation="outbox.claim",
            ) from exc

    def _call(self, verb: str, seqs: list[int], fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a settling verb of the outbox, announced at ``outbox.settle``;
        driver errors (and faults a hook injects) are wrapped in BackendError."""
        backend = self.backend
        try:
            hook("outbox.settle", relay=self.owner, verb=verb, seqs=seqs, backend=backend.kind)
            return fn(*args)
        except JobfenceError:
            raise
        except Exception as exc:
            raise BackendError(
                f"{backend.kind} outbox {backend.table!r}: {verb} failed: "
                f"{type(exc).__name__}: {exc}",
                backend=backend.kind,
                operation="outbox.settle",
            ) from exc

    def _purge_if_due(self) -> None:
        if self.retention == 0:
            return
        now = get_clock().monotonic()
        if now < self._next_purge:
            return
        self._next_purge = now + min(max(self.retention / 10, 1.0), 60.0)
        try:
            purged = self._call("purge", [], self.backend.purge, self.retention)
        except (SchemaMissing, ConfigurationError):
            raise
        except JobfenceError as exc:
            log.warning("relay %s: purging published rows failed: %s", self.owner, exc)
            return
        if purged:
            log.debug("relay %s: purged %d published rows", self.owner, purged)

    # -- closing -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this relay is closed", argument="self")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the targets the relay opened (the queues of a URL, its callables) and the
        outbox if the relay opened it (given as a URL). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for target in self._routes.owned:
            try:
                target.close()
            except Exception as exc:
                log.warning("relay %s: closing %s failed: %r", self.owner, target.name, exc)
        if self._owns_outbox:
            self.outbox.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
