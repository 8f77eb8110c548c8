"""MPipeMoE's choices on the cluster's cost model: the reuse strategy by Eq. 10 and the
granularity n by the pipelined time of each candidate (the trial Algorithm 1 would run)."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.strategies.mpipemoe.builder import check_params
from sim.strategies.mpipemoe.perf import factors_from_cluster, select
from sim.workload.moe import MoELayer

# Default granularities: PipeMoE(n=1) and the powers of two MPipeMoE's Fig. 10 / 12 explore.
DEGREES = (1, 2, 4, 8, 16)


def candidates_for(layer: MoELayer, given: list[int] | None) -> list[int]:
    if given is None:
        return [n for n in DEGREES if n <= layer.capacity]
    if (
        not isinstance(given, (list, tuple))
        or not given
        or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in given)
    ):
        raise ConfigError(f"strategy.candidates: expected positive integers, got {given!r}")
    allowed = sorted({n for n in given if n <= layer.capacity})
    if not allowed:
        raise ConfigError(f"strategy.candidates: none is <= the capacity C={layer.capacity}")
    return allowed


def choose(layer: MoELayer, params: dict[str, Any], cluster: Any) -> tuple[int, str, dict]:
    """(n, reuse strategy, what the selectors saw). Fixed values pass through; "auto" reads
    the cluster's cost model: Eq. 10 for the reuse strategy, and for n the pipelined time of
    every candidate degree (`Factors.pipeline_time`), the trial Algorithm 1 would run."""
    check_params(layer, params)
    deg, reuse = params["degree"], params["reuse"]
    if deg != "auto" and reuse != "auto":
        return deg, reuse, {"selector": "fixed", "reuse": reuse}
    h_over_m = layer.hidden_dim / layer.model_dim

    def pick(n: int) -> tuple[str, dict[str, float], Any]:
        f = factors_from_cluster(cluster, layer, n, params["algo"])
        if reuse == "auto":
            s, costs = select(f, h_over_m)
        else:
            s, costs = reuse, {reuse: f.cost(reuse, h_over_m)}
        return s, costs, f

    info: dict[str, Any] = {"selector": "eq10" if reuse == "auto" else "fixed"}
    if deg == "auto":
        times = {}
        for n in candidates_for(layer, params["candidates"]):
            s, _, f = pick(n)
            times[n] = f.pipeline_time(s, h_over_m, n)
        deg = min(times, key=lambda n: (times[n], n))
        info["granularity"] = {"estimated_s": times}
    s, costs, f = pick(deg)
    info |= {
        "reuse": s,
        "reuse_costs_s": costs,
        "alpha": f.alpha,
        "beta": f.beta,
        "mu_comp": f.mu_comp,
        "mu_all": f.mu_all,
        "eta_all": f.eta_all,
    }
    return deg, s, info
