"""The real layer's routing against the simulator's: kept tokens per (rank, expert), and the
rows every all-to-allv sent to each peer against the split of the graph's task of the same
(phase, step, chunk).

Every exchange is compared: the forward ones, autograd's gradients of them in the backward
(each goes against its forward exchange: the combine gradient with the dispatch's sizes, the
dispatch gradient with the combine's) and MPipeMoE's re-dispatch. DeepEP's exchanges are
checked stage by stage (inter-node, intra-node) against the flows of its collective, built
with `dedup: tokens` (the graph counts the rows per node and GPU from the gate plan's
per-token choices, the ones the real gate makes), so they match exactly too. DeepEP is
dropless: a run that dropped choices (its layer not dropless) differs from its graph, and the
report says why (`check_layer` runs DeepEP's layer dropless for that reason).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.workload.gate_plan import GatePlan
from sim.workload.moe import MoELayer


def graph_splits(
    layer: MoELayer, name: str, params: dict[str, Any], passes: tuple[str, ...]
) -> dict[int, dict[str, dict[int, int]]]:
    """Per rank, per 'phase/step/chunk': rows to each peer (nonzero only) of the graph's
    all_to_allv tasks, as the simulator builds the strategy with these parameters."""
    from sim.strategies import build

    if name == "deepep":  # the rows per node and GPU counted from the real gate's choices
        return deepep_splits(build(name, layer, {**params, "dedup": "tokens"}, passes), layer)
    graph = build(name, layer, params, passes)
    row_bytes = float(layer.model_dim * layer.elem)
    out: dict[int, dict[str, dict[int, int]]] = {}
    for t in graph:
        if t.kind != "all_to_allv":
            continue
        key = f"{t.tags['phase']}/{t.tags['step']}/{t.tags.get('chunk', 0)}"
        assert t.group is not None and t.split is not None  # an all_to_allv has both (checks)
        rows = {int(m): int(round(b / row_bytes)) for m, b in zip(t.group, t.split) if b}
        out.setdefault(t.rank, {})[key] = rows
    return out


def deepep_splits(graph: Any, layer: MoELayer) -> dict[int, dict[str, dict[int, int]]]:
    """Per rank, per 'phase/step/stage' (stage rdma: across nodes, nvlink: inside a node):
    rows to each peer of the flows the simulator's `deepep` collective makes of the graph's
    exchanges (`sim.hardware.collectives.deepep_flows`), bytes over the exchange's row size
    (the dispatch's dtype forward, BF16 otherwise, as the graph sized them)."""
    from sim.hardware.collectives import deepep_flows
    from sim.strategies.deepep.volumes import row_bytes

    G, meta = int(graph.meta["gpus_per_node"]), graph.meta
    by_coll: dict[str, list] = {}
    for t in graph:
        if t.kind == "all_to_allv":
            by_coll.setdefault(t.coll, []).append(t)
    acc: dict[int, dict[str, dict[int, float]]] = {}
    for tasks in by_coll.values():
        phase, step = tasks[0].tags["phase"], tasks[0].tags["step"]
        dtype = meta["dispatch_dtype"] if (phase, step) == ("fwd", "dispatch") else "bf16"
        row = row_bytes(layer.model_dim, dtype)
        f = deepep_flows(tasks, G)
        for s, d, b in zip(f.src.tolist(), f.dst.tolist(), f.nbytes.tolist()):
            key = f"{phase}/{step}/{'rdma' if s // G != d // G else 'nvlink'}"
            peers = acc.setdefault(s, {}).setdefault(key, {})
            peers[d] = peers.get(d, 0.0) + b / row  # direct and forwarded rows add up
    return {
        s: {k: {d: int(round(n)) for d, n in v.items() if round(n)} for k, v in keys.items()}
        for s, keys in acc.items()
    }


def compare(
    ranks: list[dict[str, Any]],
    label: str,
    layer: MoELayer,
    gate: GatePlan,
    name: str,
    params: dict[str, Any],
    passes: tuple[str, ...],
) -> dict[str, Any]:
    """The routing report of variant `label` of a run (exec.layers.run results per rank)."""
    E = layer.experts
    kept = np.stack(
        [
            np.bincount(
                r["variants"][label]["expert"][r["variants"][label]["slot"] >= 0], minlength=E
            )
            for r in ranks
        ]
    )
    counts_equal = bool((kept == layer.tokens_matrix).all())
    want = graph_splits(layer, name, params, passes)
    checked, differ, missing = 0, [], []
    for p, r in enumerate(ranks):
        got = {
            k: {q: n for q, n in enumerate(v) if n}
            for k, v in r["variants"][label].get("splits", {}).items()
        }
        for key, rows in sorted(want.get(p, {}).items()):
            if key not in got:
                missing.append(f"rank {p} {key}")
                continue
            checked += 1
            if got[key] != rows:
                differ.append(f"rank {p} {key}: real {got[key]}, simulator {rows}")
    dropped = int(layer.top_k * layer.tokens * layer.world - kept.sum())
    # a dropless strategy's graph moves every routed choice: a run that dropped some differs
    dropless_vs_drops = name == "deepep" and dropped > 0
    return {
        "kind": layer.routing.get("kind"),
        "realisable": gate.exact,
        "not_realised": gate.differences(),
        "kept_equal_simulator": counts_equal,
        "kept": kept.tolist(),
        "simulator_kept": layer.tokens_matrix.tolist(),
        "dropped_choices": dropped,
        "splits_checked": checked,
        "splits_differ": differ,
        "splits_missing": missing,
        "dropless_graph_vs_drops": dropless_vs_drops,
        "matches": counts_equal and not missing and not differ,
    }
