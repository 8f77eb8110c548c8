"""Megatron-Core's expert-parallel communication overlap as a strategy
(`--overlap-moe-expert-parallel-comm --delay-wgrad-compute`, "combined 1F1B").

The graph is one pipeline stage of `layers` MoE transformer layers (attention of `heads`
heads, `shared` shared experts) over `micro` micro-batches in the 1F1B order: forward of
micro-batch 0, then forward i+1 with backward i, then the last backward. With `overlap`
on, forward i+1 and backward i are merged layer by layer so that one's dispatch / combine
hides behind the other's attention / MLP (`sim.strategies.megatron_ep.schedule`); off, every
kernel waits for the one launched before it (the plain schedule, the baseline).

Parameters:
- `dispatcher`: `alltoall` (all-to-allv), `allgather` (all-gather / reduce-scatter) or
  `flex` (DeepEP's normal kernels: `sim.strategies.deepep` volumes, `sms`);
- `dispatch_dtype`: the bytes of a `flex` forward dispatch row: "bf16" (Megatron-Core's, the
  default) or "fp8" (DeepSeek's FP8 dispatch);
- `overlap`: true | false;
- `shared_overlap`: the shared experts on a second compute stream beside the dispatch and
  combine (true) or inside the MLP node (false);
- `micro`: micro-batches (>= 1; recorded as `graph.meta["micro"]`: per-token metrics divide
  by micro x tokens);
- `layers`, `heads`, `kv_heads`, `head_dim`, `shared`, `flash`, `mla`: the model around the
  MoE layer; None takes `model.blocks` (its MoE blocks, attention, shared experts) when
  given, else 2 layers, heads = model_dim / 128 of model_dim / heads dims, as many key /
  value heads, no shared expert, flash attention, no MLA (`kv_heads` < heads: grouped-query
  attention; `mla`: DeepSeek's latent attention, `sim.workload.blocks.MLA`'s fields);
- `sms`: SMs a `flex` kernel holds (DeepEP V1: 24 of 132; fewer send slower,
  `costs.resources.comm_sm_bw`; benchmarks/comm_sms.py); `gpus_per_node`: None = the
  cluster's.

Tasks enter the graph in the order Megatron's host thread launches them (with one hardware
queue, kernels of every stream start in that order). With `model.blocks` the strategy
builds the whole stage itself (`build_model` on its `STRATEGY`: the merged schedule runs
across layers and micro-batches, so there is no per-layer graph to splice into the model;
dense blocks are not modelled: the stage is its MoE layers).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sim.core import limits
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.megatron_ep.memory import place_moe
from sim.strategies.megatron_ep.nodes import DISPATCHERS, Emitter, LayerSpec, layer_spec
from sim.strategies.megatron_ep.schedule import backward, forward, merged
from sim.strategies.steps import require_whole_experts
from sim.workload.blocks import MLA, BlockModel
from sim.workload.moe import MoELayer

NAME = "megatron_ep"


GQA = ("kv_heads", "head_dim")  # graph metadata only when given: older results keep theirs


def _int(params: dict[str, Any], key: str, low: int = 1) -> int:
    v = params[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"strategy.{key}: expected an integer >= {low}, got {v!r}")
    return v


def _bool(params: dict[str, Any], key: str) -> bool:
    v = params[key]
    if v not in (True, False, "on", "off"):  # YAML 1.1 reads on/off as booleans
        raise ConfigError(f"strategy.{key}: expected true or false, got {v!r}")
    return v in (True, "on")


def model_fields(
    layer: MoELayer, params: dict[str, Any], blocks: BlockModel | None = None
) -> dict[str, Any]:
    """layers, heads, kv_heads, head_dim, shared, flash, mla: the parameters, else `blocks`,
    else defaults."""
    base: dict[str, Any] = {
        "layers": 2,
        "heads": max(1, layer.model_dim // 128),
        "kv_heads": None,
        "head_dim": None,
        "shared": 0,
        "flash": True,
        "mla": None,
    }
    if blocks is not None:
        base = {
            "layers": max(1, len(blocks.moe_blocks)),
            "heads": blocks.heads,
            "kv_heads": blocks.kv_heads,
            "head_dim": blocks.head_dim,
            "shared": blocks.shared,
            "flash": blocks.flash,
            "mla": blocks.mla,
        }
    out = {k: base[k] if params.get(k) is None else params[k] for k in base}
    for k in ("layers", "heads"):
        _int(out, k)
    for k in ("kv_heads", "head_dim"):
        if out[k] is not None:
            _int(out, k)
    _int(out, "shared", 0)
    _bool(out, "flash")
    out["mla"] = MLA.parse(out["mla"], "strategy.mla")  # the heads are checked by layer_spec
    return out


def meta_fields(m: dict[str, Any]) -> dict[str, Any]:
    """`model_fields` as graph metadata (JSON): the MLA's fields, and no key without one."""
    out = {k: v for k, v in m.items() if k != "mla" and not (k in GQA and v is None)}
    return out | ({"mla": asdict(m["mla"])} if m["mla"] is not None else {})


def block_ids(blocks: BlockModel | None, layers: int) -> list[int] | None:
    """The model's block index of each MoE layer (trace tags), when built from blocks."""
    ids = blocks.moe_blocks if blocks is not None else []
    return ids if len(ids) == layers else None


def gpus_per_node(layer: MoELayer, params: dict[str, Any], cluster: Any) -> int:
    G = params["gpus_per_node"]
    if G is None:
        G = cluster.topology.gpus_per_node if cluster is not None else layer.world
    if not isinstance(G, int) or isinstance(G, bool) or G < 1:
        raise ConfigError(f"strategy.gpus_per_node: expected a positive integer, got {G!r}")
    return min(G, layer.world)


def pair_weight(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], blocks: Any = None
) -> float:
    """Memory per rank pair in sim.strategies.PAIR_BYTES units (checked against
    limits.max_pairs): a dispatch and a combine all-to-allv per (micro-batch, layer, pass) on
    every rank, each with send and receive splits (a Python float per peer) and the
    simulation's per-flow arrays, ~2.5 units a pair (peak RSS of the demo, 4 micro-batches x
    2 layers x forward and backward: 0.4 GB at 256 GPUs, 1.4 GB at 512, 5.3 GB at 1,024)."""

    def count(v: Any, default: int) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else default

    layers = params.get("layers")
    if layers is None:
        layers = max(1, len(blocks.moe_blocks)) if blocks is not None else 2
    micro = count(params.get("micro"), 1)
    return 1 + 2.5 * 2 * micro * count(layers, 1) * max(1, len(passes))


def check_size(spec: LayerSpec, layers: int, micro: int, ranks: int, name: str) -> None:
    """Refuse, before building, a graph over `limits.max_tasks` (a huge `layers` or `micro`
    would otherwise build for hours before the graph's own check stops it). Per (rank,
    micro-batch, layer) at most 3 tasks per operator (forward, dX, dW) and 5 exchanges."""
    ops = len(spec.attn) + len(spec.shared) + len(spec.experts[0])
    n = ranks * micro * layers * (3 * ops + 5)
    what = f"strategy: {name}'s graph ({ranks:,} ranks x {micro:,} micro-batches x {layers:,}"
    limits.active().check("max_tasks", n, f"{what} layers), tasks at most")


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    return build_stage(layer, params, passes, cluster)


def build_model(
    layer: MoELayer,
    params: dict[str, Any],
    blocks: BlockModel,
    passes: tuple[str, ...],
    cluster: Any = None,
) -> TaskGraph:
    """The stage of `blocks`' MoE layers (their heads, shared experts, flash) in the schedule."""
    return build_stage(layer, params, passes, cluster, blocks)


def build_stage(
    layer: MoELayer,
    params: dict[str, Any],
    passes: tuple[str, ...],
    cluster: Any = None,
    blocks: BlockModel | None = None,
) -> TaskGraph:
    require_whole_experts(layer, NAME)
    if params["dispatcher"] not in DISPATCHERS:
        raise ConfigError(
            f"strategy.dispatcher: expected one of {DISPATCHERS}, got {params['dispatcher']!r}"
        )
    overlap, shared_overlap = _bool(params, "overlap"), _bool(params, "shared_overlap")
    micro, sms = _int(params, "micro"), _int(params, "sms")
    m = model_fields(layer, params, blocks)
    spec = layer_spec(
        layer,
        m["heads"],
        m["shared"],
        m["flash"],
        params["dispatcher"],
        gpus_per_node(layer, params, cluster),
        sms,
        params["dispatch_dtype"],
        m["mla"],
        kv_heads=m["kv_heads"],
        head_dim=m["head_dim"],
    )
    check_size(spec, m["layers"], micro, layer.world, NAME)
    g = TaskGraph(
        layer.world,
        meta={
            "strategy": NAME,
            "passes": list(passes),
            "micro": micro,
            "dispatcher": spec.dispatcher,
            "overlap": overlap,
            "shared_overlap": shared_overlap,
            **meta_fields(m),
            # per-token metrics: the MoE layers a token crosses, where others build one layer
            **({} if blocks else {"moe_layers": m["layers"]}),
        },
    )
    L = m["layers"]
    for rank in range(layer.world):
        em = Emitter(g, spec, rank, shared_overlap, chain=not overlap, dtype=layer.dtype)
        em.block_ids = block_ids(blocks, L)
        if "bwd" not in passes:
            for i in range(micro):
                forward(em, i, L, [])
            continue
        outs = {0: forward(em, 0, L, [])}
        for i in range(1, micro):
            if overlap:
                outs[i], _ = merged(em, i, i - 1, L, [], outs.pop(i - 1))
            else:
                outs[i] = forward(em, i, L, [])
                backward(em, i - 1, L, outs.pop(i - 1))
        backward(em, micro - 1, L, outs.pop(micro - 1))
    place_moe(g, spec.tensors, passes)
    g.validate()
    return g


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:MegatronEPParams",
    build=build,
    real_layer="ep_overlap",
    pair_weight=pair_weight,
    build_model=build_model,
    dropless=True,
)
