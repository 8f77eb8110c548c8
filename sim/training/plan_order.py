"""The order in which `moesim plan` (`sim.training.plan`) simulates the candidates that fit:
the lowest bound first, so that the best step found so far tightens early and rules out
the most; none whose bound cannot beat the steps ahead of it; and, with several workers, no
two candidates of one layout at once before that layout's collectives are known (`lease`).

A candidate's bound (`Entry.key`) is the larger of its compute bound and its bound with its
collectives at their floor (`sim.training.plan_bound`); the candidates are taken in the
order of their keys (ties in the order of the space). What a candidate must beat
(`SimOrder.limit`) is the best step of the candidates AHEAD of it in that order, never of
one behind it that another worker happened to finish first: so a candidate is dropped only
where a single worker, taking them one by one, drops it too, and the plan's ranking does not
depend on the number of workers (`sim.training.plan` drops the extra ones a single worker
would not have simulated: `outranked`).

Layout-affine: a layout's collectives (its data-parallel gathers and reduces over every GPU
above all, seconds each to simulate) are simulated by the worker that runs its first
candidate and sent with the layout's later candidates to whichever worker runs them. While
the first is running, the layout is leased: a free worker takes the next candidate of
another layout instead of simulating the same collectives again beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.training.plan_space import Candidate
from sim.training.recipe import Recipe


@dataclass(frozen=True)
class Entry:
    key: float  # the bound the order goes by: the larger of the two below
    lower: float  # seconds of compute, every collective free (`lower_bound`)
    floor: float  # seconds with the collectives at their floor (`Screener.floor`)
    c: Candidate
    recipe: Recipe
    layout: tuple  # the group sizes that key its collectives (`layout_key`)


class SimOrder:
    """The candidates to simulate (see the module docstring). `given`: the `--layout`
    candidate, simulated whatever its bound; `prune=False`: every one simulated."""

    def __init__(self, entries: list[Entry], given: Candidate | None, prune: bool):
        self.entries = sorted(entries, key=lambda e: e.key)  # stable: ties in space order
        self.index = {e.c: i for i, e in enumerate(self.entries)}
        self.given, self.prune = given, prune
        self.pending = list(range(len(self.entries)))
        self.steps: list[tuple[int, float]] = []  # (place in the order, step) of the done
        self.leased: set[tuple] = set()  # layouts whose first candidate is running
        self.seen: set[tuple] = set()  # layouts with a candidate back (collectives known)

    def limit(self, c: Candidate) -> float:
        """The step `c` must beat: the best of the candidates ahead of it (none: infinite)."""
        if not self.prune or c == self.given:
            return math.inf
        i = self.index[c]
        return min((s for j, s in self.steps if j < i), default=math.inf)

    def next(self, drop: Callable[[Entry, str], None], resumed: Callable[[Entry], bool]) -> Any:
        """The next candidate to simulate (leased for its layout where that is new); None
        when none is left; `wait` when each one left is of a leased layout (a result in
        flight lifts the lease). On the way, `drop(entry, reason)` for each one whose bound
        cannot win (`bound`: the compute bound alone; `comm_floor`: with the collectives'
        floors), and `resumed(entry)` for each one, True where it was taken from a journal."""
        keep: list[int] = []
        pick: Entry | None = None
        for i in self.pending:
            e = self.entries[i]
            if pick is not None:
                keep.append(i)
                continue
            limit = self.limit(e.c)
            if e.key >= limit:
                drop(e, "bound" if e.lower >= limit else "comm_floor")
                continue
            if resumed(e):
                continue
            if e.layout in self.leased:  # its collectives are being simulated: another meanwhile
                keep.append(i)
                continue
            pick = e
        self.pending = keep
        if pick is None:
            return WAIT if keep else None
        if pick.layout not in self.seen:
            self.leased.add(pick.layout)
        return pick

    def back(self, c: Candidate, step: float | None) -> None:
        """A candidate's result is in (`step`: its simulated step, None if it has none)."""
        e = self.entries[self.index[c]]
        self.seen.add(e.layout)
        self.leased.discard(e.layout)
        if step:
            self.steps.append((self.index[c], step))


class _Wait:
    def __repr__(self) -> str:
        return "wait"


WAIT: Any = _Wait()  # `SimOrder.next`'s "nothing to send until a result is back"
