"""Log-normal routing: expert loads with a target imbalance per node, per GPU and per expert.

`{kind: lognormal, node: {max_mean: 1.0}, gpu: {max_mean: 2.0}, expert: {gini: 0.2},
gpus_per_node: 8, seed, layer, step, drift}`. Each level given sets the imbalance among
siblings inside the next level up that is given: `gpu` among the GPUs of a node when `node`
is given (intra-host imbalance with balanced nodes, the case of deepseek-ai/DeepEP issue
#343), else among all GPUs of the expert-parallel group (UltraEP's max/mean per rank);
`expert` among a GPU's local experts when `gpu` is given, else a node's, else all experts
(DODOCO's Gini per expert). A level's loads are a log-normal profile solved for its target
(`sim.workload.routing.loads`), the same profile in every sibling set, permuted per set by
the seed. Each GPU splits its k*T choices over the experts in proportion to the product of
the levels' loads; every source GPU has the same popularity (the imbalance is at the
receivers, as in the sources; per-source differences are the imbalance workloads' W4).

Variation: `layer` and `step` are folded into the seed. `drift` in [0, 1] is the share of
the permutation keys renewed per step (keys_s = sqrt(1 - d) keys_(s-1) + sqrt(d) noise_s):
1 (the default) draws each step afresh, 0 keeps step 0's hot experts forever, in between
the hot set wanders; the loads themselves keep the target at every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.workload.routing.loads import MEASURES, gini, max_mean, profile, solve_sigma, split

LEVELS = ("node", "gpu", "expert")
FIELDS = {"seed", "layer", "step", "drift", "gpus_per_node", *LEVELS}
TOLERANCE = 0.02  # realised vs target imbalance after the integer split (the 2%)
MAX_DRIFT_WORK = 10**8  # steps x loads drawn when 0 < drift < 1 (each step needs the last)


def _int(routing: dict[str, Any], name: str, default: int, low: int = 0) -> int:
    v = routing.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"model.routing.{name}: expected an integer >= {low}, got {v!r}")
    return v


def _target(routing: dict[str, Any], level: str) -> tuple[str, float] | None:
    spec = routing.get(level)
    if spec is None:
        return None
    where = f"model.routing.{level}"
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in MEASURES:
        raise ConfigError(f"{where}: expected one of {{{', '.join(MEASURES)}}} with a number")
    ((measure, value),) = spec.items()
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
        raise ConfigError(f"{where}.{measure}: expected a number, got {value!r}")
    return measure, float(value)


def _keys(seed: int, layer: int, level: int, group: int, n: int, step: int, drift: float):
    """Permutation keys of one sibling set at `step` (module doc)."""

    def noise(s: int) -> np.ndarray:
        return np.random.default_rng([seed, layer, level, group, s]).standard_normal(n)

    if drift == 0:
        return noise(0)
    if drift == 1:
        return noise(step)
    keys = noise(0)
    a, b = np.sqrt(1.0 - drift), np.sqrt(drift)
    for s in range(1, step + 1):
        keys = a * keys + b * noise(s)
    return keys


def routed(routing: dict[str, Any], world: int, experts: int, tokens: int, top_k: int):
    """[P, E] choices each GPU makes per expert (module doc)."""
    unknown = set(routing) - FIELDS - {"kind"}
    if unknown:
        raise ConfigError(
            f"model.routing: unknown field(s) {sorted(unknown)} for lognormal "
            f"(known: {sorted(FIELDS)})"
        )
    targets = {lv: _target(routing, lv) for lv in LEVELS}
    given = [lv for lv in LEVELS if targets[lv] is not None]
    if not given:
        raise ConfigError(
            "model.routing: lognormal needs a target for at least one of node, gpu, expert "
            "(e.g. gpu: {max_mean: 1.5})"
        )
    seed, layer, step = (_int(routing, n, 0) for n in ("seed", "layer", "step"))
    drift = routing.get("drift", 1.0)
    if not isinstance(drift, (int, float)) or isinstance(drift, bool) or not 0 <= drift <= 1:
        raise ConfigError(f"model.routing.drift: expected a number in [0, 1], got {drift!r}")
    P, E = world, experts
    G = _int(routing, "gpus_per_node", 8, low=1) if targets["node"] else P
    if (targets["node"] or targets["gpu"]) and E % P:
        raise ConfigError(
            f"model.routing: node and gpu targets need whole experts per GPU ({E} experts "
            f"over {P} GPUs)"
        )
    if targets["node"] and P % G:
        raise ConfigError(
            f"model.routing.gpus_per_node: {G} does not divide the {P} GPUs into nodes"
        )
    if 0 < drift < 1 and step * E > MAX_DRIFT_WORK:
        raise ConfigError(
            f"model.routing.step: {step} steps of drift over {E} experts exceed "
            f"{MAX_DRIFT_WORK:,} draws; use drift 0 or 1, or a smaller step"
        )
    units_of = {"node": P // G, "gpu": P, "expert": E}  # loads per level, in expert order
    # per level given: how many sibling sets (the units of the next level up given)
    sets: dict[str, int] = {}
    parent_sets = 1
    for lv in given:
        sets[lv] = parent_sets
        parent_sets = units_of[lv]
    w = np.ones(E)
    for i, lv in enumerate(LEVELS):
        if lv not in sets:
            continue
        measure, value = targets[lv]  # type: ignore[misc]
        units, groups = units_of[lv], sets[lv]
        n = units // groups  # siblings per set
        sigma = solve_sigma(n, measure, value, f"model.routing.{lv}.{measure}")
        prof = profile(n, sigma)
        unit_w = np.empty(units)
        for g in range(groups):
            order = np.argsort(_keys(seed, layer, i, g, n, step, float(drift)), kind="stable")
            block = np.empty(n)
            block[order] = prof  # the largest key takes the largest load
            unit_w[g * n : (g + 1) * n] = block
        w *= np.repeat(unit_w, E // units)
    row = split(top_k * tokens, w / w.sum(), tokens)
    _check_realised(row, targets, sets, units_of)
    return np.tile(row, (P, 1)).astype(np.int64)


def _check_realised(row, targets, sets, units_of: dict[str, int]) -> None:
    """The integer split keeps each level's target within TOLERANCE, or says why not."""
    E = len(row)
    for lv, groups in sets.items():
        measure, value = targets[lv]
        if measure == "sigma":
            continue
        units = units_of[lv]
        loads = row.reshape(units, E // units).sum(axis=1).astype(float).reshape(groups, -1)
        f = max_mean if measure == "max_mean" else gini
        got = max(abs(f(s) - value) for s in loads)
        scale = value if measure == "max_mean" else max(value, 0.01)
        if got > TOLERANCE * scale:
            realised = [round(f(s), 4) for s in loads[:3]]
            raise ConfigError(
                f"model.routing.{lv}.{measure}: {value:g} cannot be realised with these "
                f"tokens (got {realised}{' ...' if len(loads) > 3 else ''}): too few "
                "tokens per GPU for the loads' resolution, or an expert would need more "
                "than all of a GPU's tokens (top_k choices are distinct experts)"
            )
