"""DualPipe and DualPipeV (DeepSeek-V3 report Sec. 3.2.1; github.com/deepseek-ai/DualPipe)
as a strategy: a bidirectional (or V-shaped) pipeline whose devices pair the forward chunk
of one micro-batch with the backward chunk of another, overlapping one's all-to-all
dispatch / combine with the other's computation, and split backward chunks into input (B)
and weight (W) gradients to fill bubbles (zero-bubble).

Parameters:
- `variant`: `dualpipe` (PP devices, two directions, half the micro-batches each) or
  `dualpipev` (PP/2 devices, one V-shaped pipeline);
- `pp`: pipeline stages (even); a config's `parallel.pp` (the pipeline devices of a
  replica) sets it: pp devices for dualpipe, 2 pp stages for dualpipev;
- `micro`: micro-batches in all (dualpipe: even and >= 2 PP; dualpipev: >= PP; None: 2 PP);
- `layers`: MoE layers per chunk (stage), `heads`, `kv_heads`, `head_dim`, `shared`,
  `flash`, `mla`, `dispatcher`,
  `shared_overlap`, `sms`, `dispatch_dtype`, `gpus_per_node`: a chunk's layers as
  `megatron_ep` builds them; the layer's world is one stage's EP group, so the graph has
  devices x world ranks.

Published figures (the DualPipe README's table, for the same number of PP stages): bubble
(PP/2-1)(F&B + B - 3W) for both, 2x parameters per device, PP+1 micro-batches' activations
per device; dualpipe uses PP devices, dualpipev PP/2. The simulated bubble equals the formula
when comm is free and a forward chunk takes as long as its input-gradient part (the
zero-bubble analysis' assumption); `graph.meta["memory"]` holds the schedule's counts.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies import megatron_ep as mep
from sim.strategies.base import Strategy
from sim.strategies.dualpipe.builder import build_pipeline
from sim.strategies.dualpipe.schedule import Pipeline, table
from sim.strategies.megatron_ep.nodes import layer_spec
from sim.strategies.steps import require_whole_experts
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer

NAME = "dualpipe"


__all__ = ["NAME", "STRATEGY", "build", "build_model", "table"]


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    return build_step(layer, params, passes, cluster)


def build_model(
    layer: MoELayer,
    params: dict[str, Any],
    blocks: BlockModel,
    passes: tuple[str, ...],
    cluster: Any = None,
) -> TaskGraph:
    """The step whose chunks are `blocks`' MoE layers (their heads, shared experts, flash)."""
    return build_step(layer, params, passes, cluster, blocks)


def build_step(
    layer: MoELayer,
    params: dict[str, Any],
    passes: tuple[str, ...],
    cluster: Any = None,
    blocks: BlockModel | None = None,
) -> TaskGraph:
    require_whole_experts(layer, NAME)
    if tuple(sorted(passes)) != ("bwd", "fwd"):
        raise ConfigError(f"passes: {NAME} is a training schedule: needs fwd and bwd, got {passes}")
    pp = params["pp"]
    micro = (
        params["micro"] if params["micro"] is not None else (2 * pp if isinstance(pp, int) else 0)
    )
    pipe = Pipeline(params["variant"], pp, micro)
    gpus = None if cluster is None else cluster.topology.world_size
    if gpus is not None and pipe.devices * layer.world > gpus:
        raise ConfigError(
            f"strategy.pp: {NAME} ({pipe.variant}, pp={pp}) runs {pipe.devices} pipeline devices "
            f"x an EP group of {layer.world} GPUs = {pipe.devices * layer.world} ranks, but the "
            f"cluster has {gpus}: the layer's world is one stage's EP group (lower world_size "
            f"or pp, or add nodes; or lay the pipeline out with parallel: {{ep, pp, dp}})"
        )
    m = mep.model_fields(layer, params, blocks)
    spec = layer_spec(
        layer,
        m["heads"],
        m["shared"],
        m["flash"],
        params["dispatcher"],
        mep.gpus_per_node(layer, params, cluster),
        mep._int(params, "sms"),
        params["dispatch_dtype"],
        m["mla"],
        kv_heads=m["kv_heads"],
        head_dim=m["head_dim"],
    )
    mep.check_size(spec, m["layers"], pipe.micro, pipe.devices * layer.world, NAME)
    act = float(layer.tokens * layer.model_dim * layer.elem)  # one micro-batch's hidden states
    meta = {
        "strategy": NAME,
        "passes": list(passes),
        "dispatcher": spec.dispatcher,
        **mep.meta_fields(m),
    }
    if blocks is None:  # per-token metrics: a token crosses every stage's MoE layers
        meta["moe_layers"] = m["layers"] * pipe.pp
    return build_pipeline(
        pipe,
        spec,
        m["layers"],
        mep._bool(params, "shared_overlap"),
        act,
        layer.dtype,
        meta,
        mep.block_ids(blocks, m["layers"]),
    )


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:DualPipeParams",
    build=build,
    real_layer="dualpipe",
    # DualPipeV folds two stages onto each device
    stages_per_device=lambda p: 2 if p["variant"] == "dualpipev" else 1,
    build_model=build_model,
    dropless=True,
    layer_copies=2,
)
