"""Clock alignment across ranks: offsets to rank 0's clock from ping-pong rounds.

Rank 0 exchanges `rounds` ping-pongs with every other rank over the control (default) process
group. In one round rank 0 reads its clock (t1), sends, rank i reads its clock (ti) between
receiving and replying, and rank 0 reads its clock again (t2) on the reply. Whatever the
split of the round trip between the two directions, rank i's reading was taken inside
[t1, t2] of rank 0's clock, so offset_i = ti - (t1 + t2) / 2 is off by at most (t2 - t1) / 2.
The round with the smallest round trip gives the estimate and that bound (Cristian's
algorithm). Ranks on one host share CLOCK_MONOTONIC (perf_counter_ns), so there the true
offset is 0 and the estimate only shows the method's error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockSync:
    """This rank's clock minus rank 0's (ns), and the bound on that estimate's error (ns)."""

    offset_ns: int
    bound_ns: int

    def to_reference(self, t_local_ns: int) -> int:
        return t_local_ns - self.offset_ns


def sync_clocks(rounds: int = 8, group=None) -> list[ClockSync]:
    """Collective over `group` (default: world): every rank gets every rank's ClockSync."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    result = torch.zeros(world, 2, dtype=torch.int64)
    buf = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            best = None
            for _ in range(rounds):
                t1 = time.perf_counter_ns()
                dist.send(buf, peer, group=group)
                dist.recv(buf, peer, group=group)
                t2 = time.perf_counter_ns()
                rtt = t2 - t1
                if best is None or rtt < best[1]:
                    best = (int(buf.item()) - (t1 + t2) // 2, rtt)
            assert best is not None
            result[peer, 0] = best[0]
            result[peer, 1] = (best[1] + 1) // 2
    else:
        for _ in range(rounds):
            dist.recv(buf, 0, group=group)
            buf.fill_(time.perf_counter_ns())
            dist.send(buf, 0, group=group)
    dist.broadcast(result, 0, group=group)
    return [ClockSync(int(o), int(b)) for o, b in result.tolist()]
