"""PipeMoE (paper 000): the pipelined layer with its degree r chosen by Theorem 1 / Alg. 1.

Cost models (Sec. IV-A): an expert chunk takes t_e(x) = alpha_e + beta_e * x with
alpha_e = 2 alpha_gemm, beta_e = 2 beta_gemm (Eq. 14-15, x = GEMM work m*n*k), an all-to-all
takes t_a(y) = alpha_a + beta_a * y (Eq. 16-18, y = bytes per rank). For degree r the layer
time is one of (Sec. IV-B):

    r = 1:                  t1    = 2 alpha_a + alpha_e + 2 beta_a n_d + beta_e n_e   (Eq. 19)
    Q1 (comm-bound chunks): f2(r) = 2 r alpha_a + 2 n_d beta_a                         (Eq. 25)
    not Q1, Q2:             f3(r) = 2 alpha_a + beta_e n_e + 2 beta_a n_d / r + alpha_e r (Eq. 33)
    not Q1, not Q2:         f4(r) = 2 alpha_a r + 2 n_d beta_a                         (Eq. 40)

with Q1: alpha_a + beta_a n_d / r >= alpha_e + beta_e n_e / r (Eq. 21) and
Q2: 2(r-1) alpha_a + 2(r-1)/r beta_a n_d < r alpha_e + beta_e n_e (Eq. 30). Theorem 1 takes
r = 1 unless the best of t2*, t3*, t4* beats t1. Algorithm 1 as published computes t1 on its
line 5 with the compute and communication terms swapped; this uses Eq. 19. Its line 6 (Eq.
28) and the SLSQP solves of f3 and f4 are replaced by an exact search over the integer
degrees allowed (f2 and f4 grow with r, f3 is convex), which returns the same integer
optimum. n_d and n_e are the layer's own per-rank dispatch bytes and expert GEMM work (the
quantities Eq. 14 and 17 are defined on), so the selector and the simulator cost the same
graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.hardware.costs.derived import gemm_fit
from sim.strategies.base import Strategy
from sim.strategies.layer import build_layer
from sim.strategies.resolved import Resolved
from sim.workload.moe import MoELayer

NAME = "pipemoe"


R_MAX = 64


@dataclass(frozen=True)
class Costs:
    alpha_e: float
    beta_e: float
    alpha_a: float
    beta_a: float

    @classmethod
    def from_cluster(
        cls, cluster: Any, ranks: int, layer: MoELayer | None = None, dtype: str | None = None
    ) -> Costs:
        """From a CostModel: the fitted GEMM and all-to-all alpha-beta (PipeMoE Fig. 6). The
        GEMM fit is the one for the graph's dtype (`dtype`, else the layer's) where the compute
        model has fits per dtype (a calibration of a GPU: bf16 GEMMs run ~20x faster than fp32
        ones), else its one fit for every dtype; on a cluster without fits, one fitted to its
        own models (sim.hardware.costs.derived) at the layer's chunk GEMMs."""
        if cluster is None:
            raise ConfigError(
                "strategy pipemoe: degree 'auto' needs the cluster's costs "
                "(give strategy.degree, or run through moesim simulate)"
            )
        dtype = dtype or (layer.dtype if layer is not None else None)
        gemm = measured_gemm_fit(cluster.costs.compute, dtype)
        if gemm is None and layer is not None:
            gemm = gemm_fit(cluster.costs.compute, chunk_gemms(layer), layer.dtype)
        if gemm is None:
            raise ConfigError(
                "strategy pipemoe: its selector needs alpha-beta GEMM costs "
                "(costs.compute: alpha_beta with an alpha_beta.gemm fit)"
            )
        a_a, b_a = cluster.costs.collective.params("all_to_all", ranks)
        return cls(2 * gemm[0], 2 * gemm[1], a_a, b_a)


def pair_weight(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], blocks: Any = None
) -> float:
    """Memory per rank pair in sim.strategies.PAIR_BYTES units (checked against
    limits.max_pairs): the selector (degree 'auto') derives the all-to-all's alpha-beta from
    the flow model over the group's P x P flows at once (peak RSS of the demo 0.6 GB at 1,024
    GPUs, 2.3 GB at 2,048); a given degree builds uniform exchanges only."""
    from sim.strategies import DERIVED_FIT_WEIGHT

    return 1 + (DERIVED_FIT_WEIGHT if params.get("degree") == "auto" else 0)


def chunk_gemms(layer: MoELayer) -> list[dict[str, int]]:
    """The fc1 GEMM of one chunk for every degree the selector may pick, as the layer builds
    it (the expert GEMM work t_e is defined on, Eq. 14)."""
    out = []
    for r in range(1, min(R_MAX, layer.capacity) + 1):
        m = layer.world * layer.chunk_capacity(r)[0]
        out.append(
            {"batch": layer.local_experts, "m": m, "n": layer.hidden_dim, "k": layer.model_dim}
        )
    return out


def measured_gemm_fit(compute: Any, dtype: str | None) -> tuple[float, float] | None:
    """The compute model's GEMM (alpha, beta) for `dtype`: its per-dtype fit, or its fit for
    every dtype; None without GEMM fits; a ConfigError when the fits are per dtype and
    `dtype` has none."""
    fit_for = getattr(compute, "fit_for", None)  # AlphaBetaCompute (through MeasuredCompute)
    gemm = fit_for("gemm", dtype) if fit_for is not None else None
    if gemm is not None:
        return gemm
    per_dtype = (getattr(compute, "by_dtype", None) or {}).get("gemm")
    if per_dtype:
        raise ConfigError(
            f"strategy pipemoe: its selector needs a GEMM fit for the layer's dtype {dtype!r}; "
            f"the calibration has {sorted(per_dtype)} (calibrate on a device that runs "
            f"{dtype}, or give strategy.degree)"
        )
    return None


def sizes(layer: MoELayer) -> tuple[float, float]:
    """(n_d, n_e): bytes one rank dispatches, and the work of one expert GEMM on one rank."""
    n_d = float(layer.experts * layer.capacity * layer.model_dim * layer.elem)
    n_e = float(
        layer.local_experts * layer.world * layer.capacity * layer.model_dim * layer.hidden_dim
    )
    return n_d, n_e


def t1(c: Costs, n_d: float, n_e: float) -> float:
    return 2 * c.alpha_a + c.alpha_e + 2 * c.beta_a * n_d + c.beta_e * n_e  # Eq. 19


def q1(c: Costs, n_d: float, n_e: float, r: int) -> bool:
    return c.alpha_a + c.beta_a * n_d / r >= c.alpha_e + c.beta_e * n_e / r  # Eq. 21


def q2(c: Costs, n_d: float, n_e: float, r: int) -> bool:
    return (
        2 * (r - 1) * c.alpha_a + 2 * (r - 1) / r * c.beta_a * n_d < r * c.alpha_e + c.beta_e * n_e
    )


def f2(c: Costs, n_d: float, n_e: float, r: int) -> float:
    return 2 * r * c.alpha_a + 2 * n_d * c.beta_a  # Eq. 25 (= Eq. 40's f4)


def f3(c: Costs, n_d: float, n_e: float, r: int) -> float:
    return 2 * c.alpha_a + c.beta_e * n_e + 2 * c.beta_a * n_d / r + c.alpha_e * r  # Eq. 33


def paper_cost(c: Costs, n_d: float, n_e: float, r: int) -> float:
    """The paper's predicted layer time for degree r (the case its conditions select)."""
    if r == 1:
        return t1(c, n_d, n_e)
    if q1(c, n_d, n_e, r):
        return f2(c, n_d, n_e, r)
    return f3(c, n_d, n_e, r) if q2(c, n_d, n_e, r) else f2(c, n_d, n_e, r)


def select(c: Costs, n_d: float, n_e: float, candidates: list[int]) -> tuple[int, float, str]:
    """Theorem 1 over the allowed degrees: (r, predicted time, case 't1'|'t2'|'t3'|'t4')."""
    best = {"t1": (1, t1(c, n_d, n_e))} if 1 in candidates else {}
    for r in sorted(x for x in candidates if x >= 2):
        if q1(c, n_d, n_e, r):
            case, t = "t2", f2(c, n_d, n_e, r)
        elif q2(c, n_d, n_e, r):
            case, t = "t3", f3(c, n_d, n_e, r)
        else:
            case, t = "t4", f2(c, n_d, n_e, r)
        if case not in best or t < best[case][1]:
            best[case] = (r, t)
    if not best:
        raise ConfigError("strategy pipemoe: no candidate degree")
    # Theorem 1: r = 1 unless some t_i* < t1; ties keep the smaller degree
    case = min(best, key=lambda k: (best[k][1], best[k][0]))
    return best[case][0], best[case][1], case


def candidates_for(layer: MoELayer, given: list[int] | None) -> list[int]:
    cap = min(R_MAX, layer.capacity)
    if given is None:
        return list(range(1, cap + 1))
    if not given or any(not isinstance(r, int) or r < 1 for r in given):
        raise ConfigError(f"strategy.candidates: expected positive integers, got {given!r}")
    allowed = [r for r in given if r <= layer.capacity]
    if not allowed:
        raise ConfigError(f"strategy.candidates: none is <= the capacity C={layer.capacity}")
    return allowed


def choose(layer: MoELayer, params: dict[str, Any], cluster: Any) -> tuple[int, dict[str, Any]]:
    """The degree to build with, and what the selector saw (for reports)."""
    if params["degree"] != "auto":
        return params["degree"], {"selector": "fixed"}
    c = Costs.from_cluster(cluster, layer.world, layer)
    n_d, n_e = sizes(layer)
    r, t, case = select(c, n_d, n_e, candidates_for(layer, params["candidates"]))
    return r, {"selector": "theorem1", "case": case, "predicted_s": t}


def resolve(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> Resolved:
    """The parameters the graph is built with: `degree: auto` by Theorem 1 on the cluster."""
    r, info = choose(layer, params, cluster)
    chosen = {"degree": r} if params["degree"] == "auto" else {}
    return Resolved({**params, "degree": r}, chosen, info)


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    res = resolve(layer, params, passes, cluster)
    g = build_layer(
        layer,
        degree=res.params["degree"],
        order=params["order"],
        passes=passes,
        strategy=NAME,
        algo=params["algo"],
    )
    g.meta["selector"] = res.info
    return g


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:PipeMoEParams",
    build=build,
    real_layer="pipemoe",
    resolve=resolve,
    pair_weight=pair_weight,
)
