"""Routing models: how many of each GPU's top-k choices go to each expert ([P, E] counts,
before any capacity), from a law (`zipf`, `lognormal`), a named imbalance workload
(`imbalance`: NVIDIA's W0-W7), a given matrix (`matrix`) or a recorded router map
(`replay`). `sim.workload.moe.MoELayer.routed_matrix` asks `routed` for them; uniform routing
has no counts of its own (every capacity slot full)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.errors import ConfigError

KINDS = ("uniform", "zipf", "matrix", "lognormal", "imbalance", "replay")
# routings whose `layer` field picks or seeds a layer's own loads: in a model of blocks each
# MoE block routes its own way unless the config names one layer
PER_LAYER = ("lognormal", "replay")


def routed(routing: dict[str, Any], world: int, experts: int, tokens: int, top_k: int):
    """[P, E] int64 choices per (GPU, expert) of a non-uniform routing."""
    kind = routing.get("kind")
    if kind == "lognormal":
        from sim.workload.routing import lognormal

        return lognormal.routed(routing, world, experts, tokens, top_k)
    if kind == "imbalance":
        from sim.workload.routing import imbalance

        return imbalance.routed(routing, world, experts, tokens, top_k)
    if kind == "replay":
        from sim.workload.routing import replay

        return replay.routed(routing, world, experts, tokens, top_k)
    if kind == "zipf":
        return zipf(routing, world, experts, tokens, top_k)
    raise ConfigError(f"model.routing.kind: expected one of {KINDS}, got {kind!r}")


def per_block(layer: Any, moe_blocks: list[int]) -> dict[int, Any]:
    """MoE block -> its own layer where the routing varies by layer: a log-normal routing
    with no `layer` draws each block's hot set with the block's MoE index folded into its
    seed; a router map with several layers and no `layer` replays MoE block i from the
    map's layer i. Block 0 of the model is the layer as given (empty dict: one routing)."""
    from dataclasses import replace

    r = layer.routing
    if r.get("kind") not in PER_LAYER or "layer" in r:
        return {}
    if r["kind"] == "replay":
        from sim.workload.routing import replay

        rec = r["counts"] if "counts" in r else replay.load(r["file"])
        n = rec["counts"].shape[1]
        if n == 1:
            return {}
        if n < len(moe_blocks):
            raise ConfigError(
                f"model.routing.file: the map has {n} layers, the model {len(moe_blocks)} MoE "
                "blocks (give `layer` to replay one layer in every block)"
            )
        r = {**r, "counts": rec}
        r.pop("file", None)
    return {b: replace(layer, routing={**r, "layer": i}) for i, b in enumerate(moe_blocks) if i > 0}


def zipf(routing: dict[str, Any], world: int, experts: int, tokens: int, top_k: int):
    """A seeded Zipf(s) popularity over experts; each GPU's k*T choices drawn from it."""
    unknown = set(routing) - {"kind", "s", "seed"}
    if unknown:
        raise ConfigError(f"model.routing: unknown field(s) {sorted(unknown)} for zipf")
    try:
        s = float(routing.get("s", 1.2))
        seed = int(routing.get("seed", 0))
    except (TypeError, ValueError):
        raise ConfigError("model.routing: 's' must be a number and 'seed' an integer") from None
    if s < 0:
        raise ConfigError(f"model.routing.s: Zipf exponent must be >= 0, got {s}")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, experts + 1) ** s
    popularity = popularity[rng.permutation(experts)]
    popularity /= popularity.sum()
    return rng.multinomial(top_k * tokens, popularity, size=world).astype(np.int64)
