"""Selectors that use the simulator as the oracle (strategies themselves never run the engine).

`tutel_online` replays Tutel's Algorithm 2 over a sequence of iterations whose capacity factor
changes (Tutel Fig. 1 / 22): each iteration asks the search for a (degree, algorithm), times
it in the simulator, and reports back. Simulated times are deterministic, so each
(f, strategy) is simulated once and cached.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.strategies import Cluster, build
from sim.strategies.tutel import CANDIDATES, OnlineSearch, Strategy
from sim.workload.moe import MoELayer


class Timer:
    """Simulated time of one layer step for (capacity factor, strategy), memoised."""

    def __init__(self, layer: MoELayer, cluster: Cluster, passes: tuple[str, ...]):
        self.layer, self.cluster, self.passes = layer, cluster, passes
        self.cache: dict[tuple[float, Strategy], float] = {}

    def __call__(self, f: float, s: Strategy) -> float:
        key = (f, s)
        if key not in self.cache:
            layer = dataclasses.replace(self.layer, capacity_factor=f)
            try:
                g = build("tutel", layer, {"degree": s[0], "algo": s[1]}, self.passes, self.cluster)
            except ConfigError:  # e.g. more chunks than capacity slots at this f
                self.cache[key] = math.inf
            else:
                res = simulate(g, self.cluster.topology, self.cluster.costs)
                self.cache[key] = res.makespan
        return self.cache[key]


def tutel_online(
    layer: MoELayer,
    cluster: Cluster,
    fs: Iterable[float],
    passes: tuple[str, ...] = ("fwd",),
    bucket_len: float = 0.5,
    candidates: tuple[Strategy, ...] = CANDIDATES,
) -> tuple[list[dict[str, Any]], OnlineSearch, Timer]:
    search = OnlineSearch(candidates, bucket_len)
    timer = Timer(layer, cluster, passes)
    history = []
    for i, f in enumerate(fs):
        s = search.get(f)
        t = timer(f, s)
        search.optimize(f, s, t)
        history.append({"iteration": i, "f": f, "degree": s[0], "algo": s[1], "time_s": t})
    return history, search, timer


def oracle(
    name: str,
    layer: MoELayer,
    candidates: list[dict[str, Any]],
    cluster: Cluster,
    passes: tuple[str, ...] = ("fwd",),
) -> tuple[dict[str, Any], dict[str, float]]:
    """The simulator as selector: build and simulate every candidate parameter set of
    strategy `name`; return the fastest and every candidate's time (keyed by its repr)."""
    if not candidates:
        raise ConfigError(f"oracle for {name!r}: no candidates")
    times: dict[str, float] = {}
    best: tuple[float, dict[str, Any]] | None = None
    for params in candidates:
        g = build(name, layer, params, passes, cluster)
        t = simulate(g, cluster.topology, cluster.costs).makespan
        times[repr(params)] = t
        if best is None or t < best[0]:
            best = (t, params)
    assert best is not None
    return best[1], times
