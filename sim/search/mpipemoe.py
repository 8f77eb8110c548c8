"""MPipeMoE's selectors driven by the simulator (strategies themselves never run the engine).

- `granularity_online`: Algorithm 1 (`sim.strategies.mpipemoe.granularity`) over a sequence of
  iterations whose batch of tokens B changes, each trial a simulated step of the layer with B
  tokens per GPU in n micro-batches (what `searchBestGran` measures on the real cluster).
- `reuse_times`: the simulated step time of every memory-reuse strategy (Fig. 13's bars),
  to hold the Eq. 10 selector against.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.strategies import Cluster, build
from sim.strategies.mpipemoe.granularity import GranularitySearch
from sim.strategies.mpipemoe.perf import RESTORE
from sim.strategies.mpipemoe.selector import candidates_for
from sim.workload.moe import MoELayer


def with_tokens(layer: MoELayer, B: int) -> MoELayer:
    """The layer with B tokens per GPU (B / seq_len sequences)."""
    if not isinstance(B, int) or B < 1 or B % layer.seq_len:
        raise ConfigError(
            f"batch of tokens: {B!r} is not a positive multiple of seq_len={layer.seq_len}"
        )
    return dataclasses.replace(layer, batch=B // layer.seq_len)


class StepTimer:
    """Simulated time of one mpipemoe step for (B, n) at a fixed reuse strategy, memoised."""

    def __init__(
        self, layer: MoELayer, cluster: Cluster, reuse: str, passes: tuple[str, ...], algo=None
    ):
        if reuse not in RESTORE:
            raise ConfigError(f"strategy.reuse: expected one of {list(RESTORE)}, got {reuse!r}")
        self.layer, self.cluster, self.reuse, self.passes, self.algo = (
            layer,
            cluster,
            reuse,
            passes,
            algo,
        )
        self.cache: dict[tuple[int, int], float] = {}

    def __call__(self, B: int, n: int) -> float:
        key = (B, n)
        if key not in self.cache:
            layer = with_tokens(self.layer, B)
            if n > layer.capacity:
                self.cache[key] = math.inf  # more micro-batches than capacity slots
            else:
                params = {"degree": n, "reuse": self.reuse, "algo": self.algo}
                g = build("mpipemoe", layer, params, self.passes, self.cluster)
                res = simulate(g, self.cluster.topology, self.cluster.costs)
                self.cache[key] = res.makespan
        return self.cache[key]


def granularity_online(
    layer: MoELayer,
    cluster: Cluster,
    batches: Iterable[int],
    reuse: str = "none",
    candidates: list[int] | None = None,
    passes: tuple[str, ...] = ("fwd", "bwd"),
) -> tuple[list[dict[str, Any]], GranularitySearch, StepTimer]:
    """Algorithm 1 over iterations with B tokens per GPU each; simulated trials."""
    timer = StepTimer(layer, cluster, reuse, passes)
    search = GranularitySearch(timer, candidates_for(layer, candidates))
    history = []
    for i, B in enumerate(batches):
        before = len(search.trials)
        n = search.get(B)
        history.append({"iteration": i, "B": B, "n": n, "trials": len(search.trials) - before})
    return history, search, timer


def reuse_times(
    layer: MoELayer,
    cluster: Cluster,
    degree: int,
    passes: tuple[str, ...] = ("fwd", "bwd"),
    strategies: Iterable[str] = tuple(RESTORE),
) -> dict[str, dict[str, float]]:
    """Per reuse strategy: simulated step time and peak memory (max over ranks): activations
    and buffers (the graph's), plus the model states every strategy counts beside them."""
    out = {}
    for s in strategies:
        g = build("mpipemoe", layer, {"degree": degree, "reuse": s}, passes, cluster)
        res = simulate(g, cluster.topology, cluster.costs)
        act = float(res.mem_peak.max())
        states = float(g.meta["model_states"]["bytes"])
        out[s] = {
            "makespan_s": res.makespan,
            "peak_bytes": act + states,
            "peak_activation_bytes": act,
            "model_state_bytes": states,
        }
    return out
