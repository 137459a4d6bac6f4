"""Send a schedule's slots to Celery, RQ, Dramatiq or arq, under a task id made from the slot.

Each function here returns a ``send(slot)`` callable for ``Scheduler.cron(..., send=...)``,
``Scheduler.every(..., send=...)`` or ``Scheduler.add(..., send=...)``:

```python
from jobfence.integrations import schedule_targets

sched.add("nightly-report", cron="0 3 * * *", send=schedule_targets.celery(report, "eu"))
```

The scheduler fires each slot once across all its processes. One case remains where a slot is
sent twice: a process sends the task, then dies (or stalls past its ``lease``) before it records
the slot, and another process takes the slot over and sends it again. Both sends carry the
same framework id, derived from the slot key (``schedule:<name>@<UTC ISO time>``):

* Celery: ``task_id`` = the slot key;
* RQ: ``job_id`` = :func:`rq_job_id` of the slot key (RQ allows only letters, digits, ``_``
  and ``-``), and a job with that id still stored in Redis is not enqueued again;
* Dramatiq: ``message_id`` = the slot key;
* arq: ``_job_id`` = the slot key (arq itself refuses a job whose id is queued or whose result
  is kept).

So the consumer sees the same id twice, and a task guarded with the framework integration
(``jobfence.integrations.celery.guarded`` and the others) without a ``key=`` template uses
``"<framework>:<that id>"`` as its idempotency key: the second message is a duplicate and
returns the stored result without running. A ``key=`` template of your own over the slot
(``slot_kwarg="slot"`` and ``key="report:{slot}"``) deduplicates the same way, whatever the
id.

Every function takes the task's own positional and keyword arguments, plus:

* ``slot_kwarg`` -- the name of a keyword argument that receives the slot's time, in UTC, as
  ``"2026-12-04T15:30:00Z"`` (default: none is passed);
* ``options`` -- the framework's own send options (Celery ``apply_async`` options such as
  ``queue``; RQ ``enqueue_call`` options such as ``result_ttl``; Dramatiq message options and
  ``delay``; arq ``_queue_name``, ``_defer_by``, ...), except the id, which is the slot's.

Nothing here imports a framework: each target calls the object you give it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from .._core import slots as slotmath
from .._core.schedule_info import Slot
from ..errors import ConfigurationError

__all__ = ["arq", "celery", "dramatiq", "rq", "rq_job_id", "slot_time"]

#: the characters RQ allows in a job id
_RQ_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: how much of the slot key an RQ job id keeps readable (the digest keeps it unique)
_RQ_READABLE = 100


def slot_time(slot: Slot) -> str:
    """The time of ``slot`` in UTC, to the second: ``"2026-12-04T15:30:00Z"`` (what
    ``slot_kwarg`` passes)."""
    return slotmath.slot_iso(int(slot.at.timestamp()))


def rq_job_id(key: str) -> str:
    """The RQ job id of slot key ``key``: the key with every character RQ does not allow (all
    but ``A-Z a-z 0-9 _ -``) replaced by ``_``, cut to 100 characters, then ``-`` and the
    first 16 hex digits of the key's SHA-256, so that two keys never share an id.

    ``schedule:report@2026-12-04T15:30:00Z`` gives
    ``schedule_report_2026-12-04T15_30_00Z-<16 hex>``."""
    readable = _RQ_UNSAFE.sub("_", key)[:_RQ_READABLE]
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return f"{readable}-{digest}"


def _check_slot_kwarg(slot_kwarg: object) -> str | None:
    if slot_kwarg is None:
        return None
    if not isinstance(slot_kwarg, str) or not slot_kwarg.isidentifier():
        raise ConfigurationError(
            f"slot_kwarg must be None or the name of a keyword argument, got {slot_kwarg!r}",
            argument="slot_kwarg",
        )
    return slot_kwarg


def _check_options(options: object, id_option: str) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"options must be a mapping of send options, got {options!r}", argument="options"
        )
    if id_option in options:
        raise ConfigurationError(
            f"options must not set {id_option}: it is derived from the slot key, so that a "
            "slot sent twice is one task",
            argument="options",
        )
    return dict(options)


def _arguments(kwargs: dict[str, Any], slot_kwarg: str | None, slot: Slot) -> dict[str, Any]:
    if slot_kwarg is None:
        return dict(kwargs)
    return {**kwargs, slot_kwarg: slot_time(slot)}


def _named(send: Callable[[Slot], Any], what: str) -> Callable[[Slot], Any]:
    # the scheduler shows a send target by its qualified name (``schedule show``)
    send.__qualname__ = send.__name__ = what
    return send


def _describe(obj: Any) -> str:
    return str(getattr(obj, "name", None) or getattr(obj, "actor_name", None) or obj)


def celery(
    task: Any,
    *args: Any,
    slot_kwarg: str | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[[Slot], Any]:
    """A target that sends Celery task ``task`` (a task, or a signature) with ``args`` /
    ``kwargs`` and ``task_id`` = the slot key: ``task.apply_async(args, kwargs,
    task_id=slot.key, **options)``. Returns the ``AsyncResult``.

    ``slot_kwarg`` and ``options`` (``apply_async`` options, not ``task_id``): see the
    module's description."""
    if not callable(getattr(task, "apply_async", None)):
        raise ConfigurationError(
            f"task must be a Celery task or signature (with apply_async), got {task!r}",
            argument="task",
        )
    name = _check_slot_kwarg(slot_kwarg)
    opts = _check_options(options, "task_id")

    def send(slot: Slot) -> Any:
        return task.apply_async(args, _arguments(kwargs, name, slot), task_id=slot.key, **opts)

    return _named(send, f"celery({_describe(task)})")


def rq(
    queue: Any,
    func: Any,
    *args: Any,
    slot_kwarg: str | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[[Slot], Any]:
    """A target that enqueues ``func`` (a function or its dotted path) with ``args`` /
    ``kwargs`` on RQ queue ``queue`` as job :func:`rq_job_id` of the slot key:
    ``queue.enqueue_call(func, args, kwargs, job_id=..., **options)``. Returns the ``Job``,
    or ``None`` when a job of that id is still stored in Redis (the slot was sent already;
    RQ would otherwise overwrite that job and queue it again).

    ``slot_kwarg`` and ``options`` (``enqueue_call`` options such as ``result_ttl``,
    ``retry``; not ``job_id``): see the module's description."""
    if not callable(getattr(queue, "enqueue_call", None)):
        raise ConfigurationError(f"queue must be an rq.Queue, got {queue!r}", argument="queue")
    if not (callable(func) or isinstance(func, str)):
        raise ConfigurationError(
            f"func must be a function or its dotted path, got {func!r}", argument="func"
        )
    name = _check_slot_kwarg(slot_kwarg)
    opts = _check_options(options, "job_id")

    def send(slot: Slot) -> Any:
        from rq.job import Job

        job_id = rq_job_id(slot.key)
        if Job.exists(job_id, connection=queue.connection):
            return None
        return queue.enqueue_call(
            func, args=args, kwargs=_arguments(kwargs, name, slot), job_id=job_id, **opts
        )

    what = func if isinstance(func, str) else getattr(func, "__qualname__", repr(func))
    return _named(send, f"rq({queue.name}, {what})")


def dramatiq(
    actor: Any,
    *args: Any,
    slot_kwarg: str | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[[Slot], Any]:
    """A target that sends a message to Dramatiq actor ``actor`` with ``args`` / ``kwargs``
    and ``message_id`` = the slot key: the message ``actor.message_with_options(...)`` builds,
    copied with that id, enqueued on the actor's broker (Dramatiq's ``send`` always makes a
    new id). Returns the enqueued message.

    ``options``: the message options ``send_with_options`` takes, ``delay`` (milliseconds or a
    ``timedelta``) included; not ``message_id``. ``slot_kwarg``: see the module's
    description."""
    if not callable(getattr(actor, "message_with_options", None)) or not hasattr(actor, "broker"):
        raise ConfigurationError(f"actor must be a Dramatiq actor, got {actor!r}", argument="actor")
    name = _check_slot_kwarg(slot_kwarg)
    opts = _check_options(options, "message_id")
    delay = opts.pop("delay", None)
    if delay is not None and hasattr(delay, "total_seconds"):
        delay = int(delay.total_seconds() * 1000)

    def send(slot: Slot) -> Any:
        message = actor.message_with_options(
            args=args, kwargs=_arguments(kwargs, name, slot), **opts
        )
        return actor.broker.enqueue(message.copy(message_id=slot.key), delay=delay)

    return _named(send, f"dramatiq({_describe(actor)})")


def arq(
    pool_or_redis_settings: Any,
    function: str,
    *args: Any,
    slot_kwarg: str | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[[Slot], Any]:
    """A target (``async def``: for :class:`jobfence.AsyncScheduler`) that enqueues arq
    function ``function`` (its name in ``WorkerSettings.functions``) with ``args`` /
    ``kwargs`` and ``_job_id`` = the slot key: ``await pool.enqueue_job(function, *args,
    _job_id=slot.key, **options, **kwargs)``. Returns the ``Job``, or ``None`` when arq
    refuses the id (the slot's job is queued, or its result still kept).

    ``pool_or_redis_settings``: an ``ArqRedis`` pool (made with ``arq.create_pool``, on the
    event loop the scheduler runs on) or ``arq.connections.RedisSettings``, from which a pool
    is made on the first send and kept. ``options``: ``enqueue_job``'s own options
    (``_queue_name``, ``_defer_by``, ``_expires``, ...; not ``_job_id``). ``slot_kwarg``: see
    the module's description.

    The sync :class:`jobfence.Scheduler` calls a target without awaiting it: use an
    :class:`jobfence.AsyncScheduler` for arq."""
    given = pool_or_redis_settings
    is_pool = callable(getattr(given, "enqueue_job", None))
    if not is_pool and not hasattr(given, "host"):
        raise ConfigurationError(
            "pool_or_redis_settings must be an arq pool (arq.create_pool) or "
            f"arq.connections.RedisSettings, got {given!r}",
            argument="pool_or_redis_settings",
        )
    if not isinstance(function, str) or not function:
        raise ConfigurationError(
            f"function must be the name of an arq function, got {function!r}",
            argument="function",
        )
    name = _check_slot_kwarg(slot_kwarg)
    opts = _check_options(options, "_job_id")
    pools: list[Any] = [given] if is_pool else []

    async def send(slot: Slot) -> Any:
        if not pools:
            from arq import create_pool

            pool = await create_pool(given)
            if pools:  # another slot's send made one meanwhile
                await pool.aclose()
            else:
                pools.append(pool)
        return await pools[0].enqueue_job(
            function, *args, _job_id=slot.key, **opts, **_arguments(kwargs, name, slot)
        )

    return _named(send, f"arq({function})")
