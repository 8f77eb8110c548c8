"""The real layer's routing against the simulator's: kept tokens per (rank, expert), and the
rows every all-to-allv sent to each peer against the split of the graph's task of the same
(phase, step, chunk).

Every exchange is compared: the forward ones, autograd's gradients of them in the backward
(each goes against its forward exchange: the combine gradient with the dispatch's sizes, the
dispatch gradient with the combine's) and MPipeMoE's re-dispatch.
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

    graph = build(name, layer, params, passes)
    row_bytes = float(layer.model_dim * layer.elem)
    out: dict[int, dict[str, dict[int, int]]] = {}
    for t in graph:
        if t.kind != "all_to_allv":
            continue
        key = f"{t.tags['phase']}/{t.tags['step']}/{t.tags.get('chunk', 0)}"
        rows = {int(m): int(round(b / row_bytes)) for m, b in zip(t.group, t.split) if b}
        out.setdefault(t.rank, {})[key] = rows
    return out


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
            )  # fmt: skip
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
    return {
        "kind": layer.routing.get("kind"),
        "realisable": gate.exact,
        "not_realised": gate.differences(),
        "kept_equal_simulator": counts_equal,
        "kept": kept.tolist(),
        "simulator_kept": layer.tokens_matrix.tolist(),
        "dropped_choices": int(layer.top_k * layer.tokens * layer.world - kept.sum()),
        "splits_checked": checked,
        "splits_differ": differ,
        "splits_missing": missing,
        "matches": counts_equal and not differ and not missing,
    }
