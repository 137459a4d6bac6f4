"""Scheduling strategies: who runs next when more than one task could.

A strategy is asked at every *decision*: a task reached a point (or every task is parked at
one) and more than one task could go on. ``candidates`` is in canonical order: the task that
just reached the point first (unless a fault made it give way), then the parked tasks in the
order they parked, so ``candidates[0]`` is always the FIFO choice and any other pick is a
*deviation* (a preemption). A task that parked only so that tasks just spawned or woken could
reach their points counts as the one that just reached its point: it was running. The
strategies:

- :class:`Fifo`: never deviates (each task runs until it blocks; then the one parked first);
- :class:`Random`: a seeded uniform pick;
- :class:`PCT`: probabilistic concurrency testing (Burckhardt et al.): random task
  priorities and ``depth - 1`` random points where the running task drops to the lowest
  priority; finds a bug of depth ``d`` with probability at least ``1 / (n * k^(d-1))``;
- :class:`Exhaustive`: a depth-first walk over every sequence of picks (bounded);
- :class:`TapeStrategy`: replays recorded picks by task name.
"""

from __future__ import annotations

import _random
import math
import random
from collections.abc import Sequence
from typing import Protocol

#: the C generator's seed: for an int, what ``random.Random.seed`` does after its checks
_seed = _random.Random.seed

__all__ = ["PCT", "Exhaustive", "Fifo", "Random", "Strategy", "TapeStrategy"]


class _Named(Protocol):
    name: str


class Strategy:
    """The interface: :meth:`choose` returns an index into ``candidates``."""

    name = "strategy"

    def begin(self) -> None:
        """A new schedule starts."""

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        raise NotImplementedError


class Fifo(Strategy):
    """Never deviates: the running task goes on until it blocks, then the one parked first."""

    name = "fifo"

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        return 0


class Random(Strategy):
    """A uniform pick among the candidates, from a random generator seeded with ``seed``."""

    name = "random"

    def __init__(self, seed: int) -> None:
        rng = self._rng = random.Random(seed)
        # randrange(n) is _randbelow(n) after checking its argument: the same draws, at half
        # the cost of a decision's pick
        self._below = getattr(rng, "_randbelow", rng.randrange)
        #: the generator's getrandbits when its _randbelow is random.Random's own (it draws
        #: getrandbits(n.bit_length()) until below n): a simulation draws the same inline
        self._getrandbits = (
            rng.getrandbits
            if getattr(self._below, "__func__", None)
            is getattr(random.Random, "_randbelow_with_getrandbits", False)
            else None
        )

    def reseed(self, seed: int) -> None:
        """Start again as ``Random(seed)`` does, with the same generator: explore runs one
        schedule per seed, and seeding (what ``random.Random(seed)`` does for an int,
        without its checks of the argument) costs less than a new generator."""
        _seed(self._rng, seed)
        self._rng.gauss_next = None  # type: ignore[attr-defined]  # as random.Random.seed does

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        return self._below(len(candidates))  # type: ignore[no-any-return]


class PCT(Strategy):
    """``seed`` seeds the random priorities and change points; ``depth`` 1..3; ``steps``
    estimates the decisions in one schedule (from a FIFO run)."""

    name = "pct"

    def __init__(self, seed: int, depth: int = 2, steps: int = 20) -> None:
        self._rng = random.Random(seed)
        self._priority: dict[str, float] = {}
        span = max(steps, 1)
        self._changes = sorted(self._rng.randint(1, span) for _ in range(max(depth - 1, 0)))
        self._lowered = 0

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        prio = self._priority
        best = 0
        top = -math.inf
        for i, task in enumerate(candidates):  # the first of the highest priority
            p = prio.get(task.name)
            if p is None:
                p = prio[task.name] = 1.0 + self._rng.random()  # above every lowered one
            if p > top:
                best, top = i, p
        while self._changes and self._changes[0] <= step:
            self._changes.pop(0)
            self._lowered += 1
            prio[candidates[best].name] = -float(self._lowered)  # below all, last lowest
            best = max(range(len(candidates)), key=lambda i: prio[candidates[i].name])
        return best


class Exhaustive(Strategy):
    """Walks the tree of decisions depth first: each schedule follows ``prefix`` and takes
    the first candidate past it; :meth:`advance` moves to the next unexplored branch.
    ``max_preemptions``: at most that many deviations from FIFO per schedule (``None``: no
    bound)."""

    name = "exhaustive"

    def __init__(self, max_preemptions: int | None = None) -> None:
        self.prefix: list[int] = []
        self.widths: list[int] = []
        self._max_preemptions = max_preemptions
        self._preemptions = 0

    def begin(self) -> None:
        self.widths = []
        self._preemptions = 0

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        depth = len(self.widths)
        self.widths.append(len(candidates))
        pick = self.prefix[depth] if depth < len(self.prefix) else 0
        if pick >= len(candidates):  # the scenario is not deterministic: stay in bounds
            pick = 0
        if pick:
            self._preemptions += 1
        return pick

    def advance(self) -> bool:
        """Move to the next branch; False once every branch has been walked."""
        taken = self.prefix + [0] * (len(self.widths) - len(self.prefix))
        taken = taken[: len(self.widths)]
        while taken:
            last = len(taken) - 1
            if taken[last] + 1 < self.widths[last]:
                taken[last] += 1
                if self._max_preemptions is None or sum(1 for i in taken if i) <= (
                    self._max_preemptions
                ):
                    self.prefix = taken
                    return True
                continue
            taken.pop()
        return False


class TapeStrategy(Strategy):
    """Follows recorded ``picks`` (task names, one per decision); where the name is not a
    candidate (or the tape ran out, or says ``None``), takes the FIFO choice."""

    name = "tape"

    def __init__(self, picks: Sequence[str | None]) -> None:
        self._picks = list(picks)
        self._at = 0

    def begin(self) -> None:
        self._at = 0

    def choose(self, candidates: Sequence[_Named], step: int) -> int:
        at = self._at
        self._at += 1
        if at < len(self._picks):
            want = self._picks[at]
            if want is not None:
                for i, task in enumerate(candidates):
                    if task.name == want:
                        return i
        return 0
