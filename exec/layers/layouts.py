"""Real-layer layouts beyond pure expert parallelism, DeepSpeed TED (`exec.layers.ted`) and
Tutel's P1 / P2 (`exec.layers.sliced`), run and checked: both need process sub-groups, which
every rank creates in the same order (`exec.layers.group_comms.LayoutComms`), and modules other
than `exec.layers.moe.DistMoE`.

`run_layouts` runs cases on local processes; `reference` is the layer on one process
(autograd, no communication), the ground truth for outputs and every gradient.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exec.errors import ExecError
from exec.layers.grads import grad_of
from exec.layers.group_comms import LayoutComms
from exec.layers.moe import (
    ACTIVATIONS,
    DistMoE,
    MoESpec,
    decode,
    encode,
    make_expert,
    make_gate,
    make_output_grad,
    make_tokens,
    route,
)
from exec.layers.shapes import expert_slices
from exec.layers.sliced import SlicedMoE
from exec.layers.ted import TEDMoE

# -- running cases on every rank ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One layer and a strategy on it. `ted` cases (tp > 1) run with replicated token sets
    (rank r holds set r // tp) and also run `sequential` on the same EP-group layer."""

    spec: MoESpec
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"E{self.spec.experts}:{self.name}({inner})"

    @property
    def tp(self) -> int:
        return int(self.params.get("tp", 1)) if self.name == "ted" else 1

    def token_set(self, rank: int) -> int:
        return rank // self.tp


def layout_job(
    rank: int, world: int, cases: list[Case], timeout_s: float, backend: str
) -> dict[str, Any]:
    """One rank: every case forward and backward; numpy results per case label."""
    device = (
        torch.device("cuda", rank % torch.cuda.device_count())
        if backend == "nccl"
        else torch.device("cpu")
    )
    for c in cases:
        if c.spec.world != world:
            raise ExecError(f"case {c.label} is for {c.spec.world} ranks, {world} started")
    comms = LayoutComms(rank, world, cases, timeout_s, device)
    out: dict[str, Any] = {}
    for c in cases:
        s = c.token_set(rank)
        moe: torch.nn.Module
        if c.tp > 1:
            moe = TEDMoE(c.spec, rank, c.tp, comms, device)
        elif c.spec.experts < world:
            moe = SlicedMoE(c.spec, rank, comms, device)
        else:
            moe = DistMoE(c.spec, rank, comms.world, device)
        runs = [(c.label, c.name, c.params)]
        if c.tp > 1:
            runs.append((f"{c.label}/sequential", "sequential", {}))
        for label, name, params in runs:
            moe.zero_grad(set_to_none=True)
            x = make_tokens(c.spec, s).to(device).requires_grad_(True)
            t0 = time.perf_counter()
            y, routing = moe(x, name, params)
            (y * make_output_grad(c.spec, s).to(device)).sum().backward()
            out[label] = {
                "set": s,
                "seconds": time.perf_counter() - t0,
                "y": y.detach().cpu().numpy(),
                "slot": routing.slot.cpu().numpy(),
                "grads": {
                    k: grad_of(p).detach().cpu().numpy()
                    for k, p in [("x", x), *moe.named_parameters()]
                },
            }
    return {"rank": rank, "cases": out}


def run_layouts(
    cases: list[Case], nprocs: int, backend: str = "gloo", timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Every rank's results (rank order)."""
    from exec.runtime.launch import call_ranks

    return call_ranks(layout_job, (cases, timeout_s, backend), nprocs, backend, timeout_s)


# -- the single-process reference ----------------------------------------------------------------


def reference(spec: MoESpec, sets: int) -> dict[str, Any]:
    """The layer on one process for token sets 0..sets-1 (autograd, no communication):
    outputs, x and gate gradients per set, and every expert's gradient summed over sets."""
    gate = make_gate(spec)
    experts = [
        {k: v.clone().requires_grad_(True) for k, v in make_expert(spec, e).items()}
        for e in range(spec.experts)
    ]
    act = ACTIVATIONS[spec.activation]
    ys, gx, ggate = [], [], []
    for s in range(sets):
        x = make_tokens(spec, s).requires_grad_(True)
        g = gate.clone().requires_grad_(True)
        routing = route(x, g, spec.top_k, spec.capacity)
        buf = encode(x, routing, spec.experts, spec.capacity)
        out = torch.stack(
            [act(buf[e] @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"] for e, w in enumerate(experts)]
        )
        y = decode(out, routing)
        (y * make_output_grad(spec, s)).sum().backward()
        ys.append(y.detach().numpy())
        gx.append(grad_of(x).numpy())
        ggate.append(grad_of(g).numpy())
    return {
        "y": ys,
        "x": gx,
        "gate": ggate,
        "experts": [{k: grad_of(v).numpy() for k, v in w.items()} for w in experts],
    }


def expected_expert_grads(spec: MoESpec, ref: dict[str, Any], rank: int) -> dict[str, np.ndarray]:
    """What a sliced layer's rank holds of its expert's gradient (its slices)."""
    n = spec.world // spec.experts
    hs, ms = expert_slices(spec, n, rank % n)
    g = ref["experts"][rank // n]
    return {"w1": g["w1"][:, hs], "b1": g["b1"][hs], "w2": g["w2"][hs, :], "b2": g["b2"][ms]}


def needs_layouts(name: str, params: dict[str, Any], spec: MoESpec) -> bool:
    """Whether the real layer for (strategy, params) is one of this module's: TED with a TP
    group, or Tutel on sliced experts."""
    return (name == "ted" and int(params.get("tp", 2)) > 1) or (
        name == "tutel" and spec.experts < spec.world
    )


def diff_from_reference(case: Case, ranks: list[dict[str, Any]]) -> dict[str, float]:
    """max |got - reference| / max |reference| over all ranks, per quantity: the output y,
    the x and gate gradients, and the expert gradients (a sliced rank: its slices; TED: the
    sum over each TP group, whose ranks hold the same experts with a capacity slice each)."""
    tp = case.tp
    ref = reference(case.spec, sets=case.spec.world // tp)
    worst: dict[str, tuple[float, float]] = {}

    def add(what: str, got: np.ndarray, want: np.ndarray) -> None:
        d, scale = worst.get(what, (0.0, 0.0))
        worst[what] = (
            max(d, float(np.abs(got - want).max())),
            max(scale, float(np.abs(want).max())),
        )

    for r in ranks:
        got = r["cases"][case.label]
        s = got["set"]
        add("y", got["y"], ref["y"][s])
        add("grad_x", got["grads"]["x"], ref["x"][s])
        add("grad_gate", got["grads"]["gate"], ref["gate"][s])
        if case.name == "tutel":
            for name, g in expected_expert_grads(case.spec, ref, r["rank"]).items():
                add(f"grad_{name}", got["grads"][name], g)
    if case.name == "ted":
        ep = case.spec.world // tp
        El = case.spec.experts // ep
        for j in range(ep):
            group = [ranks[j * tp + i]["cases"][case.label]["grads"] for i in range(tp)]
            for name in ("w1", "b1", "w2", "b2"):
                total = sum(g[name] for g in group)
                whole = np.stack([ref["experts"][j * El + q][name] for q in range(El)])
                add(f"grad_{name}", total, whole.reshape(total.shape))
    return {k: d / max(scale, 1e-30) for k, (d, scale) in worst.items()}
