"""What the simulation's modules share, in a module that imports none of them.

The scheduling loop (``_loop``), the simulation (``_sim``), the checkers and the simulated
tables (``table``, ``table_real``) meet here: the signals that end a task or a schedule, a
real-database statement in flight, and what a checker or a table reads of the simulation
(:class:`SimView`, which :class:`~jobfence.testing.Simulation` satisfies). So none of those
modules imports another only for its types, and the imports between them have no cycle.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol


class _Stop(BaseException):
    """Ends the schedule at once (a check failed); not an ``Exception``, so a job's own
    ``except Exception`` cannot swallow it."""


class _Deadlock(Exception):
    pass


class _Budget(_Stop):
    """``max_steps`` or ``max_time`` ran out: ends the schedule like a failed check (a
    ``BaseException`` too, so a job's ``except Exception`` cannot swallow it and spin on)."""


class _Crashed(BaseException):
    """Unwinds a crashed task at the end of its schedule (never caught by ``except
    Exception``)."""


class _Statement:
    """A statement of a real-database table in flight (:meth:`Simulation.real_io`): the
    socket it waits on (``fd``, if the driver waits on the loop's selector), and whether it
    stalled."""

    __slots__ = ("fd", "stalled")

    def __init__(self) -> None:
        self.fd: int | None = None
        self.stalled = False


class ProcessView(Protocol):
    """What a table reads of a task's process: whether it crashed."""

    @property
    def crashed(self) -> bool: ...


class TaskView(Protocol):
    """What a checker or a table reads of a task: its name (``t1``, ``t2``...) and its
    process."""

    @property
    def name(self) -> str: ...

    @property
    def process(self) -> ProcessView: ...


class SimView(Protocol):
    """What the checkers and the simulated tables read of a running simulation."""

    @property
    def effects(self) -> Mapping[str, list[Any]]:
        """The effects recorded so far, by kind (``sim.effect(kind, key)``)."""
        ...

    @property
    def tables(self) -> Sequence[Any]:
        """The simulated tables of the schedule (none once it has ended)."""
        ...

    @property
    def namespace(self) -> str:
        """The schedule's own ``memory://`` store name (``memory://<namespace>``)."""
        ...

    @property
    def block_timeout(self) -> float:
        """Real seconds a real-database statement may stall before the others go on."""
        ...

    def published(self, queue: str) -> list[str]:
        """The ids published to the schedule's queue ``queue``, in order, repeats included."""
        ...

    def iter_holders(self) -> Iterator[tuple[str, Sequence[TaskView]]]:
        """Each critical section, with the tasks inside it that count."""
        ...

    def current(self) -> TaskView | None:
        """The task running now (``None`` outside a task)."""
        ...

    def on_point(self, point: str, info: dict[str, Any]) -> Any:
        """A point reached: ``None`` to go on, or an awaitable that decides."""
        ...

    def real_io(self) -> AbstractContextManager[_Statement]:
        """The block of one real-database statement."""
        ...

    def answered(self, statement: _Statement) -> None:
        """``statement`` got its answer."""
        ...


class AttachView(SimView, Protocol):
    """What an attached connection (:mod:`jobfence.testing.connections`) reads of the
    simulation on top of :class:`SimView`: the scenario's own process (never scheduled), whether
    the schedule is ending, and the clients closed when it ends (where its attachments go)."""

    @property
    def main(self) -> ProcessView: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def clients(self) -> list[Any]: ...


class LoopDriver(Protocol):
    """What the scheduling loop reads of the simulation that drives it."""

    external: int
    statements: list[_Statement]
    running_threads: int
    stopping: bool
    max_spins: int
    max_time: float
    block_timeout: float

    def spinning(self) -> Any:
        """No task reached a point for too many loop rounds: raises."""
        ...

    def stalled_io(self) -> None:
        """A real statement did not answer within ``block_timeout``."""
        ...

    def thread_running(self) -> None:
        """A thread task runs and the loop waited for it once more: raises once it ran
        too long without reaching a point."""
        ...

    def decide(self) -> bool:
        """Let one parked task go on; whether one did."""
        ...

    def out_of_time(self) -> Any:
        """Virtual time passed ``max_time``: raises."""
        ...

    def idle_forever(self) -> Any:
        """Nothing can ever run again: raises."""
        ...
