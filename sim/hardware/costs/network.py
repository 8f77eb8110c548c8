"""Collective-level communication cost, PipeMoE Eq. 16: t = alpha + beta * bytes per rank.

Fits are tabulated per group size (PipeMoE Fig. 6 fits 16, 32 and 64 GPUs separately);
between tabulated sizes alpha and beta are interpolated linearly in log2(ranks), outside
they are clamped to the nearest fit. A kind without any fit is derived per group size from
the cluster's own models where `derive` is set (sim.hardware.costs.derived). Where `adjust` is
set (a CPU topology's shared host, sim.hardware.costs.host), it turns the given fits into the
group size's instead: gloo's algorithm across group sizes, the host's cores shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError


@dataclass
class CollectiveAlphaBeta:
    """Collective-level alpha-beta costs, fitted per kind and group size."""

    fits: dict[str, list[tuple[int, float, float]]]  # kind -> sorted (ranks, alpha, beta)
    # (kind, ranks) -> (alpha, beta) for kinds without a fit; None: such a kind is an error
    derive: Callable[[str, int], tuple[float, float]] | None = None
    derived: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    # kind -> where its fit came from ("config", "calibration file X", "topology Y"), so a
    # summary can say which costs are measured and which are the flow model's own (derived)
    sources: dict[str, str] = field(default_factory=dict)
    # (kind, ranks, fits) -> (alpha, beta) in place of `interpolate` (module doc)
    adjust: Callable[[str, int, list[tuple[int, float, float]]], tuple[float, float]] | None = None

    @classmethod
    def from_fits(cls, raw: dict[str, Any]) -> CollectiveAlphaBeta:
        fits: dict[str, list[tuple[int, float, float]]] = {}
        for kind, entries in raw.items():
            if isinstance(entries, dict):  # one fit for every group size
                entries = [{"ranks": 1, **entries}]
            rows = []
            for i, e in enumerate(entries or []):
                try:
                    rows.append((int(e["ranks"]), float(e["alpha"]), float(e["beta"])))
                except (KeyError, TypeError, ValueError):
                    raise ConfigError(
                        f"collectives.{kind}[{i}]: needs 'ranks', 'alpha' and 'beta'"
                    ) from None
            fits[kind] = sorted(rows)
        return cls(fits)

    def params(self, kind: str, ranks: int) -> tuple[float, float]:
        rows = self.fits.get(kind) or (
            self.fits.get("all_to_all") if kind == "all_to_allv" else None
        )
        if not rows and self.derive is not None:
            if (kind, ranks) not in self.derived:
                self.derived[(kind, ranks)] = self.derive(kind, ranks)
            return self.derived[(kind, ranks)]
        if not rows:
            raise ConfigError(
                f"costs.network is 'collective' but there is no alpha-beta fit for {kind!r} "
                f"(give one under costs.collectives.{kind}, or use costs.network: flow)"
            )
        if self.adjust is not None:
            return self.adjust(kind, ranks, rows)
        return interpolate(rows, ranks)

    def duration(self, kind: str, ranks: int, nbytes: float) -> float:
        a, b = self.params(kind, ranks)
        return a + b * nbytes


def interpolate(rows: list[tuple[int, float, float]], ranks: int) -> tuple[float, float]:
    """(alpha, beta) at `ranks` from fits sorted by group size: linear in log2(ranks) between
    two, the nearest one's outside them."""
    if ranks <= rows[0][0] or len(rows) == 1:
        return rows[0][1], rows[0][2]
    if ranks >= rows[-1][0]:
        return rows[-1][1], rows[-1][2]
    for (n0, a0, b0), (n1, a1, b1) in zip(rows, rows[1:]):
        if n0 <= ranks <= n1:
            w = (math.log2(ranks) - math.log2(n0)) / (math.log2(n1) - math.log2(n0))
            return a0 + w * (a1 - a0), b0 + w * (b1 - b0)
    raise AssertionError("unreachable")
