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
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from .._core import forks
from .._core.validate import check_queue_name
from ..backends.base import OutboxRow
from ..conflicts import is_transient
from ..errors import BackendError, ConfigurationError
from ..queue import Queue
from ..queue_async import AsyncQueue

__all__ = [
    "OutboxTarget",
    "TaskCall",
    "arq",
    "celery",
    "dramatiq",
    "queues",
    "rq",
    "rq_job_id",
    "task_body",
    "task_call",
]

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
#
# A body that is not a task body raises ConfigurationError before anything of the batch is
# sent (the relay then sends the run row by row: only that row fails, and is dead after
# max_attempts). A broker that cannot be reached raises BackendError (the relay gives the
# rows back without counting an attempt). Nothing here imports a framework before it sends.

#: (module prefix, class name): a framework's "the broker cannot be reached" errors, matched
#: along each exception's MRO and chain (subclasses count)
_BROKER_DOWN = (
    ("kombu", "OperationalError"),  # Celery: refused / lost, after its own publish retries
    ("amqp", "ConnectionError"),  # py-amqp (Celery on RabbitMQ)
    ("amqp", "RecoverableConnectionError"),
    ("dramatiq", "BrokerConnectionError"),  # ConnectionFailed, ConnectionClosed
    ("pika", "AMQPConnectionError"),
    ("redis", "ConnectionError"),
    ("redis", "TimeoutError"),
    ("builtins", "OSError"),  # ConnectionRefusedError, socket timeouts, ...
)
#: the characters RQ allows in a job id
_RQ_SAFE = re.compile(r"[A-Za-z0-9_-]+")


@dataclasses.dataclass(frozen=True)
class TaskCall:
    """One outbox row as a task call: ``row.queue`` is the task's name, ``args`` and
    ``kwargs`` come from its task body."""

    row: OutboxRow
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.row.queue


def task_call(row: OutboxRow) -> TaskCall:
    """Decode ``row``'s body as a task body (``{"args": [...], "kwargs": {...}}``, as
    :func:`task_body` makes it; either key may be left out, no other key is allowed);
    :class:`~jobfence.errors.ConfigurationError` (argument ``body``) naming the row when it
    is not one."""
    try:
        value = json.loads(row.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _not_a_task_body(row, f"its body is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _not_a_task_body(row, f"its body is a JSON {type(value).__name__}")
    extra = sorted(set(value) - {"args", "kwargs"})
    if extra:
        raise _not_a_task_body(row, f"its body has keys other than args and kwargs: {extra}")
    args = value.get("args", [])
    kwargs = value.get("kwargs", {})
    if not isinstance(args, list):
        raise _not_a_task_body(row, f"its args is a JSON {type(args).__name__}, not a list")
    if not isinstance(kwargs, dict):
        raise _not_a_task_body(row, f"its kwargs is a JSON {type(kwargs).__name__}, not an object")
    return TaskCall(row, tuple(args), dict(kwargs))


def _not_a_task_body(row: OutboxRow, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"outbox row {row.id!r} (task {row.queue!r}) is not a task body: {why}; add rows for "
        "a framework target with body=task_body(*args, **kwargs)",
        argument="body",
    )


def _is_broker_down(exc: BaseException) -> bool:
    if is_transient(exc):
        return True
    link: BaseException | None = exc
    for _ in range(16):
        if link is None:
            break
        for klass in type(link).__mro__:
            module = getattr(klass, "__module__", "") or ""
            for prefix, name in _BROKER_DOWN:
                if klass.__name__ == name and (module == prefix or module.startswith(prefix + ".")):
                    return True
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return False


class _FrameworkTarget(OutboxTarget):
    """What the framework targets share: every row of a batch is decoded first (a bad body
    fails the batch before any of it is sent), a broker that cannot be reached is a
    :class:`~jobfence.errors.BackendError`. Subclasses implement :meth:`_send` (blocking)
    and may implement :meth:`_send_async`."""

    framework = "framework"

    def __repr__(self) -> str:
        return f"<outbox target {self.name}>"

    def _send(self, calls: list[TaskCall]) -> None:
        raise NotImplementedError

    async def _send_async(self, calls: list[TaskCall]) -> None:
        await asyncio.to_thread(self._send, calls)

    def _down(self, exc: Exception) -> BackendError | None:
        if isinstance(exc, (BackendError, ConfigurationError)) or not _is_broker_down(exc):
            return None
        return BackendError(
            f"{self.name}: the broker cannot be reached ({type(exc).__name__}: {exc})",
            backend=self.framework,
            operation="outbox.publish",
        )

    def send(self, rows: list[OutboxRow]) -> None:
        calls = [task_call(row) for row in rows]
        if not calls:
            return
        try:
            self._send(calls)
        except Exception as exc:
            down = self._down(exc)
            if down is None:
                raise
            raise down from exc

    async def send_async(self, rows: list[OutboxRow]) -> None:
        calls = [task_call(row) for row in rows]
        if not calls:
            return
        try:
            await self._send_async(calls)
        except Exception as exc:
            down = self._down(exc)
            if down is None:
                raise
            raise down from exc


def _headers(call: TaskCall) -> dict[str, str]:
    return dict(call.row.headers or {})


#: the headers of Celery's task message protocol (v2): a row header of one of these names
#: would overwrite the task's own (its id, its name, ...)
_CELERY_HEADERS = frozenset(
    {
        "argsrepr", "eta", "expires", "group", "group_index", "id", "ignore_result",
        "kwargsrepr", "lang", "origin", "parent_id", "replaced_task_nesting", "retries",
        "root_id", "shadow", "stamped_headers", "stamps", "task", "timelimit",
    }
)  # fmt: skip


class _CeleryTarget(_FrameworkTarget):
    framework = "celery"

    def send(self, rows: list[OutboxRow]) -> None:
        _check_celery_headers(rows)
        super().send(rows)

    async def send_async(self, rows: list[OutboxRow]) -> None:
        _check_celery_headers(rows)
        await super().send_async(rows)

    def __init__(self, app: Any) -> None:
        self.app = app
        self.name = f"celery({getattr(app, 'main', None) or type(app).__name__})"

    def _send(self, calls: list[TaskCall]) -> None:
        with self.app.producer_or_acquire() as producer:
            for call in calls:
                self.app.send_task(
                    call.name,
                    args=call.args,
                    kwargs=call.kwargs,
                    task_id=call.row.id,
                    headers=_headers(call) or None,
                    producer=producer,
                )


def _check_celery_headers(rows: list[OutboxRow]) -> None:
    for row in rows:
        clash = sorted(_CELERY_HEADERS.intersection(row.headers or {}))
        if clash:
            raise ConfigurationError(
                f"outbox row {row.id!r} (task {row.queue!r}) has headers {clash}, names of "
                "Celery's own message headers: rename them",
                argument="headers",
            )


def celery(app: Any) -> OutboxTarget:
    """The target that sends each row as Celery task ``row.queue`` (the task's registered
    name) with the row's task body: ``app.send_task(row.queue, args, kwargs,
    task_id=row.id, headers=row.headers)``, a batch on one producer (one broker
    connection). The Celery queue a task goes to is the app's routing (``task_routes``,
    else ``task_default_queue``). A row whose headers use a name of Celery's own message
    headers (``id``, ``task``, ``eta``, ...) fails on its own. A task guarded by
    :mod:`jobfence.integrations.celery` without ``key=`` has the key ``"celery:<row id>"``:
    a re-sent row runs once."""
    if not callable(getattr(app, "send_task", None)) or not callable(
        getattr(app, "producer_or_acquire", None)
    ):
        raise ConfigurationError(f"app must be a Celery app, got {app!r}", argument="app")
    return _CeleryTarget(app)


def rq_job_id(row_id: str) -> str:
    """The RQ job id of outbox row ``row_id``: the id itself when RQ allows it (only ``A-Z
    a-z 0-9 _ -``, as the default uuid4 hex ids), else
    :func:`jobfence.integrations.schedule_targets.rq_job_id` of it (the id made readable,
    plus a digest)."""
    if _RQ_SAFE.fullmatch(row_id):
        return row_id
    from .schedule_targets import rq_job_id as readable

    return readable(row_id)


class _RQTarget(_FrameworkTarget):
    framework = "rq"

    def __init__(self, connection: Any, queue: str) -> None:
        self.connection = connection
        self.queue_name = queue
        self.name = f"rq({queue})"
        self._queue: Any = None

    def _send(self, calls: list[TaskCall]) -> None:
        from rq import Queue as RQQueue
        from rq.job import Job

        if self._queue is None:
            self._queue = RQQueue(self.queue_name, connection=self.connection)
        ids = [rq_job_id(call.row.id) for call in calls]
        pipe = self.connection.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(Job.key_for(job_id))
        stored = pipe.execute()
        todo, seen = [], set()
        for call, job_id, exists in zip(calls, ids, stored, strict=True):
            if exists or job_id in seen:
                continue  # a re-send of a row whose job RQ still holds
            seen.add(job_id)
            todo.append(
                self._queue.prepare_data(
                    call.name,
                    args=call.args,
                    kwargs=call.kwargs,
                    job_id=job_id,
                    meta={"headers": _headers(call)},
                )
            )
        if todo:
            self._queue.enqueue_many(todo)


def rq(connection: Any, queue: str = "default") -> OutboxTarget:
    """The target that enqueues each row on RQ queue ``queue`` (its name) of Redis
    ``connection`` (a ``redis.Redis``): the job calls ``row.queue``, a function's dotted path
    (``"app.tasks.send_receipt"``), with the row's task body, as job :func:`rq_job_id` of the
    row id, with ``meta={"headers": row.headers}``. A job of that id still stored in Redis is
    not enqueued again (RQ would overwrite it and queue it twice): a batch costs one
    ``EXISTS`` pipeline and one ``enqueue_many`` pipeline. A function guarded by
    :mod:`jobfence.integrations.rq` without ``key=`` has the key ``"rq:<job id>"``."""
    if not callable(getattr(connection, "pipeline", None)):
        raise ConfigurationError(
            f"connection must be a redis.Redis connection, got {connection!r}",
            argument="connection",
        )
    if not isinstance(queue, str) or not queue:
        raise ConfigurationError(f"queue must be an RQ queue name, got {queue!r}", argument="queue")
    return _RQTarget(connection, queue)


class _DramatiqTarget(_FrameworkTarget):
    framework = "dramatiq"

    def __init__(self, broker: Any, queue_name: str | None) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.name = f"dramatiq({type(broker).__name__})"

    def _queue_of(self, call: TaskCall) -> str:
        if self.queue_name is not None:
            return self.queue_name
        from dramatiq.errors import ActorNotFound

        try:
            return str(self.broker.get_actor(call.name).queue_name)
        except ActorNotFound:
            raise ConfigurationError(
                f"outbox row {call.row.id!r}: no Dramatiq actor {call.name!r} is declared on "
                "the target's broker in this process: import the module that declares it, or "
                "give dramatiq(broker, queue_name=...)",
                argument="queue",
            ) from None

    def _send(self, calls: list[TaskCall]) -> None:
        from dramatiq import Message

        messages: list[Any] = [
            Message(
                queue_name=self._queue_of(call),
                actor_name=call.name,
                args=call.args,
                kwargs=call.kwargs,
                options={"headers": _headers(call)} if call.row.headers else {},
                message_id=call.row.id,
            )
            for call in calls
        ]
        for message in messages:
            self.broker.enqueue(message)


def dramatiq(broker: Any, *, queue_name: str | None = None) -> OutboxTarget:
    """The target that enqueues each row on Dramatiq ``broker`` (Redis, RabbitMQ, ...) as a
    message for actor ``row.queue`` (its ``actor_name``) with the row's task body,
    ``message_id=row.id`` and ``options["headers"] = row.headers``, on the actor's queue --
    the actor must be declared on ``broker`` in the relay's process (import its module) --
    or on ``queue_name`` when given (no actor is looked up). A row for an actor that is not
    declared fails on its own (not the batch). An actor guarded by
    :mod:`jobfence.integrations.dramatiq` without ``key=`` has the key
    ``"dramatiq:<row id>"``."""
    if not callable(getattr(broker, "enqueue", None)) or not callable(
        getattr(broker, "get_actor", None)
    ):
        raise ConfigurationError(
            f"broker must be a Dramatiq broker, got {broker!r}", argument="broker"
        )
    if queue_name is not None and (not isinstance(queue_name, str) or not queue_name):
        raise ConfigurationError(
            f"queue_name must be None or a Dramatiq queue name, got {queue_name!r}",
            argument="queue_name",
        )
    return _DramatiqTarget(broker, queue_name)


class _ArqTarget(_FrameworkTarget):
    framework = "arq"

    def __init__(self, given: Any, queue_name: str | None) -> None:
        self.given = given if callable(getattr(given, "enqueue_job", None)) else None
        self.settings = None if self.given is not None else given
        self.options = {} if queue_name is None else {"_queue_name": queue_name}
        self.name = f"arq({queue_name or 'default queue'})"
        #: the pools this target made, by event loop (the relay's, or the target's own)
        self._pools: dict[asyncio.AbstractEventLoop, Any] = {}

    async def _pool(self) -> Any:
        if self.given is not None:
            return self.given
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            from arq import create_pool

            pool = self._pools[loop] = await create_pool(self.settings)
        return pool

    async def _send_async(self, calls: list[TaskCall]) -> None:
        pool = await self._pool()
        for call in calls:
            # None when arq refuses the id (its job is queued, or its result kept): sent already
            await pool.enqueue_job(
                call.name, *call.args, _job_id=call.row.id, **self.options, **call.kwargs
            )

    def _send(self, calls: list[TaskCall]) -> None:
        if self.given is not None:
            raise ConfigurationError(
                "a blocking Relay cannot use an arq pool made on another event loop: give "
                "arq.connections.RedisSettings (the target makes its own pool), or use an "
                "AsyncRelay on the pool's event loop",
                argument="pool_or_settings",
            )
        self.run(self._send_async(calls))

    async def _close_pools(self, loop: asyncio.AbstractEventLoop) -> None:
        pool = self._pools.pop(loop, None)
        if pool is not None:
            await pool.aclose()

    def close(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and loop in self._pools:
            try:
                self.run(self._close_pools(loop))
            except Exception as exc:
                log.warning("closing the arq pool of %s failed: %r", self.name, exc)
        super().close()

    async def close_async(self) -> None:
        try:
            await self._close_pools(asyncio.get_running_loop())
        except Exception as exc:
            log.warning("closing the arq pool of %s failed: %r", self.name, exc)
        self.close()

    def _after_fork(self) -> None:
        # the parent's pools (their sockets) stay the parent's
        self._pools = {}
        super()._after_fork()


def arq(pool_or_settings: Any, *, queue_name: str | None = None) -> OutboxTarget:
    """The target that enqueues each row as arq job ``row.queue`` (the function's name in
    the worker's ``WorkerSettings.functions``) with the row's task body: ``await
    pool.enqueue_job(row.queue, *args, _job_id=row.id, **kwargs)`` (arq has no headers).
    arq refuses an id whose job is queued or whose result is kept: a re-sent row is then
    not queued again.

    ``pool_or_settings``: an ``ArqRedis`` pool (``arq.create_pool``): for an
    :class:`jobfence.AsyncRelay` on that pool's event loop (the target does not close it);
    or ``arq.connections.RedisSettings``: the target makes a pool per event loop -- the
    ``AsyncRelay``'s, or, under a blocking :class:`jobfence.Relay`, the target's own -- and
    closes them with the relay. ``queue_name``: the arq queue (``_queue_name``; default: the
    pool's default queue, ``arq:queue`` for a pool made from settings). A function guarded
    by :mod:`jobfence.integrations.arq` without ``key=`` has the key ``"arq:<row id>"``."""
    given = pool_or_settings
    if not callable(getattr(given, "enqueue_job", None)) and not hasattr(given, "host"):
        raise ConfigurationError(
            "pool_or_settings must be an arq pool (arq.create_pool) or "
            f"arq.connections.RedisSettings, got {given!r}",
            argument="pool_or_settings",
        )
    if queue_name is not None and (not isinstance(queue_name, str) or not queue_name):
        raise ConfigurationError(
            f"queue_name must be None or an arq queue name, got {queue_name!r}",
            argument="queue_name",
        )
    return _ArqTarget(given, queue_name)
