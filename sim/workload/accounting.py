"""What one MoE layer's step keeps and drops, and the model states a GPU holds for it.

Both are written on every strategy's graph meta (`sim.strategies.build`) so that summaries,
`compare` rows and sweep rows report them for every strategy, and a replayed graph JSON
still carries them (a graph without them reports null, "unknown", never 0).

Tokens. Counts of (token, expert) assignments of one MoE layer over the GPUs of its
expert-parallel group (one data-parallel replica, one micro-batch): `routed` the gate's
choices, `kept` those within capacity, `dropped` the rest. A capacity-bound layer keeps at
most C = ceil(k f T / E) per (GPU, expert) (GShard / Switch, `MoELayer.capacity`); skewed
routing then drops tokens and its experts compute less, so its makespan is not for the same
work as a uniform one's. Uniform routing spreads each GPU's k*T choices evenly (k*T/E per
expert); its exchanges move the padded [E, C, M] buffers (`capacity_slots` per layer).
Dropless strategies (DeepEP's kernels, Megatron-Core's dispatchers, DualPipe's chunks built
from them) compute every choice: nothing is dropped; so does any strategy on a layer with
`dropless: true` (its capacity is the largest count). Ranks that share their tokens
(tensor-parallel replicas: TED's `tp`, Parm's MP groups) gate them once; the counts take one
rank of each such group.

Model states. Per GPU: the gate's weights [M, E] (replicated) and the GPU's share of the
experts' weights and biases (E * (2MH + H + M) / W; whole experts, or slices of one), times
the MoE layers a GPU holds. With a backward pass (training): their gradients in the layer's
dtype and Adam's optimizer states, fp32 momentum and variance (8 bytes) plus an fp32 master
copy of the weights (4 bytes) when the dtype is narrower than fp32: for bf16 / fp16,
2 + 2 + 12 = 16 bytes per parameter, the mixed-precision Adam figure of ZeRO (Rajbhandari et
al., SC'20, Sec. 3.1: "2Psi + 2Psi + 12Psi = 16Psi bytes"); fp32: 4 + 4 + 8 = 16 bytes.
Forward only (inference): the weights alone. Attention, norms and dense FFN weights of a
model are not counted (`covers` says so).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.workload.moe import MoELayer

# ZeRO (Rajbhandari et al., SC'20) Sec. 3.1: mixed-precision Adam keeps an fp32 copy of the
# parameters, the momentum and the variance: 4 + 4 + 4 = 12 bytes per parameter
ADAM_MOMENTS_BYTES = 8  # fp32 momentum + fp32 variance
MASTER_WEIGHT_BYTES = 4  # fp32 master copy, kept only when the weights are narrower
OPTIMIZER = (
    "Adam, mixed precision: fp32 momentum and variance, plus an fp32 master copy of weights "
    "narrower than fp32 (ZeRO, Rajbhandari et al. SC'20 Sec. 3.1: 16 bytes/param for fp16)"
)


def token_counts(layer: MoELayer, dropless: bool = False, shared_by: int = 1) -> dict[str, Any]:
    """One MoE layer's (token, expert) assignments over its GPUs (module doc). `shared_by`:
    consecutive ranks that hold the same tokens (one of each group is counted)."""
    P, E, C, k, T = layer.world, layer.experts, layer.capacity, layer.top_k, layer.tokens
    step = max(1, int(shared_by))
    gpus = len(range(0, P, step))
    if dropless:
        # dropless builders compute k rows per token (sim.strategies.deepep.volumes)
        routed = kept = gpus * k * T
    elif layer.uniform:
        routed = gpus * k * T
        kept = gpus * min(k * T, E * C)  # k*T/E per expert, at most C of them
    else:
        routed = int(np.asarray(layer.routed_matrix)[::step].sum())
        kept = int(np.asarray(layer.tokens_matrix)[::step].sum())
    return {
        **imbalance(layer, dropless, step),
        "routed": int(routed),
        "kept": int(kept),
        "dropped": int(routed - kept),
        "dropped_fraction": (routed - kept) / routed if routed else 0.0,
        "policy": "dropless" if dropless else "capacity",
        "capacity": None if dropless else int(C),
        "capacity_slots": None if dropless else int(gpus * E * C),
        "routing": str(layer.routing.get("kind")),
        "gpus": int(gpus),
        "scope": "one MoE layer over its expert-parallel GPUs, one micro-batch",
    }


def imbalance(layer: MoELayer, dropless: bool, step: int = 1) -> dict[str, float]:
    """How unevenly the kept choices load the receivers: max/mean of the rows each GPU's
    experts compute (the hot GPU sets the pace of an expert-parallel layer) and the Gini
    of the per-expert loads (`sim.workload.routing.loads`); 1 and 0 for uniform routing."""
    if layer.uniform:  # before the import: loads (and statistics) cost a uniform run ~1 ms
        return {"gpu_load_max_mean": 1.0, "expert_load_gini": 0.0}
    from sim.workload.routing.loads import gini, max_mean

    m = layer.routed_matrix if dropless else layer.tokens_matrix
    per_expert = np.asarray(m)[::step].sum(axis=0).astype(float)
    El = layer.local_experts
    per_gpu = per_expert.reshape(layer.world, El).sum(axis=1) if El else per_expert
    return {
        "gpu_load_max_mean": round(max_mean(per_gpu), 6),
        "expert_load_gini": round(gini(per_expert), 6),
    }


def bytes_per_param(dtype_bytes: float, training: bool) -> dict[str, float]:
    """Weights, gradients and optimizer states per parameter (module doc)."""
    if not training:
        return {"weights": dtype_bytes, "gradients": 0, "optimizer": 0}
    master = MASTER_WEIGHT_BYTES if dtype_bytes < MASTER_WEIGHT_BYTES else 0
    return {
        "weights": dtype_bytes,
        "gradients": dtype_bytes,
        "optimizer": ADAM_MOMENTS_BYTES + master,
    }


def layer_params_per_gpu(layer: MoELayer, expert_copies: int = 1) -> float:
    """Gate weights plus this GPU's share of the experts' weights and biases; `expert_copies`:
    how many GPUs hold each expert share (TED keeps all E experts in each of its tp EP groups)."""
    M, H, E, W = layer.model_dim, layer.hidden_dim, layer.experts, layer.world
    gate = M * E  # [M, E], replicated (exec.layers.moe.make_gate)
    experts = E * (2 * M * H + H + M) / W * expert_copies  # w1, b1, w2, b2 (make_expert)
    return float(gate + experts)


def model_states(
    layer: MoELayer,
    passes: tuple[str, ...] | list[str],
    moe_layers: int = 1,
    expert_copies: int = 1,
) -> dict[str, Any]:
    """Model-state bytes per GPU (module doc)."""
    training = "bwd" in passes
    per = bytes_per_param(layer.elem, training)
    params = layer_params_per_gpu(layer, expert_copies) * moe_layers
    return {
        "bytes": params * sum(per.values()),
        "params": params,
        "bytes_per_param": per,
        "moe_layers": int(moe_layers),
        "optimizer": OPTIMIZER if training else "none (forward only: weights alone)",
        "covers": (
            f"gate and expert weights of {moe_layers} MoE layer(s) per GPU"
            + (", their gradients and optimizer states" if training else "")
            + "; attention, norm and dense weights not counted"
        ),
    }
