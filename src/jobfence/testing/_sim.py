"""One schedule of a scenario: the tasks, the points, the faults and the checks.

A :class:`Simulation` (the ``sim`` a scenario receives) owns the tasks of one run. Every
task is an asyncio task on a :class:`~jobfence.testing._loop.SimLoop` (or a thread, for a
plain function, and for the threads jobfence starts in a task: a sync client's renewer) and
runs only between two *points*: the jobfence hook points (every backend operation and
sleep), the points of simulated tables, and ``testing.point(name)`` (awaited in async
code). At
a point the strategy decides who goes on; everything between two points runs alone, so a
schedule is a sequence of decisions (the *tape*) and replays exactly.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import math
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn, TypeVar, cast, overload

from .._core import compat
from .._core.clock import Clock
from .._core.hooks import hook
from ..errors import ConfigurationError, JobfenceError
from ._base import _Budget, _Crashed, _Deadlock, _Statement, _Stop
from .faults import DEFAULT_PAUSE, Fault, InjectedFault, target_of
from .strategies import Fifo, Random, Strategy

if TYPE_CHECKING:
    from ..inbox import Inbox
    from ..inbox_async import AsyncInbox
    from ..locks import Locks
    from ..locks_async import AsyncLocks
    from ..outbox import Outbox
    from ..outbox_async import AsyncOutbox
    from ..queue import Queue
    from ..queue_async import AsyncQueue
    from ._loop import SimLoop
    from .checkers import Checker
    from .table import SimTable, _Table
    from .table_real import RealTable

__all__ = ["SimClock", "SimTask", "Simulation", "Violation", "point"]

C = TypeVar("C")

#: the simulation running now (one at a time per process); the hook routes points here
_current: Simulation | None = None
_PROCESS: contextvars.ContextVar[_Process | None] = contextvars.ContextVar(
    "jobfence_sim_process", default=None
)
#: virtual time 0 is this wall-clock instant (2026-01-01T00:00:00Z), the same in every run
EPOCH = 1_767_225_600.0
_ids = itertools.count(1)
# the task each running loop runs now (what asyncio.current_task reads), read directly: a
# simulation asks it at every point
_CURRENT_TASKS: dict[Any, Any] | None = getattr(asyncio.tasks, "_current_tasks", None)
_running_loop = asyncio._get_running_loop
#: the thread asking: compared with the loop's ``_thread_id`` (set while it runs), which
#: tells what ``_running_loop() is loop`` tells without its cost (on CPython 3.11 every
#: ``_get_running_loop()`` calls ``getpid()``, a system call, to notice a fork)
_get_ident = threading.get_ident
#: ``_swap_current_task(loop, task)``: make ``task`` what ``asyncio.current_task()`` answers
#: on ``loop``, returning the one it answered before (CPython 3.12+ has it; on 3.11 the dict
#: of current tasks is written directly)
_swap_current: Callable[[Any, Any], Any] | None = getattr(asyncio.tasks, "_swap_current_task", None)
#: on 3.11, the dict itself: the scheduler writes it inline at every switch
_SWAP_DICT: dict[Any, Any] | None = None
if _swap_current is None and _CURRENT_TASKS is not None:
    _current_tasks: dict[Any, Any] = _CURRENT_TASKS
    _SWAP_DICT = _CURRENT_TASKS

    def _swap_current(loop: Any, task: Any) -> Any:
        previous = _current_tasks.get(loop)
        _current_tasks[loop] = task
        return previous


#: the scheduler steps the coroutines of spawned tasks itself at their points (see
#: ``Simulation._slice``): it needs ``create_task(context=)`` (3.11), a way to set the current
#: task, and to see a cancellation requested of a task while it runs (``Task._must_cancel``)
_DIRECT = (
    sys.version_info >= (3, 11)
    and _swap_current is not None
    and hasattr(asyncio.Task, "_must_cancel")
)
#: what a gate yields to the scheduler's stepping when its task parks (instead of a future)
_SWITCH = object()
#: what a driven task's driver is told to do (``SimTask.command``): resume at the gate, wait
#: for an asyncio future (or a bare yield), or end with a result or an exception
_GO, _AWAIT, _DONE, _FAILED = range(4)
_PARKED = (-1, None)
#: what a driver returns for a job whose end another driver concluded
_CONCLUDED = object()
#: points after which a process holds something another process recovers once it expires
_TAKES = frozenset({"lock.acquire", "inbox.claim", "queue.receive", "outbox.claim"})


class Hit(NamedTuple):
    """One hit of a point in :attr:`Simulation.trail`: the ``point``, its ``nth`` hit over
    every target, its ``target`` (:func:`~jobfence.testing.faults.target_of`) and ``tnth``, its
    hit among those at that target; whether the ``task``'s process ``holds`` a lease, claim or
    delivery there; the ``fault`` injected at it, if any. ``faults="auto"`` plans its faults
    from schedule 0's trail; a failure reports the faults injected from its own."""

    point: str
    nth: int
    target: str | None
    tnth: int
    holds: bool
    task: SimTask
    fault: Fault | None


class Violation(Exception):
    """A check failed: what the schedule's failure reports (``check`` and ``message``)."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check
        self.message = message


@dataclass(eq=False, init=False)
class _Process:
    """A group of tasks that stop and die together: a spawned task and every task started
    from it (its clients' renewers)."""

    name: str
    paused_until: float | None = None
    crashed: bool = False
    background: int = 0
    #: it has taken a lease, a claim or a delivery: work someone else takes over once it
    #: expires, so pausing or crashing it here is a fault worth trying
    holds: bool = False
    #: seconds its wall clock (``get_clock().time()``) is ahead of the schedule's true time
    skew: float = 0.0

    def __init__(self, name: str) -> None:
        # what every decision reads; the others start as the class's defaults
        self.name = name
        self.paused_until = None
        self.crashed = False


@dataclass(eq=False, init=False)
class SimTask:
    """A task of the simulation: ``name`` (``t1``, ``t2``... in spawn order, or what
    ``spawn`` was given; background tasks are ``t1.1``, ``t1.2``...), its result or error
    once done."""

    name: str
    process: _Process
    thread: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    # scheduling state
    waiter: asyncio.Future[None] | None = field(default=None, repr=False)
    go: threading.Event | None = field(default=None, repr=False)
    parked_at: str | None = None
    wait_event: threading.Event | None = field(default=None, repr=False)
    wait_until: float | None = None
    atask: asyncio.Task[Any] | None = field(default=None, repr=False)
    finished: asyncio.Future[Any] | None = field(default=None, repr=False)
    # direct stepping (async tasks spawned on CPython 3.11+): the job's coroutine and its
    # context, stepped by whichever task's driver runs; ``park``, the future its own driver
    # waits on while the coroutine is parked or stepped by another driver; ``command``, what
    # that driver does once woken
    driven: bool = False
    coro: Any = field(default=None, repr=False)
    ctx: contextvars.Context | None = field(default=None, repr=False)
    #: ``coro.send``, bound once: what the slice steps another task's coroutine with
    send: Any = field(default=None, repr=False)
    park: asyncio.Future[None] | None = field(default=None, repr=False)
    command: tuple[int, Any] | None = field(default=None, repr=False)
    # a thread task: its thread, and an event set once it runs no more simulated code
    os_thread: threading.Thread | None = field(default=None, repr=False)
    ended: threading.Event | None = field(default=None, repr=False)

    def __init__(self, name: str, process: _Process, thread: bool = False) -> None:
        # the fields every task's scheduling reads; the others (a thread task's, an
        # undriven task's) start as the class's defaults: no assignment for them per task
        self.name = name
        self.process = process
        self.thread = thread
        self.done = False
        self.result = None
        self.error = None
        self.parked_at = None
        self.atask = None
        self.driven = False
        self.park = None
        self.command = None


#: modules whose reads of the clock stand for a server's clock: the ``memory://`` stores of a
#: schedule read its true time, whichever task calls them (a server has one clock)
_SERVER_MODULES = "jobfence.backends.memory."


class SimClock(Clock):
    """Virtual time: the loop's clock, moved only when every task waits.

    :meth:`time` is the schedule's true wall-clock time plus the skew of the calling task's
    process (:meth:`Simulation.skew`); :meth:`monotonic` is never skewed."""

    #: an async renewer with no lease to look after waits until it is woken (a lease added,
    #: the client closed) instead of ticking every ``IDLE_WAIT``: here nothing else can make
    #: one due, and idle ticks would be steps through every long virtual pause
    idle_unbounded = True

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.vtime

    def time(self) -> float:
        now = EPOCH + self._loop.vtime
        sim = _current
        if sim is None or not sim.skewed:
            return now
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(_SERVER_MODULES):
            return now
        task = sim.current()
        return now if task is None else now + task.process.skew

    async def wait_async(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        if timeout <= 0:
            return False
        if type(event) is asyncio.Event and self._loop._thread_id == _get_ident():  # type: ignore[attr-defined]
            return await _wait_event(self._loop, event, timeout)
        return await super().wait_async(event, timeout)

    def sleep(self, seconds: float) -> None:
        """A blocking sleep (a ``sleep`` point): a thread task waits ``seconds`` of virtual
        time, the others run meanwhile."""
        hook("sleep", seconds=seconds)
        sim = _current
        if sim is None:
            return
        sim.thread_wait(None, seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """A blocking wait for ``event``: a thread task waits at most ``timeout`` seconds of
        virtual time (no point: waking is the scheduler's decision)."""
        if event.is_set():
            return True
        sim = _current
        if sim is None or timeout <= 0:
            return event.is_set()
        sim.thread_wait(event, timeout)
        return event.is_set()


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _wait_event(loop: SimLoop, event: asyncio.Event, timeout: float) -> bool:
    """:meth:`SimClock.wait_async` for a plain ``asyncio.Event``: one future among the
    event's waiters and one timer, instead of a task and ``asyncio.wait`` per wait (the
    renewers' pauses and the ``memory://`` backends' waits for a release go through here,
    dozens of times per schedule)."""
    waiters = event._waiters  # type: ignore[attr-defined]
    fut: asyncio.Future[None] = loop.create_future()
    waiters.append(fut)
    timer = loop.call_at(loop.vtime + timeout, _expire, fut)
    try:
        await fut
    finally:
        timer.cancel()
        try:
            waiters.remove(fut)
        except ValueError:
            pass
    return event.is_set()


class _Gate:
    """What the hook returns to an async caller at a point: awaiting it is the decision."""

    __slots__ = ("fault", "point", "sim", "task")

    def __init__(self, sim: Simulation, task: SimTask, point: str, fault: Fault | None) -> None:
        self.sim = sim
        self.task = task
        self.point = point
        self.fault = fault

    def __await__(self) -> Generator[Any, None, Fault | None]:
        sim, task, fault = self.sim, self.task, self.fault
        proc = task.process
        if fault is not None:
            sim.impaired = True
            sim._plain = False  # no lean point decides while a process may be stopped
            if fault.kind == "crash":
                sim.crash(proc)
            elif fault.kind == "pause_past_ttl":
                until = sim.loop.vtime + (fault.seconds or DEFAULT_PAUSE)
                proc.paused_until = until
                sim.loop.call_at(until, sim.noop)  # so that time gets there
        if proc.crashed or proc.paused_until is not None or not sim.go_on(task, fault is not None):
            cancelled = False
            while True:
                task.parked_at = self.point
                sim.parked.append(task)
                try:
                    if task.driven:
                        # to the scheduler stepping this coroutine: it goes on with the task
                        # go_on chose (``sim._next``), or leaves the decision to the loop
                        yield _SWITCH
                    else:
                        fut: asyncio.Future[None] = sim.loop.create_future()
                        task.waiter = fut
                        yield from fut.__await__()
                    break
                except asyncio.CancelledError:
                    # cancelled where it waits (by another task, a timeout, its lease found
                    # lost): it is no candidate any more
                    sim.unpark(task)
                    if sim.stopping or not (proc.crashed or proc.paused_until is not None):
                        raise
                    # a stopped process runs no code: it hears of it once it runs again
                    # (a crashed one never does)
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError
        if sim.stopping and proc.crashed:
            raise _Crashed
        if fault is None:
            return None
        if fault.kind == "transient":
            raise InjectedFault(fault)
        return fault if fault.kind == "commit_unknown" else None


#: what :func:`_lean_pick` answers when the decision is no common case: the full way
_FULL: Any = object()


def _lean_pick(sim: Simulation, task: SimTask) -> Any:
    """The decision at a point with no fault reached by ``task``, the driven task being
    stepped (``sim._stepping``: the caller made sure; so a slice runs, and ``sim._owner``
    is set), for the common case (nothing else ready, no process paused or crashed, no
    thread waiting, no real I/O): the decision of :meth:`Simulation.go_on`, with the
    strategy's pick drawn directly. ``None``: ``task`` goes on; else the parked task chosen,
    or ``_FULL`` (not the common case: the gate decides the full way)."""
    if (
        sim._ready
        or sim.deferred
        or sim.external
        # (no process paused or crashed: ``impaired`` clears ``_plain``, which every caller
        # tested)
        or sim.sleeping
        # a cancellation requested of the task whose driver steps this slice
        or sim._owner.atask._must_cancel  # type: ignore[union-attr]
    ):
        return _FULL
    if sim.checkers:
        sim.run_checks()
    sim._io_deferred = False
    parked = sim.parked
    if not parked:
        return None
    steps = sim.steps = sim.steps + 1
    if steps > sim.max_steps:
        sim._over_budget(f"the schedule took more than max_steps={sim.max_steps} decisions")
    n = len(parked) + 1
    bits = sim._getrandbits
    if bits is not None:  # Random: its _randbelow(n), inline (the same draws)
        k = n.bit_length()
        i = bits(k)
        while i >= n:
            i = bits(k)
    elif sim._fifo:
        i = 0
    else:
        i = sim._choose(n, task)
    if not i:
        sim.picks.append(task.name)
        return None
    sim.deviations += 1
    chosen = parked[i - 1]
    sim.picks.append(chosen.name)
    return chosen


@types.coroutine
def _lean_switch(
    sim: Simulation, task: SimTask, point: str, chosen: SimTask
) -> Generator[Any, None, None]:
    """``task`` parks at ``point`` and ``chosen`` (parked, picked by :func:`_lean_pick`) goes
    on: the stepping switches to it with no loop round if it is driven."""
    if sim._stepping is not task or chosen.parked_at is None:
        return None  # not awaited where it was reached: the decision stands, task goes on
    parked = sim.parked
    if chosen.driven:
        parked.remove(chosen)
        chosen.parked_at = None
        sim._next = chosen
    else:
        sim._release(chosen)
    task.parked_at = point
    parked.append(task)
    try:
        yield _SWITCH
    except asyncio.CancelledError:
        sim.unpark(task)
        raise
    if sim.stopping and task.process.crashed:
        raise _Crashed
    return None


@types.coroutine
def _lean_gate(sim: Simulation, task: SimTask, point: str) -> Generator[Any, None, None]:
    """The gate of a point with no fault, reached by the driven task being stepped (what
    :meth:`Simulation.on_point` returns there): a generator awaited as is (no gate object,
    no ``__await__`` call) that decides with :func:`_lean_pick`, or the full way (awaited
    later than it was reached, e.g. by another task: ``task`` is not the one stepped)."""
    chosen = _lean_pick(sim, task) if sim._stepping is task else _FULL
    if chosen is None:
        return None
    if chosen is _FULL:
        yield from _Gate(sim, task, point, None).__await__()
        return None
    # _lean_switch inline (one generator less)
    parked = sim.parked
    if chosen.driven:
        parked.remove(chosen)
        chosen.parked_at = None
        sim._next = chosen
    else:
        sim._release(chosen)
    task.parked_at = point
    parked.append(task)
    try:
        yield _SWITCH
    except asyncio.CancelledError:
        sim.unpark(task)
        raise
    if sim.stopping and task.process.crashed:
        raise _Crashed
    return None


def _route(point: str, **info: Any) -> Any:
    sim = _current
    if sim is None:
        return None
    return sim.on_point(point, info)


class Simulation:
    """The ``sim`` a scenario receives: spawn tasks, simulated data, checks, virtual time."""

    # The attributes :meth:`__init__` sets are slots: the decision at every point reads and
    # writes a dozen of them, and a slot costs less to reach than a key of an instance dict
    # this large. ``__dict__`` stays for any other attribute (a class default overridden on
    # one simulation, e.g. ``sim.thread_timeout``).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_below",
        "_blocking_clients",
        "_by_atask",
        "_by_hit",
        "_by_thread",
        "_fifo",
        "_getrandbits",
        "_io_deferred",
        "_joins",
        "_names",
        "_next",
        "_owner",
        "_plain",
        "_ready",
        "_running_mark",
        "_running_since",
        "_spawned",
        "_stepping",
        "checkers",
        "clients",
        "deferred",
        "deviations",
        "effects",
        "external",
        "failure",
        "faults",
        "hits",
        "id",
        "impaired",
        "loop",
        "main",
        "max_steps",
        "max_time",
        "namespace",
        "parked",
        "passed",
        "picks",
        "points",
        "record",
        "running_threads",
        "sections",
        "skewed",
        "sleeping",
        "statements",
        "steps",
        "stopping",
        "strategy",
        "tables",
        "target_hits",
        "tasks",
        "thread_tasks",
        "trail",
    )

    block_timeout = 1.0
    #: real seconds a thread task may run without reaching a point (or waiting, or a
    #: statement giving way) before the schedule fails: it waits for something outside the
    #: simulation (a real lock, ``threading.Event``, ``queue.get``, ``time.sleep``), which
    #: would hold up every task, and ``explore``, for ever
    thread_timeout = 60.0
    #: loop iterations in a row that each found something ready to run (so no decision was
    #: made and virtual time stood still) before the schedule fails: a task that loops
    #: without awaiting anything that takes time (``await asyncio.sleep(0)`` in a loop)
    max_spins = 1_000_000

    def __init__(
        self,
        loop: SimLoop,
        strategy: Strategy,
        faults: tuple[Fault, ...],
        *,
        max_steps: int,
        max_time: float,
        record: bool,
        namespace: str | None = None,
    ) -> None:
        self.loop = loop
        self.strategy = strategy
        #: the random strategy's draw, called without its choose() around it (same draws)
        self._below: Any = None
        #: its generator's getrandbits, when its draw is random.Random's own _randbelow:
        #: the lean gate draws inline (the same draws)
        self._getrandbits: Any = None
        if type(strategy) is Random:
            self._below = strategy._below
            self._getrandbits = strategy._getrandbits
        self._fifo = type(strategy) is Fifo
        #: points may take the lean path: no fault planned and no trail recorded (a point
        #: needs no look-up of its target), and the schedule is not ending (cleared with
        #: :attr:`stopping`, so that a point tests one flag for both)
        self._plain = not faults and not record
        self.faults = faults
        self._by_hit: dict[tuple[str, int], list[Fault]] = {}
        for f in faults:
            self._by_hit.setdefault((f.point, f.nth), []).append(f)
        self.max_steps = max_steps
        self.max_time = max_time
        self.record = record
        self.id = next(_ids)
        #: the name of the schedule's ``memory://`` stores; the schedules of one explore
        #: share it (each drops the stores it made as it ends, so the next one starts
        #: from none), so that its clients' URL is parsed once, not once per schedule
        self.namespace = namespace if namespace is not None else f"jfsim{self.id}"
        self.tasks: list[SimTask] = []
        self._by_atask: dict[asyncio.Task[Any], SimTask] = {}
        self._by_thread: dict[int, SimTask] = {}
        self.parked: list[SimTask] = []
        #: tasks parked only so that others could reach their points first: still the
        #: running ones, so they come first among the candidates (the FIFO choice)
        self.deferred: list[SimTask] = []
        self.sleeping: list[SimTask] = []  # thread tasks waiting in virtual time
        self.thread_tasks: list[SimTask] = []  # every thread task, background ones too
        self._blocking_clients: list[Any] = []  # sim.locks(sync=True)...
        self.hits: dict[str, int] = {}
        self.target_hits: dict[tuple[str, str | None], int] = {}  # by (point, target)
        self.trail: list[Hit] = []  # every hit when recording, else the faulted ones
        self.picks: list[str] = []
        self.deviations = 0
        self.steps = 0
        self.points = 0
        self.external = 0
        self.statements: list[_Statement] = []  # real statements in flight
        self.running_threads = 0
        self.stopping = False
        self.failure: BaseException | None = None
        #: (points, decisions) when the loop last found a thread task running, and since
        #: when (real time) it has found the same (:meth:`thread_running`)
        self._running_mark: tuple[int, int] = (-1, -1)
        self._running_since: float | None = None
        self.checkers: list[Checker] = []
        self.effects: dict[str, list[Any]] = {}
        self.sections: dict[str, list[tuple[SimTask, Any]]] = {}
        self.tables: list[_Table] = []
        self.clients: list[Any] = []
        self._spawned = 0
        self._names: set[str] = set()
        #: the joins waiting: (the tasks each waits for, the future that wakes it)
        self._joins: list[tuple[list[SimTask], asyncio.Future[None]]] = []
        self.main = _Process("main")
        #: some process was paused or crashed: candidates need filtering
        self.impaired = False
        #: some process's clock is skewed (:meth:`skew`): the clock looks up the caller's
        self.skewed = False
        #: the task a decision at a driven task's point chose, for :meth:`_slice` to step next
        self._next: SimTask | None = None
        #: the loop's queue of ready callbacks (one deque for the loop's life)
        self._ready: Any = loop._ready  # type: ignore[attr-defined]
        #: the task whose asyncio task runs the current :meth:`_slice` (None outside one)
        self._owner: SimTask | None = None
        #: the driven task whose coroutine :meth:`_slice` steps right now (what
        #: :meth:`current` answers on the loop's thread without looking it up)
        self._stepping: SimTask | None = None
        #: tasks wait in :attr:`deferred` (in spawn order) for real I/O to answer
        self._io_deferred = False
        #: what :meth:`lean_point` returns to a task that goes on: a done future
        self.passed: asyncio.Future[None] = loop.passed

    # -- public API ---------------------------------------------------------------------
    def spawn(self, job: Any, *args: Any, name: str | None = None, **kwargs: Any) -> SimTask:
        """Start a task: a coroutine (``job(...)`` already called), an async function with
        its arguments, or a plain function with its arguments (run in a thread, controlled
        at jobfence's points and sleeps). Each spawned task is its own *process*: faults
        that pause or crash it stop the tasks it started too. Returns its :class:`SimTask`."""
        self._spawned += 1
        label = name if name is not None else f"t{self._spawned}"
        problem = None
        if name is not None and (
            not isinstance(label, str)
            or not label
            or label == "-"  # a tape's placeholder pick (the FIFO choice)
            or any(c in label for c in " #@()+,|")
        ):
            problem = (
                "name must be a non-empty str other than '-', without spaces or any of "
                f"#@()+,|, got {label!r}"
            )
        elif label in self._names:
            problem = f"a task named {label!r} exists already"
        if problem is not None:
            if inspect.iscoroutine(job):
                job.close()  # never run: no "never awaited" warning on top of the error
            raise ConfigurationError(problem, argument="name")
        is_coro = type(job) is types.CoroutineType or inspect.iscoroutine(job)
        inner = job.func if not is_coro and isinstance(job, functools.partial) else job
        if not is_coro and (
            inspect.isasyncgenfunction(inner) or inspect.isgeneratorfunction(inner)
        ):
            raise ConfigurationError(
                "job must be a coroutine, an async function or a function, got the generator "
                f"function {job!r}: calling it runs none of its code",
                argument="job",
            )
        proc = _Process(label)
        task = SimTask(label, proc)
        self.tasks.append(task)
        self._names.add(label)
        if is_coro:
            if args or kwargs:
                job.close()
                raise ConfigurationError(
                    "args: a coroutine (job(...) already called) takes no more arguments; "
                    "pass the function and its arguments instead, spawn(job, *args)",
                    argument="args",
                )
            coro = job
        elif inspect.iscoroutinefunction(job):
            coro = job(*args, **kwargs)
        elif callable(job):
            task.thread = True
            self._start_thread(task, _no_coroutine(job), args, kwargs)
            return task
        else:
            raise ConfigurationError(
                f"job must be a coroutine, an async function or a function, got {job!r}",
                argument="job",
            )
        ctx = contextvars.copy_context()
        ctx.run(_PROCESS.set, proc)
        if _DIRECT:
            task.driven = True
            task.coro = coro
            task.ctx = ctx
            task.send = coro.send
            driver = self._drive(task)
            loop: Any = self.loop
            if loop._task_factory is None:  # create_task's own steps, without its checks
                atask = asyncio.Task(driver, loop=loop, context=ctx)  # type: ignore[call-arg]
            else:
                atask = loop.create_task(driver, context=ctx)
        else:
            atask = ctx.run(self.loop.create_task, self._run_async(task, coro))
        task.atask = atask
        self._by_atask[atask] = task
        return task

    async def join(self, *tasks: SimTask) -> list[Any]:
        """Wait until the given tasks (default: every spawned task, those spawned meanwhile
        by other tasks too) are done; return their results (an exception a job ended with is
        its result here, see :attr:`SimTask.error`). A crashed task counts as done."""
        chosen = list(tasks) if tasks else self.tasks
        while not _all_done(chosen):
            # one wake-up once they all are (see _wake_joins), not one per task; a future of
            # its own, so that cancelling the join cancels none of the tasks
            waiter = self.loop.create_future()
            entry = (chosen, waiter)
            self._joins.append(entry)
            try:
                await waiter
            finally:
                self._joins.remove(entry)
        return [t.error if t.error is not None else t.result for t in list(chosen)]

    async def sleep(self, seconds: float) -> None:
        """Sleep in virtual time (a ``sleep`` point)."""
        from .._core.clock import get_clock

        await get_clock().asleep(seconds)

    def now(self) -> float:
        """Virtual seconds since the schedule began."""
        return self.loop.vtime

    def skew(self, task: SimTask | str, seconds: float) -> None:
        """Set the wall-clock offset of ``task``'s process (a :class:`SimTask` or its name):
        from now on ``get_clock().time()`` seen from that task, and from every task it
        started (its clients' renewers), is the schedule's time plus ``seconds`` (negative:
        its clock is behind). ``get_clock().monotonic()``, sleeps and timeouts are not
        affected, and the ``memory://`` stores (``sim.locks()``, ``sim.inbox()``,
        ``sim.queue()``) stand for a server and keep the true time. Call it again to step
        the clock (``0`` puts it right); the scenario's own clock is never skewed."""
        if isinstance(task, str):
            found = [t for t in self.tasks if t.name == task]
            if not found:
                raise ConfigurationError(
                    f"task must be a spawned task or its name, got {task!r} (tasks: "
                    f"{', '.join(t.name for t in self.tasks) or 'none yet'})",
                    argument="task",
                )
            target = found[0]
        elif isinstance(task, SimTask) and task in self.tasks:
            target = task
        else:
            raise ConfigurationError(
                f"task must be a task spawned by this simulation or its name, got {task!r}",
                argument="task",
            )
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
        ):
            raise ConfigurationError(
                f"seconds must be a finite number of seconds (negative: behind), got {seconds!r}",
                argument="seconds",
            )
        target.process.skew = float(seconds)
        self.skewed = True

    @overload
    def table(
        self,
        name: str,
        rows: dict[Any, dict[str, Any]] | None = None,
        *,
        url: None = None,
        fenced: bool = False,
    ) -> SimTable: ...

    @overload
    def table(
        self,
        name: str,
        rows: dict[Any, dict[str, Any]] | None = None,
        *,
        url: str,
        fenced: bool = False,
    ) -> RealTable: ...

    def table(
        self,
        name: str,
        rows: dict[Any, dict[str, Any]] | None = None,
        *,
        url: str | None = None,
        fenced: bool = False,
    ) -> SimTable | RealTable:
        """A table of versioned rows (see :class:`~jobfence.testing.table.SimTable`): in
        memory, or with ``url`` (``sqlite:///path`` or ``postgresql://...``) a real table
        in that database (:class:`~jobfence.testing.table_real.RealTable`), its statements
        still ordered at the points."""
        table: SimTable | RealTable
        if url is None:
            sim_table = _SIM_TABLE or _load_sim_table()
            table = sim_table(self, name, rows or {}, fenced)
        else:
            from .table_real import RealTable

            table = RealTable(self, name, rows or {}, fenced, url)
        self.tables.append(table)
        return table

    def attach(self, conn: C) -> C:
        """Make the statements of your own connection ``conn`` points until the schedule
        ends, and return it (see :mod:`jobfence.testing.connections`)."""
        from .connections import attach

        return attach(self, conn)

    @overload
    def locks(self, *, sync: Literal[False] = False, **options: Any) -> AsyncLocks: ...

    @overload
    def locks(self, *, sync: Literal[True], **options: Any) -> Locks: ...

    def locks(self, *, sync: bool = False, **options: Any) -> AsyncLocks | Locks:
        """An ``AsyncLocks`` on this schedule's own ``memory://`` store; with ``sync=True``
        the blocking ``Locks`` on it, for thread tasks (its renewer is a background task of
        the task whose lease it renews). Closed when the schedule ends."""
        url = f"memory://{self.namespace}"
        client: AsyncLocks | Locks
        if _sync_flag(sync):
            from ..locks import Locks

            client = Locks(url, **options)
            self._blocking_clients.append(client)
        else:
            from ..locks_async import AsyncLocks

            client = AsyncLocks(url, **options)
        self.clients.append(client)
        return client

    @overload
    def inbox(self, *, sync: Literal[False] = False, **options: Any) -> AsyncInbox: ...

    @overload
    def inbox(self, *, sync: Literal[True], **options: Any) -> Inbox: ...

    def inbox(self, *, sync: bool = False, **options: Any) -> AsyncInbox | Inbox:
        """An ``AsyncInbox`` on this schedule's own ``memory://`` store; with ``sync=True``
        the blocking ``Inbox``, for thread tasks. Closed when the schedule ends."""
        url = f"memory://{self.namespace}"
        client: AsyncInbox | Inbox
        if _sync_flag(sync):
            from ..inbox import Inbox

            client = Inbox(url, **options)
            self._blocking_clients.append(client)
        else:
            from ..inbox_async import AsyncInbox

            client = AsyncInbox(url, **options)
        self.clients.append(client)
        return client

    @overload
    def queue(
        self, name: str = "jobs", *, sync: Literal[False] = False, **options: Any
    ) -> AsyncQueue: ...

    @overload
    def queue(self, name: str = "jobs", *, sync: Literal[True], **options: Any) -> Queue: ...

    def queue(
        self, name: str = "jobs", *, sync: bool = False, **options: Any
    ) -> AsyncQueue | Queue:
        """An ``AsyncQueue`` named ``name`` on this schedule's own ``memory://`` store (with
        ``sync=True`` the blocking ``Queue``, for thread tasks). Every message published to
        that queue, by any client, is noted in :meth:`published`. Closed when the schedule
        ends."""
        url = f"memory://{self.namespace}"
        client: AsyncQueue | Queue
        if _sync_flag(sync):
            from ..queue import Queue

            client = Queue(url, name, **options)
            self._blocking_clients.append(client)
        else:
            from ..queue_async import AsyncQueue

            client = AsyncQueue(url, name, **options)
        self.clients.append(client)
        self._journal(name)
        return client

    @overload
    def outbox(
        self, table: str = "jobfence_outbox", *, sync: Literal[False] = False, **options: Any
    ) -> AsyncOutbox: ...

    @overload
    def outbox(
        self, table: str = "jobfence_outbox", *, sync: Literal[True], **options: Any
    ) -> Outbox: ...

    def outbox(
        self, table: str = "jobfence_outbox", *, sync: bool = False, **options: Any
    ) -> AsyncOutbox | Outbox:
        """An ``AsyncOutbox`` whose table ``table`` lives in this schedule's own ``memory://``
        store, as a simulated table's inbox markers live in its database: ``await
        outbox.add(tx, ...)`` on a simulated transaction (``sim.table(...).transaction()``)
        adds the rows when ``tx`` commits, none if it rolls back or its process dies first;
        on a simulated table, at once. ``jobfence.AsyncRelay(outbox, to)`` relays them, its
        claims, sends and settlements at the points ``outbox.claim``, ``outbox.publish`` and
        ``outbox.settle``; the rows' leases run on virtual time. ``options``: those of
        ``AsyncOutbox`` (``retention``). With ``sync=True``: the blocking ``Outbox`` on the
        same store (for thread tasks; ``jobfence.Relay(outbox, to)`` relays its rows).
        Closed when the schedule ends."""
        from .._core.url import parse_url

        url = parse_url(f"memory://{self.namespace}")
        client: AsyncOutbox | Outbox
        if _sync_flag(sync):
            from ..backends.memory.outbox import MemoryOutboxBackend
            from ..outbox import Outbox

            client = Outbox(MemoryOutboxBackend(url, table=table), **options)
            self._blocking_clients.append(client)
        else:
            from ..backends.memory.outbox import AsyncMemoryOutboxBackend
            from ..outbox_async import AsyncOutbox

            client = AsyncOutbox(AsyncMemoryOutboxBackend(url, table=table), **options)
        self.clients.append(client)
        return client

    def published(self, queue: str = "jobs") -> list[str]:
        """The id of every message published to the queue ``queue`` of this schedule's
        ``memory://`` store (``sim.queue(queue)``, or any client of that URL and name, a
        relay's included) since :meth:`queue` or this method was first called for it, in
        publish order, an id published twice listed twice; acked messages included. No
        point: for checks (:func:`~jobfence.testing.published_once` reads it)."""
        return list(self._journal(queue))

    def _journal(self, queue: str) -> list[str]:
        from .._core.url import parse_url
        from .._core.validate import check_queue_name
        from ..backends.memory.queue import get_queue_store

        store = get_queue_store(
            parse_url(f"memory://{self.namespace}"), check_queue_name(queue, argument="queue")
        )
        if store.journal is None:
            store.journal = []
        return store.journal

    def effect(self, kind: str, key: Any) -> Awaitable[None]:
        """Record an external effect (a charge, an e-mail) of ``kind`` for ``key``; a point
        named ``effect.<kind>``. :func:`~jobfence.testing.exactly_once` reads them.

        ``await sim.effect(...)`` in an async task; in a thread task (a plain function) call
        it without ``await``: it blocks at the point, then records the effect. A fault at the
        point (``transient``) raises before anything is recorded."""
        _check_point_name(kind, "kind")
        gate = self.on_point(f"effect.{kind}", {"key": key})
        if gate is not None:
            return self._effect_after(gate, kind, key)
        self.effects.setdefault(kind, []).append(key)
        return _PASSED

    async def _effect_after(self, gate: Awaitable[Any], kind: str, key: Any) -> None:
        await gate
        self.effects.setdefault(kind, []).append(key)

    def critical(self, name: str, lease: Any = None) -> _Section:
        """Mark the block as the critical section ``name``, for
        :func:`~jobfence.testing.single_holder` (``async with sim.critical(...)`` in an async
        task, ``with`` in a thread task). With a jobfence ``lease``, the task counts as a
        holder only while the lease is neither lost nor past its ttl."""
        task = self.current()
        if task is None or task.process is self.main:
            raise ConfigurationError(
                "sim.critical() marks a section of a spawned task; call it inside one",
                argument="name",
            )
        return _Section(self.sections.setdefault(name, []), (task, lease))

    def check(self, condition: object, message: str = "check failed") -> None:
        """Fail the schedule with ``message`` unless ``condition`` is true."""
        if not condition:
            self.violate("check", message)
            raise _Stop

    def watch(self, *checkers: Checker) -> None:
        """Check these invariants after every step and at the end of the schedule."""
        self.checkers.extend(checkers)

    # -- the points -----------------------------------------------------------------------
    def current(self) -> SimTask | None:
        """The simulated task running now (``None`` outside one)."""
        if self.loop._thread_id != _get_ident():  # type: ignore[attr-defined]  # not running here
            atask = None
        elif self._stepping is not None:
            return self._stepping
        elif _CURRENT_TASKS is not None:
            atask = _CURRENT_TASKS.get(self.loop)
        else:  # an asyncio without the dict: the public, slower way
            atask = asyncio.current_task()
        if atask is None:
            return self._by_thread.get(threading.get_ident())
        task = self._by_atask.get(atask)
        if task is None and atask.get_loop() is self.loop:
            proc = _PROCESS.get() or self.main
            proc.background += 1
            task = SimTask(f"{proc.name}.{proc.background}", proc)
            self._by_atask[atask] = task
        return task

    def lean_point(self, point: str) -> Any:
        """A point with no target info, reached where :meth:`on_point` would take its lean
        path (the driven task being stepped, no fault to look up): the hit counted and the
        decision made now, as the gate would make it when awaited at once. Returns what the
        task awaits there (:attr:`passed`, a done future, if it goes on), or ``None`` where
        the lean path does not apply (the caller goes through :meth:`on_point`). The task is
        the one being stepped (:attr:`_stepping`, read before the call)."""
        task = self._stepping
        if (
            task is None or not self._plain or self.loop._thread_id != _get_ident()  # type: ignore[attr-defined]
        ):
            return None
        points = self.points = self.points + 1
        if points > self.max_steps:
            self._over_budget(
                f"the schedule's tasks reached more than max_steps={self.max_steps} points"
            )
        hits = self.hits
        hits[point] = hits.get(point, 0) + 1
        chosen = _lean_pick(self, task)  # ``task`` is the one stepped
        if chosen is None:
            return self.passed
        if chosen is _FULL:
            # no common case: the full way, straight to the gate (the lean one would find
            # the same when awaited at once, and both ways decide alike when awaited later)
            return _Gate(self, task, point, None)
        return _lean_switch(self, task, point, chosen)

    def on_point(self, point: str, info: dict[str, Any]) -> Any:
        task = self._stepping
        if (
            task is not None
            and self._plain  # and not stopping
            and self.loop._thread_id == _get_ident()  # type: ignore[attr-defined]
        ):
            # the driven task being stepped, no fault to look up: count the hit, the gate
            # decides
            points = self.points = self.points + 1
            if points > self.max_steps:
                self._over_budget(
                    f"the schedule's tasks reached more than max_steps={self.max_steps} points"
                )
            hits = self.hits
            hits[point] = hits.get(point, 0) + 1
            return _lean_gate(self, task, point)
        if self.stopping:
            task = self.current()
            if task is not None and task.process.crashed:
                raise _Crashed
            return None
        task = self._stepping  # a driven task being stepped: no look-up
        if task is None or self.loop._thread_id != _get_ident():  # type: ignore[attr-defined]
            task = self.current()
            if task is None or task.process is self.main:
                return None  # the scenario's own setup and checks: not a job, never faulted
        points = self.points = self.points + 1
        if points > self.max_steps:  # a lone task looping over points decides nothing
            self._over_budget(
                f"the schedule's tasks reached more than max_steps={self.max_steps} points"
            )
        nth = self.hits[point] = self.hits.get(point, 0) + 1
        fault = None
        if self._by_hit or self.record:  # a schedule without faults skips the look-up
            # a targeted fault counts the hits of its point at its target only
            target = target_of(point, info)
            at = (point, target)
            tnth = self.target_hits[at] = self.target_hits.get(at, 0) + 1
            for f in (
                *self._by_hit.get((point, nth), ()),
                *(self._by_hit.get((point, tnth), ()) if tnth != nth else ()),
            ):
                if (
                    f.nth == nth if f.target is None else f.target == target and f.nth == tnth
                ) and (f.task is None or task.name == f.task):
                    fault = f
                    break
            if self.record or fault is not None:  # every hit, or the ones a fault hit
                self.trail.append(Hit(point, nth, target, tnth, task.process.holds, task, fault))
            if self.record and point in _TAKES:
                task.process.holds = True
            if fault is not None and fault.kind == "lost_ack":
                self._lose_ack(info)
                fault = None
        if task.thread:
            self._thread_point(task, point, fault)
            return None
        return _Gate(self, task, point, fault)

    def _lose_ack(self, info: dict[str, Any]) -> None:
        from ..backends.memory.queue import _stores

        for key, store in list(_stores.items()):
            if key.startswith(self.namespace) and key.endswith(f"\x00{info.get('queue')}"):
                store.lose_acks.add(str(info.get("id")))

    def runnable(self, task: SimTask) -> bool:
        proc = task.process
        if proc.crashed:
            return False
        if proc.paused_until is not None:
            if self.loop.vtime < proc.paused_until:
                return False
            proc.paused_until = None
        return True

    def _pick(self, candidates: list[SimTask]) -> SimTask:
        if self.deferred:
            first = [t for t in self.deferred if t in candidates]
            candidates = first + [t for t in candidates if t not in first]
            self.deferred.clear()
        steps = self.steps = self.steps + 1
        if steps > self.max_steps:
            self._over_budget(f"the schedule took more than max_steps={self.max_steps} decisions")
        if len(candidates) == 1:
            return candidates[0]
        below = self._below
        i = (
            below(len(candidates))
            if below is not None
            else self.strategy.choose(candidates, len(self.picks))
        )
        if i:
            self.deviations += 1
        chosen = candidates[i]
        self.picks.append(chosen.name)
        return chosen

    def _choose(self, n: int, task: SimTask) -> int:
        """The strategy's pick among ``task`` (at its point) and the ``n - 1`` parked tasks."""
        return self.strategy.choose([task, *self.parked], len(self.picks))

    def spinning(self) -> NoReturn:
        self._over_budget(
            f"no task reached a point and virtual time did not move in {self.max_spins} loop "
            "iterations: a task loops without waiting for anything (asyncio.sleep(0) in a loop?)"
        )

    def out_of_time(self) -> NoReturn:
        """Virtual time is to pass ``max_time``: the schedule fails (a budget)."""
        self._over_budget(f"virtual time passed max_time={self.max_time:g} s")

    def _over_budget(self, message: str) -> NoReturn:
        self.violate("budget", message)
        raise _Budget(message)

    def go_on(self, task: SimTask, forced: bool) -> bool:
        """``task`` reached a point: True if it goes on; else it parks (the caller parks it)
        and, when the decision could be made now, the chosen task is let go."""
        if self.checkers:
            self.run_checks()
        owner = self._owner
        if (
            self._ready  # others first reach their points
            # a task cancelled while its driver steps others hears of it at its point first,
            # as one whose wake-up is ready
            or (owner is not None and owner.atask._must_cancel)  # type: ignore[union-attr]
        ):
            self.deferred.append(task)
            return False
        if not self.deferred:
            self._io_deferred = False
        if self._io_deferred or (self.external > 0 and not any(s.stalled for s in self.statements)):
            # a real statement is in flight: decide once it answered (when the loop is
            # idle), never while it runs; the tasks that reach their points meanwhile do so
            # in an order real timing chose, so they queue in spawn order
            self._io_deferred = True
            order = {t: i for i, t in enumerate(self.tasks)}
            rank = (order.get(task, len(order)), task.name)
            at = len(self.deferred)
            for i, other in enumerate(self.deferred):
                if (order.get(other, len(order)), other.name) > rank:
                    at = i
                    break
            self.deferred.insert(at, task)
            return False
        if self.impaired or self.sleeping:
            others = [t for t in self.parked if self.runnable(t)]
            self._wake_threads(others)
        else:
            others = self.parked
        if not others:
            return not forced or not self._has_timers()
        candidates = [*others, task] if forced else [task, *others]
        chosen = self._pick(candidates)
        if chosen is task:
            return True
        if task.driven and chosen.driven:  # the stepping switches to it: no loop round
            self.parked.remove(chosen)
            chosen.parked_at = None
            self._next = chosen
        else:
            self._release(chosen)
        return False

    def _has_timers(self) -> bool:
        return bool(self.loop._scheduled)  # type: ignore[attr-defined]

    def decide(self) -> bool:
        """The loop is idle: let one parked task go (False if none can)."""
        if self.stopping:
            return False
        if self.checkers:
            self.run_checks()
        if self.loop.vtime > self.max_time:
            self.out_of_time()
        candidates = [t for t in self.parked if self.runnable(t)]
        self._wake_threads(candidates)
        if not candidates:
            return False
        self._release(self._pick(candidates))
        return True

    def unpark(self, task: SimTask) -> None:
        """``task`` stopped waiting at its point without being let go (it was cancelled)."""
        if task in self.parked:
            self.parked.remove(task)
        if task in self.deferred:
            self.deferred.remove(task)
        task.waiter = None
        task.parked_at = None

    def _release(self, task: SimTask) -> None:
        self.parked.remove(task)
        task.parked_at = None
        if task.thread:
            self._thread_release(task)
            return
        if task.driven:
            self._signal(task, (_GO, None))
            return
        waiter, task.waiter = task.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _signal(self, task: SimTask, command: tuple[int, Any]) -> None:
        """Tell the driver of ``task`` (waiting on its ``park`` future) what to do next."""
        task.command = command
        park = task.park
        if park is None:
            park = task.park = self.loop.create_future()
        if not park.done():
            park.set_result(None)

    @contextmanager
    def real_io(self) -> Iterator[_Statement]:
        """The block is a statement of a real database (a table made with ``url=``): it
        counts in :attr:`external`, so the loop waits for its answer instead of letting
        another task go, unless it stalls (:meth:`stalled_io`)."""
        statement = _Statement()
        self.statements.append(statement)
        self.external += 1
        try:
            yield statement
        finally:
            self.statements.remove(statement)
            if not statement.stalled:
                self.external -= 1

    def stalled_io(self) -> None:
        """Real I/O did not answer within ``block_timeout``: only statements give way.
        Each statement in flight (it waits, e.g. for a row lock a parked task holds) stops
        counting in :attr:`external`, nor its socket as I/O to wait for, so the scheduler
        can let another task go; its answer is taken whenever it comes. The order of events
        then depends on real timing."""
        for statement in self.statements:
            if not statement.stalled:
                statement.stalled = True
                self.external -= 1

    def answered(self, statement: _Statement) -> None:
        """A round trip of ``statement`` answered: if it had stalled, the rest of it counts
        again."""
        if statement.stalled:
            statement.stalled = False
            self.external += 1

    def idle_forever(self) -> None:
        if any(s.stalled for s in self.statements):  # not idle: count them again, wait
            for statement in self.statements:
                self.answered(statement)
            return
        stuck = [t.name for t in self.tasks if not t.done and not t.process.crashed]
        who = ", ".join(stuck) if stuck else "the scenario"
        raise _Deadlock(f"deadlock: {who} wait(s) for something that never comes")

    def noop(self) -> None:
        pass

    def crash(self, proc: _Process) -> None:
        """``proc`` died: its tasks never run again and count as done (with no result); the
        attached connections it used last close now (on the loop's thread), as a dead
        process's do, so the server rolls back its transaction and frees its row locks even
        for a statement of another task that waits for them already."""
        proc.crashed = True
        for task in self.tasks:
            if task.process is proc and not task.done:
                task.done = True
                if task.finished is not None and not task.finished.done():
                    task.finished.set_result(None)
        for client in self.clients:
            reap = getattr(client, "reap_crashed", None)
            if reap is not None:
                reap()
        if self._joins:
            self._wake_joins()

    def _wake_joins(self) -> None:
        """Wake each :meth:`join` whose tasks are all done now."""
        for chosen, waiter in self._joins:
            if not waiter.done() and _all_done(chosen):
                waiter.set_result(None)

    def run_checks(self) -> None:
        for checker in self.checkers:
            problem = verdict(checker, self, end=False)
            if problem:
                self.violate(checker.name, problem)
                raise _Stop

    def violate(self, check: str, message: str) -> Violation:
        error = Violation(check, message)
        if self.failure is None:
            self.failure = error
        return error

    # -- threads (plain functions, and the threads jobfence starts in tasks) ---------------
    #
    # A thread task runs only while the scheduler lets it: it waits on its ``go`` event
    # everywhere else. The loop thread owns the scheduling state while no thread task runs;
    # the one thread task that runs owns it until it stops (parks at a point, waits, or
    # ends), and then hands over by posting one callback to the loop (``_thread_stopped``,
    # ``_thread_ended``): the counters of running threads, a crash's effects, a timer and
    # the release of the task it chose change there, on the loop thread, in one step. So
    # exactly one of them runs at any time, and a schedule of thread tasks replays exactly.

    def _start_thread(
        self,
        task: SimTask,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        abandon: Callable[[], None] | None = None,
        ctx: contextvars.Context | None = None,
    ) -> None:
        """Run ``fn(*args, **kwargs)`` as the thread task ``task``, parked at ``start``
        until the scheduler lets it go; ``abandon()`` runs instead of ``fn`` if it is never
        let go (its process crashed first, or the schedule ended)."""
        go = task.go = threading.Event()
        ended = task.ended = threading.Event()
        if ctx is None:
            ctx = contextvars.copy_context()
            ctx.run(_PROCESS.set, task.process)
        run_in = ctx

        def body() -> None:
            ident = threading.get_ident()
            self._by_thread[ident] = task
            stop = False
            try:
                go.wait()
                if self.stopping or task.process.crashed:
                    if abandon is not None:
                        abandon()
                else:
                    task.result = run_in.run(fn, *args, **kwargs)
            except _Crashed:
                pass
            except _Stop:  # a check failed (or a budget ran out) at one of its points
                stop = True
            except BaseException as exc:
                task.error = exc
            finally:
                if self._by_thread.get(ident) is task:
                    del self._by_thread[ident]  # its id may be another thread's later
                task.done = True
                ended.set()
                self._post(self._thread_ended, task, stop)

        thread = threading.Thread(target=body, name=f"jobfence-sim-{task.name}", daemon=True)
        task.os_thread = thread
        task.parked_at = "start"
        self.parked.append(task)
        self.thread_tasks.append(task)
        thread.start()
        if self.stopping:  # started while the schedule ends: it never runs
            go.set()

    def _spawn_background(
        self, fn: Callable[[], Any], abandon: Callable[[], None] | None
    ) -> threading.Thread | None:
        """A thread jobfence starts (``_core.compat.spawn``: a sync client's renewer, a
        give-back, ``on_lost`` callbacks): from a task, a background thread task of the
        task's process (``t1.1``...), paused and crashed with it; ``None`` (a plain thread)
        from the scenario itself or from a thread that is no task."""
        parent = self.current()
        if parent is None or parent.process is self.main:
            return None
        proc = parent.process
        proc.background += 1
        task = SimTask(f"{proc.name}.{proc.background}", proc, thread=True)
        # a new thread starts with an empty context, as it does outside a simulation
        self._start_thread(task, fn, (), {}, abandon=abandon, ctx=contextvars.Context())
        return task.os_thread

    def _join_thread(self, worker: threading.Thread, timeout: float) -> bool:
        """``_core.compat.join`` of ``worker``: False if it is no thread task. A thread task
        waits for it in virtual time; anyone else does not wait (a real wait would hold up
        the tasks, or wait for what only the scheduler makes happen): the thread ends once
        it runs (a renewer whose client closed) or when the schedule ends."""
        task = next((t for t in self.thread_tasks if t.os_thread is worker), None)
        if task is None or task.ended is None:
            return False
        if not task.ended.is_set() and threading.get_ident() in self._by_thread:
            self.thread_wait(task.ended, timeout)
        if task.ended.is_set():
            worker.join(max(timeout, 0.0))  # past its last simulated step: it is exiting
        return True

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Have the loop thread call ``fn(*args)`` (from a thread task)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the schedule ended
            pass

    def _thread_ended(self, task: SimTask, stop: bool) -> None:
        """(loop thread) A thread task's function returned or raised."""
        if self.stopping:  # unwound at the end of the schedule: nothing left to decide
            return
        self.running_threads -= 1
        self.external -= 1
        self._finish(task)
        if stop:
            self.loop.stop()  # a check failed: the schedule ends here

    def _thread_stopped(
        self,
        task: SimTask,
        chosen: SimTask | None,
        crashed: _Process | None,
        until: float | None,
    ) -> None:
        """(loop thread) The running thread task ``task`` parked or waits: it runs no more;
        its process ``crashed``, a timer at ``until`` (its pause's or wait's end), and the
        task it chose (if any) goes on."""
        if self.stopping:
            return
        self.running_threads -= 1
        self.external -= 1
        if crashed is not None:
            self.crash(crashed)
        if until is not None and math.isfinite(until):
            self.loop.call_at(until, self.noop)  # so that time gets there
        if chosen is not None:
            self._release(chosen)

    def thread_running(self) -> None:
        """(loop thread) The loop waited once more for a running thread task: the schedule
        fails (a budget) once no point was reached for :attr:`thread_timeout` real seconds,
        naming the task and where its thread waits."""
        mark = (self.points, self.steps)
        now = time.monotonic()
        if mark != self._running_mark or self._running_since is None:
            self._running_mark, self._running_since = mark, now
            return
        if now - self._running_since <= self.thread_timeout:
            return
        running = [
            t
            for t in self.thread_tasks
            if t.go is not None
            and t.go.is_set()
            and t.ended is not None
            and not t.ended.is_set()
            and t not in self.parked
            and t not in self.sleeping
        ]
        frames = sys._current_frames()
        where = []
        for t in running:
            ident = t.os_thread.ident if t.os_thread is not None else None
            frame = frames.get(ident) if ident is not None else None
            at = ""
            # the caller of a threading primitive: the job's own line, not threading.py's
            while (
                frame is not None
                and frame.f_back is not None
                and (frame.f_code.co_filename == threading.__file__)
            ):
                frame = frame.f_back
            if frame is not None:
                code = frame.f_code
                at = f" (at {code.co_filename}:{frame.f_lineno} in {code.co_name})"
            where.append(f"{t.name}{at}")
        who = ", ".join(where) or "a thread task"
        self._over_budget(
            f"{who} ran {self.thread_timeout:g} real seconds without reaching a point: it "
            "waits for something outside the simulation (a real lock, threading.Event, "
            "queue.get, time.sleep?); use the simulation's clients and clock "
            "(get_clock().sleep), or raise sim.thread_timeout for slow work"
        )

    def _thread_release(self, task: SimTask) -> None:
        """(loop thread) Let the parked or waiting thread task ``task`` go. It counts as
        running from now on (the loop waits for it to stop again), and is woken by the
        loop's next callback: after whoever chose it (an async task at its point) parked, so
        that it sees the same candidates in every run."""
        self.running_threads += 1
        self.external += 1
        assert task.go is not None
        self.loop.call_soon(task.go.set)

    def _thread_point(self, task: SimTask, point: str, fault: Fault | None) -> None:
        """(in the thread of ``task``) A thread task reached ``point``: it goes on, or parks
        until the scheduler lets it go; then the ``fault`` there, if any, takes effect."""
        proc = task.process
        crashed = None
        until = None
        if fault is not None:
            self.impaired = True
            self._plain = False  # no lean point decides while a process may be stopped
            if fault.kind == "crash":
                proc.crashed = True
                crashed = proc
            elif fault.kind == "pause_past_ttl":
                until = self.loop.vtime + (fault.seconds or DEFAULT_PAUSE)
                proc.paused_until = until
        if proc.crashed or proc.paused_until is not None:
            self._thread_park(task, point, None, crashed, until)
        else:
            chosen = self._thread_choose(task, fault is not None)
            if chosen is not task:
                self._thread_park(task, point, chosen, None, None)
        if proc.crashed:
            raise _Crashed
        if fault is not None and fault.kind == "transient":
            raise InjectedFault(fault)

    def _thread_choose(self, task: SimTask, forced: bool) -> SimTask | None:
        """The decision at a thread task's point, made in its thread (every other task
        waits): ``task`` itself, another task, or ``None`` (it parks and the loop decides,
        after time moved: ``forced`` by a fault, as an async task is)."""
        if self.checkers:
            self.run_checks()
        others = [t for t in self.parked if self.runnable(t)]
        self._wake_threads(others)
        if not others:
            return task if not forced or not self._has_timers() else None
        candidates = [*others, task] if forced else [task, *others]
        return self._pick(candidates)

    def _thread_park(
        self,
        task: SimTask,
        point: str,
        chosen: SimTask | None,
        crashed: _Process | None,
        until: float | None,
    ) -> None:
        assert task.go is not None
        task.go.clear()  # before it is a candidate: a release from now on is not lost
        task.parked_at = point
        self.parked.append(task)
        self._post(self._thread_stopped, task, chosen, crashed, until)
        self._thread_sleep(task)

    def _thread_sleep(self, task: SimTask) -> None:
        """Wait until the scheduler lets ``task`` go (or the schedule ends: ``_Crashed``)."""
        assert task.go is not None
        if not self.stopping:
            task.go.wait()
        if self.stopping:
            raise _Crashed

    def thread_wait(self, event: threading.Event | None, timeout: float) -> None:
        """A thread waits for ``event`` (``None``: it sleeps) at most ``timeout`` virtual
        seconds. A thread task stops running meanwhile (the scheduler wakes it once the
        time passed or the event is set, at a decision); another thread waits on its own."""
        task = self._by_thread.get(threading.get_ident())
        if task is None:
            self._outside_wait(event, timeout)
            return
        if self.stopping:
            raise _Crashed
        assert task.go is not None
        task.go.clear()
        task.wait_event = event
        task.wait_until = self.loop.vtime + max(timeout, 0.0)
        self.sleeping.append(task)
        self._post(self._thread_stopped, task, None, None, task.wait_until)
        self._thread_sleep(task)

    def _outside_wait(self, event: threading.Event | None, timeout: float) -> None:
        """A wait of a thread that is no task: one the scenario itself started (the renewer
        of a sync client it uses), or a clean-up as the schedule ends. It waits for virtual
        time to pass on its own, beside the tasks (not in the schedule's order)."""
        if _running_loop() is self.loop and not self.stopping:
            raise ConfigurationError(
                "a blocking wait on the simulation's event loop would stop every task: use "
                "the async clients (sim.locks()...) in async code, the sync ones "
                "(sim.locks(sync=True)...) in plain functions given to sim.spawn",
                argument="sync",
            )
        if self.stopping or not self.loop.is_running():
            # nothing moves virtual time any more: a short real wait, the caller looks again
            pause = min(max(timeout, 0.0), 0.01)
            if event is not None:
                event.wait(pause)
            else:
                time.sleep(pause)
            return
        done = threading.Event()
        due = self.loop.vtime + max(timeout, 0.0)
        if math.isfinite(due):
            self._post(self._timer_for, due, done)
        while not done.is_set() and not (event is not None and event.is_set()):
            if self.stopping:
                return
            done.wait(0.01)

    def _timer_for(self, due: float, done: threading.Event) -> None:
        self.loop.call_at(due, done.set)

    def _wake_threads(self, into: list[SimTask]) -> None:
        """Thread tasks whose virtual wait is over (time or event) become candidates,
        unless their process is paused or crashed: those wait on until it goes on."""
        if not self.sleeping:
            return
        now = self.loop.vtime
        for task in list(self.sleeping):
            due = task.wait_until is not None and now >= task.wait_until
            woken = due or (task.wait_event is not None and task.wait_event.is_set())
            if woken and self.runnable(task):
                self.sleeping.remove(task)
                task.wait_event = task.wait_until = None
                task.parked_at = "wait"
                self.parked.append(task)
                into.append(task)

    def stop_threads(self, timeout: float = 5.0) -> None:
        """The schedule ends: every thread task still alive stops as a crashed process's
        does (``_Crashed`` where it waits or at its next point; one never let go does not
        run at all), and is joined (at most ``timeout`` real seconds in all), so no thread
        of the schedule outlives it."""
        self.stopping = True
        self._plain = False  # no lean point any more (see _plain)
        if not self.thread_tasks:  # an all-async schedule: nothing to stop or join
            return
        for task in list(self.thread_tasks):
            if task.ended is not None and not task.ended.is_set():
                task.process.crashed = True
                assert task.go is not None
                task.go.set()
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for task in list(self.thread_tasks):
            thread = task.os_thread
            if thread is not None and thread is not me:
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- running ----------------------------------------------------------------------------
    @types.coroutine
    def _drive(self, task: SimTask) -> Generator[Any, Any, None]:
        """What the asyncio task of a driven ``task`` runs: it steps the job's coroutine
        (and, through :meth:`_slice`, those of the tasks the decisions at its points choose),
        yields to asyncio whatever the job awaits there (a future, a bare yield), and while
        the job is parked, waits on ``task.park`` until it is let go or handed what the job
        yielded while another driver stepped it. Once the job ends, it concludes it (unless
        the slice that ran its last step did), as :meth:`_run_async` does for an undriven
        job: the asyncio task runs this generator itself, with no coroutine around it."""
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                kind, payload = self._slice(task, value, error)
                value = error = None
                while kind == _PARKED[0]:
                    park = task.park
                    if park is None:
                        park = task.park = self.loop.create_future()
                    try:
                        yield from park.__await__()
                    except BaseException as exc:  # cancelled (a timeout, teardown, another task)
                        error = exc
                    task.park = None
                    command, task.command = task.command, None
                    if command is None:  # cancelled while parked: the gate hears of it
                        kind = _GO
                        break
                    kind, payload = command
                    if error is not None:
                        if kind == _AWAIT:
                            if isinstance(payload, asyncio.Future):
                                payload.cancel()
                            kind = _GO  # the job hears of it where it awaited
                        elif kind == _GO:
                            pass
                        else:
                            error = None  # it ended meanwhile: nothing left to cancel
                if kind in (_DONE, _FAILED):
                    break
                if kind == _AWAIT:
                    try:
                        value = yield payload
                    except BaseException as exc:
                        error = exc
        except BaseException as exc:  # the driving itself failed: the job's end, as in _run_async
            kind, payload = _FAILED, exc
        if kind == _FAILED or payload is not _CONCLUDED:  # else a slice concluded it already
            self._conclude(task, kind, payload)

    def _slice(self, owner: SimTask, value: Any, error: BaseException | None) -> tuple[int, Any]:
        """Step ``owner``'s coroutine (sending ``value`` or throwing ``error``) and, each
        time it parks at a point where the decision chose another driven task, that task's
        coroutine, in its own context and as asyncio's current task: a switch between tasks
        at a point costs no loop round. Ends when the task stepped last waits for something
        of asyncio's (handed to its own driver), ends, or parks with no decision made now
        (the loop makes it once everything ready ran). Returns what ``owner``'s driver does:
        ``_PARKED`` (wait on its park future), or its own coroutine's ``(_AWAIT, what)``,
        ``(_DONE, result)``, ``(_FAILED, exception)``."""
        cur = owner
        loop = self.loop
        current_tasks = _SWAP_DICT
        self._owner = owner
        #: what asyncio's current task is: owner's while the slice runs, except while the
        #: code of another task runs (from its step until the next step of another task or
        #: until the slice handles what it yielded)
        owner_atask = owner.atask
        shown = owner_atask
        #: owner's job ended in this slice and was concluded here (its driver only returns)
        over = False
        #: tasks whose jobs ended in this slice: their drivers are told once it returns
        ended: list[SimTask] = []
        try:
            while True:
                self._stepping = cur
                outcome: tuple[int, Any] | None
                try:
                    if cur is owner:
                        if shown is not owner_atask:
                            shown = owner_atask
                            if current_tasks is not None:
                                current_tasks[loop] = shown
                            else:
                                _swap_current(loop, shown)  # type: ignore[misc]
                        coro = cur.coro
                        yielded = coro.throw(error) if error is not None else coro.send(value)
                    else:
                        ctx: Any = cur.ctx  # set for every driven task
                        atask = cur.atask
                        if shown is not atask:  # cur's code runs as its own asyncio task
                            shown = atask
                            if current_tasks is not None:
                                current_tasks[loop] = atask
                            else:
                                _swap_current(loop, atask)  # type: ignore[misc]
                        if error is not None:
                            yielded = ctx.run(cur.coro.throw, error)
                        else:
                            yielded = ctx.run(cur.send, value)
                except StopIteration as stop:
                    outcome = (_DONE, stop.value)
                except BaseException as exc:
                    outcome = (_FAILED, exc)
                else:
                    if yielded is _SWITCH:
                        chosen = self._next
                        if chosen is not None:  # no code runs before chosen's step
                            self._next = None
                            cur = chosen
                            value = error = None
                            continue
                        outcome = None
                    else:
                        outcome = (_AWAIT, yielded)
                if shown is not owner_atask:  # asyncio's current task is owner's again
                    shown = owner_atask
                    if current_tasks is not None:
                        current_tasks[loop] = shown
                    else:
                        _swap_current(loop, shown)  # type: ignore[misc]
                if outcome is None:  # parked, no decision now
                    self._stepping = None
                    return _PARKED if not over else (_DONE, _CONCLUDED)
                self._stepping = None
                if outcome[0] == _AWAIT:
                    if cur is owner:
                        return outcome
                    self._signal(cur, outcome)  # its own driver waits for it
                    return _PARKED if not over else (_DONE, _CONCLUDED)
                if cur is owner:
                    if not self._may_chain(owner):
                        return outcome
                    over = True
                self._stepping = cur  # its end is its own, as in its own asyncio task
                try:
                    self._conclude(cur, *outcome)
                except _Stop:  # a check at its end failed
                    loop.stop()
                finally:
                    self._stepping = None
                if cur is not owner:
                    ended.append(cur)
                chosen = self._chain(cur)
                if chosen is not None:  # the decision the idle loop would make next, now
                    cur, value, error = chosen, None, None
                    continue
                return _PARKED if not over else (_DONE, _CONCLUDED)
        finally:
            self._owner = self._stepping = None
            if shown is not owner_atask:
                if current_tasks is not None:
                    current_tasks[loop] = owner_atask
                else:
                    _swap_current(loop, owner_atask)  # type: ignore[misc]
            for task in ended:
                self._signal(task, (_DONE, _CONCLUDED))  # its driver only returns

    def _may_chain(self, task: SimTask) -> bool:
        """Whether, once ``task``'s job ended in a slice, the loop's next step could be a
        decision (see :meth:`_chain`): then its driver's slice may conclude it and go on."""
        loop: Any = self.loop
        return not (
            self._ready
            or self.stopping
            or self.checkers
            or self.impaired
            or self.sleeping
            or self.thread_tasks
            or self.external
            or self.statements
            or self.deferred
            or loop._stopping
            or task.atask._callbacks  # type: ignore[union-attr]  # someone awaits it
            or self.steps >= self.max_steps
            or loop.vtime > self.max_time
            or not self.parked
        )

    def _chain(self, task: SimTask) -> SimTask | None:
        """``task``'s job ended (and was concluded) in a slice, where its driver would be
        woken to end its asyncio task and then, with nothing else ready, the idle loop would
        decide (:meth:`decide`). When that is so (nothing ready, no check, fault, thread or
        real I/O, nobody awaiting ``task``'s asyncio task, the decision cannot raise), the
        decision is made now; the driven task it chooses is returned, for the slice to step
        at once (no loop round for the wake-up nor for the decision). ``None``: the loop
        goes on as usual."""
        if not self._may_chain(task) or self.loop._io_pending():
            return None
        parked = self.parked
        chosen = self._pick(list(parked))
        if not chosen.driven:
            self._release(chosen)
            return None
        parked.remove(chosen)
        chosen.parked_at = None
        self.loop.spins = 0  # as after an idle iteration
        return chosen

    async def _run_async(self, task: SimTask, coro: Awaitable[Any]) -> None:
        try:
            result = await coro
        except BaseException as exc:
            self._conclude(task, _FAILED, exc)
        else:
            if result is not _CONCLUDED:  # a driven job that ended while another stepped it
                self._conclude(task, _DONE, result)

    def _conclude(self, task: SimTask, kind: int, payload: Any) -> None:
        """``task``'s job ended: with its result (``_DONE``) or an exception (``_FAILED``)."""
        try:
            if kind == _FAILED:
                raise payload
            task.result = payload
        except _Crashed:
            pass
        except _Stop:
            self.loop.stop()  # a check failed: the schedule ends here
        except asyncio.CancelledError:
            if not task.process.crashed:
                task.error = asyncio.CancelledError()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # an Exception, or a BaseException of the job's own
            task.error = exc
        finally:
            self._finish(task)

    def _finish(self, task: SimTask) -> None:
        task.done = True
        if task.finished is not None and not task.finished.done():
            task.finished.set_result(None)
        if self._joins:
            self._wake_joins()
        error = task.error
        if error is not None and self.failure is None:
            # a ConfigurationError ending a job says its code is wrong: a failure, as any bug
            misuse = isinstance(error, ConfigurationError) and not self.stopping
            if misuse or not _expected(error):
                self.failure = error
        if self.checkers and not self.stopping:
            self.run_checks()  # a task's last step ends here, with no point after it

    def iter_holders(self) -> Iterator[tuple[str, list[SimTask]]]:
        """Per critical section: the tasks counted as holding it now."""
        for name, entries in self.sections.items():
            holders = []
            for task, lease in entries:
                if task is not None and task.process.crashed:
                    continue
                if lease is not None and not _lease_valid(lease, self.loop.vtime):
                    continue
                holders.append(task)
            yield name, holders

    async def close_clients(self) -> None:
        if self.parked:
            self._cancel_parked_background()
        blocking = self._blocking_clients
        if blocking:
            self._close_blocking(blocking)
        for client in reversed(self.clients):
            if any(client is b for b in blocking):
                continue
            try:
                await client.close()
            except Exception:  # a crashed task's client: nothing left to give back
                pass

    def _cancel_parked_background(self) -> None:
        """The schedule ends, so nothing is decided any more: a background task of a client
        parked at a point (a renewal or a give-back of a process paused or crashed as the
        schedule ended) would never go on. It is cancelled before the clients close, as the
        teardown would after, so that no ``close()`` waits out its timeout for it (virtual
        seconds that cost loop rounds). The jobs themselves are left to the teardown."""
        jobs = set(self.tasks)
        for atask, task in list(self._by_atask.items()):
            if task not in jobs and task in self.parked and not atask.done():
                atask.cancel()

    def _close_blocking(self, clients: list[Any], timeout: float = 10.0) -> None:
        """Close the blocking clients of ``sim.locks(sync=True)``... as the schedule ends
        (after :meth:`stop_threads`): in a thread of their own, off the loop thread (a close
        may wait, which would block the loop), joined at most ``timeout`` real seconds."""

        def close_all() -> None:
            for client in reversed(clients):
                try:
                    client.close()
                except Exception:  # a crashed task's client: nothing left to give back
                    pass

        closer = threading.Thread(target=close_all, name="jobfence-sim-close", daemon=True)
        closer.start()
        closer.join(timeout)


def verdict(checker: Checker, sim: Simulation, *, end: bool) -> str | None:
    """What ``checker`` finds wrong now (``end``: at the end of the schedule), or ``None``.
    A checker that raises fails the schedule under its own name: its exception is not
    thrown into the job whose point ran the check, which might catch it and go on."""
    try:
        return checker.end(sim) if end else checker.step(sim)
    except Exception as exc:
        return f"the checker raised {exc!r}"


def _all_done(tasks: list[SimTask]) -> bool:
    """Whether every task of ``tasks`` is done: a loop, cheaper than ``all()`` over a
    generator (asked at every job's end and as the schedule ends)."""
    for task in tasks:  # noqa: SIM110  # all() over a generator costs more
        if not task.done:
            return False
    return True


def _lease_valid(lease: Any, now: float) -> bool:
    if getattr(lease, "lost", False):
        return False
    expires_in = getattr(lease, "expires_in", None)
    return expires_in is None or expires_in > 0


def _expected(error: BaseException) -> bool:
    """A job ending in an injected fault or a jobfence error (lost lease, stale version,
    claim in progress...), or in an error raised *from* one (``raise Gave_up() from exc``),
    is an outcome of the schedule, not a bug in the scenario. An error raised while
    handling one, without ``from`` (a ``TypeError`` in an ``except`` block), is a bug the
    fault revealed."""
    seen = 0
    link: BaseException | None = error
    while link is not None and seen < 20:
        if isinstance(link, (InjectedFault, JobfenceError, asyncio.CancelledError)):
            return True
        link = link.__cause__
        seen += 1
    return False


def _sync_flag(sync: object) -> bool:
    if not isinstance(sync, bool):
        raise ConfigurationError(
            f"sync must be True (a blocking client) or False (asyncio), got {sync!r}",
            argument="sync",
        )
    return sync


#: point names found good already (a point is reached thousands of times per explore)
_GOOD_NAMES: set[str] = set()


#: SimTable, imported on first use (table.py imports this module): a schedule makes its
#: tables without an import statement's look-ups each time
_SIM_TABLE: type[SimTable] | None = None


def _load_sim_table() -> type[SimTable]:
    global _SIM_TABLE
    from .table import SimTable

    _SIM_TABLE = SimTable
    return SimTable


def _check_point_name(name: object, argument: str) -> None:
    if type(name) is str and name in _GOOD_NAMES:
        return
    if not isinstance(name, str) or not name or "#" in name or "(" in name or ")" in name:
        raise ConfigurationError(
            f"{argument} must be a non-empty str without any of #(), got {name!r}",
            argument=argument,
        )
    if type(name) is str and len(_GOOD_NAMES) < 10_000:
        _GOOD_NAMES.add(name)


def _no_coroutine(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a thread task runs it: a ConfigurationError (the job's failure) if it
    returns an awaitable or a generator, which nothing would run (``lambda: job()`` with
    ``job`` an ``async def``: the job would never run, yet the schedule would pass)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if isinstance(result, _Passed):  # testing.point(...) called as a job: done already
            return None
        if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
            close = getattr(result, "close", None)
            if close is not None and not inspect.isasyncgen(result):
                close()  # never run: no "never awaited" warning on top of the error
            raise ConfigurationError(
                f"job returned a {type(result).__name__}, which nothing runs: a plain "
                "function given to sim.spawn runs in a thread task and is not awaited; give "
                "spawn the async function itself (sim.spawn(job, *args)) for an async task",
                argument="job",
            )
        return result

    return run


class _Passed:
    """What :func:`point` returns where there is nothing to wait for (outside a
    simulation, or in a thread task, which waited at the point already): an awaitable that
    is done, so ``await point(...)`` and ``point(...)`` both work, and never a coroutine
    (nothing to forget to await, no "never awaited" warning)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that finishes at once

    def __repr__(self) -> str:
        return "<jobfence.testing.point: passed>"


_PASSED = _Passed()


class _Section:
    """The block of :meth:`Simulation.critical`: a holder of the section while it runs,
    entered with ``with`` (thread tasks) or ``async with`` (async tasks)."""

    __slots__ = ("entry", "holders")

    def __init__(self, holders: list[tuple[SimTask, Any]], entry: tuple[SimTask, Any]) -> None:
        self.holders = holders
        self.entry = entry

    def __enter__(self) -> None:
        self.holders.append(self.entry)

    def __exit__(self, *exc: object) -> None:
        self.holders.remove(self.entry)

    async def __aenter__(self) -> None:
        self.holders.append(self.entry)

    async def __aexit__(self, *exc: object) -> None:
        self.holders.remove(self.entry)


def point(name: str, *, target: Any = None) -> Awaitable[None]:
    """A point in your own code: a place where the simulation may switch tasks or inject
    a fault. ``name`` is the point's name, the one a fault targets; ``target`` (optional)
    says what the point acts on (a table, a key...), passed to the hook as
    ``info["target"]`` so that a fault can be aimed at it.

    In an async task, ``await testing.point("charge")``: the task waits there for the
    scheduler's decision. In a thread task (a plain function given to ``sim.spawn``), call
    it without ``await``, ``testing.point("charge")``: it blocks there until the scheduler
    lets the task go. A fault at the point takes effect in both (``transient`` raises
    :class:`~jobfence.testing.InjectedFault`, ``pause_past_ttl`` and ``crash`` stop or kill
    the task's process). Outside a simulation it does nothing, in either form. Returns an
    awaitable, already done except in an async task of a simulation."""
    if type(name) is not str or name not in _GOOD_NAMES:  # a known name: no call
        _check_point_name(name, "name")
    sim = _current
    if sim is None:
        return _PASSED
    # on_point's lean path, decided now: an awaited point is awaited at once, nothing runs in
    # between (the commonest point of a scenario)
    step = sim.lean_point(name)
    if step is not None:
        return step  # type: ignore[no-any-return]  # sim.passed (a done future) if it goes on
    gate = sim.on_point(name, {} if target is None else {"target": target})
    return _PASSED if gate is None else cast("Awaitable[None]", gate)


class _Spawner:
    """The ``_core.compat.Spawner`` a schedule installs: the threads jobfence starts from a
    task become thread tasks of the simulation running now (see
    :meth:`Simulation._spawn_background`)."""

    __slots__ = ()

    def spawn(
        self, fn: Callable[[], Any], name: str, abandon: Callable[[], None] | None
    ) -> threading.Thread | None:
        sim = _current
        return None if sim is None else sim._spawn_background(fn, abandon)

    def controls(self) -> bool:
        sim = _current
        return sim is not None and threading.get_ident() in sim._by_thread

    def wait(self, event: threading.Event, timeout: float) -> bool:
        sim = _current
        if sim is not None and not event.is_set():
            sim.thread_wait(event, timeout)
        return event.is_set()

    def join(self, worker: threading.Thread, timeout: float) -> bool:
        sim = _current
        return sim is not None and sim._join_thread(worker, timeout)


_SPAWNER = _Spawner()


def install(sim: Simulation | None) -> None:
    """Make ``sim`` the simulation the hook points and jobfence's threads go to (``None``:
    none)."""
    global _current
    _current = sim
    compat.set_spawner(None if sim is None else _SPAWNER)


route = _route
