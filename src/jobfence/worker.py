"""The worker: a consumer loop around a handler, on any jobfence queue.

``AsyncWorker`` runs on an :class:`~jobfence.AsyncQueue` inside an event loop; ``Worker`` is
the same loop for a :class:`~jobfence.Queue`, run from blocking code (``Worker.run()`` starts
its own event loop and, for a queue opened from a URL, runs the asyncio client of that URL on
it; a queue on a client object of the caller's has its backend called in threads). One body
of logic serves both:

* **bounded concurrency**: at most ``concurrency`` handlers run at once; ``async def``
  handlers run as tasks, plain functions in a pool of ``concurrency`` threads. A handler's
  slot frees as it returns (or raises): its ack (or nack) round trip then goes on beside the
  next handlers instead of holding the slot, nor does it hold room from the receives (up to
  another ``concurrency + prefetch`` messages settling at once). A plain function's received
  messages (up to ``prefetch``) wait in the threads' queue, so that a thread that returns
  takes the next one at once; at a stop, those no thread took are given back uncounted;
* **ack after the handler returns**, never before: a worker that dies mid-message leaves it
  to be redelivered (after ``visibility``, or at once where the server redelivers on
  disconnect);
* **an exception** gives the message back with a backoff (``backoff * 2 ** (delivery - 1)``
  seconds, at most ``max_backoff``, with jitter); after ``max_deliveries`` deliveries it goes
  to the dead letters with its last error. A message already delivered more than
  ``max_deliveries`` times (its consumers kept dying) is dead-lettered without running;
* **"not now" is not a failure**: a handler refused because another worker holds what it
  needs (:class:`~jobfence.errors.NotNow`: ``ClaimInProgress``, ``LockTimeout``,
  ``LockLost``, ``ClaimLost``) gives its message back with :meth:`~jobfence.queue.Message.defer`:
  redelivered after the refusal's ``retry_after`` (the holder's known expiry; ``backoff``
  when unknown) plus jitter, WITHOUT counting the delivery, so a message that is only ever
  refused is never dead-lettered and ``last_error`` stays the last real failure. Messages
  received but not yet started when the worker stops are deferred the same way (they never
  ran; a subscription that pushes, RabbitMQ's, is cancelled first and what it pushed is
  deferred too); a consumer that dies holding a delivery still uses it up (the poison-message
  guard);
* **renewal**: every delivery is kept hidden by the queue's renewer (one batched round trip
  per tick for all in-flight messages) while its handler runs; if a renewal fails the message
  is *lost*: an ``async def`` handler is cancelled, a thread sees ``message.lost`` /
  ``message.check()``, and the message is not acked (another consumer may have it);
* **graceful shutdown** on SIGTERM/SIGINT (when run in the main thread) or :meth:`stop`:
  stop receiving, let in-flight handlers finish within ``shutdown_timeout`` seconds, then
  give back (nack, no delay) what is unfinished so that it is redelivered at once;
* :attr:`stats` and logging (logger ``jobfence.worker``; each line names the message id and
  delivery, also as ``extra`` fields ``message_id``, ``delivery``, ``queue``).

A plain-function handler that is ``guarded(inbox=Inbox(url))`` alone (no lock, limit or
retries; an inbox opened from a URL other than ``memory://``) has its claim and completion
made on the worker's loop, through the asyncio inbox of the same URL that the worker opens for
the run and closes at its end (batched across the handlers), and only the function runs in a
thread; see :mod:`jobfence._guard_worker` for how the guard's rules hold there.

Inside the handler, :func:`jobfence.current_message` is the message, and
:func:`jobfence.guarded` / ``Inbox.claim_in`` without a key use its id: a redelivery or a
duplicate publish is then recognised as a duplicate (counted in ``stats.duplicates``).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import inspect
import logging
import queue
import random
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from . import telemetry
from ._core.validate import check_ttl
from ._guard_spec import current_message_var
from ._guard_worker import NotStarted, WorkerGuard, run_guarded_in_worker, worker_guard
from .backends.base import (
    AsyncQueueBackend,
    DeadLetter,
    QueueBackend,
    QueuedMessage,
    QueueStats,
    RenewItem,
)
from .errors import ConfigurationError, FingerprintMismatch, JobfenceError, MessageLost, NotNow
from .queue import Queue
from .queue_async import AsyncMessage, AsyncQueue

__all__ = ["AsyncWorker", "Worker", "WorkerStats"]

log = logging.getLogger("jobfence.worker")

#: how long one receive waits for a message before the loop looks at ``stop`` again
RECEIVE_WAIT = 1.0
#: receives in flight at once (while one round trip is under way, the next may start)
RECEIVERS = 2
#: the longest deferral of a "not now" refusal (a hint beyond it is a holder with a very long
#: ttl: the message comes back, is refused again and deferred again, uncounted each time)
MAX_DEFER = 3600.0


@dataclasses.dataclass
class WorkerStats:
    """What a worker did so far.

    * ``received`` -- deliveries received;
    * ``processed`` -- handlers that returned, their messages acked;
    * ``duplicates`` -- of those, deliveries the inbox recognised as already processed
      (``guarded`` returned the stored result without running the function);
    * ``retried`` -- deliveries given back after an exception, to be redelivered;
    * ``deferred`` -- deliveries given back uncounted after a "not now" refusal
      (:class:`~jobfence.errors.NotNow`), to be redelivered after the holder's expiry;
    * ``dead_lettered`` -- messages moved to the dead letters;
    * ``lost`` -- deliveries that stopped being this worker's before they were finished
      (visibility passed, renewal failed); they are redelivered, not acked;
    * ``given_back`` -- deliveries returned unfinished at shutdown (those whose handler had
      not started are returned uncounted);
    * ``in_flight`` -- messages started and not yet settled: handlers running now, messages
      whose ack (or nack) is under way, and, with a plain function, the received messages
      waiting in the handler threads' queue for a thread.
    """

    received: int = 0
    processed: int = 0
    duplicates: int = 0
    retried: int = 0
    deferred: int = 0
    dead_lettered: int = 0
    lost: int = 0
    given_back: int = 0
    in_flight: int = 0


def _positive_int(value: object, argument: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigurationError(
            f"{argument} must be an int from 1 to {high}, got {value!r}", argument=argument
        )
    return value


def _nonnegative_int(value: object, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
        raise ConfigurationError(
            f"{argument} must be an int from 0 to 10000, got {value!r}", argument=argument
        )
    return value


def _seconds(value: object, argument: str, *, zero: bool = True) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0 <= value < 1e9)
        or (not zero and value == 0)
    ):
        allowed = ">= 0" if zero else "> 0"
        raise ConfigurationError(
            f"{argument} must be a number of seconds {allowed}, got {value!r}", argument=argument
        )
    return float(value)


def _extra(message: AsyncMessage) -> dict[str, Any]:
    return {"message_id": message.id, "delivery": message.delivery, "queue": message.queue}


class AsyncWorker:
    """Consume ``queue`` with ``handler(message)``; see the module documentation.

    ``handler``: an ``async def`` function or a plain one (run in threads), called with the
    message (``.id``, ``.body``, ``.delivery``, ``.headers``, ``.queue``). Returning acks the
    message; raising gives it back (a "not now" refusal, :class:`~jobfence.errors.NotNow`, is
    deferred without counting the delivery). ``visibility`` (default: the queue's) is how long a
    delivery stays hidden between renewals; ``max_deliveries`` how many deliveries a message
    gets before it is dead-lettered; ``backoff``/``max_backoff`` the redelivery delay after an
    exception; ``shutdown_timeout`` how long :meth:`run` lets in-flight handlers finish after
    a stop; ``prefetch`` how many received messages may wait for a free slot (default:
    ``concurrency``): the next batch is received while handlers run, and waiting messages are
    renewed like running ones and given back at a stop (messages whose handler returned and
    whose ack is under way take no room, up to another ``concurrency + prefetch``). ``queue``: the
    :class:`~jobfence.AsyncQueue` to consume; ``concurrency``: how many handlers run at once
    (default 8). ``handle_signals`` (default ``True``): :meth:`run`, in the main thread,
    stops on SIGTERM/SIGINT (a second one gives the in-flight messages back at once).
    """

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Callable[[Any], Any],
        *,
        concurrency: int = 8,
        max_deliveries: int = 5,
        visibility: float | None = None,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        shutdown_timeout: float = 30.0,
        prefetch: int | None = None,
        handle_signals: bool = True,
    ) -> None:
        if not isinstance(queue, AsyncQueue):
            raise ConfigurationError(
                f"queue must be a jobfence.AsyncQueue (use jobfence.Worker for a Queue), got "
                f"{type(queue).__name__}",
                argument="queue",
            )
        if not callable(handler):
            raise ConfigurationError(
                f"handler must be callable as handler(message), got {handler!r}",
                argument="handler",
            )
        self.queue = queue
        self.handler = handler
        self.concurrency = _positive_int(concurrency, "concurrency", 10_000)
        self.max_deliveries = _positive_int(max_deliveries, "max_deliveries", 1_000_000)
        self.visibility = (
            queue.visibility if visibility is None else check_ttl(visibility, argument="visibility")
        )
        self.backoff = _seconds(backoff, "backoff")
        self.max_backoff = _seconds(max_backoff, "max_backoff")
        self.shutdown_timeout = _seconds(shutdown_timeout, "shutdown_timeout")
        self.prefetch = (
            self.concurrency if prefetch is None else _nonnegative_int(prefetch, "prefetch")
        )
        self.handle_signals = bool(handle_signals)
        self.stats = WorkerStats()
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            type(handler).__call__
        )
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        #: set once a stopping run has ended its subscription: a message that never started
        #: goes back after that (given back before, on RabbitMQ its copy would be pushed to
        #: this consumer again)
        self._unsubscribed: asyncio.Event | None = None
        self._tasks: dict[asyncio.Task[None], AsyncMessage] = {}
        #: the tasks whose handler has not returned yet (each holds one of the slots)
        self._busy: set[asyncio.Task[None]] = set()
        self._slot_free: _Wakeup | None = None
        self._pool: _HandlerThreads | None = None
        #: a guarded plain handler whose inbox steps run on the loop (see _guard_worker),
        #: the asyncio inbox this worker opens for them during a run, and the tasks that
        #: complete the claims of functions still running when their handler was cut off
        self._guard: WorkerGuard | None = None if self._is_async else worker_guard(handler)
        self._guard_inbox: Any = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._running = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.queue.name} concurrency={self.concurrency}>"

    # -- control -------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to stop: no more receives; in-flight handlers get
        ``shutdown_timeout`` seconds to finish. Safe from any thread and from a handler."""
        self._stop_requested.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop is closed: run() is over
                pass

    @property
    def running(self) -> bool:
        return self._running

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # not supported here
                continue
            installed.append(sig)
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop_requested.is_set():
            log.warning("%s again: giving back in-flight messages now", sig.name)
            self.shutdown_timeout = 0.0
            for task in list(self._tasks):
                task.cancel()
        else:
            log.info(
                "%s: stopping; in-flight messages get %.0f s to finish",
                sig.name,
                self.shutdown_timeout,
            )
        self.stop()

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> WorkerStats:
        """Receive and handle messages until :meth:`stop` or SIGTERM/SIGINT; then drain
        (see the class). Returns the stats."""
        if self._running:
            raise ConfigurationError("this worker is already running", argument="self")
        self._running = True
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        unsubscribed = self._unsubscribed = asyncio.Event()
        if self._stop_requested.is_set():
            self._stopping.set()
        if not self._is_async:
            self._pool = _HandlerThreads(
                loop, self.concurrency, "jobfence-worker", self._stop_requested
            )
            if self._guard is not None:
                self._guard_inbox = self._guard.open_inbox()
        signals = self._install_signals(loop)
        slot_free = self._slot_free = _Wakeup(loop)
        log.info(
            "worker on queue %r (%s): concurrency %d, max_deliveries %d, visibility %.1f s",
            self.queue.name,
            self.queue.url,
            self.concurrency,
            self.max_deliveries,
            self.visibility,
        )
        # Receiving runs beside the handlers: while they run, the next batch is fetched into a
        # local buffer (at most ``prefetch`` messages, renewed like the running ones), so a
        # receive round trip does not leave slots idle. A receive starts once a quarter of the
        # room is free, so batches stay large.
        room_limit = self.concurrency + self.prefetch
        # A message whose handler returned (its ack, or a guarded function's stored result,
        # under way) takes no room, up to another ``room_limit`` of them: the settling round
        # trips overlap the next messages' instead of holding them back. Not where the server
        # pushes: its window counts the unacknowledged deliveries, settling ones included.
        settle_room = room_limit
        try:  # a backend whose server pushes (RabbitMQ) subscribes now
            if await self.queue.backend.stream(room_limit):
                settle_room = 0
        except Exception as exc:  # the receives will report a broken link again
            settle_room = 0  # it may subscribe when it connects again
            log.warning("queue %r: subscribing failed: %r", self.queue.name, exc)
        batch = max(1, room_limit // 4)
        buffer: collections.deque[AsyncMessage] = collections.deque()
        receiving: dict[asyncio.Task[list[AsyncMessage]], int] = {}  # -> messages asked for
        # the last receive found the queue empty: the next one waits for a message (the server
        # wakes it) instead of asking again at once while handlers run
        drained = False
        stop_wait = loop.create_task(self._stopping.wait())
        # A plain function's messages start up to ``prefetch`` beyond ``concurrency``: they
        # wait in the handler threads' queue, and a thread that returns takes the next one at
        # once instead of sleeping until the loop has seen its outcome and handed it another
        # (a sleep, a wake-up and two hand-overs of the interpreter lock per message). A
        # guarded function's claims are then made (batched on the loop) while the running
        # functions hold the threads. The threads run at most ``concurrency`` at once.
        starts = self.concurrency + (0 if self._is_async else self.prefetch)
        try:
            while not self._stopping.is_set():
                while buffer and len(self._busy) < starts:
                    self._start(loop, buffer.popleft(), slot_free)
                settling = len(self._tasks) - len(self._busy)
                room = (
                    room_limit
                    - len(self._busy)
                    - max(0, settling - settle_room)
                    - len(buffer)
                    - sum(receiving.values())
                )
                idle = not (self._tasks or buffer or receiving)
                waiting = idle or drained
                if (
                    len(receiving) < RECEIVERS
                    and (room >= batch or idle)
                    and not (waiting and receiving)  # one waiting receive is enough
                ):
                    asked = min(room, 1000)
                    task = loop.create_task(
                        self.queue.receive(
                            asked,
                            visibility=self.visibility,
                            wait=RECEIVE_WAIT if waiting else 0.0,
                            renew=True,
                        )
                    )
                    receiving[task] = asked
                waits: list[asyncio.Future[Any]] = [stop_wait, *receiving]
                if self._tasks:
                    waits.append(slot_free.arm())
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                slot_free.disarm()
                for done in [t for t in receiving if t.done()]:
                    del receiving[done]
                    try:
                        got = done.result()
                    except JobfenceError as exc:
                        log.error("receive from queue %r failed: %s", self.queue.name, exc)
                        await _first(asyncio.sleep(1.0), self._stopping.wait())
                        continue
                    drained = not got
                    self.stats.received += len(got)
                    buffer.extend(got)
            if self._pool is not None:
                # the calls no thread took yet never run: their messages go back uncounted
                # (NotStarted), as the received messages that never started do
                self._pool.cancel_waiting()
            # stopping: what was received but not started goes back at once
            for pending in list(receiving):
                try:
                    buffer.extend(await pending)
                except JobfenceError:
                    pass
            receiving.clear()
            try:  # a subscription ends first, so that what it pushed is given back too
                buffer.extend(await self.queue._unstream())
            except JobfenceError as exc:
                log.warning("queue %r: unsubscribing failed: %s", self.queue.name, exc)
            unsubscribed.set()
            for message in buffer:  # never started: not a delivery used up
                await self._give_back(message, "the worker is stopping", counted=False)
            buffer.clear()
            await self._drain()
        finally:
            unsubscribed.set()
            stop_wait.cancel()
            for sig in signals:
                loop.remove_signal_handler(sig)
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            await self._close_guard_inbox()
            self._loop = None
            self._running = False
            self._stop_requested.clear()
            log.info("worker on queue %r stopped: %s", self.queue.name, self.stats)
        return self.stats

    async def _close_guard_inbox(self) -> None:
        """Close the inbox of a guarded handler's claims, once the functions cut off at the
        stop have returned and their claims were completed (or released)."""
        inbox, self._guard_inbox = self._guard_inbox, None
        if inbox is None:
            return
        try:
            while self._finishing:
                await asyncio.wait(list(self._finishing))
        finally:
            try:
                await inbox.close()
            except Exception as exc:  # its claims expire after their ttl
                log.warning("closing the inbox of the guarded handler failed: %r", exc)

    def _run_in_thread(self, message: AsyncMessage) -> Awaitable[Any]:
        """The plain handler's call for ``message``: in a handler thread, or, for a guarded
        function whose inbox steps run on the loop, only its function there."""
        assert self._pool is not None
        if self._guard_inbox is not None and self._guard is not None:
            task = asyncio.current_task()
            return run_guarded_in_worker(
                self._guard,
                self._guard_inbox,
                self._pool,
                (message,),
                {},
                self._finishing,
                lambda: self._free_slot(task),
            )
        return self._pool.run(self.handler, message)

    def _start(
        self, loop: asyncio.AbstractEventLoop, message: AsyncMessage, slot_free: _Wakeup
    ) -> None:
        task = loop.create_task(self._handle(message))
        self._tasks[task] = message
        self._busy.add(task)
        self.stats.in_flight = len(self._tasks)
        task.add_done_callback(lambda t: self._done(t, slot_free))

    def _free_slot(self, task: asyncio.Task[None] | None) -> None:
        """The handler of ``task`` returned or raised: its slot is free for the next one
        (its ack or nack, still to come, does not hold a slot)."""
        if task is not None and task in self._busy:
            self._busy.discard(task)
            if self._slot_free is not None:
                self._slot_free.set()

    def _done(self, task: asyncio.Task[None], slot_free: _Wakeup) -> None:
        self._busy.discard(task)
        self._tasks.pop(task, None)
        self.stats.in_flight = len(self._tasks)
        slot_free.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("worker task failed", exc_info=task.exception())

    async def _drain(self) -> None:
        """In-flight handlers get ``shutdown_timeout`` seconds; the rest are cancelled (a
        thread cannot be: its message is given back and its result ignored)."""
        if not self._tasks:
            return
        log.info(
            "waiting up to %.1f s for %d in-flight message(s)",
            self.shutdown_timeout,
            len(self._tasks),
        )
        _done, pending = await asyncio.wait(list(self._tasks), timeout=self.shutdown_timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _give_back(self, message: AsyncMessage, why: str, *, counted: bool = True) -> None:
        """Return an unfinished message for redelivery at once. No error is recorded (a
        give-back is not a failure: ``last_error`` keeps the last real one). A message whose
        handler started stays counted (RabbitMQ requeues it in place); one that never started
        (``counted=False``) is deferred: its delivery is not used up."""
        try:
            if await (message.nack(0.0) if counted else message.defer(0.0)):
                self.stats.given_back += 1
                log.info(
                    "message %r (delivery %d) given back: %s",
                    message.id,
                    message.delivery,
                    why,
                    extra=_extra(message),
                )
        except JobfenceError as exc:
            log.warning(
                "giving back message %r failed (it comes back after its visibility): %s",
                message.id,
                exc,
                extra=_extra(message),
            )

    async def _handle(self, message: AsyncMessage) -> None:
        if message.delivery > self.max_deliveries:
            error = (
                f"delivered {message.delivery} times without an ack (max_deliveries "
                f"{self.max_deliveries}); last error: {message.last_error}"
            )
            await self._dead_letter(message, error)
            return
        token = current_message_var.set(message)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        cancelled_for_loss = False

        def on_lost(_message: AsyncMessage) -> None:
            nonlocal cancelled_for_loss
            if self._is_async and task is not None:
                cancelled_for_loss = True
                loop.call_soon_threadsafe(task.cancel)

        message.on_lost(on_lost)
        try:
            if self._is_async:
                await self.handler(message)
            else:
                await self._run_in_thread(message)
        except asyncio.CancelledError:
            if cancelled_for_loss or message.lost:
                self.stats.lost += 1
                log.warning(
                    "message %r (delivery %d) lost while its handler ran; not acked",
                    message.id,
                    message.delivery,
                    extra=_extra(message),
                )
                cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
                if cancelling is not None and cancelling():
                    task.uncancel()  # type: ignore[union-attr]
                return
            await asyncio.shield(self._give_back(message, "the worker stopped before it finished"))
            raise
        except NotStarted:
            self._free_slot(task)
            if self._unsubscribed is not None:
                await self._unsubscribed.wait()
            await self._give_back(message, "the worker is stopping", counted=False)
            return
        except Exception as exc:
            self._free_slot(task)
            await self._failed(message, exc)
            return
        finally:
            current_message_var.reset(token)
        self._free_slot(task)
        try:
            await message.ack()
        except MessageLost:
            self.stats.lost += 1
            log.warning(
                "message %r (delivery %d) was handled, but the delivery was lost before the "
                "ack: it will be delivered again",
                message.id,
                message.delivery,
                extra=_extra(message),
            )
            return
        except JobfenceError as exc:
            log.error(
                "ack of message %r failed (it will be delivered again): %s",
                message.id,
                exc,
                extra=_extra(message),
            )
            return
        self.stats.processed += 1
        if getattr(message, "duplicate", False):
            self.stats.duplicates += 1
            telemetry.worker_message(self.queue.backend.kind, "duplicate")
        else:
            telemetry.worker_message(self.queue.backend.kind, "processed")
        log.debug(
            "message %r (delivery %d) processed",
            message.id,
            message.delivery,
            extra=_extra(message),
        )

    def _backoff(self, delivery: int) -> float:
        base = min(self.max_backoff, self.backoff * 2.0 ** min(delivery - 1, 60))
        return base * random.uniform(0.5, 1.0)

    async def _failed(self, message: AsyncMessage, exc: Exception) -> None:
        if message.lost:
            self.stats.lost += 1
            log.warning(
                "message %r (delivery %d): handler raised after the delivery was lost: %r",
                message.id,
                message.delivery,
                exc,
                extra=_extra(message),
            )
            return
        if isinstance(exc, NotNow):
            await self._defer(message, exc)
            return
        final = isinstance(exc, FingerprintMismatch) or message.delivery >= self.max_deliveries
        if final:
            await self._dead_letter(message, exc)
            return
        delay = self._backoff(message.delivery)
        log.warning(
            "message %r (delivery %d) failed, redelivered in %.1f s: %s: %s",
            message.id,
            message.delivery,
            delay,
            type(exc).__name__,
            exc,
            extra=_extra(message),
        )
        await self._settle(message, "nack", message.nack(delay, exc), "retried")

    def _not_now_delay(self, retry_after: float | None) -> float:
        """When a refused message comes back: after the holder's known expiry
        (``retry_after``), else after ``backoff`` seconds (at least a tenth of a second), plus
        jitter (up to a tenth of it, and half a second) so that the refused deliveries of one
        holder do not all come back in the same instant."""
        base = max(0.1, self.backoff) if retry_after is None else retry_after
        base = min(base, MAX_DEFER)
        return base + random.uniform(0.0, 0.1 * base + 0.5)

    async def _defer(self, message: AsyncMessage, exc: NotNow) -> None:
        delay = self._not_now_delay(exc.retry_after)
        log.info(
            "message %r (delivery %d) refused for now, redelivered in %.1f s without using a "
            "delivery: %s: %s",
            message.id,
            message.delivery,
            delay,
            type(exc).__name__,
            exc,
            extra=_extra(message),
        )
        await self._settle(message, "defer", message.defer(delay), "deferred")

    async def _dead_letter(self, message: AsyncMessage, error: str | BaseException) -> None:
        log.error(
            "message %r (delivery %d) goes to the dead letters: %s",
            message.id,
            message.delivery,
            error if isinstance(error, str) else f"{type(error).__name__}: {error}",
            extra=_extra(message),
        )
        await self._settle(message, "dead-lettering", message.dead_letter(error), "dead_lettered")

    async def _settle(
        self, message: AsyncMessage, verb: str, finish: Awaitable[bool], outcome: str
    ) -> None:
        """Await ``finish`` (a nack, defer or dead letter of ``message``) and count it under
        ``outcome`` (the stats field and the telemetry outcome), or as lost when the delivery
        was no longer this worker's; a backend error is logged (the message comes back after
        its visibility)."""
        try:
            if await finish:
                setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
                telemetry.worker_message(self.queue.backend.kind, outcome)
            else:
                self.stats.lost += 1
        except JobfenceError as err:
            log.error("%s of message %r failed: %s", verb, message.id, err, extra=_extra(message))


class _HandlerThreads:
    """The threads of plain-function handlers: at most ``size``, started as needed. A call
    goes in with the caller's context (so :func:`jobfence.current_message` is its message) and
    its outcome comes back to the loop on a future; outcomes that finish close together come
    back in one wake-up of the loop instead of one each (a thread pool executor's future
    costs a chained future and a wake-up per call). Calls queue beyond the threads: a thread
    that returns takes the next waiting call itself, without sleeping until the loop hands it
    one. A call whose future was cancelled before a thread took it does not run, nor does a
    call taken once ``stopping`` is set (it fails with :class:`NotStarted`); one that runs
    cannot be stopped (its outcome is ignored).

    A call may also have a ``waiter``, a future the caller awaits instead of the call's own:
    the outcome goes to the waiter while it waits, else (it was cancelled) to the call's
    future, which the caller may then await for the outcome of a call it stopped waiting
    for (what ``asyncio.shield`` of the call's future gives, without its second future,
    callbacks and wake-up per call). :meth:`cancel_waiting` cancels both."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        size: int,
        name: str,
        stopping: threading.Event | None = None,
    ) -> None:
        self._loop = loop
        self._size = size
        self._name = name
        #: once set, a thread runs no further call: each one it takes fails with NotStarted
        self._stopping = stopping
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._finished: collections.deque[
            tuple[asyncio.Future[Any], asyncio.Future[Any] | None, Any, BaseException | None]
        ]
        self._finished = collections.deque()
        self._lock = threading.Lock()
        self._wakeup_sent = False
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def run(
        self, fn: Callable[[Any], Any], arg: Any, waiter: asyncio.Future[Any] | None = None
    ) -> asyncio.Future[Any]:
        """Call ``fn(arg)`` in a thread, in a copy of the current context (``waiter``: see
        the class)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        self._jobs.put((future, contextvars.copy_context(), fn, arg, waiter))
        with self._lock:
            spawn = self._idle == 0 and len(self._threads) < self._size
            if spawn:
                self._idle += 1  # counted now, so that the next call does not spawn too
        if spawn:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=False
            )
            self._threads.append(thread)
            thread.start()
        return future

    def _work(self) -> None:
        jobs, finished, lock, stopping = self._jobs, self._finished, self._lock, self._stopping
        while True:
            job = jobs.get()
            if job is None:
                return
            with lock:
                self._idle -= 1
            future, ctx, fn, arg, waiter = job
            if not future.cancelled():  # (a stale read only runs a call nobody awaits)
                if stopping is not None and stopping.is_set():
                    # taken after a stop, before the loop took the waiting calls back
                    finished.append((future, waiter, None, NotStarted("the worker is stopping")))
                else:
                    try:
                        finished.append((future, waiter, ctx.run(fn, arg), None))
                    except BaseException as exc:  # the handler's, for the loop to see
                        finished.append((future, waiter, None, exc))
                with lock:
                    wake = not self._wakeup_sent
                    self._wakeup_sent = True
                if wake:
                    try:
                        self._loop.call_soon_threadsafe(self._deliver)
                    except RuntimeError:  # the loop is closed: nobody awaits the outcome
                        pass
            del job, future, ctx, fn, arg, waiter
            with lock:
                self._idle += 1

    def _deliver(self) -> None:
        with self._lock:
            self._wakeup_sent = False
        finished = self._finished
        while finished:
            future, waiter, result, exc = finished.popleft()
            if waiter is not None and not waiter.done():
                future = waiter  # the caller still waits on it: the outcome is its only
            elif future.done():  # cancelled meanwhile: the outcome is ignored
                continue
            if exc is None:
                future.set_result(result)
            elif isinstance(exc, StopIteration):  # cannot be a future's exception
                future.set_exception(RuntimeError(f"the handler raised {exc!r}"))
            else:
                future.set_exception(exc)

    def cancel_waiting(self) -> None:
        """Take back the calls no thread took yet (they never run): a call with a waiter has
        both cancelled, one without has its future fail with :class:`NotStarted`."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                continue
            future, waiter = job[0], job[4]
            if waiter is not None:
                future.cancel()
                waiter.cancel()
            elif not future.done():
                future.set_exception(NotStarted("no handler thread took the call"))

    def shutdown(self) -> None:
        """Cancel the calls no thread took yet; let each thread end once it is done with its
        call (nothing waits for that)."""
        self.cancel_waiting()
        for _ in self._threads:
            self._jobs.put(None)
        self._threads = []


_Job = tuple[
    "asyncio.Future[Any]",
    contextvars.Context,
    Callable[[Any], Any],
    Any,
    "asyncio.Future[Any] | None",
]


class _Wakeup:
    """What the worker's loop waits on, beside its receives, for a handler to finish: a plain
    future armed for one turn of the loop (a task around ``Event.wait()`` would cost a task
    and two more hops per turn)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[None] | None = None

    def arm(self) -> asyncio.Future[None]:
        self._future = self._loop.create_future()
        return self._future

    def disarm(self) -> None:
        self._future = None

    def set(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)


async def _first(*aws: Any) -> None:
    """Wait until the first of ``aws`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class _ThreadedBackend(AsyncQueueBackend):
    """A sync queue backend driven from an event loop: each call runs in a thread."""

    def __init__(self, backend: QueueBackend) -> None:
        self.sync = backend
        self.kind = backend.kind
        self.capabilities = backend.capabilities
        self.name = backend.name

    async def publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], delay: float = 0.0
    ) -> None:
        await asyncio.to_thread(self.sync.publish, messages, delay)

    async def receive(
        self, consumer: str, max_messages: int, visibility: float, wait: float
    ) -> list[QueuedMessage]:
        return await asyncio.to_thread(self.sync.receive, consumer, max_messages, visibility, wait)

    async def ack(self, receipt: str, consumer: str) -> bool:
        return await asyncio.to_thread(self.sync.ack, receipt, consumer)

    async def ack_many(self, items: Sequence[tuple[str, str]]) -> list[bool]:
        """One thread call (and one round trip where the backend batches) per batch of acks."""
        return await asyncio.to_thread(self.sync.ack_many, items)

    async def nack(self, receipt: str, consumer: str, delay: float, error: str | None) -> bool:
        return await asyncio.to_thread(self.sync.nack, receipt, consumer, delay, error)

    async def defer(self, receipt: str, consumer: str, delay: float) -> bool:
        return await asyncio.to_thread(self.sync.defer, receipt, consumer, delay)

    async def renew(self, items: Sequence[RenewItem]) -> list[bool]:
        return await asyncio.to_thread(self.sync.renew, items)

    async def dead_letter(self, receipt: str, consumer: str, error: str | None) -> bool:
        return await asyncio.to_thread(self.sync.dead_letter, receipt, consumer, error)

    async def stats(self) -> QueueStats:
        return await asyncio.to_thread(self.sync.stats)

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        return await asyncio.to_thread(self.sync.dead_letters, limit)

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> int:
        return await asyncio.to_thread(self.sync.requeue_dead, ids)

    async def purge(self) -> int:
        return await asyncio.to_thread(self.sync.purge)

    async def install(self) -> None:
        await asyncio.to_thread(self.sync.install)

    async def drop(self) -> None:
        await asyncio.to_thread(self.sync.drop)

    async def close(self) -> None:
        """The sync queue owns the backend: its ``close()`` closes it."""


class Worker:
    """The worker for a blocking :class:`~jobfence.Queue`: the same loop as
    :class:`AsyncWorker`, run by :meth:`run` in an event loop of its own. For a queue opened
    from a URL, each run opens the asyncio client of the same URL and options on that loop
    (receives, batched acks and renewals without a thread each; RabbitMQ streams) and closes
    it at the end; a queue on a client or backend object of the caller's has its backend
    called in threads. Plain-function handlers run in a pool of ``concurrency`` threads.

    ``queue``: the :class:`~jobfence.Queue` to consume; ``handler``: called as
    ``handler(message)``, a plain function or an ``async def`` one (returning acks the
    message, raising gives it back); ``**options``: :class:`AsyncWorker`'s keyword
    arguments (``concurrency``, ``max_deliveries``, ``visibility``, ``backoff``,
    ``max_backoff``, ``shutdown_timeout``, ``prefetch``, ``handle_signals``)."""

    def __init__(self, queue: Queue, handler: Callable[[Any], Any], **options: Any) -> None:
        if not isinstance(queue, Queue):
            raise ConfigurationError(
                f"queue must be a jobfence.Queue (use jobfence.AsyncWorker for an AsyncQueue), "
                f"got {type(queue).__name__}",
                argument="queue",
            )
        self.queue = queue
        self._aqueue = AsyncQueue(
            _ThreadedBackend(queue.backend),
            queue.name,
            visibility=queue.visibility,
            serializer=queue.serializer,
        )
        self._aqueue.url = queue.url
        self._worker = AsyncWorker(self._aqueue, handler, **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.queue.name} concurrency={self.concurrency}>"

    def __getattr__(self, name: str) -> Any:
        # concurrency, max_deliveries, visibility, ... as configured on the loop
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._worker, name)

    @property
    def stats(self) -> WorkerStats:
        return self._worker.stats

    def run(self) -> WorkerStats:
        """Receive and handle messages until :meth:`stop` or SIGTERM/SIGINT, then drain.
        Blocks; returns the stats."""
        return asyncio.run(self._run())

    async def _run(self) -> WorkerStats:
        aqueue = self._open_native()
        if aqueue is None:
            return await self._worker.run()
        self._worker.queue = aqueue
        try:
            return await self._worker.run()
        finally:
            self._worker.queue = self._aqueue
            await aqueue.close()

    def _open_native(self) -> AsyncQueue | None:
        """The asyncio client of the same queue, for this run's event loop, when the queue
        was opened from a URL and the backend has one (its receives, batched acks and
        renewals then run on the loop, and RabbitMQ streams its deliveries, instead of each
        call taking a thread); ``None`` for a queue on a client or backend object of the
        caller's, whose calls run in threads."""
        opened = self.queue._opened_from
        if opened is None:
            return None
        url, options = opened
        try:
            aqueue = AsyncQueue(
                url,
                self.queue.name,
                visibility=self.queue.visibility,
                serializer=self.queue.serializer,
                **options,
            )
        except (ImportError, JobfenceError, TypeError) as exc:
            log.debug("queue %r: calling the blocking client in threads (%r)", self.queue.name, exc)
            return None
        aqueue.url = self.queue.url
        return aqueue

    def stop(self) -> None:
        """Ask :meth:`run` to stop (safe from any thread and from a handler)."""
        self._worker.stop()
