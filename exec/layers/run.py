"""The real layer on every rank: variants of strategies run on the same seeded inputs, their
outputs and gradients gathered for comparison."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exec.errors import ExecError
from exec.layers.grads import grad_of
from exec.layers.moe import Comms, DistMoE, MoESpec, make_output_grad, make_tokens


@dataclass
class Variant:
    """One strategy with its parameters; `label` names it in results."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({inner})"


def moe_job(
    rank: int,
    world: int,
    spec: MoESpec,
    variants: list[Variant],
    timeout_s: float,
    backward: bool,
    backend: str,
) -> dict[str, Any]:
    """One rank: run every variant on the same tokens and weights; return numpy results."""
    if spec.world != world:
        raise ExecError(f"the MoE layer is for {spec.world} ranks but {world} were started")
    device = (
        torch.device("cuda", rank % torch.cuda.device_count())
        if backend == "nccl"
        else torch.device("cpu")
    )
    comms = Comms(rank, world, timeout_s, device)
    moe = DistMoE(spec, rank, comms, device)
    x0 = make_tokens(spec, rank).to(device)
    dy = make_output_grad(spec, rank).to(device)
    results: dict[str, Any] = {}
    for v in variants:
        moe.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(backward)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):
            y, routing = moe(x, v.name, v.params)
        t1 = time.perf_counter()
        rec: dict[str, Any] = {
            "y": y.detach().cpu().numpy(),
            "expert": routing.expert.cpu().numpy(),
            "slot": routing.slot.cpu().numpy(),
            "weight": routing.weight.detach().cpu().numpy(),
            "forward_s": t1 - t0,
        }
        if backward:
            (y * dy).sum().backward()
            rec["backward_s"] = time.perf_counter() - t1
            rec["grads"] = {
                n: grad_of(p).detach().cpu().numpy() for n, p in [("x", x), *moe.named_parameters()]
            }
        rec["splits"] = moe.splits.snapshot()  # rows per peer of every all-to-allv (sparse)
        results[v.label] = rec
    return {"rank": rank, "x": x0.cpu().numpy(), "variants": results}


@dataclass
class MoERun:
    """Every rank's results (rank order), per variant label."""

    spec: MoESpec
    ranks: list[dict[str, Any]]

    def output(self, label: str) -> np.ndarray:
        """y of all ranks stacked: [P, T, M]."""
        return np.stack([r["variants"][label]["y"] for r in self.ranks])

    def max_abs_diff(self, label: str, base: str = "sequential") -> dict[str, float]:
        """max |label - base| over outputs and (if run) each gradient, over all ranks."""
        return {k: d for k, (d, _) in self._diffs(label, base).items()}

    def max_rel_diff(self, label: str, base: str = "sequential") -> dict[str, float]:
        """max |label - base| / max |base| per quantity: float32 rounding grows with the
        magnitude of sums (weight gradients add over tokens), so compare it relatively."""
        return {k: d / max(scale, 1e-30) for k, (d, scale) in self._diffs(label, base).items()}

    def _diffs(self, label: str, base: str) -> dict[str, tuple[float, float]]:
        y, y0 = self.output(label), self.output(base)
        out = {"y": (float(np.abs(y - y0).max()), float(np.abs(y0).max()))}
        for r in self.ranks:
            a, b = r["variants"][label], r["variants"][base]
            for name, g in a.get("grads", {}).items():
                g0 = b["grads"][name]
                d, scale = out.get(f"grad_{name}", (0.0, 0.0))
                out[f"grad_{name}"] = (
                    max(d, float(np.abs(g - g0).max())),
                    max(scale, float(np.abs(g0).max())),
                )
        return out


def run_moe(
    spec: MoESpec,
    variants: list[Variant],
    nprocs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    backward: bool = True,
) -> MoERun:
    """Run the layer with each variant on `nprocs` local processes (spec.world of them)."""
    from exec.runtime.launch import call_ranks

    if spec.world != nprocs:
        raise ExecError(
            f"the MoE layer is for {spec.world} ranks but {nprocs} processes were asked for"
        )
    ranks = call_ranks(
        moe_job, (spec, variants, timeout_s, backward, backend), nprocs, backend, timeout_s
    )
    return MoERun(spec, ranks)
