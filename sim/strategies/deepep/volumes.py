"""Bytes DeepEP's normal kernels move for a layer's routing (per-node and per-GPU dedup).

A token goes once to every *node* holding one of its top-k experts (one RDMA transfer, to the
GPU with the sender's local index there) and once to every *GPU* holding one of them (the
forwarder's NVLink copy, or a direct NVLink copy inside the sender's node); combine returns
one reduced row per (token, GPU) to the forwarder and one per (token, node) over RDMA.

Expected counts per source GPU p come from the probability that one of a token's k choices
lands on expert e, q[p, e]: uniform routing gives 1/E; any other routing gives the row of
its choices (`MoELayer.routed_matrix`: these kernels are dropless, no capacity applies)
normalised (choices are taken as independent draws, so the dedup of a
skewed row is estimated, not counted per token). Then a node n is hit with probability
1 - (1 - h)^k (h: the node's share of q), i.e. N(1 - (1 - 1/N)^k) nodes per token for
uniform routing; node-limited routing (`max_nodes` M) scales the node probabilities so that
no more than M nodes are expected. Given its node, a GPU g is hit with probability
1 - (1 - g/h)^(k_n), k_n = k h / P(node) being the choices that land in a chosen node.

`dedup: tokens` counts instead of estimating: the per-token choices the executor's real gate
makes for the routing (`sim.workload.gate_plan` of the dropless layer: every routed choice
kept, as DeepEP's kernels keep them), deduplicated token by token (`token_volumes`). So the
graph moves exactly the rows `exec --moe`'s DeepEP layer moves (`exec.layers.split_check`
compares them) where the expected counts, which take a token's k choices as independent
draws, differ by tens of percent on a small skewed layer (issue 29: 551 vs 865 rows). The
gate plan's choices are the realisation the executor runs, not a model of a trained gate's
correlations, so the expected counts stay the default, and the only ones for uniform
routing (no gate plan: the real gate routes on its own) and node-limited routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.errors import ConfigError
from sim.workload.moe import MoELayer

# DeepEP's FP8 dispatch: 1 byte per element plus one fp32 scale per 128 elements (per-token,
# per-128-channel scaling, as DeepSeek-V3's FP8 recipe); the combine stays BF16.
FP8_SCALE_GROUP = 128
DTYPE_ROW_BYTES = {
    "fp8": lambda m: m * (1.0 + 4.0 / FP8_SCALE_GROUP),
    "bf16": lambda m: m * 2.0,
}


def row_bytes(model_dim: int, dtype: str) -> float:
    if not isinstance(dtype, str) or dtype not in DTYPE_ROW_BYTES:
        raise ConfigError(
            f"strategy.dispatch_dtype: expected one of {sorted(DTYPE_ROW_BYTES)}, got {dtype!r}"
        )
    return float(DTYPE_ROW_BYTES[dtype](model_dim))


def expected_nodes(nodes: int, top_k: int, max_nodes: int | None = None) -> float:
    """Distinct nodes a uniformly routed token reaches: N(1 - (1 - 1/N)^k), capped at M."""
    n = nodes * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    return n if max_nodes is None else min(n, float(max_nodes))


@dataclass(frozen=True)
class Volumes:
    """Per source GPU p: tokens reaching each node (`node_tokens` [P, N]) and each GPU
    (`gpu_tokens` [P, P]), and the (token, expert) rows each GPU's experts compute."""

    node_tokens: np.ndarray
    gpu_tokens: np.ndarray
    expert_rows: np.ndarray  # [P]
    gpus_per_node: int


def choice_probs(layer: MoELayer) -> np.ndarray:
    """[P, E]: chance that one of a source's k choices is expert e."""
    P, E = layer.world, layer.experts
    if layer.uniform:
        return np.full((P, E), 1.0 / E)
    t = layer.routed_matrix.astype(float)
    tot = t.sum(axis=1, keepdims=True)
    return np.divide(t, tot, out=np.full_like(t, 1.0 / E), where=tot > 0)


DEDUP = ("expected", "tokens")


def token_volumes(choices: list[np.ndarray], experts: int, gpus_per_node: int) -> Volumes:
    """Exact counts from per-token choices: `choices[p]` [T, k] expert ids of GPU p's tokens
    (-1: no choice); a token counts once per node and once per GPU its choices reach."""
    P = len(choices)
    G, El = min(gpus_per_node, P), experts // P
    gpu_tokens = np.zeros((P, P))
    node_tokens = np.zeros((P, P // G))
    rows = np.zeros(P)
    for p, c in enumerate(choices):
        c = np.asarray(c, dtype=np.int64)
        T = c.shape[0]
        hit = np.zeros((T, P), dtype=bool)
        tok, j = np.nonzero(c >= 0)
        gpu = c[tok, j] // El
        hit[tok, gpu] = True
        gpu_tokens[p] = hit.sum(axis=0)
        node_tokens[p] = hit.reshape(T, P // G, G).any(axis=2).sum(axis=0)
        rows += np.bincount(gpu, minlength=P)
    return Volumes(node_tokens, gpu_tokens, rows, G)


def gate_choices(layer: MoELayer) -> list[np.ndarray]:
    """Per GPU, the [T, k] choices the executor's real gate makes for the layer's routing
    when every routed choice is kept (the gate plan of the dropless layer); the tokens'
    order (the executor's seed) does not change what they deduplicate to."""
    from dataclasses import replace

    from sim.workload.gate_plan import assign, plan

    demand = plan(replace(layer, dropless=True)).demand
    return [assign(demand[p], layer.tokens, layer.top_k) for p in range(layer.world)]


def volumes(
    layer: MoELayer, gpus_per_node: int, max_nodes: int | None = None, dedup: str = "expected"
) -> Volumes:
    P, E, k, T = layer.world, layer.experts, layer.top_k, layer.tokens
    G = min(gpus_per_node, P)
    if P % G:
        raise ConfigError(f"model.world: DeepEP needs whole nodes of {G} GPUs, got {P} GPUs")
    if max_nodes is not None and (
        not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1
    ):
        raise ConfigError(f"strategy.max_nodes: expected a positive integer, got {max_nodes!r}")
    if dedup not in DEDUP:
        raise ConfigError(f"strategy.dedup: expected one of {list(DEDUP)}, got {dedup!r}")
    if dedup == "tokens" and not layer.uniform:
        if max_nodes is not None:
            raise ConfigError(
                "strategy.dedup: tokens counts the executor's gate choices, which no node "
                "limit shapes; use dedup: expected with max_nodes"
            )
        return token_volumes(gate_choices(layer), E, G)
    N, El = P // G, E // P
    q = choice_probs(layer)
    g = q.reshape(P, P, El).sum(axis=2)  # [P, P] share of choices per GPU
    h = g.reshape(P, N, G).sum(axis=2)  # [P, N] share per node
    p_node = 1.0 - (1.0 - h) ** k
    if max_nodes is not None:
        expect = p_node.sum(axis=1, keepdims=True)
        p_node = p_node * np.minimum(1.0, max_nodes / np.maximum(expect, 1e-300))
    k_n = np.divide(
        k * h, p_node, out=np.zeros_like(h), where=p_node > 0
    )  # choices per chosen node
    h_of_gpu = np.repeat(h, G, axis=1)
    within = np.divide(g, h_of_gpu, out=np.zeros_like(g), where=h_of_gpu > 0)
    p_gpu = np.repeat(p_node, G, axis=1) * (1.0 - (1.0 - within) ** np.repeat(k_n, G, axis=1))
    rows = (T * k * g).sum(axis=0)  # dropless: every (token, expert) pair is computed
    return Volumes(T * p_node, T * p_gpu, rows, G)
