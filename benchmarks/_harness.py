"""Shared harness for the benchmark scripts in this directory.

Timing (interleaved rounds, medians), the uncontended/contended lock benchmarks (variants, a
spawned-process hand-off with a start barrier and 1 ms critical sections), the command-line
options and the printed tables. Each ``bench_*.py`` script keeps only what is specific to its
backend: its variants, its anchors and its worker's acquire/release for each kind.

The scripts import this module as ``_harness`` after putting their own directory on
``sys.path``; spawned worker processes inherit that path from the parent.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import jobfence

TTL = 30
"""Lease ttl (seconds) of the uncontended variants."""

CRITICAL_SECTION = 0.001
"""Seconds each contended worker holds the lock (``time.sleep``) per acquisition."""

Runner = Callable[[int], None]
"""Runs ``n`` acquire+release pairs (or operations) of one variant."""

Variant = tuple[str, Runner]
"""A labelled runner: ``("(a) hand-written ...", run)``."""


# -- timing ---------------------------------------------------------------------------------
class _LapSink:
    """Where ``laps`` records each lap's duration (seconds), when ``sampled`` asks for it."""

    samples: list[float] | None = None


def laps(n: int) -> Iterator[int]:
    """``range(n)`` for a runner's loop; while ``sampled`` runs the runner, the time each
    iteration took (from one ``yield`` to the next) is recorded, so every operation of a
    batch has its own latency (sync and async bodies alike: the clock is read inside the
    loop, never around ``run_until_complete``)."""
    sink = _LapSink.samples
    if sink is None:
        yield from range(n)
        return
    clock = time.perf_counter
    last = clock()
    for i in range(n):
        yield i
        now = clock()
        sink.append(now - last)
        last = now


def sampled(run: Runner, ops: int) -> list[float]:
    """The latency (seconds) of each of the ``ops`` operations of ``run(ops)``; the runner
    must loop with ``laps``."""
    samples: list[float] = []
    _LapSink.samples = samples
    try:
        run(ops)
    finally:
        _LapSink.samples = None
    if len(samples) != ops:
        raise RuntimeError(f"the runner timed {len(samples)} of {ops} operations (use laps)")
    return samples


@dataclass
class Stats:
    """Per-operation latencies of one case, in microseconds, over all its rounds; ``rounds``
    holds the median of each round on its own (empty when the case ran as one batch), so that
    a ratio between two interleaved cases can be taken round by round."""

    median: float
    p99: float
    ops: int
    rounds: tuple[float, ...] = ()

    @classmethod
    def of(cls, seconds: Sequence[float], per_round: Sequence[Sequence[float]] = ()) -> Stats:
        ordered = sorted(seconds)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        rounds = tuple(statistics.median(r) * 1e6 for r in per_round if r)
        return cls(statistics.median(ordered) * 1e6, p99 * 1e6, len(ordered), rounds)


def round_ratios(case: Stats, anchor: Stats) -> list[float]:
    """``case / anchor`` in each round both ran in (their per-round medians), in round order."""
    return [a / b for a, b in zip(case.rounds, anchor.rounds, strict=False) if b > 0]


def us_per_op(run: Runner, ops: int) -> float:
    """Microseconds per operation of ``run(ops)``."""
    started = time.perf_counter()
    run(ops)
    return (time.perf_counter() - started) / ops * 1e6


def per_op(fn: Callable[[str], Any], ops: int) -> float:
    """Microseconds per call of ``fn(key)`` over ``ops`` fresh random keys (made untimed)."""
    keys = [uuid.uuid4().hex for _ in range(ops)]

    def run(_: int) -> None:
        for k in keys:
            fn(k)

    return us_per_op(run, ops)


def medians(
    samplers: Mapping[str, Callable[[], float]], rounds: int, rotate: bool = False
) -> dict[str, float]:
    """Call every sampler once per round, in label order (shifted by one each round if
    ``rotate``), and return each label's median sample."""
    items = list(samplers.items())
    samples: dict[str, list[float]] = {label: [] for label, _ in items}
    for i in range(rounds):
        shift = i % len(items) if rotate else 0
        for label, sample in items[shift:] + items[:shift]:
            samples[label].append(sample())
    return {label: statistics.median(values) for label, values in samples.items()}


def per_call(fn: Callable[[str], Any], ops: int) -> list[float]:
    """Seconds each call of ``fn(key)`` took, over ``ops`` fresh random keys (made untimed)."""
    keys = [uuid.uuid4().hex for _ in range(ops)]
    clock = time.perf_counter
    samples = []
    for k in keys:
        started = clock()
        fn(k)
        samples.append(clock() - started)
    return samples


def interleave_stats(
    cases: Mapping[str, Callable[[str], Any]], ops: int, rounds: int, warmup: int = 20
) -> dict[str, Stats]:
    """Median and p99 µs per call of each ``fn(key)`` over ``rounds`` interleaved rounds of
    ``ops`` fresh keys each, after a ``warmup``-call run of each (connections, prepared
    statements)."""
    for fn in cases.values():
        per_call(fn, warmup)
    samples: dict[str, list[list[float]]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(per_call(fn, ops))
    return {name: _pooled(per_round) for name, per_round in samples.items()}


def _pooled(per_round: list[list[float]]) -> Stats:
    """The ``Stats`` of all rounds' samples (seconds), with each round's median."""
    return Stats.of([x for r in per_round for x in r], per_round)


def interleave(
    cases: Mapping[str, Callable[[str], Any]], ops: int, rounds: int
) -> dict[str, float]:
    """Median µs per call of each ``fn(key)`` (``interleave_stats``' medians)."""
    return {name: st.median for name, st in interleave_stats(cases, ops, rounds).items()}


def inbox_cases(
    inbox: Any,
    held: str,
    baseline: tuple[str, Callable[[str], Any]],
    in_transaction: tuple[Callable[[str], Any], Any] | None = None,
) -> dict[str, Callable[[str], Any]]:
    """The inbox benchmark's cases: the labelled hand-written ``baseline``, ``Inbox.claim`` of
    new keys and of the ``held`` key; with ``in_transaction=(baseline_tx, txconn)`` also the
    hand-written insert and ``Inbox.claim_in`` each inside a ``txconn`` transaction."""
    cases: dict[str, Callable[[str], Any]] = {
        baseline[0]: baseline[1],
        "Inbox.claim (NEW)": inbox.claim,
        "Inbox.claim (duplicate, IN_PROGRESS)": lambda k: inbox.claim(held),
    }
    if in_transaction is not None:
        baseline_tx, txconn = in_transaction

        def claim_in(k: str) -> None:
            inbox.claim_in(txconn, k)
            txconn.commit()

        cases["hand-written insert in a transaction"] = baseline_tx
        cases["Inbox.claim_in in a transaction"] = claim_in
    return cases


def report(backend: str, timings: dict[str, float], base: str, trips: Mapping[str, Any]) -> None:
    """Print one backend's timings against the ``base`` case, then its round-trip counts."""
    print(f"\n== {backend}")
    for name, us in timings.items():
        ratio = f"{us / timings[base]:.2f}x" if name != base else "1.00x (baseline)"
        print(f"  {name:<44} {us:8.1f} µs   {ratio}")
    for name, value in trips.items():
        print(f"  round trips per {name:<31} {value}")


def sleep_cost() -> float:
    """Seconds ``time.sleep(CRITICAL_SECTION)`` really takes here (mean of 200)."""
    n = 200
    started = time.perf_counter()
    for _ in range(n):
        time.sleep(CRITICAL_SECTION)
    return (time.perf_counter() - started) / n


def new_namespace() -> str:
    """A fresh namespace (key/table prefix) for one benchmark run."""
    return "bench" + uuid.uuid4().hex[:8]


# -- command line and tables ----------------------------------------------------------------
def parse_args(doc: str | None, url_env: str, url_default: str, rounds: int, ops: int) -> Any:
    """The lock benchmarks' options: ``--url --rounds --ops --seconds --workers
    --skip-contended``; the description is the first line of ``doc``."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(url_env, url_default))
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--ops", type=int, default=ops)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip-contended", action="store_true")
    return parser.parse_args()


def print_table(
    title: str, header: tuple[str, ...], rows: Sequence[Sequence[str]], width: int | None = None
) -> None:
    """Print a table with rich if it is installed, else as plain ``|``-separated text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        print(f"\n{title}")
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=width).print(table)


# -- uncontended ----------------------------------------------------------------------------
class AsyncScope:
    """One event loop for the async variants, and what to close on it when they are done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    def runner(self, body: Callable[[int], Awaitable[None]]) -> Runner:
        """A sync runner that runs ``body(n)`` to completion on the loop."""
        return lambda n: self.loop.run_until_complete(body(n))

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to completion on the loop; return its result."""
        return self.loop.run_until_complete(awaitable)

    def on_close(self, close: Callable[[], Awaitable[Any]]) -> None:
        """Await ``close()`` on the loop when the scope closes."""
        self._closers.append(close)

    def close(self) -> None:
        """Run the closers in order, let closed renewer tasks finish, close the loop."""
        for close in self._closers:
            self.run(close())
        self.run(asyncio.sleep(0.05))
        self.loop.close()


def jobfence_sync(locks: jobfence.Locks, name: str, renew: bool) -> Runner:
    """``Locks.try_acquire(name)`` + ``release()`` pairs, each checked."""

    def run(n: int) -> None:
        for _ in laps(n):
            lease = locks.try_acquire(name, ttl=TTL, renew=renew)
            if lease is None:
                raise RuntimeError("jobfence lock not acquired")
            if not lease.release():
                raise RuntimeError("jobfence lock not released")

    return run


def owner_pairs(
    acquire: Callable[[str], object], release: Callable[[str], object], what: str
) -> Runner:
    """Hand-written acquire+release pairs, each with a fresh owner token; a falsy result of
    ``acquire(token)`` or ``release(token)`` raises ``RuntimeError("<what> not ...")``."""

    def run(n: int) -> None:
        for _ in laps(n):
            owner = uuid.uuid4().hex
            if not acquire(owner):
                raise RuntimeError(f"{what} not acquired")
            if not release(owner):
                raise RuntimeError(f"{what} not released")

    return run


def owner_pairs_async(
    acquire: Callable[[str], Awaitable[object]],
    release: Callable[[str], Awaitable[object]],
    what: str,
    scope: AsyncScope,
) -> Runner:
    """``owner_pairs`` for async ``acquire``/``release``, run on the scope's loop."""

    async def body(n: int) -> None:
        for _ in laps(n):
            owner = uuid.uuid4().hex
            if not await acquire(owner):
                raise RuntimeError(f"{what} not acquired")
            if not await release(owner):
                raise RuntimeError(f"{what} not released")

    return scope.runner(body)


async def _make_async_locks(url: str, ns: str) -> jobfence.AsyncLocks:
    return jobfence.AsyncLocks(url, namespace=ns)


def jobfence_async(url: str, ns: str, scope: AsyncScope) -> Runner:
    """``AsyncLocks.try_acquire()`` + ``release()`` pairs (renew=True) on the scope's loop;
    the ``AsyncLocks`` is made on the loop and closed with the scope."""
    locks: jobfence.AsyncLocks = scope.run(_make_async_locks(url, ns))
    scope.on_close(locks.close)

    async def body(n: int) -> None:
        for _ in laps(n):
            lease = await locks.try_acquire("jobfence-async", ttl=TTL)
            if lease is None:
                raise RuntimeError("jobfence async lock not acquired")
            if not await lease.release():
                raise RuntimeError("jobfence async lock not released")

    return scope.runner(body)


def uncontended_stats(
    build: Callable[[str, AsyncScope], list[Variant]],
    cleanup: Callable[[str], None],
    rounds: int,
    ops: int,
    warmup: int,
) -> dict[str, Stats]:
    """Median and p99 µs per acquire+release of each variant ``build(ns, scope)`` returns,
    over ``rounds`` interleaved rounds (order rotated each round) of ``ops`` pairs, after a
    ``warmup``-pair run of each; then the scope is closed and ``cleanup(ns)`` called."""
    ns = new_namespace()
    scope = AsyncScope()
    try:
        variants = build(ns, scope)
        for _, run in variants:  # warm up: connect, load scripts, create tables
            run(warmup)
        samples: dict[str, list[list[float]]] = {label: [] for label, _ in variants}
        for i in range(rounds):
            shift = i % len(variants)
            for label, run in variants[shift:] + variants[:shift]:
                samples[label].append(sampled(run, ops))
    finally:
        scope.close()
        cleanup(ns)
    return {label: _pooled(per_round) for label, per_round in samples.items()}


def uncontended(
    build: Callable[[str, AsyncScope], list[Variant]],
    cleanup: Callable[[str], None],
    rounds: int,
    ops: int,
    warmup: int,
) -> list[tuple[str, float]]:
    """Median µs per acquire+release of each variant (``uncontended_stats``' medians)."""
    stats = uncontended_stats(build, cleanup, rounds, ops, warmup)
    return [(label, st.median) for label, st in stats.items()]


def print_uncontended(
    rows: list[tuple[str, float]],
    async_pair: tuple[str, str],
    precision: int = 0,
    width: int | None = None,
) -> None:
    """Print the uncontended table: µs/op and the ratio to the first row; the row labelled
    ``async_pair[0]`` also gets its ratio to the row labelled ``async_pair[1]``."""
    base = rows[0][1]
    async_label, async_base_label = async_pair
    async_base = next(us for label, us in rows if label.startswith(async_base_label))
    table: list[tuple[str, str, str]] = []
    for label, us in rows:
        ratio = f"{us / base:.2f}x"
        if label.startswith(async_label):
            ratio += f" ({us / async_base:.2f}x of {async_base_label})"
        table.append((label, f"{us:.{precision}f}", ratio))
    print_table("Uncontended acquire+release", ("variant", "µs/op", "vs (a)"), table, width)


# -- contended hand-off ---------------------------------------------------------------------
@dataclass
class Gate:
    """The parent's start barrier and result queue, handed to every worker process."""

    start: Any  # multiprocessing Event: set once every worker is ready
    ready: Any  # multiprocessing Queue: one item per worker that is ready
    out: Any  # multiprocessing Queue: one (count, held intervals) per worker

    def hand_off(self, hold: Callable[[], AbstractContextManager[Any]], seconds: float) -> int:
        """Report ready, wait for the start, then loop for ``seconds``: ``with hold():``
        sleep ``CRITICAL_SECTION``. Returns the number of critical sections run; the
        ``time.monotonic()`` (system-wide on Linux) at which each one started (lock held) and
        ended (about to release) is kept for ``report``."""
        self.ready.put(1)
        self.start.wait()
        held: list[tuple[float, float]] = []
        clock = time.monotonic
        stop = clock() + seconds
        while clock() < stop:
            with hold():
                got = clock()
                time.sleep(CRITICAL_SECTION)
                held.append((got, clock()))
        self._held = held
        return len(held)

    def report(self, count: int) -> None:
        """Hand this worker's count and held intervals to the parent."""
        self.out.put((count, getattr(self, "_held", [])))


Worker = Callable[[str, str, str, float, Gate], None]
"""``worker(kind, url, ns, seconds, gate)``: a module-level function (spawn pickles it by
name) that sets up ``kind``'s lock, runs ``gate.hand_off`` and ``gate.report``s the count."""


@dataclass
class Contended:
    """One contended run: acquisitions per second over all processes, each process's share
    (1.0 = fair), largest first, and the hand-off gaps in microseconds: from the moment the
    holder's critical section ends (it starts releasing) to the moment the next holder has
    the lock."""

    rate: float
    shares: list[float]
    gaps: list[float]

    @property
    def fairness(self) -> float:
        """The smallest share over the largest (1.0 = perfectly fair)."""
        return self.shares[-1] / self.shares[0] if self.shares and self.shares[0] else 0.0

    @property
    def gap(self) -> Stats:
        """Median and p99 of the hand-off gaps (µs)."""
        return Stats.of([g / 1e6 for g in self.gaps]) if self.gaps else Stats(0.0, 0.0, 0)


def contended_stats(
    worker: Worker,
    cleanup: Callable[[str], None],
    url: str,
    kind: str,
    workers: int,
    seconds: float,
) -> Contended:
    """Run ``workers`` spawned processes of ``worker`` on one fresh namespace, started
    together, and measure the hand-off (see ``Contended``). ``cleanup(ns)`` runs afterwards."""
    ns = new_namespace()
    ctx = mp.get_context("spawn")
    gate = Gate(ctx.Event(), ctx.Queue(), ctx.Queue())
    procs = [
        ctx.Process(target=worker, args=(kind, url, ns, seconds, gate)) for _ in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            gate.ready.get(timeout=60)
        gate.start.set()
        results = [gate.out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        cleanup(ns)
    counts = [count for count, _ in results]
    held = sorted(interval for _, intervals in results for interval in intervals)
    gaps = [(nxt[0] - cur[1]) * 1e6 for cur, nxt in itertools.pairwise(held)]
    total = sum(counts)
    fair = total / workers if total else 1
    return Contended(total / seconds, sorted((c / fair for c in counts), reverse=True), gaps)


def contended(
    worker: Worker,
    cleanup: Callable[[str], None],
    url: str,
    kind: str,
    workers: int,
    seconds: float,
) -> tuple[float, list[float]]:
    """``contended_stats``' ops/s over all processes and each one's share, largest first."""
    run = contended_stats(worker, cleanup, url, kind, workers, seconds)
    return run.rate, run.shares


def contended_row(label: str, rate: float, ideal: float, shares: str) -> tuple[str, ...]:
    """One contended-table row: ops/s, against 1000/s and against the sleep-ideal."""
    return (label, f"{rate:.0f}", f"{rate / 1000:.0%}", f"{rate / ideal:.0%}", shares)


def contended_report(
    measure: Callable[[str, int, float], tuple[float, list[float]]],
    cases: Sequence[tuple[str, str]],
    workers: int,
    seconds: float,
    reference: tuple[str, str] | None = None,
    width: int | None = None,
) -> None:
    """Measure and print the contended table. ``measure(kind, workers, seconds)`` returns ops/s
    and shares; ``cases`` are ``(kind, label)`` pairs run with ``workers`` processes; an optional
    ``reference`` ``(kind, label)`` is first run by one process alone (shares shown as -)."""
    per_sleep = sleep_cost()
    sleep_ideal = 1 / per_sleep
    rows: list[tuple[str, ...]] = []
    if reference is not None:
        kind, label = reference
        solo, _ = measure(kind, 1, seconds)
        rows.append(contended_row(label, solo, sleep_ideal, "-"))
    for kind, label in cases:
        rate, shares = measure(kind, workers, seconds)
        rows.append(contended_row(label, rate, sleep_ideal, " ".join(f"{s:.2f}" for s in shares)))
    print_table(
        f"Contended: {workers} processes, 1 ms critical sections, {seconds:g} s "
        f"(sleep(0.001) takes {per_sleep * 1000:.3f} ms here: ideal {sleep_ideal:.0f}/s)",
        ("variant", "ops/s", "of 1000/s", "of sleep-ideal", "worker shares (1.00 = fair)"),
        rows,
        width,
    )


# -- a whole lock benchmark -----------------------------------------------------------------
def run_lock_benchmarks(
    args: Any,
    variants: Callable[[str, str, AsyncScope], list[Variant]],
    cleanup: Callable[[str, str], None],
    worker: Worker,
    cases: Sequence[tuple[str, str]],
    *,
    warmup: int,
    async_pair: tuple[str, str],
    precision: int = 0,
    reference: tuple[str, str] | None = None,
    width: int | None = None,
) -> None:
    """Run and print both tables for the options ``args`` (see ``parse_args``): the
    uncontended ``variants(url, ns, scope)``, then, unless ``--skip-contended``, the
    contended ``cases`` run by ``worker``. ``cleanup(url, ns)`` removes a run's leftovers."""
    clean = partial(cleanup, args.url)
    rows = uncontended(partial(variants, args.url), clean, args.rounds, args.ops, warmup)
    print_uncontended(rows, async_pair, precision, width)
    if args.skip_contended:
        return
    measure = partial(contended, worker, clean, args.url)
    contended_report(measure, cases, args.workers, args.seconds, reference, width)
