"""All-to-allv of a capacity buffer's filled slots: the real layer's exchanges under a routing
model, moving what the simulator's graph moves.

Under uniform routing the simulator's graph exchanges the padded [E, C, M] buffer (an equal
all-to-all, as Tutel and DeepSpeed do) and so does the real layer. Under a routing model
(zipf, matrix) the graph's all_to_allv moves only the tokens each (rank, expert) keeps, and so
does the real layer here: after gating, every rank tells every other how many slots it filled
per expert (one small all-to-all of counts, before any strategy runs, as an all-to-allv needs
its sizes), and each exchange of a chunk of slots [lo, lo + c) packs the filled rows of each
block (the slots of one expert, filled from slot 0 up by the capacity rule) into one
all_to_all_single with per-peer split sizes, and unpacks what arrives into a zero-padded
buffer again, so the strategies' expert code is the same for both. The gradient of an
exchange is the exchange back with the split sizes swapped.

Every exchange's split sizes (rows per peer) are logged, keyed as the simulator's tasks are
(phase, step, chunk), so that a run can be checked against the graph (`exec.layers.split_check`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from exec.layers.waits import wait_work

if TYPE_CHECKING:
    from exec.layers.moe import Comms

Key = tuple[str, str, int]  # (phase, step, chunk) as the simulator's task tags
_GRAD_STEP = {"dispatch": "dispatch_grad", "combine": "combine_grad"}


@dataclass
class SplitLog:
    """Rows sent to each peer per exchange, in this rank's order of issue."""

    rows: dict[Key, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: Key | None, send: list[int]) -> None:
        if key is None:
            return
        with self.lock:
            self.rows[key] = list(send)

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {"/".join(map(str, k)): v for k, v in self.rows.items()}


@dataclass(frozen=True)
class Fill:
    """Slots filled per expert: `send[e]` this rank's tokens kept by expert e (slots 0..n-1
    of its [E, C] buffer), `recv[p, i]` rank p's tokens kept by my local expert i."""

    send: np.ndarray  # [E]
    recv: np.ndarray  # [P, El]

    def chunk(self, lo: int, c: int, back: bool) -> tuple[np.ndarray, np.ndarray]:
        """(blocks I send, blocks I receive) of slots [lo, lo + c): filled rows per block of
        the buffer sent (dispatch: by expert; `back`, the combine: by source rank and local
        expert) and of the buffer received."""
        by_expert = np.clip(self.send - lo, 0, c)
        by_source = np.clip(self.recv.reshape(-1) - lo, 0, c)
        return (by_source, by_expert) if back else (by_expert, by_source)


def exchange_counts(comms: Comms, counts: np.ndarray, experts_per_rank: int) -> np.ndarray:
    """[P, El] kept tokens every rank sends to my local experts, from every rank's [E]."""
    t = torch.as_tensor(counts, dtype=torch.int64).to(comms.device)
    out = torch.empty_like(t)
    work = dist.all_to_all_single(out, t, group=comms.groups["comm"], async_op=True)
    wait_work(
        work, comms.rank, "all_to_all of token counts", list(range(comms.world)), comms.timeout_s
    )
    return out.cpu().numpy().reshape(comms.world, experts_per_rank)


def _flat(fill: np.ndarray, c: int, device: torch.device) -> torch.Tensor:
    """Row indices of the filled slots of blocks of c slots (block b: rows b*c .. b*c+fill-1)."""
    idx = [b * c + s for b, n in enumerate(fill.tolist()) for s in range(n)]
    return torch.tensor(idx, dtype=torch.long, device=device)


def pack(x: torch.Tensor, fill: np.ndarray) -> torch.Tensor:
    """The filled rows of x [B, c, M], block after block."""
    B, c, M = x.shape
    return x.reshape(B * c, M)[_flat(fill, c, x.device)]


def unpack(rows: torch.Tensor, fill: np.ndarray, c: int) -> torch.Tensor:
    """Packed rows back into a [B, c, M] buffer, zeros in the empty slots."""
    B, M = len(fill), rows.shape[-1]
    return rows.new_zeros(B * c, M).index_add(0, _flat(fill, c, rows.device), rows).view(B, c, M)


def per_peer(fill: np.ndarray, world: int) -> list[int]:
    """Rows per peer of blocks laid out peer after peer (equally many blocks each)."""
    return [int(n) for n in fill.reshape(world, -1).sum(axis=1)]


def exchange_v(
    comms: Comms, x: torch.Tensor, stream: str, send: list[int], recv: list[int], what: str
) -> torch.Tensor:
    """all_to_all_single with per-peer split sizes over the first dimension."""
    x = x.contiguous()
    out = x.new_empty(sum(recv), *x.shape[1:])
    work = dist.all_to_all_single(
        out,
        x,
        output_split_sizes=recv,
        input_split_sizes=send,
        group=comms.groups[stream],
        async_op=True,
    )
    wait_work(
        work,
        comms.rank,
        f"all_to_allv for {what} (stream {stream})",
        list(range(comms.world)),
        comms.timeout_s,
    )
    return out


class ExchangeV(torch.autograd.Function):
    """Rows split per peer; the gradient goes back with the splits swapped. With a log and a
    key (phase 'fwd', step, chunk), both directions' split sizes are logged (the backward as
    the simulator's '<step>_grad' of phase 'bwd')."""

    @staticmethod
    def forward(ctx, x, comms, stream, send, recv, what, log=None, key=None):
        ctx.args = (comms, stream, send, recv, what, log, key)
        if log is not None:
            log.add(key, send)
        return exchange_v(comms, x, stream, send, recv, what)

    @staticmethod
    def backward(ctx, grad):
        comms, stream, send, recv, what, log, key = ctx.args
        if log is not None and key is not None:
            log.add(("bwd", _GRAD_STEP.get(key[1], f"{key[1]}_grad"), key[2]), recv)
        back = exchange_v(comms, grad, stream, recv, send, f"{what} (gradient)")
        return back, None, None, None, None, None, None, None


def exchange_slots(
    comms: Comms,
    x: torch.Tensor,
    fill: Fill,
    lo: int,
    back: bool,
    stream: str,
    what: str,
    log: SplitLog | None = None,
    key: Any = None,
) -> torch.Tensor:
    """One chunk [E, c, M] of slots [lo, lo + c) exchanged as all-to-allv of its filled rows
    (`back`: the combine, expert outputs to their tokens' ranks); differentiable."""
    c = x.shape[1]
    out_fill, in_fill = fill.chunk(lo, c, back)
    send, recv = per_peer(out_fill, comms.world), per_peer(in_fill, comms.world)
    rows = ExchangeV.apply(pack(x, out_fill), comms, stream, send, recv, what, log, key)
    return unpack(rows, in_fill, c)
