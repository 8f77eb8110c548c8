"""MPipeMoE (paper 001) in the real layer: micro-batches pipelined in alternating order, and the
memory-reuse strategies of Table II for real.

The forward splits the capacity dimension into n micro-batches (as `pipelined`); one thread,
the communication stream, issues S1, S2, R1, S3, R2, ... (`sim.strategies.chunking.comm_order`,
"alternating") while the calling thread, the compute stream, runs each micro-batch's expert as
soon as its dispatch has arrived. References to a micro-batch's tensors are dropped as soon as
it is done with them, so that what stays alive is what its expert's autograd node keeps.

That node (`_Expert`) keeps what the reuse strategy says, and its backward restores the rest
(`sim.strategies.mpipemoe.perf.RESTORE`):

- T_DI (the dispatched input): kept ("none"), offloaded to host memory ("offload": a copy on a
  side CUDA stream into pinned memory, copied back in the backward; on CPU a separate copy),
  or not kept at all and received again by redoing the dispatch all-to-all of the micro-batch
  from T_I ("comm");
- T_M (fc1's output, before the activation): kept, offloaded, or recomputed from T_DI.

Every variant computes the same numbers: the expert's gradients are taken from the same
tensors, restored bit for bit (a copy, or the same exchange of the same rows) or recomputed by
the same GEMM; the tests check outputs and gradients against `sequential`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from exec.layers.moe import DistMoE
from exec.layers.overlap import Overlap
from exec.layers.registry import register
from sim.core.errors import ConfigError
from sim.strategies.chunking import comm_order
from sim.strategies.mpipemoe.perf import RESTORE

ORDER = "alternating"


def check(params: dict[str, Any], capacity: int) -> tuple[int, str]:
    n, reuse = params["degree"], params["reuse"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= capacity:
        raise ConfigError(
            f"strategy.degree: the real mpipemoe layer needs an integer 1..C={capacity} (the "
            f"granularity search runs in the simulator: `moesim simulate` reports the degree "
            f"it chose), got {n!r}"
        )
    if reuse not in RESTORE:
        raise ConfigError(
            f"strategy.reuse: the real mpipemoe layer needs one of {list(RESTORE)} (the Eq. 10 "
            f"selector runs in the simulator), got {reuse!r}"
        )
    return n, reuse


# -- keeping, offloading and restoring a tensor ----------------------------------------------------


class _Stash:
    """A tensor kept on the device or offloaded to host memory until the backward."""

    _streams: dict[torch.device, Any] = {}

    def __init__(self, t: torch.Tensor, offload: bool):
        self.device, self.event = t.device, None
        if not offload:
            self.data = t
            return
        if t.is_cuda:  # a d2h on a copy stream of its own, overlapping the compute stream
            if t.device not in self._streams:
                self._streams[t.device] = torch.cuda.Stream(t.device)
            stream = self._streams[t.device]
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                self.event = stream.record_event()
            t.record_stream(stream)  # the allocator must not reuse t before the copy is done
            self.data = host
        else:  # CPU: host memory already; a copy of its own stands for the offloaded one
            self.data = t.detach().clone()

    def restore(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
            return self.data.to(self.device, non_blocking=True)
        return self.data


class _Expert(torch.autograd.Function):
    """The local experts on one received micro-batch [E, c, M] -> [E, c, M], keeping T_DI and
    T_M as the reuse strategy says."""

    @staticmethod
    def forward(
        ctx, received, w1, b1, w2, b2, moe: DistMoE, reuse: str, source, what: str, at=(0, 0)
    ):
        di_how, m_how = RESTORE[reuse]
        E, c, M = received.shape
        P, El = moe.spec.world, moe.spec.local_experts
        x = received.reshape(P, El, c, M).transpose(0, 1).reshape(El, P * c, M)
        h = torch.baddbmm(b1, x, w1)  # T_M
        y = torch.baddbmm(b2, moe.act(h), w2)
        ctx.moe, ctx.what, ctx.shape = moe, what, (E, c, M)
        ctx.di = None if di_how == "comm" else _Stash(x, offload=di_how == "offload")
        ctx.source = source if di_how == "comm" else None  # T_I's rows of this micro-batch
        ctx.at = at  # (first slot, micro-batch) of the chunk
        ctx.m = None if m_how == "recompute" else _Stash(h, offload=m_how == "offload")
        ctx.save_for_backward(w1, b1, w2, b2)
        return y.reshape(El, P, c, M).transpose(0, 1).reshape(E, c, M)

    @staticmethod
    def backward(ctx, grad):
        w1, b1, w2, b2 = ctx.saved_tensors
        moe: DistMoE = ctx.moe
        E, c, M = ctx.shape
        P, El = moe.spec.world, moe.spec.local_experts
        if ctx.di is not None:
            x = ctx.di.restore()
        else:  # re-communication: the same rows from the same ranks, so the same T_DI
            lo, j = ctx.at
            key = ("bwd", "redispatch", j)
            received = moe.exchange(ctx.source, lo, False, "comm", f"{ctx.what} (re-dispatch)", key)
            x = received.reshape(P, El, c, M).transpose(0, 1).reshape(El, P * c, M)
        h = ctx.m.restore() if ctx.m is not None else torch.baddbmm(b1, x, w1)  # re-compute
        gy = grad.reshape(P, El, c, M).transpose(0, 1).reshape(El, P * c, M)
        with torch.enable_grad():  # fc2 and the activation, differentiated from T_M
            hh, w2_, b2_ = (t.detach().requires_grad_() for t in (h, w2, b2))
            y = torch.baddbmm(b2_, moe.act(hh), w2_)
            dh, dw2, db2 = torch.autograd.grad(y, (hh, w2_, b2_), gy)
        dx = torch.bmm(dh, w1.transpose(1, 2))  # fc1 by hand: it needs only T_DI and dh
        dw1 = torch.bmm(x.transpose(1, 2), dh)
        db1 = dh.sum(dim=1, keepdim=True)
        dx = dx.reshape(El, P, c, M).transpose(0, 1).reshape(E, c, M)
        return dx, dw1, db1, dw2, db2, None, None, None, None, None


# -- the pipelined layer --------------------------------------------------------------------------


@register("mpipemoe")
def mpipemoe(moe: DistMoE, buf: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    C = buf.shape[1]
    n, reuse = check(params, C)
    bounds = [C * j // n for j in range(n + 1)]
    plan = comm_order(n, ORDER)
    chunks = {j: buf[:, bounds[j] : bounds[j + 1]] for j in range(n)}
    received: dict[int, torch.Tensor] = {}
    expert_out: dict[int, torch.Tensor] = {}
    combined: dict[int, torch.Tensor] = {}
    arrived = [threading.Event() for _ in range(n)]
    computed = [threading.Event() for _ in range(n)]
    ov = Overlap("mpipemoe")

    def comm_stream(stream: str) -> None:  # one stream, "comm", whatever the plan names
        for what, j, _ in plan:
            if what == "first":
                received[j] = moe.exchange(
                    chunks[j],
                    bounds[j],
                    False,
                    stream,
                    f"dispatch chunk {j}",
                    ("fwd", "dispatch", j),
                )
                arrived[j].set()
            else:
                ov.wait(computed[j])
                out = expert_out.pop(j)  # T_DO: gone once combined
                combined[j] = moe.exchange(
                    out, bounds[j], True, stream, f"combine chunk {j}", ("fwd", "combine", j)
                )

    def compute_stream() -> None:
        for j in range(n):
            ov.wait(arrived[j])
            x = received.pop(j)  # T_DI: from here on only the expert's node may hold it
            source = chunks[j].detach().contiguous()
            expert_out[j] = _Expert.apply(
                x,
                moe.w1,
                moe.b1,
                moe.w2,
                moe.b2,
                moe,
                reuse,
                source,
                f"dispatch chunk {j}",
                (bounds[j], j),
            )
            computed[j].set()

    ov.run(["comm"], comm_stream, compute_stream)
    return torch.cat([combined[j] for j in range(n)], dim=1)
