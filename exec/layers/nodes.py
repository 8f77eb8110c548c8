"""What the real schedules are made of: an autograd graph cut at a node's inputs, whose
backward runs in two parts (input gradients now, weight gradients later), and a CUDA stream's
stand-in on the CPU (a thread running queued work in order)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from exec.errors import ExecError
from exec.layers.ep_dispatch import Tensors


class Node:
    """One node's autograd graph: inputs become leaves, outputs are handed on detached."""

    def __init__(self, params: list[torch.Tensor]):  # leaf weights (Parameters or not)
        self.params = params
        self.pending: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def forward(self, fn: Callable[..., Tensors], inputs: Tensors) -> Tensors:
        self.leaves = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in inputs)
        with torch.enable_grad():
            self.outs = fn(*self.leaves)
        return tuple(o.detach() for o in self.outs)

    def backward(self, grads: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
        """dX: the gradients of the inputs (None where none flows); dW waits for `weights`."""
        pairs = [(o, g) for o, g in zip(self.outs, grads) if g is not None and o.requires_grad]
        outs, gs = [o for o, _ in pairs], [g for _, g in pairs]
        need = [i for i, leaf in enumerate(self.leaves) if leaf.requires_grad]
        got: tuple[torch.Tensor | None, ...] = ()
        if outs and need:
            got = torch.autograd.grad(
                outs,
                [self.leaves[i] for i in need],
                gs,
                retain_graph=bool(self.params),
                allow_unused=True,
            )
        res: list[torch.Tensor | None] = [None] * len(self.leaves)
        for i, g in zip(need, got):
            res[i] = g
        self.pending = (outs, gs) if self.params and outs else None
        if not self.params:
            self.release()
        return tuple(res)

    def weights(self) -> None:
        """dW: accumulate the node's weight gradients into its parameters' `.grad`."""
        if self.pending is not None:
            outs, gs = self.pending
            torch.autograd.backward(outs, gs, inputs=self.params)
        self.release()

    def release(self) -> None:
        self.leaves, self.outs, self.pending = (), (), None


class CommStream:
    """A CUDA stream on CPU (Megatron's communication stream, or the shared experts'): one
    thread running queued work in order."""

    def __init__(self, rank: int, timeout_s: float, name: str = "comm"):
        self.rank, self.timeout_s = rank, timeout_s
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"{name}{rank}")

    def submit(self, fn: Callable[[], Any]) -> Future:
        return self.pool.submit(fn)

    def wait(self, fut: Future, what: str) -> Any:
        try:
            return fut.result(timeout=2 * self.timeout_s)  # its collectives time out first
        except FutureTimeout:
            raise ExecError(f"rank {self.rank}: {what} did not finish in time") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
