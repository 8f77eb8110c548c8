"""FasterMoE's parameters and choices: the group layout of the smart schedule, and the shadow
set (fixed, or FasterMoE's greedy rule on the layer's token counts)."""

from __future__ import annotations

from typing import Any, Literal

from sim.core.errors import ConfigError
from sim.strategies.fastermoe.rule import greedy_shadow, param_bytes, rule_costs
from sim.workload.moe import MoELayer


def group_layout(world: int, group_size: Any) -> tuple[int, int]:
    """(g, n): ranks per group (clamped to the world size, as FastMoE does) and steps."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ConfigError(f"strategy.group_size: expected a positive integer, got {group_size!r}")
    g = min(group_size, world)
    if world % g:
        raise ConfigError(
            f"strategy.group_size: {group_size} does not divide the {world} ranks into equal "
            f"groups (expected a divisor of {world})"
        )
    return g, world // g


def parse_shadow(value: Any, experts: int) -> Literal["auto"] | tuple[int, ...]:
    """'auto', or the shadowed expert ids (sorted, unique); 'none' / None / [] mean none."""
    if value == "auto":
        return "auto"
    if value is None or value == "none":
        return ()
    if not isinstance(value, (list, tuple)) or any(
        not isinstance(e, int) or isinstance(e, bool) for e in value
    ):
        raise ConfigError(
            f"strategy.shadow: expected 'auto', 'none' or a list of expert ids, got {value!r}"
        )
    bad = [e for e in value if not 0 <= e < experts]
    if bad or len(set(value)) != len(value):
        raise ConfigError(
            f"strategy.shadow: expected distinct expert ids in 0..{experts - 1}, got {value!r}"
        )
    return tuple(sorted(value))


def choose_shadow(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any
) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The shadow set to build with, and what the rule saw (for reports)."""
    shadow = parse_shadow(params["shadow"], layer.experts)
    if shadow != "auto":
        return shadow, {"selector": "fixed", "shadow": list(shadow)}
    costs = rule_costs(layer, cluster)
    chosen, trail = greedy_shadow(
        layer.tokens_matrix,
        layer.local_experts,
        float(layer.model_dim * layer.elem),
        param_bytes(layer),
        costs,
        "bwd" in passes,
    )
    return tuple(chosen), {
        "selector": "greedy",
        "shadow": chosen,
        "predicted_s": trail[-1],
        "predicted_none_s": trail[0],
    }
