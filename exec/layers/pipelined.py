"""The real layer's capacity-chunk strategies: sequential, pipelined (three issue orders),
and PipeMoE and Tutel as pipelined at their chosen degree."""

from __future__ import annotations

import threading
from typing import Any

import torch

from exec.layers.moe import _POLL_S, DistMoE, _Aborted, _wait
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


@register("tutel")
def tutel(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Tutel's pipelining at its chosen degree (the all-to-all algorithm changes how bytes
    travel, not what arrives: the real layer uses one all_to_all for either)."""
    return pipelined(moe, buf, {**params, "order": "tutel"})


@register("pipelined")
def pipelined(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
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
    abort = threading.Event()
    errors: list[BaseException] = []
    grad_mode, n_threads = torch.is_grad_enabled(), torch.get_num_threads()

    def comm_stream(stream: str) -> None:
        torch.set_grad_enabled(grad_mode)  # both are per thread
        torch.set_num_threads(n_threads)
        try:
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
                    _wait(computed[j], abort)
                    combined[j] = moe.exchange(
                        expert_out[j], bounds[j], True, stream, f"combine chunk {j}",
                        ("fwd", "combine", j),
                    )  # fmt: skip
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - re-raised by the compute thread
            errors.append(e)
            abort.set()

    threads = [
        threading.Thread(target=comm_stream, args=(s,), name=f"moe:{s}", daemon=True)
        for s in dict.fromkeys(s for _, _, s in plan)
    ]
    for th in threads:
        th.start()
    try:
        for j in range(r):  # the compute stream: expert chunks as their dispatch arrives
            _wait(arrived[j], abort)
            expert_out[j] = moe.experts(received[j])
            computed[j].set()
    except _Aborted:
        pass
    except BaseException:
        abort.set()
        raise
    while any(th.is_alive() for th in threads) and not abort.is_set():
        for th in threads:
            th.join(_POLL_S)
    if errors:
        raise errors[0]
    return torch.cat([combined[j] for j in range(r)], dim=1)
