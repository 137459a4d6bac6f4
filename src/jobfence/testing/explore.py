"""Run a scenario under many schedules and faults; report, replay and shrink failures.

``explore(scenario, schedules=1000, seed=0, faults="auto")`` runs ``scenario(sim)`` once per
schedule. Schedule ``i`` (its *index*, from 0) has the *seed* ``seed + i``; it is fully
determined by it (its faults and, for the random strategies, the generator of its picks). A
failure prints both; ``pytest --jobfence-seed=N`` always takes the seed, never the index: it
re-runs exactly schedule ``N - seed`` of every ``explore`` in the test whose seeds include
``N`` (after schedule 0), and leaves an ``explore`` whose seeds do not include ``N`` as it is.
Schedule 0 is always FIFO without the automatic faults (it also records the points the
scenario hits).

With ``faults="auto"`` the next schedules try, on FIFO, every single fault at every hit of
every point schedule 0 hit (in the order it hit them: a ``transient`` failure, then
``commit_unknown`` at table writes and commits, ``lost_ack`` at acks, ``pause_past_ttl``,
``crash``), then every pair of them; the rest go round that plan again under the chosen
``strategy``. The first failure is shrunk (fewest faults, then fewest deviations from FIFO,
never a longer tape, always the same check and message) and reported with its seed and tape.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from .._core.clock import set_clock
from .._core.hooks import set_hook
from ..errors import ConfigurationError
from . import _sim
from ._base import _Budget, _Deadlock, _Stop
from ._loop import SimLoop
from ._sim import Hit, SimClock, Simulation, Violation
from .checkers import Checker
from .faults import Auto, Fault, _nameable, parse
from .strategies import PCT, Exhaustive, Fifo, Random, Strategy, TapeStrategy
from .table import SimTable as _SimTable

__all__ = ["Failure", "Report", "Tape", "explore", "replay"]

Scenario = Callable[[Simulation], Awaitable[Any]]
STRATEGIES = ("random", "pct", "fifo", "exhaustive")

_LOG = logging.getLogger("jobfence")
#: run only the schedule of this seed (when set, it wins over ``pytest --jobfence-seed=N``,
#: which the ``jobfence_pytest`` plugin module keeps until an explore reads it)
_REPLAY_SEED: int | None = None
#: every explore runs N schedules (when set, it wins over ``pytest --jobfence-schedules=N``)
_SCHEDULES: int | None = None
#: the random module is seeded with this at the start of every schedule (and restored after)
_RANDOM_SEED = 0


@dataclass(frozen=True)
class Tape:
    """What a schedule did: the task picked at each decision with more than one candidate,
    and the faults injected. ``str(tape)`` is ``"t1 t2 t1 | transient(db.write[orders]#1)"``;
    :meth:`parse` reads it back (tapes written before faults had targets too).

    Replaying a tape follows its picks one decision after the other; a pick that names no
    candidate at its decision (``-`` or a task that is not ready there) takes the FIFO
    choice, and once the picks run out every further decision is the FIFO choice. So a
    tape's trailing FIFO picks can be left out: a shrunk tape ends at its last deviation."""

    picks: tuple[str, ...]
    faults: tuple[Fault, ...] = ()

    def __str__(self) -> str:
        picks = " ".join(self.picks) or "-"
        if not self.faults:
            return picks
        return f"{picks} | {', '.join(map(str, self.faults))}"

    @classmethod
    def parse(cls, text: str) -> Tape:
        picks, _, faults = text.partition("|")
        names = tuple(picks.split())
        if names == ("-",):  # no picks at all; elsewhere "-" keeps its decision FIFO
            names = ()
        found = tuple(parse(f) for f in faults.replace("),", ")\x00").split("\x00") if f.strip())
        return cls(names, found)


@dataclass
class Failure:
    """A failed schedule: its ``seed`` (what ``pytest --jobfence-seed=`` takes) and
    ``index`` (its position in its ``explore``: ``seed - explore's seed``), what failed
    (``check`` is the checker's name, or ``"exception"``, ``"deadlock"``, ``"budget"``), the
    ``message``, the job's ``error`` if one raised, the shrunk ``tape`` and the ``original``
    one, and what the injected faults did to their jobs (``injected``)."""

    seed: int
    index: int
    check: str
    message: str
    tape: Tape
    original: Tape
    deviations: int
    error: BaseException | None = None
    _rerun: Callable[[Tape], Report] | None = field(default=None, repr=False)
    #: what each injected fault did to its job, e.g. ``"t2 crashed at crash(lock.acquire#2)
    #: (injected)"`` or ``"t1 got transient(db.write#1) (injected) and ended in
    #: InjectedFault(...)"``: a job a fault killed or failed is reported as such
    injected: tuple[str, ...] = ()

    def replay(self) -> Report:
        """Run the scenario once more following :attr:`tape` (a one-schedule report)."""
        if self._rerun is None:
            raise ConfigurationError("this failure has no scenario to replay", argument="failure")
        return self._rerun(self.tape)

    def __str__(self) -> str:
        faults = ", ".join(map(str, self.tape.faults)) or "none"
        # both numbers; --jobfence-seed takes the seed
        where = f"schedule {self.index} (seed {self.seed}) " if self.seed >= 0 else "the replay "
        seed = f"pytest --jobfence-seed={self.seed}, or " if self.seed >= 0 else ""
        injected = "".join(f"  {line}\n" for line in self.injected)
        return (
            f"{where}failed: {self.check}: {self.message}\n"
            f"{injected}"
            f"  faults: {faults}\n"
            f"  tape:   {self.tape}   ({self.deviations} deviation(s) from FIFO; before "
            f"shrinking: {len(self.original.picks)} picks, {len(self.original.faults)} faults)\n"
            f"  replay: {seed}failure.replay() / testing.replay(scenario, {str(self.tape)!r})"
        )


@dataclass
class Report:
    """The outcome of :func:`explore`: ``schedules`` run, ``failures`` (the first one,
    shrunk, unless ``stop_on_failure=False``), ``seconds`` of wall time, and whether an
    exhaustive search walked every branch (``exhausted``)."""

    schedules: int
    failures: list[Failure]
    seconds: float
    seed: int
    strategy: str
    faults: str
    exhausted: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` with the first failure (seed, tape, how to replay)."""
        if self.failures:
            first = self.failures[0]
            raise AssertionError(f"jobfence.testing: {first}") from first.error

    def __str__(self) -> str:
        head = (
            f"{self.schedules} schedule(s), strategy {self.strategy}, faults {self.faults}, "
            f"{self.seconds:.3f} s"
        )
        if self.ok:
            return f"{head}: no failure" + (" (search exhausted)" if self.exhausted else "")
        return f"{head}: {len(self.failures)} failure(s)\n{self.failures[0]}"


@dataclass
class _Outcome:
    failed: bool
    check: str
    message: str
    error: BaseException | None
    tape: Tape
    deviations: int
    trail: list[Hit]
    steps: int
    injected: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.injected = _injected(self.trail)

    @property
    def signature(self) -> tuple[str, ...]:
        """What a shrunk schedule must fail with to count as the same failure: the same
        check with the same message; for an exception, one of the same type and message
        (the task that raised it may differ)."""
        if self.check == "exception" and self.error is not None:
            return (self.check, type(self.error).__qualname__, str(self.error))
        return (self.check, self.message)


def _injected(trail: Sequence[Hit]) -> tuple[str, ...]:
    """One line per fault injected in a schedule, saying what it did to the job that hit it
    (the trail of a schedule holds every hit a fault was injected at)."""
    lines: list[str] = []
    for hit in trail:
        fault = hit.fault
        if fault is None:
            continue
        task = hit.task
        if fault.kind == "crash":
            lines.append(f"{task.name} crashed at {fault} (injected)")
        elif fault.kind == "pause_past_ttl":
            lines.append(f"{task.name} was paused at {fault} (injected)")
        elif fault.kind == "lost_ack":
            lines.append(f"{task.name}'s ack was lost at {fault} (injected)")
        elif task.error is not None:
            lines.append(f"{task.name} got {fault} (injected) and ended in {task.error!r}")
        else:
            lines.append(f"{task.name} got {fault} (injected) and went on")
    return tuple(lines)


def _kinds(point: str, holds: bool) -> tuple[str, ...]:
    """The faults worth trying at a hit of ``point``; pausing or crashing a process only
    where it holds a lease, claim or delivery that another process takes over (elsewhere a
    crash only loses the job, which nothing in the scenario would bring back)."""
    if point == "sleep":
        return ()
    if point.endswith(".renew"):
        return ("transient",)
    kinds = ["transient"]
    if point in ("db.write", "db.commit"):
        kinds.append("commit_unknown")
    if point == "queue.ack":
        kinds.append("lost_ack")
    if holds:
        kinds += ["pause_past_ttl", "crash"]
    return tuple(kinds)


def _singles(trail: Sequence[Hit], kinds: tuple[str, ...]) -> list[Fault]:
    """The single faults worth trying at the hits of ``trail``, in the order of the hits:
    aimed at the hit's target (its ``tnth`` hit there) when it has one a fault can name,
    else at the point's ``nth`` hit."""
    out: list[Fault] = []
    seen: set[tuple[str, str | None, int]] = set()
    for hit in trail:
        if _nameable(hit.target):
            at: tuple[str, str | None, int] = (hit.point, hit.target, hit.tnth)
        else:
            at = (hit.point, None, hit.nth)
        if at in seen:
            continue
        seen.add(at)
        for kind in _kinds(hit.point, hit.holds):
            if kind not in kinds:
                continue
            try:
                out.append(Fault(kind, hit.point, at[2], target=at[1]))
            except ConfigurationError:  # a point of the scenario's own no fault can name
                break
    return out


def _plan(trail: Sequence[Hit], limit: int, spec: Auto) -> list[tuple[Fault, ...]]:
    singles = _singles(trail, spec.kinds)
    plan: list[tuple[Fault, ...]] = [(f,) for f in singles]
    for j in range(len(singles) if spec.depth > 1 else 0):
        if len(plan) >= limit:
            break
        for i in range(j):
            a, b = singles[i], singles[j]
            if (a.point, a.target, a.nth) != (b.point, b.target, b.nth):
                plan.append((a, b))
    return plan[:limit]


class _Runner:
    def __init__(
        self,
        scenario: Scenario,
        checks: Sequence[Checker],
        max_steps: int,
        max_time: float,
        quiet: bool = True,
    ) -> None:
        if not callable(scenario):
            raise ConfigurationError(
                f"scenario must be an async function scenario(sim), got {scenario!r}",
                argument="scenario",
            )
        if _sim._current is not None or asyncio._get_running_loop() is not None:
            raise ConfigurationError(
                "explore() and replay() run the scenario on an event loop of their own: call "
                "them from synchronous code (a plain `def test_...`), not from a running event "
                "loop or another scenario",
                argument="scenario",
            )
        self.scenario = scenario
        if not isinstance(checks, (list, tuple)) or not all(
            isinstance(check, Checker) for check in checks
        ):
            raise ConfigurationError(
                "checks must be a list of jobfence.testing checkers (exactly_once(...), "
                "once_per_slot(...), published_once(...), no_lost_update(), single_holder(), "
                f"at_most_holders(n), fencing_monotonic()), got {checks!r}",
                argument="checks",
            )
        self.checks = list(checks)
        self.max_steps = max_steps
        self.max_time = max_time
        self.quiet = quiet
        self._in_session = False
        self._main_task: asyncio.Task[Any] | None = None
        self.loop = SimLoop()
        #: the ``memory://`` store name of every schedule this runner runs
        self.namespace = f"jfsim{next(_sim._ids)}"
        from ..backends.memory import inbox, locks, outbox, queue

        #: the ``memory://`` backends whose stores a schedule may create, a live view of
        #: each one's store names, and the names :meth:`_stores` found (in that order)
        self._store_modules: tuple[Any, ...] = (locks, inbox, queue, outbox)
        self._store_views: list[Any] = [m._stores.keys() for m in self._store_modules]
        self._store_keys: list[set[str]] = []

    def _stores(self) -> list[set[str]]:
        """The names of the ``memory://`` stores that exist now, per backend: as the last
        schedule left them (its new ones dropped) unless they changed since, so a schedule
        pays a snapshot only when something outside the schedules created or removed one
        (one comparison of the live views with the sets, in C, otherwise)."""
        known = self._store_keys
        if self._store_views != known:
            known = self._store_keys = _memory_stores(self._store_modules)
        return known

    def _drop_stores(self, before: list[set[str]]) -> None:
        """Drop the ``memory://`` stores the schedule created (see :func:`_drop_new_stores`),
        finding them with a set difference rather than a loop over every store."""
        if self._store_views == before:  # the commonest end: no store made or removed
            return
        for module, keys in zip(self._store_modules, before, strict=True):
            stores = module._stores
            if stores.keys() != keys:
                with module._stores_mutex:
                    for key in stores.keys() - keys:
                        del stores[key]

    def close(self) -> None:
        self.loop.close()

    async def _main(self, sim: Simulation) -> None:
        result = self.scenario(sim)
        if not inspect.isawaitable(result):
            raise _NotAScenario(
                ConfigurationError(
                    "scenario must be an async function scenario(sim) (it returned "
                    f"{type(result).__name__}, not an awaitable)",
                    argument="scenario",
                )
            )
        await result
        await sim.join()
        for checker in sim.checkers:
            problem = _sim.verdict(checker, sim, end=True)
            if problem:
                sim.violate(checker.name, problem)
                raise _Stop

    def run(self, strategy: Strategy, faults: tuple[Fault, ...], record: bool = False) -> _Outcome:
        loop = self.loop
        sim = Simulation(
            loop,
            strategy,
            faults,
            max_steps=self.max_steps,
            max_time=self.max_time,
            record=record,
            namespace=self.namespace,
        )
        sim.watch(*self.checks)
        strategy.begin()
        loop.vtime = 0.0
        loop.sim = sim
        if self._in_session:  # explore's loop: no context manager per schedule
            error = self._schedule(sim)
        else:
            with self.session():
                error = self._schedule(sim)
        return self._outcome(sim, error)

    def _schedule(self, sim: Simulation) -> BaseException | None:
        """Run one schedule of ``sim`` inside a session; return what ended it, if anything."""
        loop = self.loop
        stores = self._stores()
        _sim.install(sim)
        # what jobs draw from the random module (retry_unit's jitter: how long a backoff
        # sleeps, so which task wakes first) is the same in every run of a schedule
        random.setstate(_seeded_state())
        error: BaseException | None = None
        try:
            # the scenario's task, in a context of its own (none of its changes leak out)
            coro = self._main(sim)
            ctx = contextvars.copy_context()
            base: Any = loop  # BaseEventLoop's private attributes, untyped
            if base._task_factory is None:  # create_task's own steps, without its checks
                main: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=ctx)  # type: ignore[call-arg]
            else:
                main = base.create_task(coro, context=ctx)
            self._main_task = main
            try:
                loop.run_task(main)
            except _NotAScenario as exc:
                raise exc.error from None  # explore's argument, not the scenario's code
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # a check, a deadlock, a budget, or any error
                error = exc  # of the scenario's own: a failure of this schedule
        finally:
            try:
                self._teardown(sim, stores)
            finally:
                _sim.install(None)
                loop.sim = None
                self._main_task = None
        return error

    @contextmanager
    def session(self) -> Iterator[None]:
        """The simulation's clock and hook, quiet logs and a saved ``random`` state, for
        every schedule run inside the block (explore keeps one session for all of them;
        installing them per schedule would cost more than a small schedule itself)."""
        if self._in_session:
            yield
            return
        quiet = self.quiet and _LOG.level < logging.ERROR
        level = _LOG.level
        if quiet:  # thousands of schedules of expected warnings; a replay shows them
            _LOG.setLevel(logging.ERROR)
        old_clock = set_clock(SimClock(self.loop))
        old_hook = set_hook(_sim.route)
        old_random = random.getstate()
        self._in_session = True
        try:
            yield
        finally:
            self._in_session = False
            random.setstate(old_random)
            set_hook(old_hook)
            set_clock(old_clock)
            if quiet:
                _LOG.setLevel(level)

    def _teardown(self, sim: Simulation, stores: list[set[str]]) -> None:
        loop = self.loop
        sim.stop_threads()  # the schedule ends: its thread tasks stop, none outlives it
        if sim.clients:
            loop.run_until_complete(sim.close_clients())
        main = self._main_task
        ready = loop._ready  # type: ignore[attr-defined]
        if (
            ready  # callbacks queued as the schedule ended (a task's next step among them?)
            or loop._scheduled  # type: ignore[attr-defined]
            or sim.parked
            or not _sim._all_done(sim.tasks)
            or (main is not None and not main.done())  # a check ended the schedule early
            or not _all_futures_done(loop.started)  # a task the scenario left behind
        ):
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=3600))
        for handle in loop._scheduled:  # type: ignore[attr-defined]
            handle.cancel()
        loop._scheduled.clear()  # type: ignore[attr-defined]
        loop._timer_cancelled_count = 0  # type: ignore[attr-defined]
        for table in sim.tables:
            if type(table) is _SimTable:  # in memory: nothing to close (and no getattr miss)
                continue
            closer = getattr(table, "close", None)
            if closer is not None:
                loop.run_until_complete(closer())
        # still queued: they would run in the next schedule (a closed loop drops them)
        if ready:
            for handle in ready:
                handle.cancel()
            ready.clear()
        if loop.started:
            loop.started.clear()
        # the tables refer to the simulation, and so does a task cancelled at a gate (through
        # its error's traceback): without these cycles a schedule's objects are freed as soon
        # as it ends, not by the garbage collector (whose rounds over them cost more than a
        # small schedule's share of the rest)
        sim.tables = []
        sim._by_atask = {}  # a task cancelled at a gate: its error's traceback holds the gate
        self._drop_stores(stores)

    def _outcome(self, sim: Simulation, error: BaseException | None) -> _Outcome:
        failure = sim.failure
        check, message, err = "", "", None
        if isinstance(failure, Violation):
            check, message = failure.check, failure.message
        elif failure is not None:
            check, message, err = "exception", _describe(failure, sim), failure
        elif isinstance(error, _Deadlock):
            check, message = "deadlock", str(error)
        elif isinstance(error, _Budget):
            check, message = "budget", str(error)
        elif error is not None and not isinstance(error, _Stop):
            check, message, err = "exception", f"the scenario raised {error!r}", error
        tape = Tape(tuple(sim.picks), sim.faults)
        return _Outcome(
            bool(check), check, message, err, tape, sim.deviations, sim.trail, sim.steps
        )


class _NotAScenario(Exception):
    """The scenario given to explore/replay is no async function: raised to the caller."""

    def __init__(self, error: ConfigurationError) -> None:
        super().__init__(str(error))
        self.error = error


_SEEDED: tuple[int, Any] | None = None


def _seeded_state() -> Any:
    """The ``random`` module's state right after ``random.seed(_RANDOM_SEED)``, made once:
    restoring it is cheaper than seeding again, and the draws are the same."""
    global _SEEDED
    if _SEEDED is None or _SEEDED[0] != _RANDOM_SEED:
        saved = random.getstate()
        random.seed(_RANDOM_SEED)
        _SEEDED = (_RANDOM_SEED, random.getstate())
        random.setstate(saved)
    return _SEEDED[1]


def _all_futures_done(futures: list[asyncio.Task[Any]]) -> bool:
    for fut in futures:  # noqa: SIM110  # all() over a generator costs more
        if not fut.done():
            return False
    return True


def _memory_stores(modules: tuple[Any, ...]) -> list[set[str]]:
    """The names of the ``memory://`` stores that exist now in each of the backend
    ``modules`` (locks, inbox, queue, outbox)."""
    out: list[set[str]] = []
    for module in modules:
        with module._stores_mutex:
            out.append(set(module._stores))
    return out


def _drop_new_stores(modules: tuple[Any, ...], before: list[set[str]]) -> None:
    """Forget the ``memory://`` stores created during a schedule (``sim.locks()``,
    ``sim.outbox()``, the outbox rows a simulated transaction committed... and a job's own
    clients alike): the next schedule starts from the same state, so each one replays
    alone, and thousands of schedules keep none of them."""
    for module, keys in zip(modules, before, strict=True):
        with module._stores_mutex:
            for key in [key for key in module._stores if key not in keys]:
                del module._stores[key]


def _describe(error: BaseException, sim: Simulation) -> str:
    who = next((t.name for t in sim.tasks if t.error is error), "a task")
    return f"{who} raised {error!r}"


def _strategy(
    name: str, seed: int, depth: int, steps: int, last: Strategy | None = None
) -> Strategy:
    """The strategy of the schedule of ``seed``; ``last``, the previous schedule's (done
    with): a random one is reseeded, the same draws as a new one's."""
    if name == "random":
        if type(last) is Random:
            last.reseed(seed)
            return last
        return Random(seed)
    if name == "pct":
        return PCT(seed, depth=depth, steps=steps)
    return Fifo()


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigurationError(f"{name} must be an int >= {low}, got {value!r}", argument=name)
    return value


def _check_seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(
            f"{name} must be a number of virtual seconds > 0, got {value!r}", argument=name
        )
    return float(value)


def _fault_sets(faults: Any) -> tuple[str, tuple[Fault, ...] | None, Auto]:
    """("auto" | "none" | "fixed", the fixed faults, the auto limits)."""
    if faults is None:
        return "none", (), Auto()
    if isinstance(faults, str) and faults == "auto":
        return "auto", None, Auto()
    if isinstance(faults, Auto):
        return "auto", None, faults
    if isinstance(faults, Fault):
        return "fixed", (faults,), Auto()
    if isinstance(faults, (list, tuple)) and all(isinstance(f, Fault) for f in faults):
        return "fixed", tuple(faults), Auto()
    raise ConfigurationError(
        'faults must be None, "auto", faults.auto(...), a Fault or a list of them '
        f"(jobfence.testing.faults.transient(...)...), got {faults!r}",
        argument="faults",
    )


def explore(
    scenario: Scenario,
    *,
    schedules: int = 1000,
    seed: int = 0,
    strategy: str = "random",
    faults: Any = None,
    checks: Sequence[Checker] = (),
    depth: int = 2,
    max_preemptions: int | None = None,
    max_steps: int = 100_000,
    max_time: float = 86_400.0,
    stop_on_failure: bool = True,
    shrink: bool = True,
) -> Report:
    """Run ``scenario(sim)`` under up to ``schedules`` schedules; return a :class:`Report`.

    ``strategy``: ``"random"`` (seeded), ``"pct"`` (``depth`` 1-3), ``"fifo"`` or
    ``"exhaustive"`` (every sequence of picks, depth first, at most ``max_preemptions``
    deviations from FIFO if given, until ``schedules`` ran). ``faults``: ``None``, a list of
    :class:`~jobfence.testing.faults.Fault`, or ``"auto"``. ``checks``: invariants checked
    at every step and at the end, on top of what the scenario checks itself. A schedule
    fails on a check, a job raising an exception that is neither injected nor a jobfence
    error (a :class:`~jobfence.ConfigurationError` counts), the scenario raising any, a
    deadlock, or more than ``max_steps`` decisions (or points reached) / ``max_time``
    virtual seconds: it is reported with its seed and tape, never raised. ``seed``: schedule
    ``i`` (its index) runs with seed ``seed + i``; a failure reports both, and ``pytest
    --jobfence-seed=N`` takes the seed (never the index): it runs schedule 0 and then only
    the schedule of seed ``N``, in an explore whose seeds include ``N``.
    ``stop_on_failure`` (default ``True``): stop at the first failing schedule, else run them
    all and report every failure. ``shrink`` (default ``True``): reduce a failure to the
    fewest faults and the fewest deviations from FIFO that still fail with the same check and
    message (an exception: the same type and message), never lengthening its tape, before
    reporting it; its tape then ends at its last deviation from FIFO.
    """
    schedules = _check_int(schedules, "schedules", 1)
    replay_seed, forced_schedules = _pytest_options()
    if forced_schedules:
        schedules = forced_schedules
    seed = _check_int(seed, "seed", 0)
    depth = _check_int(depth, "depth", 1)
    if depth > 3:
        raise ConfigurationError(f"depth must be 1, 2 or 3, got {depth!r}", argument="depth")
    max_time = _check_seconds(max_time, "max_time")
    if strategy not in STRATEGIES:
        raise ConfigurationError(
            f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}",
            argument="strategy",
        )
    if max_preemptions is not None:
        _check_int(max_preemptions, "max_preemptions", 0)
    mode, fixed, spec = _fault_sets(faults)
    runner = _Runner(scenario, checks, _check_int(max_steps, "max_steps", 1), max_time)
    started = time.perf_counter()
    failures: list[Failure] = []
    ran = 0
    exhausted = False
    only = None
    if replay_seed is not None and seed <= replay_seed < seed + schedules:
        only = replay_seed - seed  # the seed's index in this explore

    def record(index: int, outcome: _Outcome, faults_used: tuple[Fault, ...]) -> bool:
        if not outcome.failed:
            return False
        shrunk = _shrink(runner, outcome) if shrink else outcome
        failures.append(
            Failure(
                seed + index,
                index,
                shrunk.check,
                shrunk.message,
                shrunk.tape,
                outcome.tape,
                shrunk.deviations,
                shrunk.error,
                lambda t: replay(
                    scenario, t, checks=checks, max_steps=max_steps, max_time=max_time
                ),
                injected=shrunk.injected,
            )
        )
        return stop_on_failure

    session = runner.session()
    session.__enter__()
    try:
        baseline = runner.run(Fifo(), fixed or (), record=True)
        ran = 1
        steps = max(baseline.steps, 1)
        if only in (None, 0) and record(0, baseline, fixed or ()):
            return _report(ran, failures, started, seed, strategy, mode, exhausted)
        plan: list[tuple[Fault, ...]]
        plan = [(), *_plan(baseline.trail, schedules, spec)] if mode == "auto" else [fixed or ()]
        if strategy == "exhaustive":
            index, exhausted = 0, True
            for faults_used in plan:
                walker = Exhaustive(max_preemptions)
                while True:
                    if index + 1 >= schedules:
                        exhausted = False
                        break
                    index += 1
                    outcome = runner.run(walker, faults_used)
                    if only is None or index == only:
                        ran += 1
                        if record(index, outcome, faults_used) or index == only:
                            return _report(ran, failures, started, seed, strategy, mode, False)
                    if not walker.advance():
                        break
                if not exhausted:
                    break
            return _report(ran, failures, started, seed, strategy, mode, exhausted)
        singles = len(plan) if mode == "auto" else 0
        last: Strategy | None = None
        for index in range(1, schedules):
            if only is not None and index != only:
                continue
            if mode == "auto" and index < singles:
                strat: Strategy = Fifo()
                faults_used = plan[index]
            else:
                strat = last = _strategy(strategy, seed + index, depth, steps, last)
                faults_used = plan[(index - singles) % len(plan)] if mode == "auto" else plan[0]
            outcome = runner.run(strat, faults_used)
            ran += 1
            if record(index, outcome, faults_used):
                break
        return _report(ran, failures, started, seed, strategy, mode, exhausted)
    finally:
        session.__exit__(None, None, None)
        runner.close()


def _report(
    ran: int,
    failures: list[Failure],
    started: float,
    seed: int,
    strategy: str,
    mode: str,
    exhausted: bool,
) -> Report:
    return Report(ran, failures, time.perf_counter() - started, seed, strategy, mode, exhausted)


def _pytest_options() -> tuple[int | None, int | None]:
    """(the seed to replay, the schedules to run) that this module's overrides or ``pytest
    --jobfence-seed`` / ``--jobfence-schedules`` ask for, if any. The plugin module keeps the
    options; it is looked up, never imported: outside pytest it is not there."""
    seed, schedules = _REPLAY_SEED, _SCHEDULES
    plugin = sys.modules.get("jobfence_pytest")
    if plugin is not None:
        if seed is None:
            seed = getattr(plugin, "replay_seed", None)
        if schedules is None:
            schedules = getattr(plugin, "schedules", None)
    return seed, schedules or None


class _Trimming(TapeStrategy):
    """A tape strategy that notes its last decision away from FIFO: the picks after it are
    FIFO picks, which a tape can leave out (past its end every decision is FIFO)."""

    def __init__(self, picks: Sequence[str | None]) -> None:
        super().__init__(picks)
        self.last = -1
        self._calls = 0

    def begin(self) -> None:
        super().begin()
        self.last, self._calls = -1, 0

    def choose(self, candidates: Sequence[Any], step: int) -> int:
        i = super().choose(candidates, step)
        if i:
            self.last = self._calls
        self._calls += 1
        return i


def _run_tape(
    runner: _Runner, picks: Sequence[str | None], faults: tuple[Fault, ...]
) -> tuple[_Outcome, int]:
    """Run a tape: its outcome, and how many of the picks it made to keep (up to its last
    deviation from FIFO: the picks after it are FIFO picks a tape can leave out)."""
    strategy = _Trimming(picks)
    outcome = runner.run(strategy, faults)
    return outcome, strategy.last + 1


def _shrink(runner: _Runner, outcome: _Outcome, budget: int = 200) -> _Outcome:
    """Fewest faults first, then fewest deviations from FIFO, keeping the same failure
    (:attr:`_Outcome.signature`: the same check and message). A tape is counted up to its
    last deviation from FIFO (the FIFO picks after it can be left out), and a step is taken
    only if its tape is no longer than the one before (the first: the original tape, all of
    its picks), so the shrunk tape is never longer than the original. The outcome of the
    shrunk schedule, with its tape cut after its last deviation."""
    want = outcome.signature
    if not outcome.tape.faults and outcome.deviations == 0:  # FIFO all along: nothing to run
        return replace(outcome, tape=Tape((), ()))

    def same(attempt: _Outcome, kept: int, limit: int) -> bool:
        return attempt.failed and attempt.signature == want and kept <= limit

    best, keep = _run_tape(runner, outcome.tape.picks, outcome.tape.faults)
    runs = 1
    limit = len(outcome.tape.picks)
    if not same(best, keep, limit):  # the tape does not replay its own failure: keep it
        return outcome
    faults = list(best.tape.faults)
    i = 0
    while i < len(faults) and runs < budget:
        trial = tuple(faults[:i] + faults[i + 1 :])
        attempt, kept = _run_tape(runner, best.tape.picks, trial)
        runs += 1
        if same(attempt, kept, limit):
            faults = list(trial)
            best, keep, limit = attempt, kept, kept
        else:
            i += 1
    limit = keep
    for k in range(keep):  # the shortest start of the tape that fails the same, then FIFO
        if runs >= budget:
            break
        attempt, kept = _run_tape(runner, best.tape.picks[:k], best.tape.faults)
        runs += 1
        if same(attempt, kept, limit) and attempt.deviations <= best.deviations:
            best, keep, limit = attempt, kept, kept
            break
    changed = best.deviations > 0  # else there is no deviation to take back
    while changed and runs < budget:
        changed = False
        picks: list[str | None] = list(best.tape.picks)
        for j in range(len(picks) - 1, -1, -1):
            if runs >= budget:
                break
            trial_picks = [*picks[:j], None, *picks[j + 1 :]]
            attempt, kept = _run_tape(runner, trial_picks, best.tape.faults)
            runs += 1
            if same(attempt, kept, limit) and attempt.deviations < best.deviations:
                best, keep, limit = attempt, kept, kept
                changed = True
                break
    best.tape = Tape(best.tape.picks[:keep], best.tape.faults)
    return best


def replay(
    scenario: Scenario,
    tape: Tape | str,
    *,
    checks: Sequence[Checker] = (),
    max_steps: int = 100_000,
    max_time: float = 86_400.0,
) -> Report:
    """Run ``scenario`` once, following ``tape`` (a :class:`Tape` or its ``str``), with
    ``checks``, ``max_steps`` and ``max_time`` as in :func:`explore`. Once the tape's picks
    run out, every decision is the FIFO choice (a pick naming no candidate is one too). A
    failure's ``tape`` is the one that ran, up to its last deviation from FIFO: replaying a
    shrunk tape reports that same tape."""
    if isinstance(tape, str):
        tape = Tape.parse(tape)
    if not isinstance(tape, Tape):
        raise ConfigurationError(f"tape must be a Tape or its str, got {tape!r}", argument="tape")
    max_steps = _check_int(max_steps, "max_steps", 1)
    max_time = _check_seconds(max_time, "max_time")
    runner = _Runner(scenario, checks, max_steps, max_time, quiet=False)
    started = time.perf_counter()
    try:
        outcome, keep = _run_tape(runner, tape.picks, tape.faults)
        outcome.tape = Tape(outcome.tape.picks[:keep], outcome.tape.faults)
    finally:
        runner.close()
    failures = []
    if outcome.failed:
        failures.append(
            Failure(
                -1,
                0,
                outcome.check,
                outcome.message,
                outcome.tape,
                tape,
                outcome.deviations,
                outcome.error,
                lambda t: replay(
                    scenario, t, checks=checks, max_steps=max_steps, max_time=max_time
                ),
                injected=outcome.injected,
            )
        )
    return _report(1, failures, started, -1, "tape", "fixed", False)
