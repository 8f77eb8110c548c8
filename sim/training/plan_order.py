"""The order in which `moesim plan` (`sim.training.plan`) bounds and simulates the candidates
that fit: the lowest bound first, so that the best step found so far tightens early and
rules out the most; none whose bound cannot beat the steps ahead of it; floors computed
only where the compute bound leaves a candidate a chance; and, with several workers, no two
candidates of one layout at once before that layout's collectives are known (`lease`).

A candidate's bound (`Entry.key`) is its compute bound until its bound with its collectives
at their floor (`sim.training.plan_bound.Screener.floor`, a few milliseconds) is known, the
larger of the two after. The candidates are taken in the order of their keys (ties in the
order of the space); the first one whose floor is not known yet has it computed, with the
next ones' (FLOOR_CHUNK of them, one task of the pool), and goes back in its place: as in a
best-first search, a candidate is simulated once every one whose bound could still come
before it has its final bound. A floor only raises a bound, so one whose compute bound
already cannot win is dropped without its floor.

What a candidate must beat (`SimOrder.limit`) is the best step of the candidates AHEAD of
it in that order, never of one behind it that another worker happened to finish first: so a
candidate is dropped only where a single worker, taking them one by one, drops it too, and
the plan's ranking does not depend on the number of workers (`sim.training.plan` drops the
extra ones a single worker would not have simulated: `outranked`).

Layout-affine: a layout's collectives (its data-parallel gathers and reduces over every GPU
above all, up to a second each to simulate) are simulated by the worker that runs its first
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

FLOOR_CHUNK = 32  # floors per task of the pool: ~0.1-0.5 s of work


@dataclass
class Entry:
    lower: float  # seconds of compute, every collective free (`lower_bound`)
    c: Candidate
    recipe: Recipe
    layout: tuple  # the group sizes that key its collectives (`layout_key`)
    at: int  # its place in the space (ties)
    floor: float | None = None  # seconds with the collectives at their floor, once known

    @property
    def key(self) -> float:
        """The bound the order goes by."""
        return self.lower if self.floor is None else max(self.lower, self.floor)

    @property
    def place(self) -> tuple[float, int]:
        return (self.key, self.at)


class SimOrder:
    """The candidates to bound and simulate (see the module docstring). `given`: the
    `--layout` candidate, simulated whatever its bound; `prune=False`: every one simulated
    (their floors computed all the same, for the record)."""

    def __init__(self, entries: list[Entry], given: Candidate | None, prune: bool):
        self.entries = {e.c: e for e in entries}
        self.given, self.prune = given, prune
        self.pending = sorted(entries, key=lambda e: e.place)
        self.asked: set[Candidate] = set()  # floors being computed
        self.steps: list[tuple[tuple[float, int], float]] = []  # (place, step) of the done
        self.leased: set[tuple] = set()  # layouts whose first candidate is running
        self.seen: set[tuple] = set()  # layouts with a candidate back (collectives known)

    def limit(self, c: Candidate) -> float:
        """The step `c` must beat: the best of the candidates ahead of it (none: infinite)."""
        if not self.prune or c == self.given:
            return math.inf
        at = self.entries[c].place
        return min((s for p, s in self.steps if p < at), default=math.inf)

    def next(self, drop: Callable[[Entry, str], None], resumed: Callable[[Entry], bool]) -> Any:
        """What to do next: a candidate to simulate (its layout leased where that is new), a
        list of candidates whose floors to compute, `WAIT` where each one left waits on a
        result in flight, or None when none is left. On the way, `drop(entry, reason)` for
        each one whose bound cannot win (`bound`: the compute bound alone; `comm_floor`:
        with the collectives' floors), and `resumed(entry)` for each one about to be
        simulated, True where it was taken from a journal instead."""
        keep: list[Entry] = []
        ask: list[Entry] = []
        pick: Entry | None = None
        for e in self.pending:
            if pick is not None or len(ask) >= FLOOR_CHUNK:
                keep.append(e)
                continue
            limit = self.limit(e.c)
            if e.key >= limit:
                drop(e, "bound" if e.lower >= limit else "comm_floor")
                continue
            keep.append(e)
            if e.floor is None:
                if e.c not in self.asked:
                    ask.append(e)
                continue
            if ask:  # floors ahead of it come first: they may put candidates before it
                continue
            if e.layout in self.leased:  # its collectives are being simulated: another meanwhile
                continue
            keep.pop()
            if not resumed(e):
                pick = e
        self.pending = keep
        if ask:
            self.asked.update(e.c for e in ask)
            return ask
        if pick is None:
            return WAIT if keep else None
        if pick.layout not in self.seen:
            self.leased.add(pick.layout)
        return pick

    def floors(self, cands: list[Candidate], floors: list[float]) -> None:
        """The floors of candidates asked for: each goes back in its place."""
        for c, f in zip(cands, floors):
            self.entries[c].floor = f
            self.asked.discard(c)
        self.pending.sort(key=lambda e: e.place)

    def back(self, c: Candidate, step: float | None) -> None:
        """A candidate's result is in (`step`: its simulated step, None if it has none)."""
        e = self.entries[c]
        self.seen.add(e.layout)
        self.leased.discard(e.layout)
        if step:
            self.steps.append((e.place, step))


class _Wait:
    def __repr__(self) -> str:
        return "wait"


WAIT: Any = _Wait()  # `SimOrder.next`'s "nothing to send until a result is back"
