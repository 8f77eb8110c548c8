"""The real layer's capacity-chunk strategies: sequential, pipelined (three issue orders),
and PipeMoE and Tutel as pipelined at their chosen degree."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import torch

from exec.layers.moe import DistMoE
from exec.layers.overlap import Overlap
from exec.layers.registry import register
from sim.core.errors import ConfigError
from sim.strategies.chunking import comm_order


@register("sequential")
def sequential(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    received = moe.exchange(buf, 0, False, "comm", "dispatch", ("fwd", "dispatch", 0))
    return moe.exchange(moe.experts(received), 0, True, "comm", "combine", ("fwd", "combine", 0))


@register("pipemoe")
def pipemoe(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """PipeMoE is the pipelined layer at the degree its selector picked (sim side)."""
    if not isinstance(params["degree"], int):
        raise ConfigError(
            "strategy pipemoe in the real layer needs an integer strategy.degree (the "
            "selector runs in the simulator: `moesim simulate` reports the degree it chose)"
        )
    return pipelined(moe, buf, params)


@register("tutel_ep")  # Tutel on whole experts; exec.layers.sliced wraps it
def tutel(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Tutel's pipelining at its chosen degree (the all-to-all algorithm changes how bytes
    travel, not what arrives: the real layer uses one all_to_all for either), on the padded
    [E, C, M] buffer whatever the routing, as Tutel exchanges it (`exec.layers.sliced`'s
    entry is marked `padded`; the simulator's graph: `MoELayer.padded`)."""
    return pipelined(moe, buf, {**params, "order": "tutel"})


class Chunked(Protocol):
    """What pipelining uses of a layer: the exchange of a chunk of slots and the experts
    (`exec.layers.moe.DistMoE`, or a sliced layout's stand-in)."""

    def exchange(
        self, x: torch.Tensor, lo: int, back: bool, stream: str, what: str, key: Any
    ) -> torch.Tensor: ...

    def experts(self, received: torch.Tensor) -> torch.Tensor: ...


@register("pipelined")
def pipelined(moe: Chunked, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    r, order = params["degree"], params["order"]
    C = buf.shape[1]
    if not isinstance(r, int) or not 1 <= r <= C:
        raise ConfigError(f"strategy.degree: expected 1..C={C} chunks, got {r!r}")
    bounds = [C * j // r for j in range(r + 1)]
    plan = comm_order(r, order)
    received: dict[int, torch.Tensor] = {}
    expert_out: dict[int, torch.Tensor] = {}
    combined: dict[int, torch.Tensor] = {}
    arrived = [threading.Event() for _ in range(r)]
    computed = [threading.Event() for _ in range(r)]
    ov = Overlap("moe")

    def comm_stream(stream: str) -> None:
        for what, j, s in plan:
            if s != stream:
                continue
            if what == "first":
                chunk = buf[:, bounds[j] : bounds[j + 1]]
                key = ("fwd", "dispatch", j)
                what = f"dispatch chunk {j}"
                received[j] = moe.exchange(chunk, bounds[j], False, stream, what, key)
                arrived[j].set()
            else:
                ov.wait(computed[j])
                combined[j] = moe.exchange(
                    expert_out[j],
                    bounds[j],
                    True,
                    stream,
                    f"combine chunk {j}",
                    ("fwd", "combine", j),
                )

    def compute_stream() -> None:  # expert chunks as their dispatch arrives
        for j in range(r):
            ov.wait(arrived[j])
            expert_out[j] = moe.experts(received[j])
            computed[j].set()

    ov.run(dict.fromkeys(s for _, _, s in plan), comm_stream, compute_stream)
    return torch.cat([combined[j] for j in range(r)], dim=1)
