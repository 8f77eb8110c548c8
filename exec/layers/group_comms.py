"""Communication over process sub-groups, as TED's TP and EP groups and Tutel's expert shards
need: `GroupComms` (one partition of the ranks) and `LayoutComms` (every group a list of
cases needs, created in the same order on every rank, as torch.distributed requires).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from exec.layers.moe import Comms, wait_work
from exec.runtime.compat import all_gather_single, reduce_scatter_single

if TYPE_CHECKING:
    from exec.layers.layouts import Case


class GroupComms(Comms):
    """`Comms` over this rank's member of a partition of the ranks into groups (one process
    group per stream). Every rank creates every group, as torch.distributed requires."""

    def __init__(
        self,
        rank: int,
        groups: list[list[int]],
        timeout_s: float,
        device: torch.device,
        streams: tuple[str, ...] = ("comm",),
    ):
        from exec.runtime.timeouts import SETUP_TIMEOUT_S

        self.rank, self.timeout_s, self.device = rank, timeout_s, device
        timeout = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
        self.groups = {}
        for s in streams:
            for members in groups:
                pg = dist.new_group(members, timeout=timeout)
                if rank in members:
                    self.groups[s], self.members = pg, list(members)
        self.world = len(self.members)
        self.index = self.members.index(rank)

    def exchange(self, x: torch.Tensor, stream: str, what: str) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        work = dist.all_to_all_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(
            work,
            self.rank,
            f"all_to_all for {what} (stream {stream})",
            self.members,
            self.timeout_s,
        )
        return out

    def all_gather(self, x: torch.Tensor, what: str, stream: str = "comm") -> torch.Tensor:
        """Members' x stacked along a new first dimension, in member order."""
        x = x.contiguous()
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))  # members along dim 0
        work = all_gather_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(work, self.rank, f"all_gather for {what}", self.members, self.timeout_s)
        return out.view(self.world, *x.shape)

    def reduce_scatter(self, x: torch.Tensor, what: str, stream: str = "comm") -> torch.Tensor:
        """Sum over members of x [world, ...]; this member keeps row `index`."""
        out = x.new_empty(x.shape[1:])
        x = x.reshape(self.world * x.shape[1], *x.shape[2:]).contiguous()  # members along dim 0
        work = reduce_scatter_single(out, x, group=self.groups[stream], async_op=True)
        wait_work(work, self.rank, f"reduce_scatter for {what}", self.members, self.timeout_s)
        return out


class LayoutComms:
    """Every process group the cases need, created in the same order on every rank."""

    def __init__(self, rank: int, world: int, cases: list[Case], timeout_s: float, device):
        self.world = Comms(rank, world, timeout_s, device)
        self.ep: dict[int, GroupComms] = {}
        self.tp: dict[int, GroupComms] = {}
        self.shard: dict[int, GroupComms] = {}
        for tp in sorted({c.tp for c in cases if c.tp > 1}):
            ep = world // tp
            self.ep[tp] = GroupComms(
                rank, [[j * tp + i for j in range(ep)] for i in range(tp)], timeout_s, device
            )
            self.tp[tp] = GroupComms(
                rank, [list(range(k * tp, (k + 1) * tp)) for k in range(ep)], timeout_s, device
            )
        for n in sorted({world // c.spec.experts for c in cases if c.spec.experts < world}):
            groups = [list(range(e * n, (e + 1) * n)) for e in range(world // n)]
            self.shard[n] = GroupComms(rank, groups, timeout_s, device)
