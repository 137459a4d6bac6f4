"""Where an outbox relay sends the rows it publishes.

A :class:`jobfence.Relay` / :class:`jobfence.AsyncRelay` takes its destination as ``to``:

* a queue URL (``"redis://..."``, ``"amqp://..."``, ``"postgresql://..."``,
  ``"sqlite:///file.db"``): the same as :func:`queues` of that URL -- each row goes to the
  jobfence queue named by its ``queue``, with message id = the row's id and the row's
  headers;
* a :class:`~jobfence.Queue` / :class:`~jobfence.AsyncQueue`: every row the relay claims goes
  to that queue (the relay claims the rows of that queue's name unless ``queues=`` says
  otherwise); the relay does not close it;
* a target object: an :class:`OutboxTarget` (:func:`queues`, or the framework targets below);
* a callable ``send(rows)``, plain or ``async def``, called with a list of
  :class:`~jobfence.backends.base.OutboxRow` (``row.id``, ``row.queue``, ``row.key``,
  ``row.body`` -- the JSON bytes as stored --, ``row.headers``): it must send them all or
  raise;
* a dict ``{queue name: any of the above}``: each row goes to the target of its queue, and
  the relay claims only the rows of those queues.

How the relay treats a target's exception: a broken link (:func:`jobfence.is_transient`, a
:class:`~jobfence.BackendError`, ``ConnectionError``, ``OSError``, ``TimeoutError``) means
the destination is down: the rows go back to the outbox without counting an attempt and the
relay backs off. Any other exception is the rows' own: the relay sends them one by one to
find the failing ones, which are retried later and given up (dead) after ``max_attempts``.

Publishing never re-encodes a body: the bytes the outbox stored are what the queue stores, so
a consumer of the queue decodes them with the queue's default (JSON) serializer unchanged.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from .._core import forks
from .._core.validate import check_queue_name
from ..backends.base import OutboxRow
from ..errors import ConfigurationError
from ..queue import Queue
from ..queue_async import AsyncQueue

__all__ = ["OutboxTarget", "queues", "task_body"]

log = logging.getLogger("jobfence.relay")

#: what a relay's ``to`` (or a value of its routes) may be
Destination = Any


class OutboxTarget:
    """The protocol of an outbox target, with its defaults: subclass it and implement
    :meth:`send` (blocking; used by :class:`jobfence.Relay`) and/or :meth:`send_async` (used
    by :class:`jobfence.AsyncRelay`).

    ``send(rows)`` gets rows in ``seq`` order (each key's rows in their order) and must send
    them all or raise (see the module for how a relay reads an exception). A re-send of a
    row carries the same ``row.id``: give it to the destination as the message / task id so
    a consumer can recognise the duplicate. :meth:`close` is called when the relay closes.

    The defaults: :meth:`send_async` runs :meth:`send` in a thread (a blocking target works
    under an ``AsyncRelay``); :meth:`send` refuses, for a target that only has
    :meth:`send_async` -- unless it overrides :meth:`send` with ``self.run(self.send_async(
    rows))``, which runs the coroutine on the target's own event loop.
    """

    #: what the relay's log lines and the ``outbox.publish`` hook call this target
    name: str = "target"

    def send(self, rows: list[OutboxRow]) -> None:
        raise ConfigurationError(
            f"{self.name} can only be used by an AsyncRelay (it has no blocking send)",
            argument="to",
        )

    async def send_async(self, rows: list[OutboxRow]) -> None:
        await asyncio.to_thread(self.send, rows)

    def close(self) -> None:
        """Release what the target opened (a blocking relay closes)."""
        self._close_loop()

    async def close_async(self) -> None:
        """Release what the target opened (an ``AsyncRelay`` closes)."""
        self.close()

    # -- a private event loop for coroutines a blocking relay must run -----------------------
    _loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to its end on this target's own event loop (made on first use,
        kept for the target's life so that clients bound to it stay usable, closed by
        :meth:`close`): how a blocking relay calls an ``async def`` send."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
            forks.register(self)
        return self._loop.run_until_complete(_as_coroutine(awaitable))

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.close()

    def _after_fork(self) -> None:
        # the parent's event loop (its selector, its clients) stays the parent's
        forks.keep(self._loop)
        self._loop = None


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def task_body(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The body of an outbox row meant for a framework target (Celery, RQ, Dramatiq, arq):
    ``{"args": [...], "kwargs": {...}}``: the task's positional arguments ``*args`` and
    keyword arguments ``**kwargs``, which must be JSON values:
    ``outbox.add(conn, queue="app.tasks.send_mail", body=task_body(7, lang="en"))``."""
    return {"args": list(args), "kwargs": dict(kwargs)}


# -- jobfence queues -----------------------------------------------------------------------
def _by_queue(rows: Sequence[OutboxRow]) -> dict[str, list[tuple[str, bytes, dict[str, str]]]]:
    """The rows as publish batches, one per destination queue name (each in seq order)."""
    out: dict[str, list[tuple[str, bytes, dict[str, str]]]] = {}
    for row in rows:
        out.setdefault(row.queue, []).append((row.id, bytes(row.body), dict(row.headers)))
    return out


class _QueuesTarget(OutboxTarget):
    """Each row to the jobfence queue named by its ``queue`` at ``url``: one ``Queue`` (or
    ``AsyncQueue``) per name, opened on first use with ``options``, kept, closed with the
    target. One publish round trip per destination queue of a batch."""

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        from .._core.url import mask_url

        self.url = url
        self.options = dict(options)
        self.name = f"queues({mask_url(url)})"
        self._sync: dict[str, Queue] = {}
        self._async: dict[str, AsyncQueue] = {}

    def __repr__(self) -> str:
        return f"<outbox target {self.name}>"

    def queue(self, name: str) -> Queue:
        """The blocking queue ``name`` (opened now if it is not yet)."""
        q = self._sync.get(name)
        if q is None:
            q = self._sync[name] = Queue(self.url, name, **self.options)
        return q

    def async_queue(self, name: str) -> AsyncQueue:
        """The asyncio queue ``name`` (opened now if it is not yet)."""
        q = self._async.get(name)
        if q is None:
            q = self._async[name] = AsyncQueue(self.url, name, **self.options)
        return q

    def send(self, rows: list[OutboxRow]) -> None:
        for name, batch in _by_queue(rows).items():
            self.queue(name)._publish_encoded(batch, 0.0)

    async def send_async(self, rows: list[OutboxRow]) -> None:
        for name, batch in _by_queue(rows).items():
            await self.async_queue(name)._publish_encoded(batch, 0.0)

    def close(self) -> None:
        opened, self._sync = list(self._sync.values()), {}
        for q in opened:
            try:
                q.close()
            except Exception as exc:
                log.warning("closing %r failed: %r", q, exc)
        super().close()

    async def close_async(self) -> None:
        opened, self._async = list(self._async.values()), {}
        for q in opened:
            try:
                await q.close()
            except Exception as exc:
                log.warning("closing %r failed: %r", q, exc)
        self.close()


class _QueueTarget(OutboxTarget):
    """Every row to one given queue (the caller's: never closed here)."""

    def __init__(self, queue: Queue | AsyncQueue) -> None:
        self.queue = queue
        self.name = f"queue({queue.name})"

    def __repr__(self) -> str:
        return f"<outbox target {self.name}>"

    def _batch(self, rows: Sequence[OutboxRow]) -> list[tuple[str, bytes, dict[str, str]]]:
        return [(row.id, bytes(row.body), dict(row.headers)) for row in rows]

    def send(self, rows: list[OutboxRow]) -> None:
        if isinstance(self.queue, AsyncQueue):  # refused when the relay was made
            raise ConfigurationError("an AsyncQueue needs an AsyncRelay", argument="to")
        self.queue._publish_encoded(self._batch(rows), 0.0)

    async def send_async(self, rows: list[OutboxRow]) -> None:
        if isinstance(self.queue, AsyncQueue):
            await self.queue._publish_encoded(self._batch(rows), 0.0)
        else:
            await asyncio.to_thread(self.queue._publish_encoded, self._batch(rows), 0.0)


def queues(url_or_queue: str | Queue | AsyncQueue, **options: Any) -> OutboxTarget:
    """The target that publishes each row to a jobfence queue, as message id ``row.id`` with
    the row's headers and its body as stored (not encoded again).

    ``url_or_queue``: a queue URL (``redis://``, ``amqp://``, ``postgresql://``,
    ``sqlite:///...``): each row goes to the queue named by its ``queue`` there, opened on
    first use (with ``options``, e.g. ``namespace=`` or ``table=``), kept open, and closed
    when the relay closes; or a :class:`~jobfence.Queue` / :class:`~jobfence.AsyncQueue`:
    every row goes to that queue, which the relay does not close. A batch costs one publish
    round trip per destination queue."""
    if isinstance(url_or_queue, (Queue, AsyncQueue)):
        if options:
            raise ConfigurationError(
                "options are for a queue URL; a Queue is used as it was opened",
                argument="options",
            )
        return _QueueTarget(url_or_queue)
    if not isinstance(url_or_queue, str) or "://" not in url_or_queue:
        raise ConfigurationError(
            "url_or_queue must be a queue URL (redis://, amqp://, postgresql://, "
            f"sqlite:///...) or a jobfence Queue/AsyncQueue, got {url_or_queue!r}",
            argument="url_or_queue",
        )
    return _QueuesTarget(url_or_queue, options)


# -- user callables ------------------------------------------------------------------------
def _is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class _CallableTarget(OutboxTarget):
    """``fn(rows)``, plain or ``async def``: under a blocking relay an ``async def`` one runs
    on the target's own event loop; under an ``AsyncRelay`` a plain one runs in a thread."""

    def __init__(self, fn: Callable[[list[OutboxRow]], Any]) -> None:
        self.fn = fn
        self.is_async = _is_async_callable(fn)
        self.name = getattr(fn, "__qualname__", None) or type(fn).__name__

    def __repr__(self) -> str:
        return f"<outbox target {self.name}>"

    def send(self, rows: list[OutboxRow]) -> None:
        result = self.fn(list(rows))
        if inspect.isawaitable(result):
            self.run(result)

    async def send_async(self, rows: list[OutboxRow]) -> None:
        if self.is_async:
            await self.fn(list(rows))
            return
        result = await asyncio.to_thread(self.fn, list(rows))
        if inspect.isawaitable(result):
            await result


# -- routing (used by the relay) -------------------------------------------------------------
class Routes:
    """Internal (the relay's): which target each claimed row goes to, which queue names the
    relay claims (``queues``, None: all), and the targets the relay closes (``owned``)."""

    def __init__(
        self,
        default: OutboxTarget | None,
        routes: Mapping[str, OutboxTarget],
        queues: list[str] | None,
        owned: list[OutboxTarget],
    ) -> None:
        self.default = default
        self.routes = dict(routes)
        self.queues = queues
        self.owned = owned

    def describe(self) -> str:
        """The targets, for a log line: ``name`` of each, or ``queue -> name`` per route."""
        if self.default is not None:
            return self.default.name
        return ", ".join(f"{queue} -> {target.name}" for queue, target in self.routes.items())

    def target_for(self, queue: str) -> OutboxTarget:
        target = self.routes.get(queue, self.default)
        if target is None:  # not claimed: the claim is limited to the routes' queues
            raise ConfigurationError(f"no route for queue {queue!r}", argument="to")
        return target

    def runs(self, rows: Iterable[OutboxRow]) -> list[tuple[OutboxTarget, list[OutboxRow]]]:
        """``rows`` (in seq order) split into runs of consecutive rows of one target."""
        out: list[tuple[OutboxTarget, list[OutboxRow]]] = []
        for row in rows:
            target = self.target_for(row.queue)
            if out and out[-1][0] is target:
                out[-1][1].append(row)
            else:
                out.append((target, [row]))
        return out


def _check_queues(value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable):
        raise ConfigurationError(
            f"queues must be None or a list of queue names, got {value!r}", argument="queues"
        )
    names = [check_queue_name(name, argument="queues") for name in value]
    if not names:
        raise ConfigurationError(
            "queues must name at least one queue (None: every queue)", argument="queues"
        )
    return list(dict.fromkeys(names))


def resolve(to: Destination, queues: object = None, *, asynchronous: bool) -> Routes:
    """Internal (the relay's): the :class:`Routes` of a relay's ``to`` and ``queues`` (see
    the module). ``asynchronous``: for an ``AsyncRelay`` (a blocking ``Relay`` refuses an
    ``AsyncQueue``). Opens nothing: queues are opened on first use."""
    names = _check_queues(queues)
    owned: list[OutboxTarget] = []
    by_url: dict[str, OutboxTarget] = {}

    def one(value: Destination, where: str) -> tuple[OutboxTarget, list[str] | None]:
        """The target of ``value`` and the queue names it implies (a Queue: its name)."""
        if isinstance(value, AsyncQueue) and not asynchronous:
            raise ConfigurationError(
                f"{where} is an AsyncQueue: use jobfence.AsyncRelay for it, or pass a Queue",
                argument="to",
            )
        if isinstance(value, (Queue, AsyncQueue)):
            return _QueueTarget(value), [value.name]
        if isinstance(value, str):
            if "://" not in value:
                raise ConfigurationError(
                    f"{where} must be a queue URL (redis://, amqp://, postgresql://, "
                    f"sqlite:///...), got {value!r}",
                    argument="to",
                )
            target = by_url.get(value)
            if target is None:
                target = by_url[value] = _QueuesTarget(value, {})
                owned.append(target)
            return target, None
        if isinstance(value, OutboxTarget):
            if value not in owned:
                owned.append(value)
            return value, None
        if isinstance(value, Mapping):
            raise ConfigurationError(
                f"{where} must not be a dict (routes do not nest)", argument="to"
            )
        if callable(value):
            target = _CallableTarget(value)
            owned.append(target)
            return target, None
        raise ConfigurationError(
            f"{where} must be a queue URL, a Queue, an outbox target "
            "(jobfence.integrations.outbox_targets) or a callable send(rows), got "
            f"{value!r}",
            argument="to",
        )

    if isinstance(to, Mapping):
        if not to:
            raise ConfigurationError("to must not be an empty dict of routes", argument="to")
        routes: dict[str, OutboxTarget] = {}
        for name, value in to.items():
            check_queue_name(name, argument="to")
            routes[name], _ = one(value, f"to[{name!r}]")
        if names is None:
            names = list(routes)
        else:
            unrouted = [n for n in names if n not in routes]
            if unrouted:
                raise ConfigurationError(
                    f"queues {unrouted} have no route in to (routes: {sorted(routes)})",
                    argument="queues",
                )
        return Routes(None, routes, names, owned)
    target, implied = one(to, "to")
    return Routes(target, {}, names if names is not None else implied, owned)


# -- framework targets ----------------------------------------------------------------------
# Celery, RQ, Dramatiq and arq: OutboxTarget subclasses whose queue= is the task name and
# whose body is task_body(...); each sends with the framework's id = row.id.
