"""Partial full recomputation in `moesim plan` (`sim.training.plan`): Megatron-Core's
`--recompute-granularity full --recompute-method block --recompute-num-layers N`, which
recomputes the first N layers of each model chunk (`checkpointed_forward` counts over one
chunk's TransformerBlock: with VP, N of each virtual stage) and keeps the others' activations.

For each full-recompute candidate that fits while the same candidate recomputing nothing does
not, the fewest N whose peak memory fits (a binary search on the memory model, which needs no
simulation; the memory falls as N grows): recomputing fewer layers costs less compute, so of
the candidates that fit with full recomputation of some layers that one is the one that can
win. One such candidate per (layout, other choices), none where recomputing nothing fits or
only every layer does."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError, MoesimError
from sim.training.plan_space import Candidate, Request
from sim.training.recipe import Recipe

if TYPE_CHECKING:
    from sim.training.plan_bound import Screener

Answer = tuple[bool, float] | str  # a screened candidate: (fits, lower bound) or why not


def chunk_layers(c: Candidate, layers: int, base: Recipe) -> int:
    """The most transformer layers a model chunk of the candidate holds, split evenly as a
    plan's recipes split them (`recipe_of`); 0 where the layout cannot split the model."""
    from sim.training import stages
    from sim.training.pipeline_kind import Placement

    n = Placement(c.pipeline, c.pp, c.vp).vstages
    emb, loss = base.account_for_embedding and n > 1, base.account_for_loss and n > 1
    try:
        return max(v.count("t") for v in stages.even(n, layers, emb, loss))
    except ConfigError:
        return 0


def check_given(req: Request, c: Candidate, layers: int, base: Recipe) -> None:
    """One-line error for a given layout's `recompute_layers` beyond its model chunks'."""
    most = chunk_layers(c, layers, base)
    if c.recompute_layers and most and c.recompute_layers > most:
        raise ConfigError(
            f"{req.where}: --layout: recompute_layers={c.recompute_layers}: a model chunk of "
            f"this layout holds at most {most} layers (Megatron-Core's block method counts "
            "per chunk)"
        )


def fewest_layers(s: Screener, c: Candidate, none_fits: bool | None) -> tuple[int, Answer] | None:
    """(N, its screening) for the fewest layers of each model chunk fully recomputed whose
    peak memory fits, for a candidate `c` that fits recomputing every layer (in a worker);
    None where recomputing nothing fits (`none_fits`; None: unknown, so tried), where only
    every layer does, or where the candidate cannot be built."""
    try:
        top = chunk_layers(c, s.prepared(c).arch.layers, s.base)
        if none_fits is None:
            none_fits = s.fits(replace(c, recompute="none", recompute_layers=0))
        if none_fits or top < 2:
            return None
        lo, hi = 0, top  # lo does not fit, hi does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s.fits(replace(c, recompute_layers=mid)):
                hi = mid
            else:
                lo = mid
        if hi >= top:
            return None
        return hi, s.screen(replace(c, recompute_layers=hi))
    except MoesimError:
        return None


class Partial:
    """A plan's partial-recompute round, after its screening: the questions (`chunks`),
    then the candidates found, added to the plan's space, its screen-key groups and its
    screened answers (`took`)."""

    def __init__(
        self,
        space: list[Candidate],
        share: dict[tuple, list[Candidate]],
        screened: dict[tuple, Any],
    ):
        self.space, self.share, self.screened = space, share, screened
        self.searched = self.found = self.added = self.waiting = 0

    def chunks(self, size: int) -> list[list[tuple[Candidate, bool | None]]]:
        """One question per screen key of the full-recompute candidates that fit: (its first
        candidate, whether it fits recomputing nothing: None where not screened); none where
        that fits."""
        asks, seen = [], set()
        for c in self.space:
            k = c.screen_key()
            got = self.screened.get(k)
            if c.recompute != "full" or c.recompute_layers or k in seen:
                continue
            seen.add(k)
            if not isinstance(got, tuple) or not got[0]:
                continue
            plain = self.screened.get(replace(c, recompute="none").screen_key())
            fits = plain[0] if isinstance(plain, tuple) else None
            if fits is not True:
                asks.append((c, fits))
        self.searched = len(asks)
        out = [asks[i : i + size] for i in range(0, len(asks), size)]
        self.waiting = len(out)
        return out

    def took(self, asked: list[tuple[Candidate, bool | None]], answers: list[Any]) -> int:
        """The candidates a chunk's answers add (their count)."""
        self.waiting -= 1
        keys = {c.key() for c in self.space}
        added = 0
        for (q, _), got in zip(asked, answers):
            if got is None:
                continue
            n, answer = got
            self.found += 1
            key = replace(q, recompute_layers=n).screen_key()
            self.screened[key] = answer
            for c in self.share[q.screen_key()]:
                p = replace(c, recompute_layers=n)
                if p.key() not in keys:
                    keys.add(p.key())
                    self.space.append(p)
                    self.share.setdefault(key, []).append(p)
                    added += 1
        self.added += added
        return added

    def summary(self) -> dict[str, int]:
        """What the round did: full-recompute layouts over memory without recomputation
        searched, those with fewer layers that fit, the candidates added."""
        return {"searched": self.searched, "found": self.found, "added": self.added}
